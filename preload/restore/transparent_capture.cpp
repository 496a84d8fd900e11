#include "preload/restore/transparent_capture.hpp"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "preload/interpose/real_driver.hpp"
#include "preload/restore/shim_kv_environment.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

using restore::GraphRestore;
using transparent_detail::g_eliding;
using transparent_detail::g_handed;

template <typename Fn>
Fn driver_fn(const char* name) {
  return reinterpret_cast<Fn>(driver_symbol(name));
}

// A call the elision kept: a kernel launch with its arguments deep-copied, or a memset / a
// device-to-device copy (their arguments are values).
struct KeptLaunch {
  enum class Kind { kernel, memset, copy } kind = Kind::kernel;
  LaunchKernelFn real = nullptr;
  LaunchKernelExFn real_ex = nullptr;    // set: a cuLaunchKernelEx, replayed as one
  std::vector<CUlaunchAttribute> attrs;  // its attributes, deep-copied
  CUfunction f = nullptr;
  unsigned grid[3]{}, block[3]{}, shared = 0;
  CUstream stream = nullptr;
  std::vector<std::uint8_t> bytes;     // the parameters, laid out as the record's slots
  std::vector<std::uint32_t> offsets;  // of each parameter in bytes
  std::function<CUresult()> call;      // memset, copy: the call itself, to the driver
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_MEMCPY3D copy{};
};

struct Elision {
  CUstream stream = nullptr;
  bool per_thread = false;
  GraphRestore::TransparentMatch match;
  std::size_t next = 0;  // chain position of the next launch
  std::vector<KeptLaunch> kept;
};

struct State {
  std::mutex mutex;
  std::vector<Elision> active;
  struct Handed {
    CUgraphExec exec = nullptr;
    unsigned long long flags = 0;
  };
  std::map<CUgraph, Handed> handed;  // graphs handed back, not yet instantiated
  std::uint64_t captures = 0, transparent = 0, fallbacks = 0;
  std::map<std::string, std::uint64_t> reasons;
  std::unique_ptr<restore::GraphBuildDriver> driver;  // the engine threads' (under mutex)
  bool driver_tried = false;
};

State& state();

// Fork: the lock is held across fork(); the child has none of the parent's captures (only the
// forking thread is there, and its driver state is its own) nor its graphs.
void fork_prepare() {
  state().mutex.lock();
}
void fork_parent() {
  state().mutex.unlock();
}
void fork_child() {
  State& s = state();
  new (&s.mutex) std::mutex();
  s.active.clear();
  s.handed.clear();
  s.captures = s.transparent = s.fallbacks = 0;
  s.reasons.clear();
  transparent_detail::g_eliding.store(0, std::memory_order_relaxed);
  transparent_detail::g_handed.store(0, std::memory_order_relaxed);
}

State& state() {
  static State* s = [] {
    auto* created = new State();  // used by exit handlers: never destroyed
    ::pthread_atfork(&fork_prepare, &fork_parent, &fork_child);
    return created;
  }();
  return *s;
}

restore::GraphBuildDriver* build_driver(State& s) {
  if (!s.driver_tried) {
    s.driver_tried = true;
    s.driver = shim_graph_build_driver();
  }
  return s.driver.get();
}

void count_fallback(State& s, const std::string& reason) {
  ++s.fallbacks;
  ++s.reasons[reason];
  counters().graph_restore_fallbacks.fetch_add(1, std::memory_order_relaxed);
}

bool default_stream(CUstream stream) {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

// The graph the stream's capture records into, or null.
CUgraph capture_graph(CUstream stream, bool per_thread) {
  using V3 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                          const CUgraphNode**, const CUgraphEdgeData**, size_t*);
  using V2 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                          const CUgraphNode**, size_t*);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  if (auto v3 = driver_fn<V3>(per_thread ? "cuStreamGetCaptureInfo_v3_ptsz"
                                         : "cuStreamGetCaptureInfo_v3")) {
    if (v3(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr) != CUDA_SUCCESS)
      return nullptr;
  } else if (auto v2 = driver_fn<V2>(per_thread ? "cuStreamGetCaptureInfo_v2_ptsz"
                                                : "cuStreamGetCaptureInfo_v2")) {
    if (v2(stream, &status, nullptr, &graph, nullptr, nullptr) != CUDA_SUCCESS) return nullptr;
  }
  return status == CU_STREAM_CAPTURE_STATUS_NONE ? nullptr : graph;
}

