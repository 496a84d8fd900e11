// Hooks of stream capture: they keep the runtime's StreamCaptures — which captures are in
// progress, in which mode, begun by which thread — so that the memory hooks can tell when
// the driver would refuse an allocation (see stream_captures.hpp), and they tell the graph
// recorder (preload/artifact/graph_recorder.hpp) where the layout's allocation sequence
// stood when a capture began and which graph it ended with. The calls themselves pass to
// the driver unchanged; only their outcome is read, with the driver's own queries: the
// capture id of a stream (cuStreamGetCaptureInfo) after a capture began, and again after
// cuStreamEndCapture, which ends the capture on success and on most errors alike.
#include "preload/hooks/capture_hooks.hpp"

#include <cuda.h>

#include <optional>

#include "preload/interpose/hook_table.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/restore/transparent_capture.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

// cuda.h maps the plain names to the newest (or per-thread) variants: the shim exports each
// variant under its own name.
#undef cuStreamBeginCapture
#undef cuStreamBeginCaptureToGraph
#undef cuStreamEndCapture

// The per-thread-default-stream variants, declared by cuda.h only in that build.
extern "C" {
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode*,
                                          const CUgraphEdgeData*, size_t, CUstreamCaptureMode);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph*);
}

using namespace thaw::preload;

namespace {

using CaptureInfoV3 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                   const CUgraphNode**, const CUgraphEdgeData**, size_t*);
using CaptureInfoV2 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                   const CUgraphNode**, size_t*);

// The id of the capture `stream` takes part in (active or invalidated), as the caller's own
// variant (`per_thread`: the _ptsz one, where stream 0 is this thread's default stream)
// resolves the handle; nullopt when it takes part in none or the driver cannot say.
std::optional<cuuint64_t> capture_id(CUstream stream, bool per_thread) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUresult r = CUDA_ERROR_NOT_FOUND;
  if (auto v3 = reinterpret_cast<CaptureInfoV3>(driver_symbol(
          per_thread ? "cuStreamGetCaptureInfo_v3_ptsz" : "cuStreamGetCaptureInfo_v3"))) {
    r = v3(stream, &status, &id, nullptr, nullptr, nullptr, nullptr);
  } else if (auto v2 = reinterpret_cast<CaptureInfoV2>(driver_symbol(
                 per_thread ? "cuStreamGetCaptureInfo_v2_ptsz" : "cuStreamGetCaptureInfo_v2"))) {
    r = v2(stream, &status, &id, nullptr, nullptr, nullptr);
  }
  if (r != CUDA_SUCCESS || status == CU_STREAM_CAPTURE_STATUS_NONE) return std::nullopt;
  return id;
}

// The calling thread's capture interaction mode, as the driver keeps it: exchanged out and
// back (the mode is the thread's own, so nothing else sees the exchange).
CUstreamCaptureMode thread_capture_mode() {
  using Exchange = CUresult (*)(CUstreamCaptureMode*);
  auto exchange = reinterpret_cast<Exchange>(driver_symbol("cuThreadExchangeStreamCaptureMode"));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (exchange == nullptr || exchange(&mode) != CUDA_SUCCESS) {
    return CU_STREAM_CAPTURE_MODE_GLOBAL;  // every thread's default
  }
  CUstreamCaptureMode back = mode;
  (void)exchange(&back);
  return mode;
}

// Allocations the deterministic layout has served so far (0 with none).
std::uint64_t layout_allocations() {
  DeterministicLayout* layout = runtime().layout();
  return layout != nullptr ? layout->allocations() : 0;
}

bool layout_active() {
  DeterministicLayout* layout = runtime().layout();
  return layout != nullptr && layout->active();
}

