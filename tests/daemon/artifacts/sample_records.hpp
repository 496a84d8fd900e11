// Records of each kind as engines' shims store them, for the artifact listing's tests (unit and
// end to end): a graph record written by common/graphs' codec, a layout record by
// common/layout's, and a KV-cache sizing in preload/restore's text form.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/graphs/graph_record.hpp"
#include "common/layout/layout_record.hpp"

namespace thaw::testing {

struct SampleIdentity {
  std::string engine = "/usr/bin/refengine 4096 1700000000.000000000";
  std::string model = "gpt-syn";
  std::string gpu = "Thaw Emulated GPU";
  std::string driver = "12040";
  nlohmann::json to_json() const {
    return {{"engine", engine}, {"model", model}, {"gpu", gpu}, {"driver", driver}};
  }
};

inline graphs::RecordedNode sample_kernel(const std::string& digest, std::string name) {
  graphs::KernelNode k;
  k.kernel = {digest, std::move(name)};
  k.grid = {4, 1, 1};
  k.block = {128, 1, 1};
  k.params = {{0, 8}, {8, 4}};
  k.param_bytes = std::vector<std::uint8_t>(12, 7);
  graphs::RecordedNode n;
  n.type = graphs::NodeType::kernel;
  n.kernel = std::move(k);
  return n;
}

// Two graphs (3 and 2 nodes) of one module.
inline std::string sample_graph_record(const SampleIdentity& id = {}) {
  const std::string digest(64, 'a');
  graphs::GraphRecord r;
  r.identity = {id.engine, id.model, id.gpu, id.driver};
  r.modules = {{digest, 4096, graphs::ImageKind::cubin}};
  graphs::RecordedGraph g0;
  g0.index = 0;
  g0.allocation_index = 12;
  g0.nodes.push_back(sample_kernel(digest, "_Z4gemmPfS_i"));
  g0.nodes.push_back(sample_kernel(digest, "_Z7softmaxPfi"));
  graphs::RecordedNode memset;
  memset.type = graphs::NodeType::memset;
  memset.memset = graphs::MemsetNode{0x7f0000001000, 4096, 0, 4, 1024, 1};
  g0.nodes.push_back(memset);
  g0.edges = {{0, 1}, {1, 2}};
  graphs::RecordedGraph g1;
  g1.index = 1;
  g1.allocation_index = 12;
  g1.nodes.push_back(sample_kernel(digest, "_Z4gemmPfS_i"));
  graphs::RecordedNode empty;
  empty.type = graphs::NodeType::empty;
  g1.nodes.push_back(empty);
  g1.edges = {{0, 1}};
  r.graphs = {g0, g1};
  return graphs::graph_record_to_json(r);
}

// Three allocations, two copies of 3 MiB in all.
inline std::string sample_layout_record(const SampleIdentity& id = {}) {
  layout::LayoutRecord r;
  r.identity = {id.engine, id.model, id.gpu, id.driver};
  r.va_base = 0x7f0000000000;
  r.granularity = 2u << 20;
  r.allocations = {{1u << 20, 0}, {2u << 20, 2u << 20}, {4096, 4u << 20}};
  r.copies = {{0, 0, "model.safetensors", 8, 1u << 20},
              {1, 0, "model.safetensors", 8 + (1u << 20), 2u << 20}};
  return r.to_json().dump();
}

// 512 blocks of 64 KiB: 32 MiB.
inline std::string sample_kv_record(const SampleIdentity& id = {}) {
  return nlohmann::json{
      {"version", 1},
      {"identity", id.to_json()},
      {"key", "max_num_seqs=8"},
      {"conditions",
       {{"device_total", 1ull << 30},
        {"mem_total", 1ull << 29},
        {"mem_free", 1ull << 28},
        {"engine_bytes", 1ull << 27}}},
      {"kv", {{"kv_bytes", 512u << 16}, {"num_blocks", 512}, {"block_bytes", 1u << 16}}}}
      .dump();
}

}  // namespace thaw::testing
