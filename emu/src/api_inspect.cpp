// thawEmu* inspection entry points (emu/include/thaw/emu_inspect.h): exact counts for
// tests' leak checks, canonical descriptions of graphs for parity checks. Not CUDA API.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "api_common.hpp"
#include "graph.hpp"
#include "module.hpp"
#include "thaw/emu_inspect.h"

using namespace emu;

EMU_EXPORT int thawEmuGetDeviceStats(int device, ThawEmuDeviceStats* out) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  ThawEmuDeviceStats s{};
  Device& d = driver().device(device);
  s.capacity_bytes = d.capacity;
  s.device_bytes_in_use = d.ledger.used();
  s.process_bytes_in_use = d.ledger.used_by_self();
  std::shared_lock lock(driver().space_mu);
  auto& space = driver().space;
  for (auto& [h, ref] : driver().vmm_handles) {
    if (ref.refs > 0 && ref.mem->device() == device) {
      s.vmm_handle_refs += static_cast<unsigned>(ref.refs);
    }
  }
  for (auto& [va, res] : space.reservations) {
    for (auto& [mva, m] : res.mappings) {
      if (m.mem->device() == device) ++s.vmm_mappings;
    }
  }
  for (auto& [va, a] : space.legacy) {
    if (a.mem->device() == device) ++s.legacy_allocations;
  }
  for (auto& [va, m] : space.ipc) {
    if (m.mem->device() == device) ++s.ipc_mappings;
  }
  for (auto& [key, weak] : driver().known_memory) {
    if (auto m = weak.lock(); m && m->device() == device) ++s.physical_allocations;
  }
  s.physical_allocations += s.legacy_allocations + s.ipc_mappings;
  *out = s;
  return CUDA_SUCCESS;
}

EMU_EXPORT int thawEmuGetProcessStats(ThawEmuProcessStats* out) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ThawEmuProcessStats s{};
  {
    std::lock_guard lock(driver().mu);
    for (auto& [h, ctx] : driver().contexts.items()) {
      if (!ctx->destroyed && ctx->active) ++s.contexts;
    }
    s.streams = driver().streams.size();
    s.events = driver().events.size();
  }
  {
    std::shared_lock lock(driver().space_mu);
    s.reservations = driver().space.reservations.size();
    for (auto& [va, r] : driver().space.reservations) s.reserved_bytes += r.range.size();
    s.pinned_host_ranges = driver().space.pinned.size();
  }
  s.trace_lines = trace().lines();
  *out = s;
  return CUDA_SUCCESS;
}

