// Fuzz target for the graph record codec (common/graphs/graph_record_model.hpp): the text of an
// artifact of kind "graphs", which thawd keeps on disk and hands to engines, and which the
// preload shim parses before restoring CUDA graphs from it.
//
// An input is the record's text. Properties: parsing never crashes and never throws; a refusal
// is one printable line of bounded length; whatever parses is written again, and that text
// parses to an equal record and is written to the same bytes (a fixpoint).
//
// Built two ways (tests/fuzz/CMakeLists.txt):
//   graph_record_fuzz         libFuzzer (clang -fsanitize=fuzzer); tests/fuzz/run-libfuzzer.sh.
//   graph_record_fuzz_replay  a plain program (THAW_FUZZ_REPLAY_MAIN) for any compiler: every
//                             file of the given corpus, then seeded mutations of it (three in four
//                             JSON-aware: a value replaced, nudged, dropped, duplicated or added
//                             anywhere in the tree, so the mutants get past parsing to the
//                             record's rules); ctest runs it. --write-seeds DIR writes the seed
//                             corpus (corpus/graph_record/).
// Either way an input fails by crashing, by a sanitizer report, or by breaking one of the
// properties (__builtin_trap). Only the core is used: it builds with clang 14, which has no
// std::expected.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/graphs/graph_record_model.hpp"

