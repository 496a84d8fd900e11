// Fuzz target for the shim socket's codec (common/proto/shim_messages.hpp): the bytes and
// descriptors thawd receives from any local user, and the shim from thawd.
//
// An input is one byte — how many descriptors came with the packet (its value mod 8, or up to
// kMaxFdsPerMessage when the byte is 0x80 or more) — then the packet.
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   shim_message_fuzz         libFuzzer (clang -fsanitize=fuzzer); tests/fuzz/run-libfuzzer.sh.
//   shim_message_fuzz_replay  a plain program (THAW_FUZZ_REPLAY_MAIN) for any compiler: every
//                             file of the given corpus, then seeded mutations of it (half of
//                             them JSON-aware: a field's value replaced, dropped or added, so
//                             the mutants get past parsing to the field rules); ctest runs it.
//                             --write-seeds DIR writes the seed corpus (corpus/shim/).
// Either way an input fails by crashing, by a sanitizer report, or by breaking one of the
// invariants below (__builtin_trap). Only the core is used: it builds with clang 14, which has
// no std::expected.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/proto/shim_messages.hpp"

namespace {

namespace proto = thaw::proto;
using thaw::UniqueFd;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

std::size_t fd_count(std::uint8_t b) {
  return b >= 0x80 ? (b & 0x7f) % (proto::kMaxFdsPerMessage + 1) : b % 8;
}

// Descriptors to hand the decoder: duplicates of one, so that each is really closed or kept.
std::vector<UniqueFd> descriptors(std::size_t n) {
  static const int base = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<UniqueFd> out;
  for (std::size_t i = 0; i < n; ++i) out.emplace_back(::fcntl(base, F_DUPFD_CLOEXEC, 0));
  return out;
}

// An error is one line of bounded length that thawd logs as is, with the peer's name.
void check_error(const std::string& e) {
  check(!e.empty());
  check(e.size() < 1024);
  for (char c : e) check(c >= 0x20 && c < 0x7f);
}

std::size_t carried(const proto::ShimMessage& m) {
  std::vector<std::byte> bytes;
  std::vector<int> fds;
  if (!proto::encode_message(0, m, bytes, fds).empty()) return ~std::size_t{0};
  return fds.size();
}

void run_one(std::span<const std::byte> packet, std::size_t fds) {
  proto::Envelope out;
  bool value_error = false;
  const std::string e = proto::decode_message(packet, descriptors(fds), out, &value_error);
  if (!e.empty()) {
    check_error(e);
    return;
  }
  // Accepted: the frame was whole, the descriptors exactly the type's, and what thawd or the
  // shim would send back of it is accepted again, byte for byte the same (a fixpoint).
  check(packet.size() <= proto::kMaxMessageBytes);
  check(!value_error);
  check(carried(out.message) == fds);
  std::vector<std::byte> again;
  std::vector<int> again_fds;
  check(proto::encode_message(out.request_id, out.message, again, again_fds).empty());
  check(again_fds.size() == fds);
  std::vector<UniqueFd> dup;
  for (int fd : again_fds) dup.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  proto::Envelope back;
  check(proto::decode_message(again, std::move(dup), back).empty());
  check(back.request_id == out.request_id);
  check(proto::type_of(back.message) == proto::type_of(out.message));
  std::vector<std::byte> third;
  std::vector<int> third_fds;
  check(proto::encode_message(back.request_id, back.message, third, third_fds).empty());
  check(third == again);
}

// The payload as a slot layout document too (the shim reads one from every slot's memfd).
void run_layout(std::span<const std::byte> packet) {
  if (packet.size() <= proto::kHeaderBytes) return;
  const std::string_view text(reinterpret_cast<const char*>(packet.data() + proto::kHeaderBytes),
                              packet.size() - proto::kHeaderBytes);
  std::vector<proto::LayoutRow> rows;
  const std::string e = proto::decode_slot_layout(text, rows);
  if (!e.empty()) {
    check_error(e);
    check(rows.empty());
    return;
  }
  std::string again;
  check(proto::encode_slot_layout(rows, again).empty());
  std::vector<proto::LayoutRow> back;
  check(proto::decode_slot_layout(again, back).empty());
  check(back.size() == rows.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> packet(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  run_one(packet, fd_count(data[0]));
  run_layout(packet);
  return 0;
}

#ifdef THAW_FUZZ_REPLAY_MAIN
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <utility>

#include "replay_corpus.hpp"

namespace {

using Bytes = std::string;

UniqueFd fd() {
  return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

// A corpus file: the descriptor count byte, then the packet.
Bytes input_of(const proto::ShimMessage& m, std::uint32_t id) {
  std::vector<std::byte> bytes;
  std::vector<int> fds;
  check(proto::encode_message(id, m, bytes, fds).empty());
  Bytes out(1, static_cast<char>(fds.size() < 8 ? fds.size() : 0x80 | fds.size()));
  out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return out;
}

std::vector<std::pair<std::string, Bytes>> seeds() {
  const proto::ArtifactIdentity id{"/usr/bin/python3 4096 1700000000.000000000", "org/model-7b",
                                   "NVIDIA H100 80GB HBM3", "12040"};
  std::vector<std::pair<std::string, proto::ShimMessage>> all;
  all.emplace_back("hello", proto::Hello{"thaw-preload", "python3"});
  all.emplace_back("hello_ok", proto::HelloOk{proto::kProtocolVersion, "node-a", "0.1.0"});
  all.emplace_back("open_file",
                   proto::OpenFile{"org/model-7b", "model-00001-of-00002.safetensors"});
  all.emplace_back("file", proto::File{14'000'000'000, false, fd(), fd()});
  all.emplace_back("attach_slot", proto::AttachSlot{"org/model-7b"});
  all.emplace_back("slot", proto::Slot{"g0s1", 0x8f3a'11c2'7d00'4e51, 40ull << 30, 13ull << 30,
                                       2u << 20, proto::LayoutKind::engine,
                                       "3f2a9c0d1e4b5a6978877665544332211", 18342, 52, fd()});
  proto::SlotPages pages;
  for (std::uint64_t i = 0; i < 5; ++i) {
    pages.offsets.push_back(i << 21);
    pages.pages.push_back(fd());
  }
  all.emplace_back("slot_pages", std::move(pages));
  all.emplace_back("imported", proto::Imported{"g0s1", 0x8f3a'11c2'7d00'4e51});
  all.emplace_back("ok", proto::Ok{});
  all.emplace_back("release", proto::Release{"g0s1", true});
  all.emplace_back("report_artifact",
                   proto::ReportArtifact{proto::ArtifactKind::layout, id, 20480, fd()});
  all.emplace_back("error", proto::Error::make("org.thaw.Error.UnknownArtifact",
                                               "no layout record of org/model-7b"));
  all.emplace_back("get_artifact", proto::GetArtifact{proto::ArtifactKind::layout, id});
  all.emplace_back("artifact", proto::Artifact{20480, fd()});
  all.emplace_back("report_counters", proto::ReportCounters{proto::EngineCounters{
                                          1234, 56, 0, 2, 17, 1ull << 32, 1, 3, 1, 1, 0}});
  all.emplace_back("export_ipc", proto::ExportIpc{2u << 20, fd()});
  all.emplace_back("ipc_exported", proto::IpcExported{0x1122'3344'5566'7788});
  all.emplace_back("import_ipc", proto::ImportIpc{0x1122'3344'5566'7788});
  all.emplace_back("ipc", proto::Ipc{2u << 20, fd()});
  all.emplace_back("free_pages", proto::FreePages{"g0s1", {0, 2u << 20, 4u << 20}});
  all.emplace_back("lease_memory", proto::LeaseMemory{"5f1c2a3b4c5d6e7f8091a2b3c4d5e6f7"});
  all.emplace_back("memory_lease", proto::MemoryLease{30ull << 30});
  std::vector<std::pair<std::string, Bytes>> out;
  std::uint32_t id_n = 1;
  for (const auto& [name, m] : all) out.emplace_back(name, input_of(m, id_n++));
  // A slot's layout document, as a packet body (run_layout reads it).
  std::string layout;
  check(proto::encode_slot_layout({{0, "model.safetensors", 8, 4096},
                                   {4096, "model.safetensors", 4104, 1 << 20},
                                   {2u << 20, "sub/model-2.safetensors", 0, 77}},
                                  layout)
            .empty());
  Bytes l(1, '\0');
  std::vector<std::byte> header(proto::kHeaderBytes);
  proto::write_frame_header(
      {proto::kProtocolVersion, 0, 0, static_cast<std::uint32_t>(layout.size())}, header.data());
  l.append(reinterpret_cast<const char*>(header.data()), header.size());
  l += layout;
  out.emplace_back("zz-slot-layout", l);
  return out;
}

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // JSON-aware: one field of the body replaced, removed or added; the header fixed up.
  bool mutate_json(Bytes& b) {
    if (b.size() < 1 + proto::kHeaderBytes) return false;
    nlohmann::json body =
        nlohmann::json::parse(b.begin() + 1 + proto::kHeaderBytes, b.end(), nullptr, false);
    if (body.is_discarded() || !body.is_object()) return false;
    mutate_value(body, 0);
    const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    b.resize(1 + proto::kHeaderBytes);
    const auto n = static_cast<std::uint32_t>(text.size());
    std::memcpy(b.data() + 1 + 12, &n, 4);
    b += text;
    if (below(8) == 0) b[0] = static_cast<char>(below(256));  // another descriptor count
    if (below(16) == 0) {                                     // another type, same body
      const auto t = static_cast<std::uint16_t>(1 + below(24));
      std::memcpy(b.data() + 1 + 6, &t, 2);
    }
    return true;
  }

  void mutate_bytes(Bytes& b, const std::vector<Bytes>& corpus) {
    if (b.empty()) {
      b.assign(1 + below(32), static_cast<char>(rng_()));
      return;
    }
    switch (below(8)) {
      case 0:
        b[below(b.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1: {
        constexpr char kBytes[] = {'"', '{', '}', '[', ']', ',', ':', '\\', '-', '0', '\0', '\xff'};
        b[below(b.size())] = kBytes[below(std::size(kBytes))];
        break;
      }
      case 2:
        b.resize(below(b.size() + 1));
        break;
      case 3: {
        const std::size_t from = below(b.size());
        b.insert(below(b.size() + 1), b.substr(from, 1 + below(32)));
        break;
      }
      case 4:
        b.erase(below(b.size()), 1 + below(16));
        break;
      case 5:
        b += corpus[below(corpus.size())];
        break;
      case 6:
        b[0] = static_cast<char>(rng_());
        break;
      default:
        b[below(b.size())] = static_cast<char>(rng_());
        break;
    }
  }

 private:
  nlohmann::json random_value(int depth) {
    switch (below(14)) {
      case 0:
        return nullptr;
      case 1:
        return below(2) == 0;
      case 2:
        return -static_cast<std::int64_t>(below(1000));
      case 3:
        return 1.5;
      case 4:
        return ~std::uint64_t{0};
      case 5:
        return std::uint64_t{1} << below(64);
      case 6:
        return "";
      case 7:
        return std::string(below(5000), 'a');
      case 8:
        return "../../etc/passwd";
      case 9:
        return std::string("a\nb\x01\x7f\xc3\xa9", 7);
      case 10:
        return depth < 3 ? nlohmann::json::array({random_value(depth + 1), 0}) : nullptr;
      case 11:
        return depth < 3 ? nlohmann::json::object({{"k", random_value(depth + 1)}}) : nullptr;
      case 12:
        return below(2) == 0 ? "engine" : "layout";
      default:
        return below(1u << 20);
    }
  }
  void mutate_value(nlohmann::json& object, int depth) {
    if (!object.is_object()) return;
    const std::uint64_t how = below(6);
    if (object.empty() || how == 0) {
      object[below(2) == 0 ? "extra" : "pid"] = random_value(depth);
      return;
    }
    auto it = object.begin();
    std::advance(it, static_cast<long>(below(object.size())));
    if (how == 1) {
      object.erase(it);
    } else if (it->is_object() && depth < 3) {
      mutate_value(*it, depth + 1);
    } else if (it->is_array() && !it->empty() && below(2) == 0) {
      (*it)[below(it->size())] = random_value(depth);
    } else {
      *it = random_value(depth);
    }
  }

  std::mt19937_64 rng_;
};

void run(const Bytes& input, long& accepted, long& refused) {
  const std::vector<std::uint8_t> exact(input.begin(), input.end());
  LLVMFuzzerTestOneInput(exact.empty() ? nullptr : exact.data(), exact.size());
  if (exact.empty()) return;
  proto::Envelope out;
  const std::span<const std::byte> packet(reinterpret_cast<const std::byte*>(exact.data() + 1),
                                          exact.size() - 1);
  if (proto::decode_message(packet, descriptors(fd_count(exact[0])), out).empty()) {
    ++accepted;
  } else {
    ++refused;
  }
}

int write_seeds(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [name, bytes] : seeds()) {
    std::ofstream out(dir / (name + ".bin"), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "shim_message_fuzz_replay: cannot write %s\n", dir.c_str());
      return 1;
    }
  }
  std::printf("shim_message_fuzz_replay: %zu seeds written to %s\n", seeds().size(), dir.c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: shim_message_fuzz_replay [--mutations N] [--seed S] <file or dir>...\n"
               "       shim_message_fuzz_replay --write-seeds DIR\n"
               "Runs every file (directories: their regular files) through the shim message\n"
               "fuzz target, then N (default 20000) random mutations of them from seed S; or\n"
               "writes the seed corpus (a valid packet of every message type) to DIR.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--write-seeds") return write_seeds(argv[2]);
  const auto args = thaw::fuzz::parse_replay_args(argc, argv);
  if (!args) return usage();
  const auto files = thaw::fuzz::corpus_files(args->paths, "shim_message_fuzz_replay");
  if (files.empty()) return 2;
  std::vector<Bytes> corpus;
  for (const auto& f : files) corpus.push_back(thaw::fuzz::read_file<Bytes>(f));

  const auto start = std::chrono::steady_clock::now();
  long seeds_accepted = 0, seeds_refused = 0, accepted = 0, refused = 0;
  for (const Bytes& b : corpus) run(b, seeds_accepted, seeds_refused);
  Mutator m(args->seed);
  for (long i = 0; i < args->mutations; ++i) {
    Bytes b = corpus[static_cast<std::size_t>(i) % corpus.size()];
    const std::uint64_t how = m.below(4);
    if (how != 0 && !m.mutate_json(b)) m.mutate_bytes(b, corpus);
    if (how == 0 || m.below(4) == 0) m.mutate_bytes(b, corpus);
    run(b, accepted, refused);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "shim_message_fuzz_replay: %zu corpus files (%ld accepted, %ld refused), %ld mutations "
      "(seed %#llx: %ld accepted, %ld refused): no failure in %.1f s\n",
      corpus.size(), seeds_accepted, seeds_refused, args->mutations,
      static_cast<unsigned long long>(args->seed), accepted, refused, s);
  return 0;
}
#endif  // THAW_FUZZ_REPLAY_MAIN
