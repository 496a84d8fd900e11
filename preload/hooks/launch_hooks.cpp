// Hooks of the calls a transparent graph restore elides or must see
// (preload/restore/transparent_capture.hpp): kernel launches, and the stream operations the
// elision does not model — each stops the elision of a capture on its stream before it is
// forwarded, so the driver sees the kept launches first, as in a live capture — and
// cuGraphInstantiateWithFlags, which hands out the pre-instantiated exec of a graph the
// transparent restore handed back. While nothing is elided each hook is one relaxed atomic load
// and the call to the driver's function.
#include <cuda.h>

#include "preload/interpose/hook_table.hpp"
#include "preload/restore/transparent_capture.hpp"

// cuda.h may map the plain names to the per-thread variants: the shim exports each variant.
#undef cuLaunchKernel
#undef cuLaunchKernelEx
#undef cuEventRecord
#undef cuEventRecordWithFlags
#undef cuStreamWaitEvent
#undef cuLaunchHostFunc
#undef cuGraphLaunch
#undef cuGraphInstantiate
#undef cuStreamGetCaptureInfo
#undef cuGraphInstantiateWithParams
#undef cuMemsetD8Async
#undef cuMemsetD16Async
#undef cuMemsetD32Async
#undef cuMemcpyDtoDAsync

extern "C" {
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig*, CUfunction, void**, void**);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuEventRecordWithFlags_ptsz(CUevent, CUstream, unsigned int);
CUresult cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
CUresult cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void*);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                        const CUgraphNode**, size_t*);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                        const CUgraphNode**, const CUgraphEdgeData**, size_t*);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
}

using namespace thaw::preload;

namespace {

template <typename Fn, typename... Args>
CUresult launch(Hook h, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params,
                void** extra) {
  auto fn = real<LaunchKernelFn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) {
    if (auto r = transparent_launch(fn, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
      return *r;
  }
  return fn(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

// cuLaunchKernelEx: elided like cuLaunchKernel when its attributes are the recorded node's
// (cuBLAS / CUTLASS 3 launch their sm_90 GEMMs this way, with a cluster).
CUresult launch_ex(Hook h, const CUlaunchConfig* config, CUfunction f, void** params,
                   void** extra) {
  auto fn = real<LaunchKernelExFn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) {
    if (auto r = transparent_launch_ex(fn, config, f, params, extra)) return *r;
  }
  return fn(config, f, params, extra);
}

// A stream operation the elision does not model: the capture on `stream` falls back first.
template <typename Fn, typename... Args>
CUresult unmodelled(Hook h, CUstream stream, const char* what, Args... args) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) transparent_unmodeled(stream, what);
  return fn(args...);
}

// A capture-info query that asks for the capture's graph or its dependencies would see what
// the elision left out: the elision stops first. The status and id alone are the driver's own.
template <typename Fn, typename... Rest>
CUresult capture_info(Hook h, CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                      CUgraph* graph, const CUgraphNode** deps, Rest... rest) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding() && (graph != nullptr || deps != nullptr || ((rest != nullptr) || ...))) {
    transparent_unmodeled(stream, "a capture-info query for the graph or its dependencies");
  }
  return fn(stream, status, id, graph, deps, rest...);
}

template <typename Fn>
CUresult instantiate_with_params(Hook h, CUgraphExec* exec, CUgraph graph,
                                 CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // Pre-instantiated: only without an upload stream (the exec was never uploaded).
  if (params != nullptr && params->hUploadStream == nullptr) {
    if (auto r = transparent_instantiate(exec, graph, params->flags)) {
      params->hErrNode_out = nullptr;
      params->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
      return *r;
    }
  }
  return fn(exec, graph, params);
}

template <typename Fn, typename Value>
CUresult memset_async(Hook h, CUdeviceptr dst, Value value, size_t count, CUstream stream) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) {
    if (auto r = transparent_memset([=] { return fn(dst, value, count, stream); }, dst,
                                    static_cast<unsigned>(value), sizeof(Value), count, stream))
      return *r;
  }
  return fn(dst, value, count, stream);
}

template <typename Fn>
CUresult copy_dtod_async(Hook h, CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) {
    if (auto r =
            transparent_copy([=] { return fn(dst, src, bytes, stream); }, dst, src, bytes, stream))
      return *r;
  }
  return fn(dst, src, bytes, stream);
}

}  // namespace