// The nodes of `graph` (cuGraphGetNodes).
std::vector<CUgraphNode> graph_nodes(CUgraph graph) {
  using GetNodes = CUresult (*)(CUgraph, CUgraphNode*, size_t*);
  auto get = driver_fn<GetNodes>("cuGraphGetNodes");
  std::vector<CUgraphNode> out;
  size_t n = 0;
  if (get == nullptr || graph == nullptr || get(graph, nullptr, &n) != CUDA_SUCCESS) return out;
  out.resize(n);
  if (n > 0 && get(graph, out.data(), &n) != CUDA_SUCCESS) n = 0;
  out.resize(n);
  return out;
}

// How many nodes the driver captured meanwhile (calls the shim does not hook: memcpys,
// memsets, ...): all of the capture's graph.
std::size_t captured_nodes(const Elision& e) {
  return graph_nodes(capture_graph(e.stream, e.per_thread)).size();
}

// Why the elision must stop before the current call, checked with one query (at every elided
// call): the driver captured a node on the stream meanwhile (the stream began with no
// dependencies, so any means a node; a node of another stream can join the capture only
// through an event of this one, which is hooked, and the end counts every node of the graph),
// or the capture is no longer active (invalidated: the calls kept are replayed and answer as
// they would live). {reason, line}, or nullopt.
std::optional<std::pair<std::string, std::string>> disturbed(const Elision& e) {
  using V3 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                          const CUgraphNode**, const CUgraphEdgeData**, size_t*);
  static const auto v3 = driver_fn<V3>("cuStreamGetCaptureInfo_v3");
  static const auto v3_ptsz = driver_fn<V3>("cuStreamGetCaptureInfo_v3_ptsz");
  const V3 fn = e.per_thread ? v3_ptsz : v3;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  size_t deps = 0;
  const CUresult r = fn != nullptr
                         ? fn(e.stream, &status, nullptr, nullptr, nullptr, nullptr, &deps)
                         : CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_ERROR_NOT_SUPPORTED) {  // no v3: count the graph's nodes
    const std::size_t n = captured_nodes(e);
    if (n == 0) return std::nullopt;
    return std::pair{std::string("captured outside the shim"),
                     fmt::format("the driver captured {} node(s) the shim does not elide", n)};
  }
  if (r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return std::pair{std::string("capture invalidated"),
                     fmt::format("the driver's capture is no longer active (CUresult {}, status "
                                 "{})",
                                 static_cast<int>(r), static_cast<int>(status))};
  }
  if (deps == 0) return std::nullopt;
  return std::pair{
      std::string("captured outside the shim"),
      fmt::format("the driver captured {} node(s) the shim does not elide", captured_nodes(e))};
}

std::vector<void*> param_pointers(KeptLaunch& k) {
  std::vector<void*> p;
  for (std::uint32_t off : k.offsets) p.push_back(k.bytes.data() + off);
  return p;
}

// The attributes a kernel node holds (and a graph record models).
bool node_attribute(CUlaunchAttributeID id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return true;
    default:
      return false;
  }
}

CUlaunchConfig launch_config(KeptLaunch& k) {
  CUlaunchConfig c{};
  c.gridDimX = k.grid[0];
  c.gridDimY = k.grid[1];
  c.gridDimZ = k.grid[2];
  c.blockDimX = k.block[0];
  c.blockDimY = k.block[1];
  c.blockDimZ = k.block[2];
  c.sharedMemBytes = k.shared;
  c.hStream = k.stream;
  c.attrs = k.attrs.empty() ? nullptr : k.attrs.data();
  c.numAttrs = static_cast<unsigned>(k.attrs.size());
  return c;
}

