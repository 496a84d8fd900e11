// Transparent CUDA-graph restore (issue 24, part 2; no engine change): a stream capture whose
// launches match a recorded graph is not recorded by the driver; its end hands back the graph
// GraphRestore rebuilt from the record (pre-built by its worker), and cuGraphInstantiate the
// executable graph the worker instantiated beforehand.
//
// The capture itself is begun and ended FOR REAL with the driver, so every query and every
// call the shim does not hook keeps the driver's semantics. While a capture is elided the hooks
// of kernel launches (cuLaunchKernel, cuLaunchKernelEx with the launch attributes a record
// holds: cluster, priority, ...), memsets (cuMemsetD8/D16/D32Async) and device-to-device
// copies (cuMemcpyDtoDAsync) on its stream do not forward: each call is compared with the next
// node of the recorded chain (a kernel's function as GraphRestore resolves the record's module
// digest + name, grid, block, dynamic shared memory, each parameter's bytes; a memset's or a
// copy's addresses, sizes and value) and kept, its arguments deep-copied (the driver copies
// kernel parameters at launch, so must the shim). The first mismatch — or a hooked call on the
// stream the elision does not model (an event record or wait, host functions, graph launches, a
// capture-info query for the graph or its dependencies), or a node the driver captured meanwhile
// (checked at every elided call and at the end) — stops the elision: the kept calls are replayed
// into the real capture in order (or, when the driver captured nodes already, added before them as
// a chain), then the current call is forwarded; one log line says which graph, which node and why,
// and the reason is counted. The result is always what a live capture gives.
//
// Hot path: with nothing elided each of these hooks costs one relaxed atomic load (eliding())
// besides the lookup of the driver's function every hook makes.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "common/graphs/graph_record.hpp"

namespace thaw::preload {

namespace transparent_detail {
inline std::atomic<int> g_eliding{0};  // captures elided now
inline std::atomic<int> g_handed{0};   // graphs handed back, not yet instantiated
}  // namespace transparent_detail

inline bool eliding() {
  return transparent_detail::g_eliding.load(std::memory_order_relaxed) != 0;
}

// The real launch a kept call is replayed with.
using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, CUstream, void**, void**);

// The capture hooks (after a successful begin, before the real end). `into_graph`: begun with
// cuStreamBeginCaptureToGraph (into an existing graph, after its nodes): never elided.
void transparent_capture_began(CUstream stream, bool per_thread, bool into_graph);
// Before the real end: the graph to hand back instead of the driver's, or nullopt (the kept
// launches, if any, were replayed: the real end returns the live graph).
struct TransparentEnd {
  CUgraph graph = nullptr;
  const graphs::RecordedGraph* recorded = nullptr;  // what it was rebuilt from
};
std::optional<TransparentEnd> transparent_capture_ending(CUstream stream);
// After the real end of a capture transparent_capture_ending handed a graph for: `r` and the
// driver's (empty) graph; returns what the engine gets.
CUresult transparent_capture_ended(CUresult r, CUgraph driver_graph, const TransparentEnd& end,
                                   CUgraph* out);

using LaunchKernelExFn = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

// The launch hooks: nullopt when the call is to be forwarded to the driver.
std::optional<CUresult> transparent_launch(LaunchKernelFn real, CUfunction f, unsigned gx,
                                           unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                           unsigned bz, unsigned shared, CUstream stream,
                                           void** params, void** extra);
// cuLaunchKernelEx(_ptsz): as transparent_launch, the configuration's attributes compared with
// the recorded node's as a set (attributes_differ in the .cpp), kept deep-copied and replayed
// with cuLaunchKernelEx on a fallback.
std::optional<CUresult> transparent_launch_ex(LaunchKernelExFn real, const CUlaunchConfig* config,
                                              CUfunction f, void** params, void** extra);
// The memset hooks (cuMemsetD8/D16/D32Async) and the device-to-device copy hook
// (cuMemcpyDtoDAsync): `call` is the call itself, made if the elision stops.
std::optional<CUresult> transparent_memset(std::function<CUresult()> call, CUdeviceptr dst,
                                           unsigned value, unsigned element_size, size_t count,
                                           CUstream stream);
std::optional<CUresult> transparent_copy(std::function<CUresult()> call, CUdeviceptr dst,
                                         CUdeviceptr src, size_t bytes, CUstream stream);
// A hooked call on `stream` the elision does not model (`what`: the call's name): the elision
// of a capture on it stops first (kept launches replayed).
void transparent_unmodeled(CUstream stream, const char* what);

// cuGraphInstantiate*: the pre-instantiated exec of a graph handed back, when the flags match.
std::optional<CUresult> transparent_instantiate(CUgraphExec* exec, CUgraph graph,
                                                unsigned long long flags);

// At exit: "thaw: graph restore summary: ..." when a capture met a graphs record; what was
// handed back and never instantiated is destroyed.
void transparent_summary_at_exit();

}  // namespace thaw::preload
