// The graph API: building graphs node by node, inspecting captured ones,
// instantiating and launching them.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "api_common.hpp"
#include "graph.hpp"
#include "kernel_exec.hpp"
#include "module.hpp"

using namespace emu;

#undef cuGraphAddKernelNode
#undef cuGraphKernelNodeGetParams
#undef cuGraphKernelNodeSetParams
#undef cuGraphExecKernelNodeSetParams
#undef cuGraphGetEdges
#undef cuGraphAddDependencies
#undef cuGraphExecUpdate
#undef cuGraphNodeGetDependencies
#undef cuGraphNodeGetDependentNodes

namespace {

// An enum member of a caller's union as the integer it stored (any value, valid or not).
template <typename E>
unsigned raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(unsigned));
  unsigned raw = 0;
  std::memcpy(&raw, &e, sizeof raw);
  return raw;
}

using Lock = std::lock_guard<std::mutex>;

std::shared_ptr<Graph> find_graph(CUgraph h) {
  return graph_tables().graphs.find(handle_value(h));
}
std::shared_ptr<GraphNode> find_node(CUgraphNode h) {
  return graph_tables().nodes.find(handle_value(h));
}

// The context a node works in: the one named, else the current one.
std::expected<Context*, CUresult> node_context(CUcontext named) {
  return named != nullptr ? context_from_handle_locked(named) : current_context_locked();
}

CUresult check_deps(const Graph& g, const CUgraphNode* deps, size_t n,
                    std::vector<std::uint64_t>& out) {
  if (n > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    auto d = find_node(deps[i]);
    if (!d || d->graph != g.handle) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(out.begin(), out.end(), d->handle) != out.end()) {
      return CUDA_ERROR_INVALID_VALUE;  // duplicate dependency
    }
    out.push_back(d->handle);
  }
  return CUDA_SUCCESS;
}