// Why a launch with `attrs` (cuLaunchKernelEx's; none for cuLaunchKernel) is not the recorded
// node `n` as to its attributes, or "". The attributes only a launch gives (cluster, its
// scheduling policy, cooperative, carveout) must be the record's whether the launch sets them
// or not; those a stream also gives (priority, memory-sync domain and map) are compared when the
// launch sets them, else they are the stream's in a live capture too. An attribute the record
// cannot hold (programmatic serialization, events, an access policy window, ...) set to other
// than its default is not modelled: the capture goes on live. The record keeps an attribute only
// where it differs from the driver's defaults (`d`, this run's as the restore checked), so a
// launch's value equal to the default is compared as "not set": a launch that asks for a
// carveout of 0 on a driver that answers 0 for "not set" is the recorded node without one.
std::string attributes_differ(const graphs::KernelNode& n, const graphs::AttributeDefaults& d,
                              std::span<const CUlaunchAttribute> attrs) {
  const graphs::KernelNode unset;  // each attribute's "not set" value in a record
  graphs::KernelNode launch;       // the launch-only attributes at their defaults
  // The launch's value as the record would hold it.
  auto as_recorded = [](auto value, auto default_value, auto unset_value) {
    return value == default_value ? unset_value : value;
  };
  for (const CUlaunchAttribute& a : attrs) {
    const CUlaunchAttributeValue& v = a.value;
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
        break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        launch.cluster = as_recorded(
            std::array<std::uint32_t, 3>{v.clusterDim.x, v.clusterDim.y, v.clusterDim.z}, d.cluster,
            unset.cluster);
        break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        launch.cluster_scheduling =
            as_recorded(static_cast<std::uint32_t>(v.clusterSchedulingPolicyPreference),
                        d.cluster_scheduling, unset.cluster_scheduling);
        break;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        launch.cooperative =
            as_recorded(v.cooperative != 0 ? 1u : 0u, d.cooperative, unset.cooperative);
        break;
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        launch.carveout = as_recorded(v.sharedMemCarveout, d.carveout, unset.carveout);
        break;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        if (as_recorded(static_cast<std::uint32_t>(v.priority), d.priority, unset.priority) !=
            n.priority)
          return fmt::format("priority differs ({})", n.kernel.name);
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        if (as_recorded(static_cast<std::uint32_t>(v.memSyncDomain), d.mem_sync_domain,
                        unset.mem_sync_domain) != n.mem_sync_domain)
          return fmt::format("memory sync domain differs ({})", n.kernel.name);
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        if (as_recorded(std::array<std::uint32_t, 2>{v.memSyncDomainMap.default_,
                                                     v.memSyncDomainMap.remote},
                        d.mem_sync_domain_map, unset.mem_sync_domain_map) != n.mem_sync_domain_map)
          return fmt::format("memory sync domain map differs ({})", n.kernel.name);
        break;
      default: {
        // Unmodelled: harmless only at its default (all zero bytes).
        static constexpr CUlaunchAttributeValue kZero{};
        if (std::memcmp(&v, &kZero, sizeof v) != 0)
          return fmt::format("launch attribute {} (not modelled) on {}", static_cast<int>(a.id),
                             n.kernel.name);
      }
    }
  }
  if (launch.cluster != n.cluster) {
    return fmt::format("cluster dimension [{}, {}, {}] where the record has [{}, {}, {}] ({})",
                       launch.cluster[0], launch.cluster[1], launch.cluster[2], n.cluster[0],
                       n.cluster[1], n.cluster[2], n.kernel.name);
  }
  if (launch.cluster_scheduling != n.cluster_scheduling)
    return fmt::format("cluster scheduling policy differs ({})", n.kernel.name);
  if (launch.cooperative != n.cooperative)
    return fmt::format("cooperative differs ({})", n.kernel.name);
  if (launch.carveout != n.carveout)
    return fmt::format("shared memory carveout differs ({})", n.kernel.name);
  return "";
}

