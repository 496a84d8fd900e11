// Fuzz target for the safetensors parser core (common/safetensors/header_parser.hpp and
// index_parser.hpp): the bytes of a model file a registry serves, and the text of a
// model.safetensors.index.json.
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   safetensors_fuzz         libFuzzer (clang -fsanitize=fuzzer); tests/fuzz/run-libfuzzer.sh
//   safetensors_fuzz_replay  a plain program (THAW_FUZZ_REPLAY_MAIN) for any compiler: every
//                            file of the given corpus, then seeded mutations that know the file
//                            layout (JSON tokens spliced into the header, the length prefix
//                            kept consistent or not). ctest runs it, under the asan preset too.
// Either way an input fails by crashing, by a sanitizer report, or by breaking one of the
// invariants below (__builtin_trap). Only the core is used: it builds with clang 14, which has
// no std::expected.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/safetensors/header_parser.hpp"
#include "common/safetensors/index_parser.hpp"

namespace {

namespace st = thaw::safetensors;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr std::string_view kFile = "fuzz.safetensors";
constexpr std::string_view kIndex = "fuzz.index.json";

void check_error(const st::Error& e, std::string_view file) {
  // One line, about the file it was given.
  check(e.message.starts_with(std::string(file) + ": "));
  check(e.message.find('\n') == std::string::npos);
  check(!st::errc_name(e.code).empty() && st::errc_name(e.code) != "unknown");
}

// What a parsed header guarantees: the tensors tile the data section exactly, each holding
// shape x dtype bytes, and every name finds its own tensor.
void check_header(const st::Header& h, std::uint64_t file_size) {
  check(h.header_size() <= st::kMaxHeaderBytes);
  check(h.file_size() == file_size);
  check(h.data_begin() == 8 + h.header_size() && h.data_begin() <= file_size);
  std::uint64_t at = h.data_begin();
  for (const st::TensorInfo& t : h.tensors()) {
    check(t.begin == at && t.end >= t.begin);
    const unsigned __int128 bits =
        static_cast<unsigned __int128>(t.elements()) * st::dtype_bits(t.dtype);
    check(bits % 8 == 0 && bits / 8 == t.bytes());
    check(h.find(t.name) == &t);
    check(t.name != "__metadata__");
    at = t.end;
  }
  check(at == file_size);
}

void check_index(const st::ShardIndex& index) {
  check(!index.weight_map.empty() && !index.files.empty());
  for (std::size_t i = 0; i < index.weight_map.size(); ++i) {
    const auto& [tensor, file] = index.weight_map[i];
    if (i > 0) check(index.weight_map[i - 1].first < tensor);
    check(index.shard_of(tensor) && *index.shard_of(tensor) == file);
    check(!st::core::shard_name_problem(file));
  }
  for (std::size_t i = 1; i < index.files.size(); ++i) check(index.files[i - 1] < index.files[i]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));

  // The input as a whole safetensors file.
  st::Header header;
  if (const auto e = st::core::parse_header(bytes, size, kFile, header)) {
    check_error(*e, kFile);
  } else {
    check_header(header, size);
    // The same bytes as the prefix of a longer file: the data no longer reaches its end.
    st::Header longer;
    const auto e2 = st::core::parse_header(bytes, size + 1, kFile, longer);
    check(e2 && e2->code == st::errc::trailing_bytes);
    // The length prefix alone agrees.
    std::uint64_t n = 0;
    check(!st::core::read_header_length(bytes, size, kFile, n) && n == header.header_size());
  }

  // The input as an index.
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  st::ShardIndex index;
  if (const auto e = st::core::parse_index(text, kIndex, index)) {
    check_error(*e, kIndex);
  } else {
    check_index(index);
  }
  return 0;
}

#ifdef THAW_FUZZ_REPLAY_MAIN
#include "replay_corpus.hpp"

// ---- The replay program. ----
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <vector>