// After a successful begin: the capture the stream now takes part in, for the unsafe-call
// rules (not RELAXED ones) and for the graph recorder (where the layout's sequence stands).
CUresult began(CUresult r, CUstream stream, CUstreamCaptureMode mode, bool per_thread,
               bool into_graph = false) {
  if (r != CUDA_SUCCESS || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  // A capture whose launches may be a recorded graph's: elided (transparent_capture.hpp).
  transparent_capture_began(stream, per_thread, into_graph);
  GraphRecorder* graphs = config().disabled ? nullptr : runtime().graph_recorder();
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED && graphs == nullptr) return r;
  const std::optional<cuuint64_t> id = capture_id(stream, per_thread);
  if (!id) return r;
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED) runtime().captures().began(*id, mode);
  if (graphs != nullptr) graphs->capture_began(*id, layout_allocations());
  return r;
}

// The capture ends: forgotten by the unsafe-call rules, and the graph the driver returns is
// recorded (walked now: engines destroy it as soon as it is instantiated).
template <typename End>
CUresult end(End end_capture, CUstream stream, CUgraph* graph, bool per_thread) {
  if (ReentryGuard::inside()) return end_capture();
  // An elided capture (transparent_capture.hpp): either its kept launches are replayed now (the
  // driver then returns the live graph) or the driver's empty graph is replaced by the
  // restored one.
  std::optional<TransparentEnd> restored;
  if (eliding() && graph != nullptr) {
    ReentryGuard guard;
    restored = transparent_capture_ending(stream);
  }
  GraphRecorder* graphs = config().disabled ? nullptr : runtime().graph_recorder();
  // Nothing kept (no restricting capture, or only relaxed ones) and nothing recorded.
  if (!restored && !runtime().captures().any() && graphs == nullptr) return end_capture();
  ReentryGuard guard;
  const std::optional<cuuint64_t> before = capture_id(stream, per_thread);
  CUresult r = end_capture();
  if (restored) r = transparent_capture_ended(r, *graph, *restored, graph);
  // Whatever the answer, the capture is over once the stream no longer takes part in it.
  if (before && capture_id(stream, per_thread) != before) runtime().captures().ended(*before);
  if (r == CUDA_SUCCESS && before && graphs != nullptr && graph != nullptr && *graph != nullptr) {
    graphs->capture_ended(*before, *graph, layout_active(),
                          restored ? restored->recorded : nullptr);
  }
  return r;
}

}  // namespace

namespace thaw::preload {

bool capture_restricts_unsafe_calls() {
  StreamCaptures& captures = runtime().captures();
  if (!captures.any()) return false;
  return captures.restricts(thread_capture_mode());
}

}  // namespace thaw::preload

extern "C" {

// The original entry point has no mode: its captures are GLOBAL.
CUresult cuStreamBeginCapture(CUstream stream) {
  auto fn = real<decltype(&cuStreamBeginCapture)>(Hook::stream_begin_capture);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream), stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  auto fn = real<decltype(&cuStreamBeginCapture_ptsz)>(Hook::stream_begin_capture_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream), stream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  auto fn = real<decltype(&cuStreamBeginCapture_v2)>(Hook::stream_begin_capture_v2);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream, mode), stream, mode, false);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  auto fn = real<decltype(&cuStreamBeginCapture_v2_ptsz)>(Hook::stream_begin_capture_v2_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream, mode), stream, mode, true);
}

CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                     const CUgraphNode* dependencies, const CUgraphEdgeData* edges,
                                     size_t count, CUstreamCaptureMode mode) {
  auto fn = real<decltype(&cuStreamBeginCaptureToGraph)>(Hook::stream_begin_capture_to_graph);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream, graph, dependencies, edges, count, mode), stream, mode, false, true);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                          const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* edges, size_t count,
                                          CUstreamCaptureMode mode) {
  auto fn =
      real<decltype(&cuStreamBeginCaptureToGraph_ptsz)>(Hook::stream_begin_capture_to_graph_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return began(fn(stream, graph, dependencies, edges, count, mode), stream, mode, true, true);
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  auto fn = real<decltype(&cuStreamEndCapture)>(Hook::stream_end_capture);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return end([&] { return fn(stream, graph); }, stream, graph, false);
}

CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  auto fn = real<decltype(&cuStreamEndCapture_ptsz)>(Hook::stream_end_capture_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return end([&] { return fn(stream, graph); }, stream, graph, true);
}

}  // extern "C"