// The kept launches into the real capture, in order: launched on the stream (nothing captured
// meanwhile), else added as a chain before the nodes the driver captured already (the graph a
// live capture would have given). Returns the first error.
CUresult replay(Elision& e, std::string& why) {
  if (e.kept.empty()) return CUDA_SUCCESS;
  CUgraph graph = capture_graph(e.stream, e.per_thread);
  const std::vector<CUgraphNode> present = graph_nodes(graph);
  if (present.empty()) {
    for (KeptLaunch& k : e.kept) {
      std::vector<void*> p = param_pointers(k);
      CUresult r = CUDA_SUCCESS;
      if (k.kind != KeptLaunch::Kind::kernel) {
        r = k.call();
      } else if (k.real_ex != nullptr) {
        const CUlaunchConfig config = launch_config(k);
        r = k.real_ex(&config, k.f, p.empty() ? nullptr : p.data(), nullptr);
      } else {
        r = k.real(k.f, k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
                   k.shared, k.stream, p.empty() ? nullptr : p.data(), nullptr);
      }
      if (r != CUDA_SUCCESS) {
        why = fmt::format("replaying a kept launch failed: CUresult {}", static_cast<int>(r));
        return r;
      }
    }
    e.kept.clear();
    return CUDA_SUCCESS;
  }
  // The roots of what the driver captured: nodes without an edge in.
  using GetEdges = CUresult (*)(CUgraph, CUgraphNode*, CUgraphNode*, size_t*);
  using AddKernel = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const CUDA_KERNEL_NODE_PARAMS*);
  using AddDeps = CUresult (*)(CUgraph, const CUgraphNode*, const CUgraphNode*, size_t);
  auto edges = driver_fn<GetEdges>("cuGraphGetEdges");
  auto add_kernel = driver_fn<AddKernel>("cuGraphAddKernelNode_v2");
  if (add_kernel == nullptr) add_kernel = driver_fn<AddKernel>("cuGraphAddKernelNode");
  auto add_deps = driver_fn<AddDeps>("cuGraphAddDependencies");
  using AddMemset = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const CUDA_MEMSET_NODE_PARAMS*, CUcontext);
  using AddMemcpy = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const CUDA_MEMCPY3D*, CUcontext);
  auto add_memset = driver_fn<AddMemset>("cuGraphAddMemsetNode");
  auto add_memcpy = driver_fn<AddMemcpy>("cuGraphAddMemcpyNode");
  if (edges == nullptr || add_kernel == nullptr || add_deps == nullptr) {
    why = "the driver lacks cuGraphGetEdges / cuGraphAddKernelNode / cuGraphAddDependencies";
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  size_t n = 0;
  if (CUresult r = edges(graph, nullptr, nullptr, &n); r != CUDA_SUCCESS) return r;
  std::vector<CUgraphNode> from(n), to(n);
  if (n > 0) {
    if (CUresult r = edges(graph, from.data(), to.data(), &n); r != CUDA_SUCCESS) return r;
  }
  std::vector<CUgraphNode> roots;
  for (CUgraphNode node : present) {
    if (std::find(to.begin(), to.begin() + static_cast<long>(n), node) == to.begin() + n)
      roots.push_back(node);
  }
  CUcontext ctx = nullptr;
  if (auto get = driver_fn<CUresult (*)(CUcontext*)>("cuCtxGetCurrent")) (void)get(&ctx);
  CUgraphNode last = nullptr;
  for (KeptLaunch& k : e.kept) {
    const CUgraphNode* deps = last ? &last : nullptr;
    const size_t ndeps = last ? 1 : 0;
    if (k.kind != KeptLaunch::Kind::kernel) {
      CUgraphNode node = nullptr;
      CUresult r = CUDA_ERROR_NOT_SUPPORTED;
      if (k.kind == KeptLaunch::Kind::memset && add_memset != nullptr) {
        r = add_memset(&node, graph, deps, ndeps, &k.memset, ctx);
      } else if (k.kind == KeptLaunch::Kind::copy && add_memcpy != nullptr) {
        r = add_memcpy(&node, graph, deps, ndeps, &k.copy, ctx);
      }
      if (r != CUDA_SUCCESS) {
        why = fmt::format("adding a kept memset or copy to the capture failed: CUresult {}",
                          static_cast<int>(r));
        return r;
      }
      last = node;
      continue;
    }
    std::vector<void*> p = param_pointers(k);
    CUDA_KERNEL_NODE_PARAMS params{};
    params.func = k.f;
    params.gridDimX = k.grid[0];
    params.gridDimY = k.grid[1];
    params.gridDimZ = k.grid[2];
    params.blockDimX = k.block[0];
    params.blockDimY = k.block[1];
    params.blockDimZ = k.block[2];
    params.sharedMemBytes = k.shared;
    params.kernelParams = p.empty() ? nullptr : p.data();
    params.ctx = ctx;
    CUgraphNode node = nullptr;
    CUresult r = add_kernel(&node, graph, last ? &last : nullptr, last ? 1 : 0, &params);
    using SetAttr = CUresult (*)(CUgraphNode, CUkernelNodeAttrID, const CUkernelNodeAttrValue*);
    static const auto set_attr = driver_fn<SetAttr>("cuGraphKernelNodeSetAttribute");
    for (const CUlaunchAttribute& a : k.attrs) {
      // Only what a kernel node holds: the others were kept only at their defaults (all zero),
      // which a node has already, and the driver may refuse them on a node (launch-only ones).
      if (r != CUDA_SUCCESS || !node_attribute(a.id)) continue;
      r = set_attr != nullptr ? set_attr(node, a.id, &a.value) : CUDA_ERROR_NOT_SUPPORTED;
    }
    if (r != CUDA_SUCCESS) {
      why = fmt::format("adding a kept launch to the capture failed: CUresult {}",
                        static_cast<int>(r));
      return r;
    }
    last = node;
  }
  for (CUgraphNode root : roots) {
    if (CUresult r = add_deps(graph, &last, &root, 1); r != CUDA_SUCCESS) {
      why =
          fmt::format("ordering the kept launches first failed: CUresult {}", static_cast<int>(r));
      return r;
    }
  }
  e.kept.clear();
  return CUDA_SUCCESS;
}