// thawEmuDescribeGraphExec / thawEmuDescribeGraph: the canonical description documented in
// emu_inspect.h, for node-by-node parity checks of graphs built by different processes.
namespace {

using Lock = std::lock_guard<std::mutex>;

// FNV-1a 64 over the fields of a parsed module, each length-prefixed so that field boundaries
// cannot shift; a module's identity across processes (the emulator keeps no image bytes).
class Fnv1a {
 public:
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  }
  void u64(std::uint64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string module_digest(const CubinInfo& m) {
  Fnv1a h;
  h.u64(static_cast<std::uint64_t>(m.sm));
  h.u64(m.arch_specific ? 1 : 0);
  h.u64(m.image_size);
  h.u64(m.kernels.size());
  for (const auto& k : m.kernels) {
    h.str(k.name);
    h.u64(k.params.size());
    for (const auto& p : k.params) {
      h.u64(p.ordinal);
      h.u64(p.offset);
      h.u64(p.size);
    }
    for (unsigned v : {k.param_bytes, k.max_threads, k.shared_bytes, k.num_regs, k.local_bytes})
      h.u64(v);
  }
  h.u64(m.globals.size());
  for (const auto& g : m.globals) {
    h.str(g.name);
    h.u64(g.size);
    h.u64(g.init.size());
    h.bytes(g.init.data(), g.init.size());
    h.u64((g.constant ? 1 : 0) | (g.managed ? 2 : 0));
  }
  return fmt::format("emu-fnv1a64:{:016x}", h.value());
}

const char* type_name(CUgraphNodeType t) {
  switch (raw(t)) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return "kernel";
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return "memcpy";
    case CU_GRAPH_NODE_TYPE_MEMSET:
      return "memset";
    case CU_GRAPH_NODE_TYPE_HOST:
      return "host";
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return "graph";
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return "empty";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return "wait_event";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return "event_record";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      return "ext_semas_signal";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      return "ext_semas_wait";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      return "mem_alloc";
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return "mem_free";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
      return "batch_mem_op";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return "conditional";
    default:
      return nullptr;
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      out += fmt::format("\\u{:04x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string hex_bytes(const std::vector<std::uint8_t>& b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (std::uint8_t v : b) {
    out += kDigits[v >> 4];
    out += kDigits[v & 15];
  }
  return out;
}

// One node as a JSON object; modules are looked up in `digests` (by image) first.
// Caller holds driver().mu.
std::string describe_node(CUgraphNodeType type, const NodeData& data,
                          std::map<const CubinInfo*, std::string>& digests) {
  const char* name = type_name(type);
  std::string out =
      fmt::format("{{\"type\":\"{}\"", name ? name : fmt::format("type_{}", raw(type)));
  if (const auto* k = std::get_if<KernelNode>(&data)) {
    std::string module = "null";  // the function's module was unloaded since
    if (auto f = module_tables().functions.find(k->function); f && f->image) {
      auto [it, fresh] = digests.try_emplace(f->image.get());
      if (fresh) it->second = module_digest(*f->image);
      module = json_string(it->second);
    }
    out += fmt::format(
        ",\"name\":{},\"module\":{},\"grid\":[{},{},{}],\"block\":[{},{},{}],"
        "\"shared_bytes\":{},\"priority\":{},\"params\":\"{}\"",
        json_string(k->name), module, k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1],
        k->block[2], k->shared, k->priority, hex_bytes(k->params));
    // The launch attributes a restore must reproduce (a GEMM's cluster, ...).
    const KernelAttributes& a = k->attrs;
    out += fmt::format(
        ",\"cluster\":[{},{},{}],\"cluster_policy\":{},\"cooperative\":{},"
        "\"mem_sync_domain\":{},\"mem_sync_map\":[{},{}],\"carveout\":{}",
        a.cluster[0], a.cluster[1], a.cluster[2], a.cluster_policy, a.cooperative,
        a.mem_sync_domain, a.mem_sync_map[0], a.mem_sync_map[1], a.carveout);
  } else if (const auto* m = std::get_if<MemsetNode>(&data)) {
    out += fmt::format(
        ",\"dst\":\"{:#x}\",\"pitch\":{},\"value\":{},\"element_size\":{},\"width\":{},"
        "\"height\":{}",
        m->dst, m->pitch, m->value, m->element_size, m->width, m->height);
  } else if (const auto* c = std::get_if<MemcpyNode>(&data)) {
    out += fmt::format(
        ",\"dst\":\"{:#x}\",\"src\":\"{:#x}\",\"bytes\":{},\"dst_device\":{},\"src_device\":{}",
        c->dst, c->src, c->bytes, c->dst_device, c->src_device);
  } else if (const auto* op = std::get_if<MemOpNode>(&data)) {
    out += fmt::format(",\"address\":\"{:#x}\",\"value\":{},\"size\":{},\"flags\":{}", op->address,
                       op->value, op->size, op->flags);
  }
  return out + "}";
}

struct DescribedNode {
  std::string text;
  std::vector<std::size_t> deps;  // indices into the same list
};

// Kahn's algorithm, the smallest ready description first (then the given order): the same
// graph built in another creation order comes out the same. Empty on a cycle.
std::string canonical_document(const char* kind, const std::vector<DescribedNode>& nodes) {
  const std::size_t n = nodes.size();
  std::vector<std::vector<std::size_t>> out(n);
  std::vector<std::size_t> pending(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    pending[i] = nodes[i].deps.size();
    for (auto d : nodes[i].deps) out[d].push_back(i);
  }
  auto later = [&](std::size_t a, std::size_t b) {
    return std::tie(nodes[a].text, a) > std::tie(nodes[b].text, b);
  };
  std::vector<std::size_t> ready;  // a min-heap under `later`
  for (std::size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  std::make_heap(ready.begin(), ready.end(), later);
  std::vector<std::size_t> canon(n, n);
  std::vector<std::size_t> order;
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), later);
    const std::size_t i = ready.back();
    ready.pop_back();
    canon[i] = order.size();
    order.push_back(i);
    for (auto m : out[i]) {
      if (--pending[m] == 0) {
        ready.push_back(m);
        std::push_heap(ready.begin(), ready.end(), later);
      }
    }
  }
  if (order.size() != n) return {};
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  for (std::size_t i = 0; i < n; ++i) {
    for (auto d : nodes[i].deps) edges.emplace_back(canon[d], canon[i]);
  }
  std::sort(edges.begin(), edges.end());
  std::string doc = fmt::format("{{\"kind\":\"{}\",\"nodes\":[", kind);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (k > 0) doc += ',';
    doc += nodes[order[k]].text;
  }
  doc += "],\"edges\":[";
  for (std::size_t k = 0; k < edges.size(); ++k) {
    doc += fmt::format("{}[{},{}]", k > 0 ? "," : "", edges[k].first, edges[k].second);
  }
  return doc + "]}";
}

int hand_out(const std::string& doc, char** json) {
  if (doc.empty()) return CUDA_ERROR_INVALID_VALUE;  // a cycle: not a graph CUDA would take
  auto* buf = static_cast<char*>(std::malloc(doc.size() + 1));
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memcpy(buf, doc.c_str(), doc.size() + 1);
  *json = buf;
  return CUDA_SUCCESS;
}

}  // namespace

EMU_EXPORT int thawEmuDescribeGraphExec(CUgraphExec exec, char** json) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (json == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::string doc;
  {
    Lock lock(driver().mu);
    auto e = graph_tables().execs.find(handle_value(exec));
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    std::map<const CubinInfo*, std::string> digests;
    std::vector<DescribedNode> nodes;
    nodes.reserve(e->nodes.size());
    for (const auto& n : e->nodes)
      nodes.push_back({describe_node(n.type, n.data, digests), n.deps});
    doc = canonical_document("exec", nodes);
  }
  return hand_out(doc, json);
}

EMU_EXPORT int thawEmuDescribeGraph(CUgraph graph, char** json) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (json == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::string doc;
  {
    Lock lock(driver().mu);
    auto g = graph_tables().graphs.find(handle_value(graph));
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    std::map<std::uint64_t, std::size_t> index;
    for (auto h : g->nodes) index.emplace(h, index.size());
    std::map<const CubinInfo*, std::string> digests;
    std::vector<DescribedNode> nodes;
    nodes.reserve(g->nodes.size());
    for (auto h : g->nodes) {
      auto n = graph_tables().nodes.find(h);
      if (!n) return CUDA_ERROR_INVALID_VALUE;  // cannot happen: a graph owns its nodes
      DescribedNode d{describe_node(n->type, n->data, digests), {}};
      for (auto dep : n->deps) {
        auto it = index.find(dep);
        if (it == index.end()) return CUDA_ERROR_INVALID_VALUE;  // cannot happen, as above
        d.deps.push_back(it->second);
      }
      nodes.push_back(std::move(d));
    }
    doc = canonical_document("graph", nodes);
  }
  return hand_out(doc, json);
}
