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

extern "C" {
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig*, CUfunction, void**, void**);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuEventRecordWithFlags_ptsz(CUevent, CUstream, unsigned int);
CUresult cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
CUresult cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void*);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
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

// A stream operation the elision does not model: the capture on `stream` falls back first.
template <typename Fn, typename... Args>
CUresult unmodelled(Hook h, CUstream stream, const char* what, Args... args) {
  auto fn = real<Fn>(h);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (eliding()) transparent_unmodeled(stream, what);
  return fn(args...);
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
  return unmodelled<decltype(&cuLaunchKernelEx)>(Hook::launch_kernel_ex,
                                                 config ? config->hStream : nullptr,
                                                 "cuLaunchKernelEx", config, f, params, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra) {
  return unmodelled<decltype(&cuLaunchKernelEx_ptsz)>(Hook::launch_kernel_ex_ptsz,
                                                      config ? config->hStream : nullptr,
                                                      "cuLaunchKernelEx", config, f, params, extra);
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

}  // extern "C"