// Stops eliding `it` (under the lock): kept launches replayed, the pre-built graph dropped,
// one line and a count.
CUresult fall_back(State& s, std::vector<Elision>::iterator it, const std::string& reason,
                   const std::string& detail) {
  Elision e = std::move(*it);
  s.active.erase(it);
  g_eliding.fetch_sub(1, std::memory_order_relaxed);
  std::string why;
  const CUresult r = replay(e, why);
  count_fallback(s, reason);
  debug("graph restore: recorded graph {} captured live from node {} of {}: {}{}",
        e.match.graph->index, e.next, e.match.chain.size(), detail,
        why.empty() ? "" : " (" + why + ")");
  if (restore::GraphBuildDriver* d = build_driver(s)) {
    runtime().graph_restore().transparent_drop(*d, e.match.position);
  }
  return r;
}

std::vector<Elision>::iterator find(State& s, CUstream stream) {
  return std::find_if(s.active.begin(), s.active.end(),
                      [&](const Elision& e) { return e.stream == stream; });
}

// Why launch `k` is not recorded node `n` (of function `f`), or "".
std::string differs(const graphs::KernelNode& n, CUfunction f, const KeptLaunch& k, void** params,
                    void** extra) {
  if (k.f != f) return fmt::format("another kernel than {}", n.kernel.name);
  for (int d = 0; d < 3; ++d) {
    if (k.grid[d] != n.grid[d] || k.block[d] != n.block[d])
      return fmt::format("launch dimensions differ ({})", n.kernel.name);
  }
  if (k.shared != n.shared_bytes) return fmt::format("shared memory differs ({})", n.kernel.name);
  if (extra != nullptr) return "parameters passed with 'extra' (not modelled)";
  if (!n.params.empty() && params == nullptr) return "no kernel parameters";
  for (std::size_t p = 0; p < n.params.size(); ++p) {
    const graphs::ParamSlot& slot = n.params[p];
    if (params[p] == nullptr ||
        std::memcmp(params[p], n.param_bytes.data() + slot.offset, slot.size) != 0) {
      return fmt::format("parameter {} of {} differs from the record", p, n.kernel.name);
    }
  }
  return "";
}

// The elision of `stream`'s capture, if any, after the check that the driver captured nothing
// meanwhile (which stops it: then `forward` says what to answer). Under the lock.
std::vector<Elision>::iterator elided(State& s, CUstream stream, std::optional<CUresult>& forward) {
  auto it = find(s, stream);
  if (it == s.active.end()) return it;
  if (auto why = disturbed(*it)) {
    const CUresult r = fall_back(s, it, why->first, why->second);
    if (r != CUDA_SUCCESS) forward = r;
    return s.active.end();
  }
  return it;
}

// Keeps `k` when `why_not(recorded node)` says nothing, else stops the elision.
std::optional<CUresult> keep(
    State& s, std::vector<Elision>::iterator it, KeptLaunch k,
    const std::function<std::string(const graphs::RecordedNode&)>& why_not) {
  Elision& e = *it;
  std::string why;
  if (e.next >= e.match.chain.size()) {
    why = "more calls than the recorded graph has nodes";
  } else {
    why = why_not(e.match.graph->nodes[e.match.chain[e.next]]);
  }
  if (!why.empty()) {
    const CUresult r = fall_back(s, it, "launch mismatch", why);
    if (r != CUDA_SUCCESS) return r;
    return std::nullopt;
  }
  e.kept.push_back(std::move(k));
  ++e.next;
  return CUDA_SUCCESS;
}

}  // namespace

