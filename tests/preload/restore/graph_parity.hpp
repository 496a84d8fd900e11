// Node-by-node description of a CUgraph with the driver's own graph queries, for parity checks
// between a live capture and a restore of it: each node's type and payload (a kernel's name,
// launch dimensions, dynamic shared memory, parameter bytes as cuFuncGetParamInfo lays them
// out, and its cluster, priority, cluster policy and memory-sync domain attributes; a memset's or a
// 1-D memcpy's parameters), and the edges. Nodes are listed in a canonical topological order (among
// the nodes ready next, the smallest description first) so that two graphs with the same nodes and
// edges describe the same whatever order the driver lists them in. A program linked against
// libcuda.so.1 (the emulator) includes it; compare the results with graph_parity_diff().
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace thaw::testing {

inline std::string hex_bytes(const unsigned char* p, std::size_t n) {
  std::string out;
  char b[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    out += b;
  }
  return out;
}

// One node, or {"error": ...} when the driver will not say.
inline nlohmann::json describe_node(CUgraphNode node) {
  CUgraphNodeType type{};
  if (cuGraphNodeGetType(node, &type) != CUDA_SUCCESS) return {{"error", "cuGraphNodeGetType"}};
  nlohmann::json j;
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      CUDA_KERNEL_NODE_PARAMS p{};
      if (cuGraphKernelNodeGetParams(node, &p) != CUDA_SUCCESS)
        return {{"error", "cuGraphKernelNodeGetParams"}};
      const char* name = nullptr;
      if (cuFuncGetName(&name, p.func) != CUDA_SUCCESS || name == nullptr)
        return {{"error", "cuFuncGetName"}};
      std::string params;
      for (std::size_t i = 0;; ++i) {
        size_t offset = 0, size = 0;
        if (cuFuncGetParamInfo(p.func, i, &offset, &size) != CUDA_SUCCESS) break;
        if (p.kernelParams == nullptr) return {{"error", "kernel node without parameters"}};
        params += (params.empty() ? "" : ":") +
                  hex_bytes(static_cast<const unsigned char*>(p.kernelParams[i]), size);
      }
      j = {{"type", "kernel"},
           {"name", name},
           {"grid", {p.gridDimX, p.gridDimY, p.gridDimZ}},
           {"block", {p.blockDimX, p.blockDimY, p.blockDimZ}},
           {"shared", p.sharedMemBytes},
           {"params", params}};
      // The launch attributes a restore must reproduce (a GEMM's cluster, ...), as the driver
      // answers them; one it does not answer is left out of both sides alike.
      CUkernelNodeAttrValue v{};
      if (cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v) ==
          CUDA_SUCCESS)
        j["cluster"] = {v.clusterDim.x, v.clusterDim.y, v.clusterDim.z};
      v = {};
      if (cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v) ==
          CUDA_SUCCESS)
        j["priority"] = v.priority;
      v = {};
      if (cuGraphKernelNodeGetAttribute(
              node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &v) ==
          CUDA_SUCCESS)
        j["cluster_policy"] = static_cast<int>(v.clusterSchedulingPolicyPreference);
      v = {};
      if (cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_MEM_SYNC_DOMAIN, &v) ==
          CUDA_SUCCESS)
        j["mem_sync_domain"] = static_cast<int>(v.memSyncDomain);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS p{};
      if (cuGraphMemsetNodeGetParams(node, &p) != CUDA_SUCCESS)
        return {{"error", "cuGraphMemsetNodeGetParams"}};
      j = {{"type", "memset"},
           {"dst", p.dst},
           {"pitch", p.pitch},
           {"value", p.value},
           {"elementSize", p.elementSize},
           {"width", p.width},
           {"height", p.height}};
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D p{};
      if (cuGraphMemcpyNodeGetParams(node, &p) != CUDA_SUCCESS)
        return {{"error", "cuGraphMemcpyNodeGetParams"}};
      j = {{"type", "memcpy"},
           {"src", p.srcDevice},
           {"dst", p.dstDevice},
           {"bytes", p.WidthInBytes},
           {"src_type", static_cast<int>(p.srcMemoryType)},
           {"dst_type", static_cast<int>(p.dstMemoryType)}};
      break;
    }
    case CU_GRAPH_NODE_TYPE_EMPTY:
      j = {{"type", "empty"}};
      break;
    default:
      j = {{"type", "other"}, {"code", static_cast<int>(type)}};
  }
  return j;
}