template <class Make>
CUresult add_node(CUgraphNode* ph, CUgraph hg, const CUgraphNode* deps, size_t n, Call& c,
                  Make&& make) {
  c.ptr("graph", handle_value(hg)).arg("deps", n);
  EMU_REQUIRE_INIT();
  if (ph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock lock(driver().mu);
  auto g = find_graph(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::uint64_t> dep_handles;
  if (CUresult r = check_deps(*g, deps, n, dep_handles); r != CUDA_SUCCESS) return r;
  NodeSpec spec;
  if (CUresult r = make(spec); r != CUDA_SUCCESS) return r;
  std::uint64_t h = add_node_locked(*g, std::move(spec), dep_handles);
  *ph = to_handle<CUgraphNode>(h);
  c.out_ptr("node", h);
  return CUDA_SUCCESS;
}

// Builds a kernel node as a launch would (caller holds driver().mu).
CUresult make_kernel_node(std::uint64_t func, const unsigned grid[3], const unsigned block[3],
                          unsigned shared, void** kernelParams, void** extra, CUcontext named,
                          Call& c, KernelNode& node) {
  auto ctx = node_context(named);
  if (!ctx) return ctx.error();
  auto fn = function_for_launch_locked(func, **ctx, c);
  if (!fn) return fn.error();
  const KernelInfo& k = (*fn)->info();
  if (CUresult r = check_geometry(grid, block, shared, false, **fn); r != CUDA_SUCCESS) return r;
  if (CUresult r = pack_params(k, kernelParams, extra, node.params); r != CUDA_SUCCESS) return r;
  node.function = (*fn)->handle;
  node.ctx = (*ctx)->handle;
  std::copy(grid, grid + 3, node.grid);
  std::copy(block, block + 3, node.block);
  node.shared = shared;
  node.offsets.clear();
  for (const auto& p : k.params) node.offsets.push_back(p.offset);
  node.twin = (*fn)->twin;
  node.name = k.name;
  node.from_extra = kernelParams == nullptr && extra != nullptr;
  return CUDA_SUCCESS;
}

template <class P>
CUresult kernel_node_from_params(const P* p, CUcontext named, Call& c, KernelNode& node) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  std::uint64_t func = handle_value(p->func);
  if constexpr (requires { p->kern; }) {
    if (p->kern != nullptr) func = handle_value(p->kern);
  }
  return make_kernel_node(func, grid, block, p->sharedMemBytes, p->kernelParams, p->extra, named, c,
                          node);
}

// Points at the node's own parameter bank; valid while the node lives (as documented
// for cuGraphKernelNodeGetParams).
struct ParamView {
  std::vector<void*> pointers;  // kernelParams form, or the `extra` array
  std::size_t size = 0;         // CU_LAUNCH_PARAM_BUFFER_SIZE points here
};
std::map<std::uint64_t, ParamView>& param_views() {
  static std::map<std::uint64_t, ParamView> v;
  return v;
}

template <class P>
void fill_params(const GraphNode& n, P* out) {
  const auto& k = std::get<KernelNode>(n.data);
  auto& view = param_views()[n.handle];
  auto* bank = const_cast<std::uint8_t*>(k.params.data());
  view.pointers.clear();
  view.size = k.params.size();
  if (k.from_extra) {
    view.pointers = {CU_LAUNCH_PARAM_BUFFER_POINTER, bank, CU_LAUNCH_PARAM_BUFFER_SIZE, &view.size,
                     CU_LAUNCH_PARAM_END};
  } else {
    for (unsigned off : k.offsets) view.pointers.push_back(bank + off);
  }
  *out = P{};
  out->func = to_handle<CUfunction>(k.function);
  out->gridDimX = k.grid[0];
  out->gridDimY = k.grid[1];
  out->gridDimZ = k.grid[2];
  out->blockDimX = k.block[0];
  out->blockDimY = k.block[1];
  out->blockDimZ = k.block[2];
  out->sharedMemBytes = k.shared;
  out->kernelParams = k.from_extra ? nullptr : view.pointers.data();
  out->extra = k.from_extra ? view.pointers.data() : nullptr;
  if constexpr (requires { out->ctx; }) out->ctx = to_handle<CUcontext>(k.ctx);
}

// "The element size must be 1, 2, or 4 bytes"; zero-sized memsets are refused; the rows must lie
// in device memory (caller holds driver().mu).
CUresult memset_node_from(const CUDA_MEMSET_NODE_PARAMS* p, CUcontext named, MemsetNode& node) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto ctx = node_context(named);
  if (!ctx) return ctx.error();
  unsigned es = p->elementSize;
  if ((es != 1 && es != 2 && es != 4) || p->width == 0 || p->height == 0 || p->dst % es) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (p->height > 1 && p->pitch < p->width * es) return CUDA_ERROR_INVALID_VALUE;
  std::shared_lock space(driver().space_mu);
  std::uint64_t extent = (p->height - 1) * p->pitch + p->width * es;
  if (driver().space.check_device_shape(p->dst, extent) != CUDA_SUCCESS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  node = MemsetNode{p->dst, p->pitch, p->value, es, p->width, p->height, (*ctx)->handle};
  return CUDA_SUCCESS;
}

CUresult memcpy_node_from(const CUDA_MEMCPY3D* p, CUcontext named, MemcpyNode& node) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto ctx = node_context(named);
  if (!ctx) return ctx.error();
  // The one-dimensional subset (what engines use for graph copies).
  if (p->Height > 1 || p->Depth > 1 || p->srcXInBytes || p->srcY || p->srcZ || p->dstXInBytes ||
      p->dstY || p->dstZ) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  auto side = [](int type, CUdeviceptr dev, const void* host, std::uint64_t& addr, bool& device) {
    switch (type) {
      case CU_MEMORYTYPE_HOST:
        addr = reinterpret_cast<std::uint64_t>(host);
        device = false;
        return true;
      case CU_MEMORYTYPE_DEVICE:
        addr = dev;
        device = true;
        return true;
      case CU_MEMORYTYPE_UNIFIED:
        addr = dev;
        device = driver().space.classify(dev) == MemoryClass::kDevice;
        return true;
      default:
        return false;
    }
  };
  std::shared_lock space(driver().space_mu);
  if (!side(raw(p->dstMemoryType), p->dstDevice, p->dstHost, node.dst, node.dst_device) ||
      !side(raw(p->srcMemoryType), p->srcDevice, p->srcHost, node.src, node.src_device)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  node.bytes = p->WidthInBytes;
  int device = (*ctx)->device;
  if (node.dst_device) {
    if (driver().space.check_device_shape(node.dst, node.bytes, &device) != CUDA_SUCCESS) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (node.src_device) {
    if (driver().space.check_device_shape(node.src, node.bytes, &device) != CUDA_SUCCESS) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  node.device = device;
  node.ctx = (*ctx)->handle;
  node.desc = *p;
  return CUDA_SUCCESS;
}

// A memcpy descriptor of the one-dimensional kind cuGraphExecMemcpyNodeSetParams accepts.
bool one_dimensional(const CUDA_MEMCPY3D& p) {
  return p.Height <= 1 && p.Depth <= 1 && p.srcXInBytes == 0 && p.srcY == 0 && p.srcZ == 0 &&
         p.dstXInBytes == 0 && p.dstY == 0 && p.dstZ == 0;
}

// Topological order (Kahn, creation order among ready nodes); empty if there is a cycle.
std::vector<std::uint64_t> topo_order(const Graph& g) {
  auto& nodes = graph_tables().nodes;
  std::map<std::uint64_t, std::size_t> pending;
  std::map<std::uint64_t, std::vector<std::uint64_t>> out;
  for (auto h : g.nodes) {
    auto n = nodes.find(h);
    pending[h] = n->deps.size();
    for (auto d : n->deps) out[d].push_back(h);
  }
  std::vector<std::uint64_t> order;
  std::vector<std::uint64_t> ready;
  for (auto h : g.nodes) {
    if (pending[h] == 0) ready.push_back(h);
  }
  while (!ready.empty()) {
    std::uint64_t h = ready.front();
    ready.erase(ready.begin());
    order.push_back(h);
    for (auto m : out[h]) {
      if (--pending[m] == 0) ready.push_back(m);
    }
  }
  if (order.size() != g.nodes.size()) order.clear();
  return order;
}

CUresult instantiate(CUgraphExec* ph, CUgraph hg, unsigned long long flags, Call& c) {
  c.ptr("graph", handle_value(hg)).arg("flags", flags);
  auto t0 = Clock::now();
  EMU_REQUIRE_INIT();
  if (ph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned long long kKnown =
      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
  // UPLOAD needs a stream (cuGraphInstantiateWithParams); device launch is not emulated.
  if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) return CUDA_ERROR_INVALID_VALUE;
  if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) return CUDA_ERROR_NOT_SUPPORTED;
  std::size_t count = 0;
  {
    Lock lock(driver().mu);
    auto g = find_graph(hg);
    if (!g || g->capturing) return CUDA_ERROR_INVALID_VALUE;
    auto order = topo_order(*g);
    if (order.size() != g->nodes.size()) return CUDA_ERROR_INVALID_VALUE;  // a cycle
    auto exec = std::make_shared<GraphExec>();
    exec->graph = g->handle;
    exec->flags = flags;
    std::map<std::uint64_t, std::size_t> index;
    for (auto h : order) {
      auto n = graph_tables().nodes.find(h);
      ExecNode e{h, n->type, n->data, {}};
      for (auto d : n->deps) e.deps.push_back(index[d]);
      index[h] = exec->nodes.size();
      exec->nodes.push_back(std::move(e));
    }
    count = exec->nodes.size();
    exec->handle = graph_tables().execs.add(exec);
    *ph = to_handle<CUgraphExec>(exec->handle);
    c.out_ptr("exec", exec->handle).out("nodes", count);
  }
  if (driver().timing()) {
    wait_until(t0 + driver().cfg().instantiate_node_cost * static_cast<long>(count));
  }
  return CUDA_SUCCESS;
}

CUresult graph_launch(CUgraphExec he, CUstream hs, bool ptds, Call& c) {
  c.ptr("exec", handle_value(he)).ptr("stream", handle_value(hs));
  EMU_REQUIRE_INIT();
  Lock lock(driver().mu);
  auto exec = graph_tables().execs.find(handle_value(he));
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  auto s = resolve_stream_locked(hs, ptds);
  if (!s) return s.error();
  if (auto cap = (*s)->capture) {  // child-graph capture is not emulated
    cap->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  auto ctx = driver().contexts.find((*s)->ctx());
  StreamOp op;
  std::vector<std::function<CUresult()>> works;
  std::vector<std::shared_ptr<EventRecord>> records;
  for (const auto& n : exec->nodes) {
    if (n.type == CU_GRAPH_NODE_TYPE_KERNEL && std::get<KernelNode>(n.data).twin == nullptr) {
      report_missing_twin(std::get<KernelNode>(n.data).name.c_str());
      return CUDA_ERROR_NOT_FOUND;
    }
    if (n.type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
      auto e = driver().events.find(std::get<EventNode>(n.data).event);
      if (e && e->last) op.waits.push_back(e->last->point);
      continue;
    }
    if (n.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
      auto e = driver().events.find(std::get<EventNode>(n.data).event);
      if (!e) continue;
      auto rec = std::make_shared<EventRecord>();
      rec->point.stream = *s;
      e->last = rec;
      e->capture.reset();
      records.push_back(rec);
      works.push_back([rec] {
        rec->time = Clock::now();
        return CUDA_SUCCESS;
      });
      continue;
    }
    StreamOp node_op = op_for_node({n.type, n.data});
    op.model += node_op.model + driver().cfg().graph_node_latency;
    op.runs_user_code = op.runs_user_code || node_op.runs_user_code;
    if (node_op.work) works.push_back(std::move(node_op.work));
  }
  // Nodes run in topological order, one after another: a valid schedule of the graph.
  op.work = [works = std::move(works)] {
    for (const auto& w : works) {
      if (CUresult r = w(); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  };
  // One instance of an exec runs at a time, in launch order, whatever the streams.
  if (exec->last_launch.stream) op.waits.push_back(exec->last_launch);
  std::uint64_t seq = 0;
  if (CUresult r = submit_locked(*ctx, *s, std::move(op), {}, &seq); r != CUDA_SUCCESS) return r;
  for (auto& rec : records) rec->point.seq = seq;
  exec->last_launch = {*s, seq};
  return CUDA_SUCCESS;
}

void destroy_graph_locked(std::uint64_t handle) {
  auto& t = graph_tables();
  auto g = t.graphs.remove(handle);
  if (!g) return;
  for (auto n : g->nodes) {
    t.nodes.remove(n);
    param_views().erase(n);
  }
}

}  // namespace

EMU_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return api("cuGraphCreate", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto g = std::make_shared<Graph>();
    g->handle = graph_tables().graphs.add(g);
    *phGraph = to_handle<CUgraph>(g->handle);
    c.out_ptr("graph", g->handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  return api("cuGraphDestroy", [&](Call& c) {
    c.ptr("graph", handle_value(hGraph));
    EMU_REQUIRE_INIT();
    Lock lock(driver().mu);
    auto g = find_graph(hGraph);
    if (!g || g->capturing) return CUDA_ERROR_INVALID_VALUE;
    destroy_graph_locked(g->handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                         size_t n, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return api("cuGraphAddKernelNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      KernelNode k;
      CUresult r = kernel_node_from_params(p, nullptr, c, k);
      spec = {CU_GRAPH_NODE_TYPE_KERNEL, std::move(k)};
      return r;
    });
  });
}

EMU_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                            size_t n, const CUDA_KERNEL_NODE_PARAMS* p) {
  return api("cuGraphAddKernelNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      KernelNode k;
      CUresult r = kernel_node_from_params(p, p != nullptr ? p->ctx : nullptr, c, k);
      spec = {CU_GRAPH_NODE_TYPE_KERNEL, std::move(k)};
      return r;
    });
  });
}

EMU_EXPORT CUresult cuGraphAddMemsetNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                         size_t n, const CUDA_MEMSET_NODE_PARAMS* p,
                                         CUcontext ctx) {
  return api("cuGraphAddMemsetNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      MemsetNode m;
      CUresult r = memset_node_from(p, ctx, m);
      spec = {CU_GRAPH_NODE_TYPE_MEMSET, m};
      return r;
    });
  });
}

