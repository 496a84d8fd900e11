// Fuzz target for the module image parsers (emu/src/cubin.cpp, emu/src/fatbin.cpp): the bytes
// cuModuleLoadData, cuModuleLoadFatBinary and cuLibraryLoadData hand the emulator.
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   module_image_fuzz         libFuzzer (clang -fsanitize=fuzzer); tests/fuzz/run-libfuzzer.sh
//   module_image_fuzz_replay  a plain program (THAW_FUZZ_REPLAY_MAIN) for any compiler: runs
//                             every file of the given corpus directories, then a fixed number
//                             of seeded random mutations of them. ctest runs it, so CI (g++,
//                             and the asan preset) exercises the parsers on bad input.
// Either way an input fails by crashing, by a sanitizer report, or by breaking one of the
// checks below (__builtin_trap).
#include <cstddef>
#include <cstdint>
#include <string>

#include "cubin.hpp"
#include "fatbin.hpp"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool within(const std::uint8_t* p, std::size_t n, const std::uint8_t* data, std::size_t size) {
  return p >= data && p <= data + size && n <= static_cast<std::size_t>(data + size - p);
}

void check_module(const emu::ImageResult<emu::CubinInfo>& r, std::size_t size) {
  if (!r) {
    // A wrapper is refused (follow_wrapper = false): its pointer cannot be checked.
    check(r.error() == CUDA_ERROR_INVALID_IMAGE || r.error() == CUDA_ERROR_NO_BINARY_FOR_GPU);
    return;
  }
  check(r->image_size <= size);
  for (const emu::KernelInfo& k : r->kernels) {
    check(!k.name.empty());
    for (std::size_t i = 0; i < k.params.size(); ++i) {
      check(k.params[i].ordinal == i);
      check(std::uint64_t{k.params[i].offset} + k.params[i].size <= k.param_bytes);
    }
  }
  for (const emu::GlobalInfo& g : r->globals) check(g.init.size() <= g.size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string why;
  for (int sm : {90, 80, 86}) {
    const auto r =
        emu::parse_module_image(data, size, sm, {.follow_wrapper = false, .diagnostic = &why});
    check_module(r, size);
    if (!r) check(!why.empty());
  }

  if (const auto n = emu::elf_extent(data, size)) check(*n <= size);
  if (const auto n = emu::fatbin_extent(data, size)) check(*n <= size);
  if (const auto n = emu::module_image_extent(data, size)) {
    // A wrapper's extent is its own size; the rest lie within the input.
    check(*n <= size);
  }
  if (const auto c = emu::parse_cubin(data, size)) check(c->image_size <= size);
  if (const auto e = emu::parse_fatbin(data, size, {.follow_wrapper = false})) {
    for (const emu::FatbinEntry& entry : *e)
      check(within(entry.payload, entry.payload_size, data, size));
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
#include <random>
#include <vector>

namespace {

using Bytes = std::vector<std::uint8_t>;

struct Outcomes {
  long loaded = 0, no_binary = 0, invalid = 0;
};

// Runs one input from a buffer of exactly its size, so ASan sees any read past the end.
void run(const Bytes& input, Outcomes& o) {
  const Bytes exact(input);
  const std::uint8_t* data = exact.empty() ? nullptr : exact.data();
  LLVMFuzzerTestOneInput(data, exact.size());
  const auto r = emu::parse_module_image(data, exact.size(), 90, {.follow_wrapper = false});
  ++(r ? o.loaded : r.error() == CUDA_ERROR_NO_BINARY_FOR_GPU ? o.no_binary : o.invalid);
}

// libFuzzer-style mutations, biased towards the places the parsers read: the first KiB (ELF
// and fatbin headers, small images' tables) and the last 4 KiB (nvcc puts a cubin's section
// and program header tables at its end).
class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}

  void mutate(Bytes& b) {
    const int n = 1 + static_cast<int>(below(8));
    for (int i = 0; i < n; ++i) mutate_once(b);
  }

 private:
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  std::size_t position(const Bytes& b) {
    const std::size_t size = b.size();
    switch (below(3)) {
      case 0:
        return below(std::min<std::size_t>(size, 1024));
      case 1:
        return size - 1 - below(std::min<std::size_t>(size, 4096));
      default:
        return below(size);
    }
  }

  std::uint64_t interesting(std::size_t size) {
    static constexpr std::uint64_t kValues[] = {
        0,       1,          2,          4,          8,          0x10,   0x40,
        0x7f,    0x80,       0xff,       0x100,      0x7fff,     0x8000, 0xffff,
        0x10000, 0x7fffffff, 0x80000000, 0xffffffff, ~0ull >> 1, ~0ull};
    const std::uint64_t pick = below(std::size(kValues) + 3);
    if (pick < std::size(kValues)) return kValues[pick];
    if (pick == std::size(kValues)) return size;
    if (pick == std::size(kValues) + 1) return size + 1;
    return below(size + 1);
  }

  void mutate_once(Bytes& b) {
    if (b.empty()) {
      b.push_back(static_cast<std::uint8_t>(rng_()));
      return;
    }
    switch (below(8)) {
      case 0:  // flip a bit
        b[position(b)] ^= static_cast<std::uint8_t>(1u << below(8));
        break;
      case 1:  // a random byte
        b[position(b)] = static_cast<std::uint8_t>(rng_());
        break;
      case 2:
      case 3: {  // an interesting 1/2/4/8-byte little-endian value
        const std::size_t width = std::size_t{1} << below(4);
        if (b.size() < width) break;
        std::size_t at = std::min(position(b), b.size() - width);
        at &= ~(width - 1);  // headers are naturally aligned
        const std::uint64_t v = interesting(b.size());
        for (std::size_t i = 0; i < width; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
        break;
      }
      case 4:  // truncate
        b.resize(below(b.size() + 1));
        break;
      case 5: {  // copy a chunk over another place
        const std::size_t from = below(b.size()), to = below(b.size());
        const std::size_t len = std::min({below(256) + 1, b.size() - from, b.size() - to});
        std::copy_n(Bytes(b.begin() + from, b.begin() + from + len).begin(), len, b.begin() + to);
        break;
      }
      case 6: {  // insert bytes
        const std::size_t at = below(b.size() + 1);
        Bytes ins(below(64) + 1);
        for (auto& c : ins) c = static_cast<std::uint8_t>(rng_());
        b.insert(b.begin() + at, ins.begin(), ins.end());
        break;
      }
      default: {  // erase a chunk
        const std::size_t at = below(b.size());
        const std::size_t len = std::min<std::size_t>(below(256) + 1, b.size() - at);
        b.erase(b.begin() + at, b.begin() + at + len);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

int usage() {
  std::fprintf(stderr,
               "usage: module_image_fuzz_replay [--mutations N] [--seed S] <file or dir>...\n"
               "Runs every file (directories: their regular files) through the module image\n"
               "fuzz target, then N (default 20000) random mutations of them from seed S.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = thaw::fuzz::parse_replay_args(argc, argv);
  if (!args) return usage();
  const long mutations = args->mutations;
  const std::uint64_t seed = args->seed;
  const auto files = thaw::fuzz::corpus_files(args->paths, "module_image_fuzz_replay",
                                              [](const auto& p) { return p.extension() != ".d"; });
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
      "module_image_fuzz_replay: %zu corpus files (sm_90: %ld load, %ld no binary, %ld "
      "invalid), %ld mutations (seed %#llx: %ld load, %ld no binary, %ld invalid): no "
      "failure in %.1f s\n",
      corpus.size(), seeds.loaded, seeds.no_binary, seeds.invalid, mutations,
      static_cast<unsigned long long>(seed), mutants.loaded, mutants.no_binary, mutants.invalid, s);
  return 0;
}
#endif  // THAW_FUZZ_REPLAY_MAIN