// {"nodes": [...], "edges": [[from, to], ...]} in canonical order, or {"error": ...}.
inline nlohmann::json describe_graph(CUgraph graph) {
  size_t count = 0;
  if (cuGraphGetNodes(graph, nullptr, &count) != CUDA_SUCCESS) return {{"error", "nodes"}};
  std::vector<CUgraphNode> nodes(count);
  if (count > 0 && cuGraphGetNodes(graph, nodes.data(), &count) != CUDA_SUCCESS)
    return {{"error", "nodes"}};
  size_t n_edges = 0;
  if (cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &n_edges) != CUDA_SUCCESS)
    return {{"error", "edges"}};
  std::vector<CUgraphNode> from(n_edges), to(n_edges);
  if (n_edges > 0 &&
      cuGraphGetEdges(graph, from.data(), to.data(), nullptr, &n_edges) != CUDA_SUCCESS)
    return {{"error", "edges"}};
  std::map<CUgraphNode, std::size_t> at;
  std::vector<std::string> text(count);
  std::vector<nlohmann::json> desc(count);
  for (std::size_t i = 0; i < count; ++i) {
    at[nodes[i]] = i;
    desc[i] = describe_node(nodes[i]);
    text[i] = desc[i].dump();
  }
  std::vector<int> in(count, 0);
  std::vector<std::vector<std::size_t>> out(count);
  for (std::size_t e = 0; e < n_edges; ++e) {
    out[at[from[e]]].push_back(at[to[e]]);
    ++in[at[to[e]]];
  }
  std::vector<std::size_t> order, canonical(count);
  std::vector<bool> done(count, false);
  while (order.size() < count) {
    std::size_t best = count;
    for (std::size_t i = 0; i < count; ++i) {
      if (!done[i] && in[i] == 0 && (best == count || text[i] < text[best])) best = i;
    }
    if (best == count) return {{"error", "cycle"}};
    done[best] = true;
    canonical[best] = order.size();
    order.push_back(best);
    for (std::size_t t : out[best]) --in[t];
  }
  nlohmann::json j;
  j["nodes"] = nlohmann::json::array();
  for (std::size_t i : order) j["nodes"].push_back(desc[i]);
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  for (std::size_t e = 0; e < n_edges; ++e)
    edges.emplace_back(canonical[at[from[e]]], canonical[at[to[e]]]);
  std::sort(edges.begin(), edges.end());
  j["edges"] = nlohmann::json::array();
  for (auto [f, t] : edges) j["edges"].push_back({f, t});
  return j;
}

// "" when `a` and `b` (describe_graph's) are equal; else the first difference, said.
inline std::string graph_parity_diff(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.contains("error") || b.contains("error")) return "a graph could not be described";
  if (a["nodes"].size() != b["nodes"].size()) {
    return "node counts differ: " + std::to_string(a["nodes"].size()) + " vs " +
           std::to_string(b["nodes"].size());
  }
  for (std::size_t i = 0; i < a["nodes"].size(); ++i) {
    if (a["nodes"][i] != b["nodes"][i]) {
      return "node " + std::to_string(i) + " differs: " + a["nodes"][i].dump() + " vs " +
             b["nodes"][i].dump();
    }
  }
  if (a["edges"] != b["edges"])
    return "edges differ: " + a["edges"].dump() + " vs " + b["edges"].dump();
  return "";
}

}  // namespace thaw::testing