EMU_EXPORT CUresult cuGraphAddMemcpyNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                         size_t n, const CUDA_MEMCPY3D* p, CUcontext ctx) {
  return api("cuGraphAddMemcpyNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      MemcpyNode m;
      CUresult r = memcpy_node_from(p, ctx, m);
      spec = {CU_GRAPH_NODE_TYPE_MEMCPY, m};
      return r;
    });
  });
}

EMU_EXPORT CUresult cuGraphAddHostNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                       size_t n, const CUDA_HOST_NODE_PARAMS* p) {
  return api("cuGraphAddHostNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
      spec = {CU_GRAPH_NODE_TYPE_HOST, HostNode{p->fn, p->userData}};
      return CUDA_SUCCESS;
    });
  });
}

EMU_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                        size_t n) {
  return api("cuGraphAddEmptyNode", [&](Call& c) {
    return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
      spec = {CU_GRAPH_NODE_TYPE_EMPTY, EmptyNode{}};
      return CUDA_SUCCESS;
    });
  });
}

static CUresult event_node(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps, size_t n,
                           CUevent ev, CUgraphNodeType type, Call& c) {
  return add_node(ph, g, deps, n, c, [&](NodeSpec& spec) {
    if (!driver().events.find(handle_value(ev))) return CUDA_ERROR_INVALID_VALUE;
    spec = {type, EventNode{handle_value(ev)}};
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphAddEventRecordNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                              size_t n, CUevent ev) {
  return api("cuGraphAddEventRecordNode", [&](Call& c) {
    return event_node(ph, g, deps, n, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD, c);
  });
}

EMU_EXPORT CUresult cuGraphAddEventWaitNode(CUgraphNode* ph, CUgraph g, const CUgraphNode* deps,
                                            size_t n, CUevent ev) {
  return api("cuGraphAddEventWaitNode", [&](Call& c) {
    return event_node(ph, g, deps, n, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT, c);
  });
}

static CUresult add_dependencies(CUgraph hg, const CUgraphNode* from, const CUgraphNode* to,
                                 const CUgraphEdgeData* edges, size_t n, Call& c) {
  c.ptr("graph", handle_value(hg)).arg("count", n);
  EMU_REQUIRE_INIT();
  if (n > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (edges != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      // Only default edges (full dependency) are emulated.
      if (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT || edges[i].from_port != 0 ||
          edges[i].to_port != 0) {
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
  }
  Lock lock(driver().mu);
  auto g = find_graph(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::pair<std::shared_ptr<GraphNode>, std::uint64_t>> adds;
  for (size_t i = 0; i < n; ++i) {
    auto a = find_node(from[i]);
    auto b = find_node(to[i]);
    if (!a || !b || a->graph != g->handle || b->graph != g->handle || a == b) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (std::find(b->deps.begin(), b->deps.end(), a->handle) != b->deps.end()) {
      return CUDA_ERROR_INVALID_VALUE;  // already there
    }
    adds.emplace_back(b, a->handle);
  }
  for (auto& [b, a] : adds) b->deps.push_back(a);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode* from,
                                           const CUgraphNode* to, size_t n) {
  return api("cuGraphAddDependencies",
             [&](Call& c) { return add_dependencies(g, from, to, nullptr, n, c); });
}

EMU_EXPORT CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode* from,
                                              const CUgraphNode* to, const CUgraphEdgeData* e,
                                              size_t n) {
  return api("cuGraphAddDependencies",
             [&](Call& c) { return add_dependencies(g, from, to, e, n, c); });
}

// Fills an array the CUDA way: NULL array → the count; else up to *count entries and
// *count set to how many were written.
template <class H>
CUresult fill_list(const std::vector<std::uint64_t>& items, H* out, size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (out == nullptr) {
    *count = items.size();
    return CUDA_SUCCESS;
  }
  size_t k = std::min(*count, items.size());
  for (size_t i = 0; i < k; ++i) out[i] = to_handle<H>(items[i]);
  for (size_t i = k; i < *count; ++i) out[i] = nullptr;
  *count = k;
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphGetNodes(CUgraph hg, CUgraphNode* nodes, size_t* numNodes) {
  return api("cuGraphGetNodes", [&](Call&) {
    EMU_REQUIRE_INIT();
    Lock lock(driver().mu);
    auto g = find_graph(hg);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    return fill_list(g->nodes, nodes, numNodes);
  });
}

EMU_EXPORT CUresult cuGraphGetRootNodes(CUgraph hg, CUgraphNode* roots, size_t* numRoots) {
  return api("cuGraphGetRootNodes", [&](Call&) {
    EMU_REQUIRE_INIT();
    Lock lock(driver().mu);
    auto g = find_graph(hg);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::uint64_t> r;
    for (auto h : g->nodes) {
      if (graph_tables().nodes.find(h)->deps.empty()) r.push_back(h);
    }
    return fill_list(r, roots, numRoots);
  });
}

static CUresult get_edges(CUgraph hg, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                          size_t* num) {
  EMU_REQUIRE_INIT();
  if (num == nullptr || ((from == nullptr) != (to == nullptr))) return CUDA_ERROR_INVALID_VALUE;
  // "If edgeData is non-NULL then from and to must be as well."
  if (data != nullptr && from == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock lock(driver().mu);
  auto g = find_graph(hg);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::uint64_t> a, b;
  for (auto h : g->nodes) {
    for (auto d : graph_tables().nodes.find(h)->deps) {
      a.push_back(d);
      b.push_back(h);
    }
  }
  if (from == nullptr) {
    *num = a.size();
    return CUDA_SUCCESS;
  }
  size_t want = *num;
  fill_list(a, from, num);
  fill_list(b, to, &want);
  if (data != nullptr) {
    for (size_t i = 0; i < *num; ++i) data[i] = CUgraphEdgeData{};
  }
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphGetEdges(CUgraph g, CUgraphNode* from, CUgraphNode* to, size_t* n) {
  return api("cuGraphGetEdges", [&](Call&) { return get_edges(g, from, to, nullptr, n); });
}

EMU_EXPORT CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode* from, CUgraphNode* to,
                                       CUgraphEdgeData* e, size_t* n) {
  return api("cuGraphGetEdges", [&](Call&) { return get_edges(g, from, to, e, n); });
}

EMU_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  return api("cuGraphNodeGetType", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = find_node(hNode);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
  });
}

template <class P>
static CUresult kernel_get(CUgraphNode h, P* out) {
  EMU_REQUIRE_INIT();
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Lock lock(driver().mu);
  auto n = find_node(h);
  if (!n || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  fill_params(*n, out);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return api("cuGraphKernelNodeGetParams", [&](Call&) { return kernel_get(h, p); });
}
EMU_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS* p) {
  return api("cuGraphKernelNodeGetParams", [&](Call&) { return kernel_get(h, p); });
}

template <class P>
static CUresult kernel_set(CUgraphNode h, const P* p, Call& c) {
  EMU_REQUIRE_INIT();
  Lock lock(driver().mu);
  auto n = find_node(h);
  if (!n || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  CUcontext named = nullptr;
  if constexpr (requires { p->ctx; }) {
    if (p != nullptr) named = p->ctx;
  }
  if (named == nullptr) named = to_handle<CUcontext>(std::get<KernelNode>(n->data).ctx);
  KernelNode k;
  k.priority = std::get<KernelNode>(n->data).priority;
  k.attrs = std::get<KernelNode>(n->data).attrs;
  if (CUresult r = kernel_node_from_params(p, named, c, k); r != CUDA_SUCCESS) return r;
  n->data = std::move(k);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return api("cuGraphKernelNodeSetParams", [&](Call& c) { return kernel_set(h, p, c); });
}
EMU_EXPORT CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS* p) {
  return api("cuGraphKernelNodeSetParams", [&](Call& c) { return kernel_set(h, p, c); });
}

CUresult emu::check_cluster(const unsigned cluster[3], const unsigned grid[3]) {
  const bool none = cluster[0] == 0 && cluster[1] == 0 && cluster[2] == 0;
  if (none) return CUDA_SUCCESS;
  if (cluster[0] == 0 || cluster[1] == 0 || cluster[2] == 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  constexpr std::uint64_t kMaxPortableClusterSize = 8;
  if (std::uint64_t{cluster[0]} * cluster[1] * cluster[2] > kMaxPortableClusterSize) {
    return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  }
  for (int i = 0; i < 3; ++i) {
    if (grid[i] % cluster[i] != 0) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
  }
  return CUDA_SUCCESS;
}

// The kernel node attributes of CUDA 13 (CU_KERNEL_NODE_ATTRIBUTE_*) that the emulator keeps;
// the others (access policy windows, preferred clusters, device updates, ...) are
// CUDA_ERROR_NOT_SUPPORTED, which a caller must handle as for an older driver.
EMU_EXPORT CUresult cuGraphKernelNodeGetAttribute(CUgraphNode h, CUkernelNodeAttrID attr,
                                                  CUkernelNodeAttrValue* value) {
  return api("cuGraphKernelNodeGetAttribute", [&](Call& c) {
    c.ptr("node", handle_value(h)).arg("attr", raw(attr));
    EMU_REQUIRE_INIT();
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = find_node(h);
    if (!n || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    const KernelNode& k = std::get<KernelNode>(n->data);
    const KernelAttributes& a = k.attrs;
    switch (raw(attr)) {
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        value->priority = k.priority;
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        value->cooperative = a.cooperative;
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {
        // No cluster: what this driver answers for none (THAW_EMU_CLUSTER_DEFAULT).
        const bool none = a.cluster[0] == 0 && a.cluster[1] == 0 && a.cluster[2] == 0;
        const unsigned d = driver().cfg().reported_cluster_default;
        value->clusterDim.x = none ? d : a.cluster[0];
        value->clusterDim.y = none ? d : a.cluster[1];
        value->clusterDim.z = none ? d : a.cluster[2];
        return CUDA_SUCCESS;
      }
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        value->clusterSchedulingPolicyPreference =
            static_cast<CUclusterSchedulingPolicy>(a.cluster_policy);
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        value->memSyncDomain = static_cast<CUlaunchMemSyncDomain>(a.mem_sync_domain);
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        value->memSyncDomainMap.default_ = a.mem_sync_map[0];
        value->memSyncDomainMap.remote = a.mem_sync_map[1];
        return CUDA_SUCCESS;
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        // Not set: what this driver answers for it (THAW_EMU_CARVEOUT_DEFAULT).
        value->sharedMemCarveout =
            a.carveout == 0xffffffffu ? driver().cfg().reported_carveout_default : a.carveout;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  });
}

// One attribute's value checked as the driver checks it, into `a` (or the node's priority).
CUresult emu::set_launch_attribute(int id, const CUlaunchAttributeValue& v, const unsigned grid[3],
                                   KernelAttributes& a, int& priority) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      priority = std::clamp(v.priority, kGreatestStreamPriority, kLeastStreamPriority);
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      a.cooperative = v.cooperative != 0 ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {
      const unsigned cluster[3] = {v.clusterDim.x, v.clusterDim.y, v.clusterDim.z};
      if (CUresult r = check_cluster(cluster, grid); r != CUDA_SUCCESS) return r;
      std::copy(cluster, cluster + 3, a.cluster);
      return CUDA_SUCCESS;
    }
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      // Checked as the raw value the caller stored: an out-of-range enum must be refused, and
      // loading it as the enum type would be undefined behaviour.
      if (raw_enum(v.clusterSchedulingPolicyPreference) >
          CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      a.cluster_policy = v.clusterSchedulingPolicyPreference;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      if (raw_enum(v.memSyncDomain) != CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT &&
          raw_enum(v.memSyncDomain) != CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      a.mem_sync_domain = v.memSyncDomain;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      a.mem_sync_map[0] = v.memSyncDomainMap.default_;
      a.mem_sync_map[1] = v.memSyncDomainMap.remote;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (v.sharedMemCarveout > 100 && v.sharedMemCarveout != 0xffffffffu) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      a.carveout = v.sharedMemCarveout;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

EMU_EXPORT CUresult cuGraphKernelNodeSetAttribute(CUgraphNode h, CUkernelNodeAttrID attr,
                                                  const CUkernelNodeAttrValue* value) {
  return api("cuGraphKernelNodeSetAttribute", [&](Call& c) {
    c.ptr("node", handle_value(h)).arg("attr", raw(attr));
    EMU_REQUIRE_INIT();
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = find_node(h);
    if (!n || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    KernelNode& k = std::get<KernelNode>(n->data);
    // On a copy: a refused value leaves the node as it was.
    KernelAttributes a = k.attrs;
    int priority = k.priority;
    if (CUresult r = set_launch_attribute(raw(attr), *value, k.grid, a, priority);
        r != CUDA_SUCCESS) {
      return r;
    }
    k.attrs = a;
    k.priority = priority;
    return CUDA_SUCCESS;
  });
}

// Memset and memcpy nodes: their parameters as given or captured, and changed in place.
// The wrong kind of node is CUDA_ERROR_INVALID_VALUE, as for every other node-type getter.
template <class Node>
static std::shared_ptr<GraphNode> typed_node(CUgraphNode h, CUgraphNodeType type, Call& c) {
  c.ptr("node", handle_value(h));
  auto n = find_node(h);
  if (!n || n->type != type || !std::holds_alternative<Node>(n->data)) return nullptr;
  return n;
}

EMU_EXPORT CUresult cuGraphMemsetNodeGetParams(CUgraphNode h, CUDA_MEMSET_NODE_PARAMS* p) {
  return api("cuGraphMemsetNodeGetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = typed_node<MemsetNode>(h, CU_GRAPH_NODE_TYPE_MEMSET, c);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    const auto& m = std::get<MemsetNode>(n->data);
    *p = CUDA_MEMSET_NODE_PARAMS{};
    p->dst = m.dst;
    p->pitch = m.pitch;
    p->value = m.value;
    p->elementSize = m.element_size;
    p->width = m.width;
    p->height = m.height;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphMemsetNodeSetParams(CUgraphNode h, const CUDA_MEMSET_NODE_PARAMS* p) {
  return api("cuGraphMemsetNodeSetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = typed_node<MemsetNode>(h, CU_GRAPH_NODE_TYPE_MEMSET, c);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    // The node keeps the context it was made in (the call names none).
    std::uint64_t ctx = std::get<MemsetNode>(n->data).ctx;
    MemsetNode m;
    if (CUresult r = memset_node_from(p, ctx != 0 ? to_handle<CUcontext>(ctx) : nullptr, m);
        r != CUDA_SUCCESS) {
      return r;
    }
    n->data = m;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphMemcpyNodeGetParams(CUgraphNode h, CUDA_MEMCPY3D* p) {
  return api("cuGraphMemcpyNodeGetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = typed_node<MemcpyNode>(h, CU_GRAPH_NODE_TYPE_MEMCPY, c);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *p = std::get<MemcpyNode>(n->data).desc;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphMemcpyNodeSetParams(CUgraphNode h, const CUDA_MEMCPY3D* p) {
  return api("cuGraphMemcpyNodeSetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto n = typed_node<MemcpyNode>(h, CU_GRAPH_NODE_TYPE_MEMCPY, c);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t ctx = std::get<MemcpyNode>(n->data).ctx;
    MemcpyNode m;
    if (CUresult r = memcpy_node_from(p, ctx != 0 ? to_handle<CUcontext>(ctx) : nullptr, m);
        r != CUDA_SUCCESS) {
      return r;
    }
    n->data = m;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* ph, CUgraph g, unsigned long long f) {
  return api("cuGraphInstantiateWithFlags", [&](Call& c) { return instantiate(ph, g, f, c); });
}

EMU_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  return api("cuGraphLaunch", [&](Call& c) { return graph_launch(e, s, false, c); });
}
EMU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return api("cuGraphLaunch", [&](Call& c) { return graph_launch(e, s, true, c); });
}

EMU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  return api("cuGraphExecDestroy", [&](Call&) {
    EMU_REQUIRE_INIT();
    Lock lock(driver().mu);
    // A launched exec keeps running: its operation owns copies of the nodes.
    return graph_tables().execs.remove(handle_value(e)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

EMU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec he, CUgraph hg,
                                         CUgraphExecUpdateResultInfo* info) {
  return api("cuGraphExecUpdate", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *info = CUgraphExecUpdateResultInfo{};
    Lock lock(driver().mu);
    auto exec = graph_tables().execs.find(handle_value(he));
    auto g = find_graph(hg);
    if (!exec || !g) return CUDA_ERROR_INVALID_VALUE;
    auto fail = [&](CUgraphExecUpdateResult why, std::uint64_t node) {
      info->result = why;
      info->errorNode = to_handle<CUgraphNode>(node);
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    };
    // Same topology: pair nodes in creation order, compare types and edges.
    if (g->nodes.size() != exec->nodes.size()) {
      return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, 0);
    }
    auto src = find_graph(to_handle<CUgraph>(exec->graph));
    std::map<std::uint64_t, std::size_t> exec_index;  // original node -> exec position
    for (std::size_t i = 0; i < exec->nodes.size(); ++i) exec_index[exec->nodes[i].node] = i;
    std::map<std::uint64_t, std::uint64_t> pair;  // new node -> original node
    std::vector<std::uint64_t> originals;
    if (src) {
      originals = src->nodes;
    } else {
      for (auto& n : exec->nodes) originals.push_back(n.node);
      std::sort(originals.begin(), originals.end());
    }
    for (std::size_t i = 0; i < g->nodes.size(); ++i) pair[g->nodes[i]] = originals[i];
    std::vector<std::pair<std::size_t, NodeData>> updates;
    for (auto h : g->nodes) {
      auto n = graph_tables().nodes.find(h);
      auto it = exec_index.find(pair[h]);
      if (it == exec_index.end()) return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, h);
      ExecNode& e = exec->nodes[it->second];
      if (e.type != n->type) return fail(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, h);
      std::vector<std::size_t> deps;
      for (auto d : n->deps) deps.push_back(exec_index[pair[d]]);
      std::vector<std::size_t> a = deps, b = e.deps;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, h);
      if (n->type == CU_GRAPH_NODE_TYPE_KERNEL &&
          std::get<KernelNode>(n->data).ctx != std::get<KernelNode>(e.data).ctx) {
        return fail(CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED, h);
      }
      updates.emplace_back(it->second, n->data);
    }
    for (auto& [i, data] : updates) exec->nodes[i].data = std::move(data);
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
  });
}

template <class P>
static CUresult exec_kernel_set(CUgraphExec he, CUgraphNode hn, const P* p, Call& c) {
  EMU_REQUIRE_INIT();
  Lock lock(driver().mu);
  auto exec = graph_tables().execs.find(handle_value(he));
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  auto it = std::find_if(exec->nodes.begin(), exec->nodes.end(),
                         [&](const ExecNode& e) { return e.node == handle_value(hn); });
  if (it == exec->nodes.end() || it->type != CU_GRAPH_NODE_TYPE_KERNEL) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  KernelNode k;
  auto& old = std::get<KernelNode>(it->data);
  k.priority = old.priority;
  k.attrs = old.attrs;
  if (CUresult r = kernel_node_from_params(p, to_handle<CUcontext>(old.ctx), c, k);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (k.ctx != old.ctx) return CUDA_ERROR_INVALID_VALUE;  // cannot move between contexts
  it->data = std::move(k);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n,
                                                   const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return api("cuGraphExecKernelNodeSetParams",
             [&](Call& c) { return exec_kernel_set(e, n, p, c); });
}
EMU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n,
                                                      const CUDA_KERNEL_NODE_PARAMS* p) {
  return api("cuGraphExecKernelNodeSetParams",
             [&](Call& c) { return exec_kernel_set(e, n, p, c); });
}

// The exec's copy of a memset/memcpy node (cuGraphExec*NodeSetParams), or nullptr.
static ExecNode* exec_node_locked(CUgraphExec he, CUgraphNode hn, CUgraphNodeType type, Call& c) {
  c.ptr("exec", handle_value(he)).ptr("node", handle_value(hn));
  auto exec = graph_tables().execs.find(handle_value(he));
  if (!exec) return nullptr;
  auto it = std::find_if(exec->nodes.begin(), exec->nodes.end(),
                         [&](const ExecNode& e) { return e.node == handle_value(hn); });
  return it == exec->nodes.end() || it->type != type ? nullptr : &*it;
}

// "Both the value and pointer address may be updated. Changing other aspects of the memset
// (width, height, element size or pitch) may cause the update to be rejected": strict, the
// emulator takes only those two, so what passes here passes on any driver. The destination stays
// with the same context and device; the graph's node is not changed.
EMU_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                   const CUDA_MEMSET_NODE_PARAMS* p,
                                                   CUcontext ctx) {
  return api("cuGraphExecMemsetNodeSetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    ExecNode* e = exec_node_locked(he, hn, CU_GRAPH_NODE_TYPE_MEMSET, c);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto& old = std::get<MemsetNode>(e->data);
    MemsetNode m;
    if (CUresult r = memset_node_from(p, ctx, m); r != CUDA_SUCCESS) return r;
    if (m.ctx != old.ctx || m.height != old.height || m.width != old.width ||
        m.element_size != old.element_size || (old.height > 1 && m.pitch != old.pitch)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::shared_lock space(driver().space_mu);
    int old_device = -1, new_device = -1;
    std::uint64_t bytes = m.width * m.element_size;
    if (driver().space.check_device_shape(old.dst, bytes, &old_device) != CUDA_SUCCESS ||
        driver().space.check_device_shape(m.dst, bytes, &new_device) != CUDA_SUCCESS ||
        old_device != new_device) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    e->data = m;
    return CUDA_SUCCESS;
  });
}

// "Both the instantiation-time memory operands and the memory operands in copyParams must be
// 1-dimensional. Zero-length operations are not supported." and "Returns
// CUDA_ERROR_INVALID_VALUE if the memory operands' mappings changed": each side stays host or
// device memory of the same device, in the same context; the graph's node is not changed.
EMU_EXPORT CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec he, CUgraphNode hn,
                                                   const CUDA_MEMCPY3D* p, CUcontext ctx) {
  return api("cuGraphExecMemcpyNodeSetParams", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (p == nullptr || !one_dimensional(*p) || p->WidthInBytes == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    Lock lock(driver().mu);
    ExecNode* e = exec_node_locked(he, hn, CU_GRAPH_NODE_TYPE_MEMCPY, c);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto& old = std::get<MemcpyNode>(e->data);
    MemcpyNode m;
    if (CUresult r = memcpy_node_from(p, ctx, m); r != CUDA_SUCCESS) return r;
    if (m.ctx != old.ctx || m.dst_device != old.dst_device || m.src_device != old.src_device ||
        ((m.dst_device || m.src_device) && m.device != old.device)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    e->data = m;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphClone(CUgraph* phClone, CUgraph original) {
  return api("cuGraphClone", [&](Call& c) {
    EMU_REQUIRE_INIT();
    if (phClone == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto g = find_graph(original);
    if (!g || g->capturing) return CUDA_ERROR_INVALID_VALUE;
    auto clone = std::make_shared<Graph>();
    clone->handle = graph_tables().graphs.add(clone);
    std::map<std::uint64_t, std::uint64_t> map;
    for (auto h : g->nodes) {
      auto n = graph_tables().nodes.find(h);
      std::vector<std::uint64_t> deps;
      for (auto d : n->deps) deps.push_back(map[d]);
      map[h] = add_node_locked(*clone, {n->type, n->data}, deps);
    }
    *phClone = to_handle<CUgraph>(clone->handle);
    c.out_ptr("graph", clone->handle);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuGraphDebugDotPrint(CUgraph hg, const char* path, unsigned int flags) {
  return api("cuGraphDebugDotPrint", [&](Call& c) {
    c.arg("path", path).arg("flags", flags);
    EMU_REQUIRE_INIT();
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Lock lock(driver().mu);
    auto g = find_graph(hg);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    std::ofstream out(path);
    if (!out) return CUDA_ERROR_OPERATING_SYSTEM;
    out << "digraph thaw_emu_graph {\n";
    for (auto h : g->nodes) {
      auto n = graph_tables().nodes.find(h);
      std::string label;
      switch (n->type) {
        case CU_GRAPH_NODE_TYPE_KERNEL:
          label = "kernel " + std::get<KernelNode>(n->data).name;
          break;
        case CU_GRAPH_NODE_TYPE_MEMCPY:
          label = "memcpy";
          break;
        case CU_GRAPH_NODE_TYPE_MEMSET:
          label = "memset";
          break;
        case CU_GRAPH_NODE_TYPE_HOST:
          label = "host";
          break;
        case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
          label = "event record";
          break;
        case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
          label = "event wait";
          break;
        case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
          label = "mem op";
          break;
        default:
          label = "empty";
          break;
      }
      out << "  n" << std::hex << h << std::dec << " [label=\"" << label << "\"];\n";
      for (auto d : n->deps) out << "  n" << std::hex << d << " -> n" << h << std::dec << ";\n";
    }
    out << "}\n";
    return out ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
  });
}