std::optional<CUresult> transparent_memset(std::function<CUresult()> call, CUdeviceptr dst,
                                           unsigned value, unsigned element_size, size_t count,
                                           CUstream stream) {
  if (ReentryGuard::inside()) return std::nullopt;
  ReentryGuard guard;
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::optional<CUresult> forward;
  auto it = elided(s, stream, forward);
  if (it == s.active.end()) return forward;
  KeptLaunch k;
  k.kind = KeptLaunch::Kind::memset;
  k.call = std::move(call);
  k.memset.dst = dst;
  k.memset.value = value;
  k.memset.elementSize = element_size;
  k.memset.width = count;
  k.memset.height = 1;
  k.memset.pitch = 0;
  return keep(s, it, std::move(k), [&](const graphs::RecordedNode& n) -> std::string {
    if (!n.memset)
      return fmt::format("a memset where the record has a {} node", graphs::to_string(n.type));
    const graphs::MemsetNode& m = *n.memset;
    // One row: its pitch means nothing (drivers record 0 or the row's bytes).
    const bool same = m.dst == dst && m.value == value && m.element_size == element_size &&
                      m.width == count && m.height == 1 &&
                      (m.pitch == 0 || m.pitch == count * element_size);
    return same ? "" : "a memset that differs from the record";
  });
}

std::optional<CUresult> transparent_copy(std::function<CUresult()> call, CUdeviceptr dst,
                                         CUdeviceptr src, size_t bytes, CUstream stream) {
  if (ReentryGuard::inside()) return std::nullopt;
  ReentryGuard guard;
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::optional<CUresult> forward;
  auto it = elided(s, stream, forward);
  if (it == s.active.end()) return forward;
  KeptLaunch k;
  k.kind = KeptLaunch::Kind::copy;
  k.call = std::move(call);
  k.copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  k.copy.srcDevice = src;
  k.copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  k.copy.dstDevice = dst;
  k.copy.WidthInBytes = bytes;
  k.copy.Height = 1;
  k.copy.Depth = 1;
  return keep(s, it, std::move(k), [&](const graphs::RecordedNode& n) -> std::string {
    if (!n.memcpy)
      return fmt::format("a copy where the record has a {} node", graphs::to_string(n.type));
    const graphs::MemcpyNode& c = *n.memcpy;
    const bool same = c.src == src && c.dst == dst && c.bytes == bytes &&
                      c.src_memory_type == CU_MEMORYTYPE_DEVICE &&
                      c.dst_memory_type == CU_MEMORYTYPE_DEVICE;
    return same ? "" : "a device-to-device copy that differs from the record";
  });
}

void transparent_capture_began(CUstream stream, bool per_thread, bool into_graph) {
  if (!config().transparent_graphs || config().disabled) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  restore::GraphBuildDriver* d = build_driver(s);
  if (d == nullptr) return;
  auto match = runtime().graph_restore().transparent_candidate(*d);
  if (!match) {
    if (!match.error().record) return;  // no graphs record: nothing to restore, nothing said
    ++s.captures;
    count_fallback(s, match.error().reason);
    debug("graph restore: capture {} captured live: {}", s.captures, match.error().why);
    return;
  }
  ++s.captures;
  const char* why = into_graph                          ? "capture into a graph"
                    : default_stream(stream)            ? "default stream"
                    : find(s, stream) != s.active.end() ? "stream elided already"
                                                        : nullptr;
  if (why != nullptr) {
    count_fallback(s, why);
    debug("graph restore: recorded graph {} captured live: {}", match->graph->index, why);
    runtime().graph_restore().transparent_drop(*d, match->position);
    return;
  }
  Elision e;
  e.stream = stream;
  e.per_thread = per_thread;
  e.match = std::move(*match);
  s.active.push_back(std::move(e));
  g_eliding.fetch_add(1, std::memory_order_relaxed);
}