namespace {

using Bytes = std::string;

struct Outcomes {
  long parsed = 0, index = 0, refused = 0;
  std::map<std::string_view, long> file_errors;  // why inputs were refused as files, by rule
};

// Runs one input from a buffer of exactly its size, so ASan sees any read past the end.
void run(const Bytes& input, Outcomes& o) {
  const std::vector<std::uint8_t> exact(input.begin(), input.end());
  const std::uint8_t* data = exact.empty() ? nullptr : exact.data();
  LLVMFuzzerTestOneInput(data, exact.size());
  st::Header h;
  st::ShardIndex index;
  const auto e =
      st::core::parse_header(std::as_bytes(std::span(data, exact.size())), exact.size(), kFile, h);
  if (e) ++o.file_errors[st::errc_name(e->code)];
  if (!e) {
    ++o.parsed;
  } else if (!st::core::parse_index(input, kIndex, index)) {
    ++o.index;
  } else {
    ++o.refused;
  }
}

// Tokens that matter to the parsers, spliced into the JSON.
constexpr std::string_view kTokens[] = {
    "\"dtype\":",
    "\"shape\":",
    "\"data_offsets\":",
    "\"__metadata__\":",
    "\"weight_map\":",
    "\"metadata\":",
    "\"total_size\":",
    "\"F32\"",
    "\"F4\"",
    "\"F6_E2M3\"",
    "\"BOOL\"",
    "\"C64\"",
    "\"F8_E8M0\"",
    "\"f32\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "\"",
    "0",
    "-1",
    "-0",
    "1.5",
    "1e3",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "null",
    "true",
    "\\u0000",
    "\\ud800",
    "\\\"",
    "\xff",
    "\xc0\xaf",
    "\xef\xbb\xbf",
    "\t",
    " ",
    "\"../x.safetensors\"",
    "\"a/b.safetensors\"",
    "\"m.safetensors\"",
    "[0,0]",
    "[[[[[[[[",
    "{\"a\":{\"a\":",
};

// Mutations that know the layout: a file is [N][header][data]; mutating the header and then
// rewriting N to match reaches the JSON and extent checks instead of stopping at the length.
class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}

  void mutate(Bytes& b) {
    Bytes header, data;
    const bool framed = split(b, header, data);
    Bytes& target = framed && below(8) != 0 ? header : b;
    const int n = 1 + static_cast<int>(below(4));
    for (int i = 0; i < n; ++i) mutate_once(target);
    if (&target == &header) {
      if (below(4) == 0) mutate_data(data);
      // Usually keep N consistent; sometimes leave it stale.
      const std::uint64_t len = below(8) == 0 ? rng_() % (header.size() + 16) : header.size();
      b = le64(len) + header + data;
    }
  }

 private:
  static Bytes le64(std::uint64_t v) {
    Bytes s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
    return s;
  }
  static bool split(const Bytes& b, Bytes& header, Bytes& data) {
    if (b.size() < 8) return false;
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
    if (n > b.size() - 8) return false;
    header = b.substr(8, n);
    data = b.substr(8 + n);
    return true;
  }
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void mutate_data(Bytes& d) {
    switch (below(3)) {
      case 0:
        d.resize(below(d.size() + 1));
        break;
      case 1:
        d.append(1 + below(16), '\0');
        break;
      default:
        if (!d.empty()) d.pop_back();
        break;
    }
  }

  // A digit run in `b` replaced by another number (offsets, shapes, sizes).
  bool renumber(Bytes& b) {
    std::vector<std::size_t> starts;
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (b[i] >= '0' && b[i] <= '9' && (i == 0 || b[i - 1] < '0' || b[i - 1] > '9'))
        starts.push_back(i);
    }
    if (starts.empty()) return false;
    const std::size_t at = starts[below(starts.size())];
    std::size_t end = at;
    while (end < b.size() && b[end] >= '0' && b[end] <= '9') ++end;
    const std::uint64_t old = std::strtoull(b.substr(at, end - at).c_str(), nullptr, 10);
    std::uint64_t v = 0;
    switch (below(5)) {
      case 0:
        v = old + 1;
        break;
      case 1:
        v = old == 0 ? 0 : old - 1;
        break;
      case 2:
        v = old * 2;
        break;
      case 3:
        v = below(64);
        break;
      default:
        v = rng_() >> below(64);
        break;
    }
    b.replace(at, end - at, std::to_string(v));
    return true;
  }

  void mutate_once(Bytes& b) {
    if (b.empty()) {
      b = kTokens[below(std::size(kTokens))];
      return;
    }
    switch (below(9)) {
      case 0:  // flip a bit
        b[below(b.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1:  // a random byte
        b[below(b.size())] = static_cast<char>(rng_());
        break;
      case 2:
      case 3: {  // splice a token in
        const std::string_view t = kTokens[below(std::size(kTokens))];
        b.insert(below(b.size() + 1), t);
        break;
      }
      case 4:
      case 5:
        if (!renumber(b)) b.insert(below(b.size() + 1), "0");
        break;
      case 6:  // truncate
        b.resize(below(b.size() + 1));
        break;
      case 7: {  // duplicate a chunk elsewhere (duplicate keys, repeated entries)
        const std::size_t from = below(b.size());
        const std::size_t len = std::min<std::size_t>(below(128) + 1, b.size() - from);
        const Bytes chunk = b.substr(from, len);
        b.insert(below(b.size() + 1), chunk);
        break;
      }
      default: {  // erase a chunk
        const std::size_t at = below(b.size());
        b.erase(at, std::min<std::size_t>(below(64) + 1, b.size() - at));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

int usage() {
  std::fprintf(stderr,
               "usage: safetensors_fuzz_replay [--mutations N] [--seed S] <file or dir>...\n"
               "Runs every file (directories: their regular files) through the safetensors\n"
               "fuzz target, then N (default 20000) random mutations of them from seed S.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = thaw::fuzz::parse_replay_args(argc, argv);
  if (!args) return usage();
  const long mutations = args->mutations;
  const std::uint64_t seed = args->seed;
  const auto files = thaw::fuzz::corpus_files(args->paths, "safetensors_fuzz_replay");
  if (files.empty()) return 2;
  std::vector<Bytes> corpus;
  for (const auto& f : files) corpus.push_back(thaw::fuzz::read_file<Bytes>(f));

  const auto start = std::chrono::steady_clock::now();
  Outcomes seeds, mutants;
  for (const Bytes& b : corpus) run(b, seeds);
  Mutator m(seed);
  for (long i = 0; i < mutations; ++i) {
    Bytes b = corpus[static_cast<std::size_t>(i) % corpus.size()];
    m.mutate(b);
    run(b, mutants);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "safetensors_fuzz_replay: %zu corpus files (%ld files parse, %ld indexes parse, %ld "
      "refused), %ld mutations (seed %#llx: %ld files parse, %ld indexes parse, %ld refused): "
      "no failure in %.1f s\n",
      corpus.size(), seeds.parsed, seeds.index, seeds.refused, mutations,
      static_cast<unsigned long long>(seed), mutants.parsed, mutants.index, mutants.refused, s);
  // Which rules the mutants reached, so a corpus or mutator change that stops exercising one
  // shows here.
  std::printf("safetensors_fuzz_replay: mutants refused as files by rule:");
  for (const auto& [rule, n] : mutants.file_errors)
    std::printf(" %.*s %ld", static_cast<int>(rule.size()), rule.data(), n);
  std::printf("\n");
  return 0;
}
#endif  // THAW_FUZZ_REPLAY_MAIN