extern "C" {

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params,
                        void** extra) {
  return launch<LaunchKernelFn>(Hook::launch_kernel, f, gx, gy, gz, bx, by, bz, shared, stream,
                                params, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared, CUstream stream,
                             void** params, void** extra) {
  return launch<LaunchKernelFn>(Hook::launch_kernel_ptsz, f, gx, gy, gz, bx, by, bz, shared, stream,
                                params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  return launch_ex(Hook::launch_kernel_ex, config, f, params, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra) {
  return launch_ex(Hook::launch_kernel_ex_ptsz, config, f, params, extra);
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  return unmodelled<decltype(&cuEventRecord)>(Hook::event_record, stream, "cuEventRecord", event,
                                              stream);
}

CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  return unmodelled<decltype(&cuEventRecord_ptsz)>(Hook::event_record_ptsz, stream, "cuEventRecord",
                                                   event, stream);
}

CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  return unmodelled<decltype(&cuEventRecordWithFlags)>(
      Hook::event_record_with_flags, stream, "cuEventRecordWithFlags", event, stream, flags);
}

CUresult cuEventRecordWithFlags_ptsz(CUevent event, CUstream stream, unsigned int flags) {
  return unmodelled<decltype(&cuEventRecordWithFlags_ptsz)>(
      Hook::event_record_with_flags_ptsz, stream, "cuEventRecordWithFlags", event, stream, flags);
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  return unmodelled<decltype(&cuStreamWaitEvent)>(Hook::stream_wait_event, stream,
                                                  "cuStreamWaitEvent", stream, event, flags);
}

CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) {
  return unmodelled<decltype(&cuStreamWaitEvent_ptsz)>(Hook::stream_wait_event_ptsz, stream,
                                                       "cuStreamWaitEvent", stream, event, flags);
}

CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* data) {
  return unmodelled<decltype(&cuLaunchHostFunc)>(Hook::launch_host_func, stream, "cuLaunchHostFunc",
                                                 stream, fn, data);
}

CUresult cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void* data) {
  return unmodelled<decltype(&cuLaunchHostFunc_ptsz)>(Hook::launch_host_func_ptsz, stream,
                                                      "cuLaunchHostFunc", stream, fn, data);
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return unmodelled<decltype(&cuGraphLaunch)>(Hook::graph_launch, stream, "cuGraphLaunch", exec,
                                              stream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return unmodelled<decltype(&cuGraphLaunch_ptsz)>(Hook::graph_launch_ptsz, stream, "cuGraphLaunch",
                                                   exec, stream);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  auto fn = real<decltype(&cuGraphInstantiateWithFlags)>(Hook::graph_instantiate_with_flags);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (auto r = transparent_instantiate(exec, graph, flags)) return *r;
  return fn(exec, graph, flags);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** deps, size_t* count) {
  return capture_info<decltype(&cuStreamGetCaptureInfo_v2)>(Hook::stream_get_capture_info_v2,
                                                            stream, status, id, graph, deps, count);
}

CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        size_t* count) {
  return capture_info<decltype(&cuStreamGetCaptureInfo_v2_ptsz)>(
      Hook::stream_get_capture_info_v2_ptsz, stream, status, id, graph, deps, count);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                   CUgraph* graph, const CUgraphNode** deps,
                                   const CUgraphEdgeData** edges, size_t* count) {
  return capture_info<decltype(&cuStreamGetCaptureInfo_v3)>(
      Hook::stream_get_capture_info_v3, stream, status, id, graph, deps, edges, count);
}

CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        const CUgraphEdgeData** edges, size_t* count) {
  return capture_info<decltype(&cuStreamGetCaptureInfo_v3_ptsz)>(
      Hook::stream_get_capture_info_v3_ptsz, stream, status, id, graph, deps, edges, count);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiate_with_params<decltype(&cuGraphInstantiateWithParams)>(
      Hook::graph_instantiate_with_params, exec, graph, params);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiate_with_params<decltype(&cuGraphInstantiateWithParams_ptsz)>(
      Hook::graph_instantiate_with_params_ptsz, exec, graph, params);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  return memset_async<decltype(&cuMemsetD8Async)>(Hook::memset_d8_async, dst, value, count, stream);
}

CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  return memset_async<decltype(&cuMemsetD8Async_ptsz)>(Hook::memset_d8_async_ptsz, dst, value,
                                                       count, stream);
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
  return memset_async<decltype(&cuMemsetD16Async)>(Hook::memset_d16_async, dst, value, count,
                                                   stream);
}

CUresult cuMemsetD16Async_ptsz(CUdeviceptr dst, unsigned short value, size_t count,
                               CUstream stream) {
  return memset_async<decltype(&cuMemsetD16Async_ptsz)>(Hook::memset_d16_async_ptsz, dst, value,
                                                        count, stream);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  return memset_async<decltype(&cuMemsetD32Async)>(Hook::memset_d32_async, dst, value, count,
                                                   stream);
}

CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  return memset_async<decltype(&cuMemsetD32Async_ptsz)>(Hook::memset_d32_async_ptsz, dst, value,
                                                        count, stream);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy_dtod_async<decltype(&cuMemcpyDtoDAsync_v2)>(Hook::memcpy_dtod_async, dst, src, bytes,
                                                          stream);
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                   CUstream stream) {
  return copy_dtod_async<decltype(&cuMemcpyDtoDAsync_v2_ptsz)>(Hook::memcpy_dtod_async_ptsz, dst,
                                                               src, bytes, stream);
}

}  // extern "C"