namespace {

namespace graphs = thaw::graphs;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void check_error(const std::string& e) {
  check(!e.empty());
  check(e.size() <= 1003);  // graph_record.cpp's printable(): 1000 and "..."
  for (char c : e) check(c >= 0x20 && c < 0x7f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  graphs::GraphRecord record;
  const std::string e = graphs::parse_graph_record(text, record);
  if (!e.empty()) {
    check_error(e);
    return 0;
  }
  check(record.version == graphs::kGraphRecordVersion);
  const std::string again = graphs::graph_record_to_json(record);
  graphs::GraphRecord back;
  check(graphs::parse_graph_record(again, back).empty());
  check(back == record);
  check(graphs::graph_record_to_json(back) == again);
  return 0;
}

#ifdef THAW_FUZZ_REPLAY_MAIN
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>
#include <vector>

#include "replay_corpus.hpp"

namespace {

using graphs::GraphRecord;
using graphs::ImageKind;
using graphs::NodeType;
using Text = std::string;

std::string digest_of(int n) {
  std::string d(64, '0');
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 64; ++i) d[static_cast<std::size_t>(i)] = hex[(n * 7 + i * 13) % 16];
  return d;
}

graphs::RecordedNode kernel(const std::string& digest, std::string name,
                            std::vector<graphs::ParamSlot> params, std::size_t param_bytes) {
  graphs::KernelNode k;
  k.kernel = {digest, std::move(name)};
  k.grid = {132, 2, 1};
  k.block = {128, 1, 1};
  k.shared_bytes = 1024;
  k.params = std::move(params);
  for (std::size_t i = 0; i < param_bytes; ++i)
    k.param_bytes.push_back(static_cast<std::uint8_t>(i));
  return {NodeType::kernel, k, std::nullopt, std::nullopt};
}

graphs::RecordedNode bare(NodeType type) {
  return {type, std::nullopt, std::nullopt, std::nullopt};
}

std::vector<std::pair<std::string, GraphRecord>> seed_records() {
  std::vector<std::pair<std::string, GraphRecord>> out;
  GraphRecord base;
  base.identity = {"/usr/bin/python3 4096 1700000000.000000000", "org/model-7b",
                   "NVIDIA H100 80GB HBM3", "12040"};
  out.emplace_back("empty", base);

  GraphRecord all = base;
  all.modules = {{digest_of(1), 1 << 20, ImageKind::cubin},
                 {digest_of(2), 4 << 20, ImageKind::fatbin},
                 {digest_of(3), 900, ImageKind::ptx},
                 {digest_of(4), 12, ImageKind::unknown}};
  graphs::RecordedGraph g{0, 52, {}, {}};
  g.nodes.push_back(kernel(digest_of(1), "_Z6gemm_kPKfS0_Pfiii", {{0, 8}, {8, 8}, {16, 4}}, 20));
  g.nodes.push_back({NodeType::memset, std::nullopt,
                     graphs::MemsetNode{0x7f00'0000'1000'0000, 4096, 0xab, 1, 1024, 16},
                     std::nullopt});
  g.nodes.push_back({NodeType::memcpy, std::nullopt, std::nullopt,
                     graphs::MemcpyNode{0x7f00'0000'2000'0000, 0x7f00'0000'3000'0000, 4096, 2, 2}});
  for (NodeType t : {NodeType::empty, NodeType::event_record, NodeType::event_wait, NodeType::host,
                     NodeType::other})
    g.nodes.push_back(bare(t));
  g.nodes.push_back(kernel(digest_of(2), "sm90_xmma_gemm", {{0, 4}, {8, 8}, {40, 8}}, 48));
  // A CUTLASS 3 GEMM as cuBLAS launches it on an H100: a cluster and its launch attributes.
  graphs::KernelNode& gemm = *g.nodes.back().kernel;
  gemm.cluster = {2, 1, 1};
  gemm.cluster_scheduling = 1;
  gemm.mem_sync_domain = 1;
  gemm.mem_sync_domain_map = {0, 1};
  gemm.carveout = 100;
  gemm.priority = 2;
  g.edges = {{0, 1}, {1, 2}, {0, 3}, {2, 4}, {3, 4}, {5, 6}, {4, 7}, {6, 7}, {7, 8}};
  all.graphs.push_back(g);
  all.graphs.push_back({2, 0xffff'ffff'ffff'ffff, {kernel(digest_of(3), "k", {}, 0)}, {}});
  // A driver that answers a carveout of 0 and a cluster of [1, 1, 1] for "not set".
  all.attribute_defaults.carveout = 0;
  all.attribute_defaults.cluster = {1, 1, 1};
  out.emplace_back("all_node_types", all);

  // A decode step's graph: a long chain of kernels, as an engine captures per layer.
  GraphRecord chain = base;
  chain.modules = {{digest_of(9), 8 << 20, ImageKind::fatbin}};
  graphs::RecordedGraph c{0, 1000, {}, {}};
  for (std::uint32_t i = 0; i < 24; ++i) {
    c.nodes.push_back(kernel(digest_of(9), "layer_" + std::to_string(i % 4),
                             {{0, 8}, {8, 8}, {16, 8}, {24, 4}}, 28));
    if (i > 0) c.edges.push_back({i - 1, i});
  }
  chain.graphs.push_back(c);
  c.index = 1;
  c.allocation_index = 1200;
  chain.graphs.push_back(c);
  out.emplace_back("decode_chain", chain);

  // Forks and joins, memsets of every element size.
  GraphRecord dag = base;
  dag.modules = {{digest_of(5), 1 << 16, ImageKind::cubin}};
  graphs::RecordedGraph d{7, 3, {}, {}};
  d.nodes.push_back(bare(NodeType::empty));
  for (std::uint32_t size : {1u, 2u, 4u})
    d.nodes.push_back(
        {NodeType::memset, std::nullopt,
         graphs::MemsetNode{0x1000u * size, 0, size == 4 ? 0xffffffffu : 1u, size, 64, 1},
         std::nullopt});
  d.nodes.push_back(kernel(digest_of(5), "join", {{0, 8}}, 8));
  d.edges = {{0, 1}, {0, 2}, {0, 3}, {1, 4}, {2, 4}, {3, 4}};
  dag.graphs.push_back(d);
  out.emplace_back("fork_join", dag);
  return out;
}

std::vector<std::pair<std::string, Text>> seeds() {
  std::vector<std::pair<std::string, Text>> out;
  for (const auto& [name, record] : seed_records())
    out.emplace_back(name, graphs::graph_record_to_json(record));
  return out;
}

using ojson = nlohmann::ordered_json;

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // JSON-aware: one place in the tree (any depth) changed; false when the text is not JSON.
  bool mutate_json(Text& t, const std::vector<Text>& corpus) {
    ojson doc = ojson::parse(t, nullptr, false);
    if (doc.is_discarded()) return false;
    ojson donor = ojson::parse(corpus[below(corpus.size())], nullptr, false);
    const int rounds = 1 + static_cast<int>(below(4) == 0 ? below(3) : 0);
    for (int i = 0; i < rounds; ++i) mutate_at(doc, donor, 0);
    t = doc.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
  }

  void mutate_bytes(Text& b, const std::vector<Text>& corpus) {
    if (b.empty()) {
      b.assign(1 + below(32), static_cast<char>(rng_()));
      return;
    }
    switch (below(7)) {
      case 0:
        b[below(b.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1: {
        constexpr char kBytes[] = {'"', '{', '}', '[', ']', ',', ':',  '\\',  '-',
                                   '0', '9', 'a', 'F', '.', 'e', '\0', '\xff'};
        b[below(b.size())] = kBytes[below(std::size(kBytes))];
        break;
      }
      case 2:
        b.resize(below(b.size() + 1));
        break;
      case 3: {
        const std::size_t from = below(b.size());
        b.insert(below(b.size() + 1), b.substr(from, 1 + below(64)));
        break;
      }
      case 4:
        b.erase(below(b.size()), 1 + below(16));
        break;
      case 5: {
        const Text& other = corpus[below(corpus.size())];
        b.insert(below(b.size() + 1), other.substr(below(other.size()), 1 + below(256)));
        break;
      }
      default:
        b[below(b.size())] = static_cast<char>(rng_());
        break;
    }
  }

 private:
  // A value from the donor document: a subtree found by a random walk.
  ojson donor_value(const ojson& donor) {
    const ojson* at = &donor;
    while ((at->is_object() || at->is_array()) && !at->empty() && below(4) != 0) {
      auto it = at->begin();
      std::advance(it, static_cast<long>(below(at->size())));
      at = &*it;
    }
    return *at;
  }

  ojson random_value(const ojson& donor) {
    static const char* const kNames[] = {
        "kernel", "memset", "memcpy", "empty", "event_record", "event_wait",  "host",
        "other",  "cubin",  "fatbin", "ptx",   "unknown",      "conditional", ""};
    switch (below(16)) {
      case 0:
        return nullptr;
      case 1:
        return below(2) == 0;
      case 2:
        return -static_cast<std::int64_t>(below(3));
      case 3:
        return 1.5;
      case 4:
        return ~std::uint64_t{0};
      case 5:
        return std::uint64_t{1} << below(64);
      case 6:
        return 0xffff'ffffull + below(3) - 1;
      case 7:
        return kNames[below(std::size(kNames))];
      case 8:
        return digest_of(static_cast<int>(below(12)));
      case 9:
        return std::string(2 * below(40), static_cast<char>("0fA"[below(3)]));
      case 10:
        return ojson::array({below(64), below(64)});
      case 11:
        return ojson::array();
      case 12:
        return ojson::object();
      case 13:
      case 14:
        return donor_value(donor);
      default:
        return below(64);
    }
  }

  // A number nudged to a neighbour or a boundary; a string's character changed.
  bool tweak(ojson& v) {
    if (v.is_number_unsigned()) {
      const auto n = v.get<std::uint64_t>();
      switch (below(6)) {
        case 0:
          v = n + 1;
          break;
        case 1:
          v = n - 1;  // 0 - 1 becomes the largest u64
          break;
        case 2:
          v = n * 2 + 1;
          break;
        case 3:
          v = std::uint64_t{0};
          break;
        case 4:
          v = std::uint64_t{1} << (32 + below(2));
          break;
        default:
          // Negative (two's complement of n, without the overflow of negating INT64_MIN).
          v = static_cast<std::int64_t>(std::uint64_t{0} - n);
          break;
      }
      return true;
    }
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      if (s.empty() || below(4) == 0) {
        s.push_back("0aF\""[below(4)]);
      } else {
        s[below(s.size())] = "0af9gA"[below(6)];
      }
      v = s;
      return true;
    }
    return false;
  }

  void mutate_at(ojson& v, const ojson& donor, int depth) {
    if ((v.is_object() || v.is_array()) && !v.empty() && depth < 8 && below(6) != 0) {
      // Mostly down into containers: most of the record's rules are deep in the tree.
      std::vector<ojson*> children, containers;
      for (auto& child : v) {
        children.push_back(&child);
        if (child.is_object() || child.is_array()) containers.push_back(&child);
      }
      const auto& from = !containers.empty() && below(4) != 0 ? containers : children;
      mutate_at(*from[below(from.size())], donor, depth + 1);
      return;
    }
    if (v.is_object()) {
      switch (below(4)) {
        case 0:
          if (!v.empty()) {
            auto it = v.begin();
            std::advance(it, static_cast<long>(below(v.size())));
            v.erase(it);
            return;
          }
          [[fallthrough]];
        case 1: {
          static const char* const kKeys[] = {"extra", "kernel", "memset", "memcpy",
                                              "type",  "params", "index"};
          v[kKeys[below(std::size(kKeys))]] = random_value(donor);
          return;
        }
        default:
          v = random_value(donor);
          return;
      }
    }
    if (v.is_array()) {
      switch (below(4)) {
        case 0:
          if (!v.empty()) {
            v.erase(below(v.size()));
            return;
          }
          [[fallthrough]];
        case 1:
          if (!v.empty()) {
            v.push_back(v[below(v.size())]);  // a duplicate: an edge, a module, a node
            return;
          }
          [[fallthrough]];
        case 2:
          v.push_back(random_value(donor));
          return;
        default:
          v = random_value(donor);
          return;
      }
    }
    if (below(3) != 0 && tweak(v)) return;
    v = random_value(donor);
  }

  std::mt19937_64 rng_;
};

void run(const Text& input, long& accepted, long& refused) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  graphs::GraphRecord out;
  if (graphs::parse_graph_record(input, out).empty()) {
    ++accepted;
  } else {
    ++refused;
  }
}

int write_seeds(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto all = seeds();
  for (const auto& [name, text] : all) {
    std::ofstream out(dir / (name + ".json"), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) {
      std::fprintf(stderr, "graph_record_fuzz_replay: cannot write %s\n", dir.c_str());
      return 1;
    }
  }
  std::printf("graph_record_fuzz_replay: %zu seeds written to %s\n", all.size(), dir.c_str());
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: graph_record_fuzz_replay [--mutations N] [--seed S] <file or dir>...\n"
               "       graph_record_fuzz_replay --write-seeds DIR\n"
               "Runs every file (directories: their regular files) through the graph record\n"
               "fuzz target, then N (default 20000) random mutations of them from seed S; or\n"
               "writes the seed corpus (records of every node type) to DIR.\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--write-seeds") return write_seeds(argv[2]);
  const auto args = thaw::fuzz::parse_replay_args(argc, argv);
  if (!args) return usage();
  const auto files = thaw::fuzz::corpus_files(args->paths, "graph_record_fuzz_replay");
  if (files.empty()) return 2;
  std::vector<Text> corpus;
  for (const auto& f : files) corpus.push_back(thaw::fuzz::read_file<Text>(f));

  const auto start = std::chrono::steady_clock::now();
  long seeds_accepted = 0, seeds_refused = 0, accepted = 0, refused = 0;
  for (const Text& t : corpus) run(t, seeds_accepted, seeds_refused);
  Mutator m(args->seed);
  for (long i = 0; i < args->mutations; ++i) {
    Text t = corpus[static_cast<std::size_t>(i) % corpus.size()];
    const std::uint64_t how = m.below(4);
    if (how != 0 && !m.mutate_json(t, corpus)) m.mutate_bytes(t, corpus);
    if (how == 0 || m.below(8) == 0) m.mutate_bytes(t, corpus);
    run(t, accepted, refused);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "graph_record_fuzz_replay: %zu corpus files (%ld accepted, %ld refused), %ld mutations "
      "(seed %#llx: %ld accepted, %ld refused): no failure in %.1f s\n",
      corpus.size(), seeds_accepted, seeds_refused, args->mutations,
      static_cast<unsigned long long>(args->seed), accepted, refused, s);
  return 0;
}
#endif  // THAW_FUZZ_REPLAY_MAIN
