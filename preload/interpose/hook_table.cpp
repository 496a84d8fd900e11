#include "preload/interpose/hook_table.hpp"

#include <cuda.h>

#include <array>
#include <cstring>

#include "preload/interpose/real_driver.hpp"

// cuda.h maps these names to other variants; the table names each variant as exported.
#undef cuStreamBeginCapture
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
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

// The hooks (preload/hooks/*.cpp), exported under the driver's names.
extern "C" {
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetAddressRange_v2(CUdeviceptr*, size_t*, CUdeviceptr);
CUresult cuPointerGetAttribute(void*, CUpointer_attribute, CUdeviceptr);
CUresult cuPointerGetAttributes(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void*, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void*, size_t, CUstream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void*, size_t, CUstream);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr*, CUipcMemHandle, unsigned int);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuMemAddressReserve(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemCreate(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
CUresult cuMemGetAccess(unsigned long long*, const CUmemLocation*, CUdeviceptr);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle*, void*);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuDevicePrimaryCtxRelease(CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxReset(CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph(CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*,
                                     size_t, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode*,
                                          const CUgraphEdgeData*, size_t, CUstreamCaptureMode);
CUresult cuStreamEndCapture(CUstream, CUgraph*);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph*);
CUresult cuModuleLoad(CUmodule*, const char*);
CUresult cuModuleLoadData(CUmodule*, const void*);
CUresult cuModuleLoadDataEx(CUmodule*, const void*, unsigned int, CUjit_option*, void**);
CUresult cuModuleLoadFatBinary(CUmodule*, const void*);
CUresult cuLibraryLoadData(CUlibrary*, const void*, CUjit_option*, void**, unsigned int,
                           CUlibraryOption*, void**, unsigned int);
CUresult cuLibraryLoadFromFile(CUlibrary*, const char*, CUjit_option*, void**, unsigned int,
                               CUlibraryOption*, void**, unsigned int);
// launch_hooks.cpp
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void**, void**);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig*, CUfunction, void**, void**);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuEventRecordWithFlags(CUevent, CUstream, unsigned int);
CUresult cuEventRecordWithFlags_ptsz(CUevent, CUstream, unsigned int);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int);
CUresult cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
CUresult cuLaunchHostFunc(CUstream, CUhostFn, void*);
CUresult cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void*);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGraphInstantiateWithFlags(CUgraphExec*, CUgraph, unsigned long long);
CUresult cuStreamGetCaptureInfo_v2(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                   const CUgraphNode**, size_t*);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                        const CUgraphNode**, size_t*);
CUresult cuStreamGetCaptureInfo_v3(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                   const CUgraphNode**, const CUgraphEdgeData**, size_t*);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                        const CUgraphNode**, const CUgraphEdgeData**, size_t*);
CUresult cuGraphInstantiateWithParams(CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD16Async(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
}

namespace thaw::preload {

namespace {

std::array<HookEntry, static_cast<std::size_t>(Hook::count)>& table() {
  static std::array<HookEntry, static_cast<std::size_t>(Hook::count)> t = {{
      {"cuMemAlloc_v2", reinterpret_cast<void*>(&::cuMemAlloc_v2), {}},
      {"cuMemFree_v2", reinterpret_cast<void*>(&::cuMemFree_v2), {}},
      {"cuMemGetAddressRange_v2", reinterpret_cast<void*>(&::cuMemGetAddressRange_v2), {}},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&::cuPointerGetAttribute), {}},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&::cuPointerGetAttributes), {}},
      {"cuMemcpyHtoD_v2", reinterpret_cast<void*>(&::cuMemcpyHtoD_v2), {}},
      {"cuMemcpyHtoD_v2_ptds", reinterpret_cast<void*>(&::cuMemcpyHtoD_v2_ptds), {}},
      {"cuMemcpyHtoDAsync_v2", reinterpret_cast<void*>(&::cuMemcpyHtoDAsync_v2), {}},
      {"cuMemcpyHtoDAsync_v2_ptsz", reinterpret_cast<void*>(&::cuMemcpyHtoDAsync_v2_ptsz), {}},
      {"cuMemGetInfo_v2", reinterpret_cast<void*>(&::cuMemGetInfo_v2), {}},
      {"cuIpcGetMemHandle", reinterpret_cast<void*>(&::cuIpcGetMemHandle), {}},
      {"cuIpcOpenMemHandle_v2", reinterpret_cast<void*>(&::cuIpcOpenMemHandle_v2), {}},
      {"cuIpcCloseMemHandle", reinterpret_cast<void*>(&::cuIpcCloseMemHandle), {}},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&::cuMemAddressReserve), {}},
      {"cuMemAddressFree", reinterpret_cast<void*>(&::cuMemAddressFree), {}},
      {"cuMemCreate", reinterpret_cast<void*>(&::cuMemCreate), {}},
      {"cuMemRelease", reinterpret_cast<void*>(&::cuMemRelease), {}},
      {"cuMemMap", reinterpret_cast<void*>(&::cuMemMap), {}},
      {"cuMemUnmap", reinterpret_cast<void*>(&::cuMemUnmap), {}},
      {"cuMemSetAccess", reinterpret_cast<void*>(&::cuMemSetAccess), {}},
      {"cuMemGetAccess", reinterpret_cast<void*>(&::cuMemGetAccess), {}},
      {"cuMemRetainAllocationHandle", reinterpret_cast<void*>(&::cuMemRetainAllocationHandle), {}},
      {"cuCtxDestroy_v2", reinterpret_cast<void*>(&::cuCtxDestroy_v2), {}},
      {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&::cuDevicePrimaryCtxRelease), {}},
      {"cuDevicePrimaryCtxRelease_v2",
       reinterpret_cast<void*>(&::cuDevicePrimaryCtxRelease_v2),
       {}},
      {"cuDevicePrimaryCtxReset", reinterpret_cast<void*>(&::cuDevicePrimaryCtxReset), {}},
      {"cuDevicePrimaryCtxReset_v2", reinterpret_cast<void*>(&::cuDevicePrimaryCtxReset_v2), {}},
      {"cuStreamBeginCapture", reinterpret_cast<void*>(&::cuStreamBeginCapture), {}},
      {"cuStreamBeginCapture_ptsz", reinterpret_cast<void*>(&::cuStreamBeginCapture_ptsz), {}},
      {"cuStreamBeginCapture_v2", reinterpret_cast<void*>(&::cuStreamBeginCapture_v2), {}},
      {"cuStreamBeginCapture_v2_ptsz",
       reinterpret_cast<void*>(&::cuStreamBeginCapture_v2_ptsz),
       {}},
      {"cuStreamBeginCaptureToGraph", reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph), {}},
      {"cuStreamBeginCaptureToGraph_ptsz",
       reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph_ptsz),
       {}},
      {"cuStreamEndCapture", reinterpret_cast<void*>(&::cuStreamEndCapture), {}},
      {"cuStreamEndCapture_ptsz", reinterpret_cast<void*>(&::cuStreamEndCapture_ptsz), {}},
      {"cuModuleLoad", reinterpret_cast<void*>(&::cuModuleLoad), {}},
      {"cuModuleLoadData", reinterpret_cast<void*>(&::cuModuleLoadData), {}},
      {"cuModuleLoadDataEx", reinterpret_cast<void*>(&::cuModuleLoadDataEx), {}},
      {"cuModuleLoadFatBinary", reinterpret_cast<void*>(&::cuModuleLoadFatBinary), {}},
      {"cuLibraryLoadData", reinterpret_cast<void*>(&::cuLibraryLoadData), {}},
      {"cuLibraryLoadFromFile", reinterpret_cast<void*>(&::cuLibraryLoadFromFile), {}},
      {"cuLaunchKernel", reinterpret_cast<void*>(&::cuLaunchKernel), {}},
      {"cuLaunchKernel_ptsz", reinterpret_cast<void*>(&::cuLaunchKernel_ptsz), {}},
      {"cuLaunchKernelEx", reinterpret_cast<void*>(&::cuLaunchKernelEx), {}},
      {"cuLaunchKernelEx_ptsz", reinterpret_cast<void*>(&::cuLaunchKernelEx_ptsz), {}},
      {"cuEventRecord", reinterpret_cast<void*>(&::cuEventRecord), {}},
      {"cuEventRecord_ptsz", reinterpret_cast<void*>(&::cuEventRecord_ptsz), {}},
      {"cuEventRecordWithFlags", reinterpret_cast<void*>(&::cuEventRecordWithFlags), {}},
      {"cuEventRecordWithFlags_ptsz", reinterpret_cast<void*>(&::cuEventRecordWithFlags_ptsz), {}},
      {"cuStreamWaitEvent", reinterpret_cast<void*>(&::cuStreamWaitEvent), {}},
      {"cuStreamWaitEvent_ptsz", reinterpret_cast<void*>(&::cuStreamWaitEvent_ptsz), {}},
      {"cuLaunchHostFunc", reinterpret_cast<void*>(&::cuLaunchHostFunc), {}},
      {"cuLaunchHostFunc_ptsz", reinterpret_cast<void*>(&::cuLaunchHostFunc_ptsz), {}},
      {"cuGraphLaunch", reinterpret_cast<void*>(&::cuGraphLaunch), {}},
      {"cuGraphLaunch_ptsz", reinterpret_cast<void*>(&::cuGraphLaunch_ptsz), {}},
      {"cuGraphInstantiateWithFlags", reinterpret_cast<void*>(&::cuGraphInstantiateWithFlags), {}},
      {"cuStreamGetCaptureInfo_v2", reinterpret_cast<void*>(&::cuStreamGetCaptureInfo_v2), {}},
      {"cuStreamGetCaptureInfo_v2_ptsz",
       reinterpret_cast<void*>(&::cuStreamGetCaptureInfo_v2_ptsz),
       {}},
      {"cuStreamGetCaptureInfo_v3", reinterpret_cast<void*>(&::cuStreamGetCaptureInfo_v3), {}},
      {"cuStreamGetCaptureInfo_v3_ptsz",
       reinterpret_cast<void*>(&::cuStreamGetCaptureInfo_v3_ptsz),
       {}},
      {"cuGraphInstantiateWithParams",
       reinterpret_cast<void*>(&::cuGraphInstantiateWithParams),
       {}},
      {"cuGraphInstantiateWithParams_ptsz",
       reinterpret_cast<void*>(&::cuGraphInstantiateWithParams_ptsz),
       {}},
      {"cuMemsetD8Async", reinterpret_cast<void*>(&::cuMemsetD8Async), {}},
      {"cuMemsetD8Async_ptsz", reinterpret_cast<void*>(&::cuMemsetD8Async_ptsz), {}},
      {"cuMemsetD16Async", reinterpret_cast<void*>(&::cuMemsetD16Async), {}},
      {"cuMemsetD16Async_ptsz", reinterpret_cast<void*>(&::cuMemsetD16Async_ptsz), {}},
      {"cuMemsetD32Async", reinterpret_cast<void*>(&::cuMemsetD32Async), {}},
      {"cuMemsetD32Async_ptsz", reinterpret_cast<void*>(&::cuMemsetD32Async_ptsz), {}},
      {"cuMemcpyDtoDAsync_v2", reinterpret_cast<void*>(&::cuMemcpyDtoDAsync_v2), {}},
      {"cuMemcpyDtoDAsync_v2_ptsz", reinterpret_cast<void*>(&::cuMemcpyDtoDAsync_v2_ptsz), {}},
  }};
  return t;
}

}  // namespace

HookEntry& hook_entry(Hook h) {
  return table()[static_cast<std::size_t>(h)];
}

HookEntry* find_hook(std::string_view variant) {
  for (HookEntry& e : table()) {
    if (variant == e.variant) return &e;
  }
  return nullptr;
}

HookEntry* find_hook_by_pointer(const void* hook) {
  for (HookEntry& e : table()) {
    if (e.hook == hook) return &e;
  }
  return nullptr;
}

void* real_function(Hook h) {
  HookEntry& e = hook_entry(h);
  if (void* p = e.real.load(std::memory_order_acquire)) return p;
  void* p = driver_symbol(e.variant);
  // Never our own hook (a lookup that found the shim's export would loop forever).
  if (p == e.hook) return nullptr;
  if (p != nullptr) e.real.store(p, std::memory_order_release);
  return p;
}

}  // namespace thaw::preload