std::optional<CUresult> transparent_launch(LaunchKernelFn real, CUfunction f, unsigned gx,
                                           unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                           unsigned bz, unsigned shared, CUstream stream,
                                           void** params, void** extra) {
  if (ReentryGuard::inside()) return std::nullopt;
  ReentryGuard guard;
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::optional<CUresult> forward;
  auto it = elided(s, stream, forward);
  if (it == s.active.end()) return forward;
  Elision& e = *it;
  KeptLaunch k;
  k.real = real;
  k.f = f;
  k.grid[0] = gx, k.grid[1] = gy, k.grid[2] = gz;
  k.block[0] = bx, k.block[1] = by, k.block[2] = bz;
  k.shared = shared;
  k.stream = stream;
  std::string why;
  if (e.next >= e.match.chain.size()) {
    why = "more launches than the recorded graph has nodes";
  } else {
    const std::uint32_t node = e.match.chain[e.next];
    const graphs::RecordedNode& recorded = e.match.graph->nodes[node];
    if (!recorded.kernel) {
      why = fmt::format("a kernel launch where the record has a {} node",
                        graphs::to_string(recorded.type));
    } else {
      why = differs(*recorded.kernel, e.match.functions[node], k, params, extra);
      if (why.empty()) why = attributes_differ(*recorded.kernel, e.match.defaults, {});
    }
    const graphs::KernelNode* nk = recorded.kernel ? &*recorded.kernel : nullptr;
    if (why.empty()) {
      const graphs::KernelNode& n = *nk;
      k.bytes = n.param_bytes;  // equal to the launch's, byte for byte
      for (const graphs::ParamSlot& slot : n.params) k.offsets.push_back(slot.offset);
    }
  }
  if (!why.empty()) {
    const CUresult r = fall_back(s, it, "launch mismatch", why);
    if (r != CUDA_SUCCESS) return r;
    return std::nullopt;
  }
  e.kept.push_back(std::move(k));
  ++e.next;
  return CUDA_SUCCESS;
}

std::optional<CUresult> transparent_launch_ex(LaunchKernelExFn real, const CUlaunchConfig* config,
                                              CUfunction f, void** params, void** extra) {
  if (config == nullptr || (config->numAttrs > 0 && config->attrs == nullptr)) {
    return std::nullopt;  // the driver's error, capturing nothing
  }
  if (ReentryGuard::inside()) return std::nullopt;
  ReentryGuard guard;
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::optional<CUresult> forward;
  auto it = elided(s, config->hStream, forward);
  if (it == s.active.end()) return forward;
  Elision& e = *it;
  KeptLaunch k;
  k.real_ex = real;
  k.f = f;
  k.grid[0] = config->gridDimX, k.grid[1] = config->gridDimY, k.grid[2] = config->gridDimZ;
  k.block[0] = config->blockDimX, k.block[1] = config->blockDimY, k.block[2] = config->blockDimZ;
  k.shared = config->sharedMemBytes;
  k.stream = config->hStream;
  k.attrs.assign(config->attrs, config->attrs + config->numAttrs);  // the caller's may go
  std::string why;
  if (e.next >= e.match.chain.size()) {
    why = "more launches than the recorded graph has nodes";
  } else {
    const std::uint32_t node = e.match.chain[e.next];
    const graphs::RecordedNode& recorded = e.match.graph->nodes[node];
    if (!recorded.kernel) {
      why = fmt::format("a kernel launch where the record has a {} node",
                        graphs::to_string(recorded.type));
    } else {
      why = differs(*recorded.kernel, e.match.functions[node], k, params, extra);
      if (why.empty()) why = attributes_differ(*recorded.kernel, e.match.defaults, k.attrs);
    }
    if (why.empty()) {
      const graphs::KernelNode& n = *recorded.kernel;
      k.bytes = n.param_bytes;  // equal to the launch's, byte for byte
      for (const graphs::ParamSlot& slot : n.params) k.offsets.push_back(slot.offset);
    }
  }
  if (!why.empty()) {
    const CUresult r = fall_back(s, it, "launch mismatch", why);
    if (r != CUDA_SUCCESS) return r;
    return std::nullopt;
  }
  e.kept.push_back(std::move(k));
  ++e.next;
  return CUDA_SUCCESS;
}

void transparent_unmodeled(CUstream stream, const char* what) {
  if (ReentryGuard::inside()) return;
  ReentryGuard guard;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = find(s, stream);
  if (it == s.active.end()) return;
  (void)fall_back(s, it, "unmodelled call", fmt::format("{} on the capturing stream", what));
}

std::optional<TransparentEnd> transparent_capture_ending(CUstream stream) {
  if (!eliding()) return std::nullopt;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = find(s, stream);
  if (it == s.active.end()) return std::nullopt;
  Elision& e = *it;
  if (auto why = disturbed(e)) {
    (void)fall_back(s, it, why->first, why->second);
    return std::nullopt;
  }
  if (std::size_t n = captured_nodes(e); n != 0) {
    (void)fall_back(s, it, "captured outside the shim",
                    fmt::format("the driver captured {} node(s) the shim does not elide", n));
    return std::nullopt;
  }
  if (e.next != e.match.chain.size()) {
    (void)fall_back(s, it, "ended early", "the capture ended before the recorded graph did");
    return std::nullopt;
  }
  restore::GraphBuildDriver* d = build_driver(s);
  auto taken = runtime().graph_restore().transparent_take(*d, e.match);
  if (!taken) {
    (void)fall_back(s, it, "checked at the end", *taken.error().c_str() ? taken.error() : "?");
    return std::nullopt;
  }
  ++s.transparent;
  // The graph is recorded as the record's nodes: with the record's defaults (the take checked
  // they are this driver's).
  if (GraphRecorder* recorder = runtime().graph_recorder())
    recorder->adopt_defaults(e.match.defaults);
  counters().graphs_restored.fetch_add(1, std::memory_order_relaxed);
  debug("graph restore: recorded graph {} restored transparently ({} nodes, {})",
        e.match.graph->index, e.match.chain.size(),
        taken->prebuilt ? "pre-built in the background" : "built at the end of the capture");
  if (taken->exec != nullptr) {
    s.handed[taken->graph] = State::Handed{taken->exec, taken->flags};
    g_handed.fetch_add(1, std::memory_order_relaxed);
  }
  TransparentEnd end{taken->graph, e.match.graph};
  s.active.erase(it);
  g_eliding.fetch_sub(1, std::memory_order_relaxed);
  return end;
}

CUresult transparent_capture_ended(CUresult r, CUgraph driver_graph, const TransparentEnd& end,
                                   CUgraph* out) {
  using Destroy = CUresult (*)(CUgraph);
  auto destroy = driver_fn<Destroy>("cuGraphDestroy");
  if (r == CUDA_SUCCESS) {
    if (driver_graph != nullptr && destroy != nullptr) (void)destroy(driver_graph);
    *out = end.graph;
    return r;
  }
  // The capture failed for the driver (invalidated): the engine sees that, as live.
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (auto h = s.handed.find(end.graph); h != s.handed.end()) {
    if (auto exec_destroy = driver_fn<CUresult (*)(CUgraphExec)>("cuGraphExecDestroy"))
      (void)exec_destroy(h->second.exec);
    s.handed.erase(h);
    g_handed.fetch_sub(1, std::memory_order_relaxed);
  }
  if (destroy != nullptr) (void)destroy(end.graph);
  // Counted as restored at the end's check: a fallback after all (nothing to replay: the
  // capture is over, as a live one would be).
  --s.transparent;
  counters().graphs_restored.fetch_sub(1, std::memory_order_relaxed);
  count_fallback(s, "capture failed");
  debug("graph restore: recorded graph's capture failed at its end (CUresult {}): not restored",
        static_cast<int>(r));
  return r;
}

std::optional<CUresult> transparent_instantiate(CUgraphExec* exec, CUgraph graph,
                                                unsigned long long flags) {
  if (transparent_detail::g_handed.load(std::memory_order_relaxed) == 0) return std::nullopt;
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto h = s.handed.find(graph);
  if (h == s.handed.end()) return std::nullopt;
  const State::Handed got = h->second;
  s.handed.erase(h);
  g_handed.fetch_sub(1, std::memory_order_relaxed);
  runtime().graph_restore().transparent_flags_seen(flags);
  if (exec == nullptr) return std::nullopt;  // the driver says what is wrong
  if (got.flags != flags) {
    if (auto exec_destroy = driver_fn<CUresult (*)(CUgraphExec)>("cuGraphExecDestroy"))
      (void)exec_destroy(got.exec);
    debug("graph restore: pre-instantiated graph not used: flags {:#x}, the engine's {:#x}",
          got.flags, flags);
    return std::nullopt;
  }
  *exec = got.exec;
  return CUDA_SUCCESS;
}

void transparent_summary_at_exit() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (auto exec_destroy = driver_fn<CUresult (*)(CUgraphExec)>("cuGraphExecDestroy")) {
    for (auto& [graph, h] : s.handed) (void)exec_destroy(h.exec);
  }
  s.handed.clear();
  if (s.captures == 0) return;
  std::string line =
      fmt::format("thaw: graph restore summary: captures={} transparent={} fallbacks={}",
                  s.captures, s.transparent, s.fallbacks);
  if (!s.reasons.empty()) {
    line += " (";
    bool first = true;
    for (const auto& [reason, n] : s.reasons) {
      line += fmt::format("{}{}: {}", first ? "" : ", ", reason, n);
      first = false;
    }
    line += ")";
  }
  debug("{}", line);
}

}  // namespace thaw::preload
