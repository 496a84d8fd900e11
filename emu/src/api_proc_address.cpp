// cuGetProcAddress: how the CUDA runtime (and PyTorch, and thaw) reach every other
// entry point. A base name plus a CUDA version select one ABI variant; the per-thread
// default-stream flag selects _ptsz/_ptds variants where they exist.
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api_common.hpp"
#include "faults.hpp"

using namespace emu;

namespace {

struct Variant {
  const char* base;
  int version;  // the CUDA version that introduced this ABI (cudaTypedefs.h PFN_<base>_v<N>)
  const char* symbol;
  bool per_thread;
};

// Pre-3.2 (32-bit size) ABIs are not provided: no CUDA runtime of the last decade asks
// for them, and a request that old gets VERSION_NOT_SUFFICIENT.
constexpr Variant kVariants[] = {
    {"cuInit", 2000, "cuInit", false},
    {"cuDriverGetVersion", 2020, "cuDriverGetVersion", false},
    {"cuGetProcAddress", 11030, "cuGetProcAddress", false},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", false},
    {"cuGetErrorName", 6000, "cuGetErrorName", false},
    {"cuGetErrorString", 6000, "cuGetErrorString", false},
    {"cuGetExportTable", 3000, "cuGetExportTable", false},
    {"cuLogsRegisterCallback", 12090, "cuLogsRegisterCallback", false},
    {"cuLogsUnregisterCallback", 12090, "cuLogsUnregisterCallback", false},
    {"cuDeviceGet", 2000, "cuDeviceGet", false},
    {"cuDeviceGetCount", 2000, "cuDeviceGetCount", false},
    {"cuDeviceGetName", 2000, "cuDeviceGetName", false},
    {"cuDeviceGetUuid", 9020, "cuDeviceGetUuid", false},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2", false},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", false},
    {"cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute", false},
    {"cuDeviceGetPCIBusId", 4010, "cuDeviceGetPCIBusId", false},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain", false},
    {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease", false},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2", false},
    {"cuDevicePrimaryCtxReset", 7000, "cuDevicePrimaryCtxReset", false},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2", false},
    {"cuDevicePrimaryCtxSetFlags", 7000, "cuDevicePrimaryCtxSetFlags", false},
    {"cuDevicePrimaryCtxSetFlags", 11000, "cuDevicePrimaryCtxSetFlags_v2", false},
    {"cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState", false},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2", false},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3", false},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4", false},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2", false},
    {"cuCtxGetCurrent", 4000, "cuCtxGetCurrent", false},
    {"cuCtxSetCurrent", 4000, "cuCtxSetCurrent", false},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2", false},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2", false},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice", false},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2", false},
    {"cuCtxGetFlags", 7000, "cuCtxGetFlags", false},
    {"cuCtxGetApiVersion", 3020, "cuCtxGetApiVersion", false},
    {"cuCtxGetStreamPriorityRange", 5050, "cuCtxGetStreamPriorityRange", false},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize", false},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2", false},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", false},
    {"cuMemFree", 3020, "cuMemFree_v2", false},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", false},
    {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2", false},
    {"cuMemAllocHost", 3020, "cuMemAllocHost_v2", false},
    {"cuMemHostAlloc", 2020, "cuMemHostAlloc", false},
    {"cuMemFreeHost", 2000, "cuMemFreeHost", false},
    {"cuMemHostRegister", 6050, "cuMemHostRegister_v2", false},
    {"cuMemHostUnregister", 4000, "cuMemHostUnregister", false},
    {"cuMemHostGetDevicePointer", 3020, "cuMemHostGetDevicePointer_v2", false},
    {"cuMemHostGetFlags", 2030, "cuMemHostGetFlags", false},
    {"cuPointerGetAttribute", 4000, "cuPointerGetAttribute", false},
    {"cuPointerGetAttributes", 7000, "cuPointerGetAttributes", false},
    {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle", false},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2", false},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle", false},
    {"cuMemcpy", 4000, "cuMemcpy", false},
    {"cuMemcpy", 7000, "cuMemcpy_ptds", true},
    {"cuMemcpyAsync", 4000, "cuMemcpyAsync", false},
    {"cuMemcpyAsync", 7000, "cuMemcpyAsync_ptsz", true},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2", false},
    {"cuMemcpyHtoD", 7000, "cuMemcpyHtoD_v2_ptds", true},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2", false},
    {"cuMemcpyDtoH", 7000, "cuMemcpyDtoH_v2_ptds", true},
    {"cuMemcpyDtoD", 3020, "cuMemcpyDtoD_v2", false},
    {"cuMemcpyDtoD", 7000, "cuMemcpyDtoD_v2_ptds", true},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2", false},
    {"cuMemcpyHtoDAsync", 7000, "cuMemcpyHtoDAsync_v2_ptsz", true},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2", false},
    {"cuMemcpyDtoHAsync", 7000, "cuMemcpyDtoHAsync_v2_ptsz", true},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2", false},
    {"cuMemcpyDtoDAsync", 7000, "cuMemcpyDtoDAsync_v2_ptsz", true},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2", false},
    {"cuMemsetD8", 7000, "cuMemsetD8_v2_ptds", true},
    {"cuMemsetD16", 3020, "cuMemsetD16_v2", false},
    {"cuMemsetD16", 7000, "cuMemsetD16_v2_ptds", true},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2", false},
    {"cuMemsetD32", 7000, "cuMemsetD32_v2_ptds", true},
    {"cuMemsetD8Async", 3020, "cuMemsetD8Async", false},
    {"cuMemsetD8Async", 7000, "cuMemsetD8Async_ptsz", true},
    {"cuMemsetD16Async", 3020, "cuMemsetD16Async", false},
    {"cuMemsetD16Async", 7000, "cuMemsetD16Async_ptsz", true},
    {"cuMemsetD32Async", 3020, "cuMemsetD32Async", false},
    {"cuMemsetD32Async", 7000, "cuMemsetD32Async_ptsz", true},
    {"cuStreamWriteValue32", 11070, "cuStreamWriteValue32_v2", false},
    {"cuStreamWriteValue32", 11070, "cuStreamWriteValue32_v2_ptsz", true},
    {"cuStreamWriteValue64", 11070, "cuStreamWriteValue64_v2", false},
    {"cuStreamWriteValue64", 11070, "cuStreamWriteValue64_v2_ptsz", true},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity", false},
    {"cuMemCreate", 10020, "cuMemCreate", false},
    {"cuMemRelease", 10020, "cuMemRelease", false},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve", false},
    {"cuMemAddressFree", 10020, "cuMemAddressFree", false},
    {"cuMemMap", 10020, "cuMemMap", false},
    {"cuMemUnmap", 10020, "cuMemUnmap", false},
    {"cuMemSetAccess", 10020, "cuMemSetAccess", false},
    {"cuMemGetAccess", 10020, "cuMemGetAccess", false},
    {"cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle", false},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, "cuMemGetAllocationPropertiesFromHandle",
     false},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle", false},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle", false},
    {"cuMulticastCreate", 12010, "cuMulticastCreate", false},
    {"cuMulticastGetGranularity", 12010, "cuMulticastGetGranularity", false},
    {"cuMulticastAddDevice", 12010, "cuMulticastAddDevice", false},
    {"cuMulticastBindMem", 12010, "cuMulticastBindMem", false},
    {"cuMulticastBindAddr", 12010, "cuMulticastBindAddr", false},
    {"cuMulticastUnbind", 12010, "cuMulticastUnbind", false},
    {"cuStreamCreate", 2000, "cuStreamCreate", false},
    {"cuStreamCreateWithPriority", 5050, "cuStreamCreateWithPriority", false},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2", false},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize", false},
    {"cuStreamSynchronize", 7000, "cuStreamSynchronize_ptsz", true},
    {"cuStreamQuery", 2000, "cuStreamQuery", false},
    {"cuStreamQuery", 7000, "cuStreamQuery_ptsz", true},
    {"cuStreamWaitEvent", 3020, "cuStreamWaitEvent", false},
    {"cuStreamWaitEvent", 7000, "cuStreamWaitEvent_ptsz", true},
    {"cuStreamAddCallback", 5000, "cuStreamAddCallback", false},
    {"cuStreamAddCallback", 7000, "cuStreamAddCallback_ptsz", true},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc", false},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc_ptsz", true},
    {"cuStreamGetPriority", 5050, "cuStreamGetPriority", false},
    {"cuStreamGetPriority", 7000, "cuStreamGetPriority_ptsz", true},
    {"cuStreamGetFlags", 5050, "cuStreamGetFlags", false},
    {"cuStreamGetFlags", 7000, "cuStreamGetFlags_ptsz", true},
    {"cuStreamGetCtx", 9020, "cuStreamGetCtx", false},
    {"cuStreamGetCtx", 9020, "cuStreamGetCtx_ptsz", true},
    {"cuStreamGetCtx", 12050, "cuStreamGetCtx_v2", false},
    {"cuStreamGetCtx", 12050, "cuStreamGetCtx_v2_ptsz", true},
    {"cuStreamGetDevice", 12080, "cuStreamGetDevice", false},
    {"cuStreamGetDevice", 12080, "cuStreamGetDevice_ptsz", true},
    {"cuStreamGetId", 12000, "cuStreamGetId", false},
    {"cuStreamGetId", 12000, "cuStreamGetId_ptsz", true},
    {"cuEventCreate", 2000, "cuEventCreate", false},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2", false},
    {"cuEventQuery", 2000, "cuEventQuery", false},
    {"cuEventSynchronize", 2000, "cuEventSynchronize", false},
    {"cuEventRecord", 2000, "cuEventRecord", false},
    {"cuEventRecord", 7000, "cuEventRecord_ptsz", true},
    {"cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags", false},
    {"cuEventRecordWithFlags", 11010, "cuEventRecordWithFlags_ptsz", true},
    {"cuEventElapsedTime", 2000, "cuEventElapsedTime", false},
    {"cuEventElapsedTime", 12080, "cuEventElapsedTime_v2", false},
    {"cuModuleLoad", 2000, "cuModuleLoad", false},
    {"cuModuleLoadData", 2000, "cuModuleLoadData", false},
    {"cuModuleLoadDataEx", 2010, "cuModuleLoadDataEx", false},
    {"cuModuleLoadFatBinary", 2000, "cuModuleLoadFatBinary", false},
    {"cuModuleUnload", 2000, "cuModuleUnload", false},
    {"cuModuleGetFunction", 2000, "cuModuleGetFunction", false},
    {"cuModuleGetFunctionCount", 12040, "cuModuleGetFunctionCount", false},
    {"cuModuleEnumerateFunctions", 12040, "cuModuleEnumerateFunctions", false},
    {"cuModuleGetGlobal", 3020, "cuModuleGetGlobal_v2", false},
    {"cuFuncGetName", 12030, "cuFuncGetName", false},
    {"cuFuncGetParamInfo", 12040, "cuFuncGetParamInfo", false},
    {"cuFuncGetModule", 11000, "cuFuncGetModule", false},
    {"cuFuncIsLoaded", 12040, "cuFuncIsLoaded", false},
    {"cuFuncLoad", 12040, "cuFuncLoad", false},
    {"cuFuncGetAttribute", 2020, "cuFuncGetAttribute", false},
    {"cuFuncSetAttribute", 9000, "cuFuncSetAttribute", false},
    {"cuFuncSetCacheConfig", 3000, "cuFuncSetCacheConfig", false},
    {"cuLibraryLoadData", 12000, "cuLibraryLoadData", false},
    {"cuLibraryLoadFromFile", 12000, "cuLibraryLoadFromFile", false},
    {"cuLibraryUnload", 12000, "cuLibraryUnload", false},
    {"cuLibraryGetKernel", 12000, "cuLibraryGetKernel", false},
    {"cuLibraryGetKernelCount", 12040, "cuLibraryGetKernelCount", false},
    {"cuLibraryEnumerateKernels", 12040, "cuLibraryEnumerateKernels", false},
    {"cuLibraryGetModule", 12000, "cuLibraryGetModule", false},
    {"cuKernelGetFunction", 12000, "cuKernelGetFunction", false},
    {"cuKernelGetName", 12030, "cuKernelGetName", false},
    {"cuKernelGetParamInfo", 12040, "cuKernelGetParamInfo", false},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", false},
    {"cuLaunchKernel", 7000, "cuLaunchKernel_ptsz", true},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", false},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx_ptsz", true},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel", false},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel_ptsz", true},
    {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture", false},
    {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture_ptsz", true},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2", false},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2_ptsz", true},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture", false},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture_ptsz", true},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing", false},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing_ptsz", true},
    {"cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo", false},
    {"cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo_ptsz", true},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2", false},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2_ptsz", true},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3", false},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3_ptsz", true},
    {"cuThreadExchangeStreamCaptureMode", 10010, "cuThreadExchangeStreamCaptureMode", false},
    {"cuGraphCreate", 10000, "cuGraphCreate", false},
    {"cuGraphDestroy", 10000, "cuGraphDestroy", false},
    {"cuGraphAddKernelNode", 10000, "cuGraphAddKernelNode", false},
    {"cuGraphAddKernelNode", 12000, "cuGraphAddKernelNode_v2", false},
    {"cuGraphAddMemsetNode", 10000, "cuGraphAddMemsetNode", false},
    {"cuGraphAddMemcpyNode", 10000, "cuGraphAddMemcpyNode", false},
    {"cuGraphAddHostNode", 10000, "cuGraphAddHostNode", false},
    {"cuGraphAddEmptyNode", 10000, "cuGraphAddEmptyNode", false},
    {"cuGraphAddEventRecordNode", 11010, "cuGraphAddEventRecordNode", false},
    {"cuGraphAddEventWaitNode", 11010, "cuGraphAddEventWaitNode", false},
    {"cuGraphAddDependencies", 10000, "cuGraphAddDependencies", false},
    {"cuGraphAddDependencies", 12030, "cuGraphAddDependencies_v2", false},
    {"cuGraphGetNodes", 10000, "cuGraphGetNodes", false},
    {"cuGraphGetRootNodes", 10000, "cuGraphGetRootNodes", false},
    {"cuGraphGetEdges", 10000, "cuGraphGetEdges", false},
    {"cuGraphGetEdges", 12030, "cuGraphGetEdges_v2", false},
    {"cuGraphNodeGetType", 10000, "cuGraphNodeGetType", false},
    {"cuGraphKernelNodeGetParams", 10000, "cuGraphKernelNodeGetParams", false},
    {"cuGraphKernelNodeGetParams", 12000, "cuGraphKernelNodeGetParams_v2", false},
    {"cuGraphKernelNodeSetParams", 10000, "cuGraphKernelNodeSetParams", false},
    {"cuGraphKernelNodeSetParams", 12000, "cuGraphKernelNodeSetParams_v2", false},
    {"cuGraphMemsetNodeGetParams", 10000, "cuGraphMemsetNodeGetParams", false},
    {"cuGraphMemsetNodeSetParams", 10000, "cuGraphMemsetNodeSetParams", false},
    {"cuGraphMemcpyNodeGetParams", 10000, "cuGraphMemcpyNodeGetParams", false},
    {"cuGraphMemcpyNodeSetParams", 10000, "cuGraphMemcpyNodeSetParams", false},
    {"cuGraphKernelNodeGetAttribute", 11000, "cuGraphKernelNodeGetAttribute", false},
    {"cuGraphKernelNodeSetAttribute", 11000, "cuGraphKernelNodeSetAttribute", false},
    {"cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags", false},
    {"cuGraphLaunch", 10000, "cuGraphLaunch", false},
    {"cuGraphLaunch", 10000, "cuGraphLaunch_ptsz", true},
    {"cuGraphExecDestroy", 10000, "cuGraphExecDestroy", false},
    {"cuGraphExecUpdate", 12000, "cuGraphExecUpdate_v2", false},
    {"cuGraphExecKernelNodeSetParams", 10010, "cuGraphExecKernelNodeSetParams", false},
    {"cuGraphExecKernelNodeSetParams", 12000, "cuGraphExecKernelNodeSetParams_v2", false},
    {"cuGraphExecMemsetNodeSetParams", 10020, "cuGraphExecMemsetNodeSetParams", false},
    {"cuGraphExecMemcpyNodeSetParams", 10020, "cuGraphExecMemcpyNodeSetParams", false},
    {"cuGraphClone", 10000, "cuGraphClone", false},
    {"cuGraphDebugDotPrint", 11030, "cuGraphDebugDotPrint", false},
};

// Our own definition of `symbol`. Looked up through this library's handle, not the
// global scope, so an LD_PRELOAD interposer of cu* gets the driver's functions here
// exactly as it would from NVIDIA's driver.
void* own_symbol(const char* symbol) {
  static void* self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&own_symbol), &info);
    return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  }();
  return self == nullptr ? nullptr : dlsym(self, symbol);
}

struct Lookup {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
};

Lookup find(const char* symbol, int version, bool per_thread) {
  const Variant* best = nullptr;
  bool known = false;
  for (const auto& v : kVariants) {
    if (std::strcmp(v.base, symbol) != 0) continue;
    known = true;
    if (v.version > version || (v.per_thread && !per_thread)) continue;
    // Prefer a per-thread variant when asked for one; else the newest ABI.
    if (best == nullptr || (v.per_thread && !best->per_thread) ||
        (v.per_thread == best->per_thread && v.version > best->version)) {
      best = &v;
    }
  }
  if (best == nullptr) {
    return {nullptr, known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                           : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND};
  }
  void* fn = own_symbol(best->symbol);
  return {fn, fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND};
}

CUresult get_proc_address(const char* symbol, void** pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status, Call& c) {
  c.arg("symbol", symbol).arg("version", version).arg("flags", flags);
  if (symbol == nullptr || pfn == nullptr || version <= 0 || version > kDriverVersion) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM &&
      flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Lookup r = find(symbol, version, flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  *pfn = r.fn;
  if (status != nullptr) *status = r.status;
  c.out("status", r.status);
  return CUDA_SUCCESS;
}

}  // namespace

bool emu::is_driver_function(const std::string& base_name) {
  for (const auto& v : kVariants) {
    if (base_name == v.base) return true;
  }
  return false;
}

// The CUDA 12 form: unknown symbols are not an error, the status says why pfn is NULL.
EMU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* symbolStatus) {
  return api("cuGetProcAddress", [&](Call& c) {
    return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus, c);
  });
}

// The CUDA 11.3 form has no status: a symbol it cannot return is CUDA_ERROR_NOT_FOUND.
#undef cuGetProcAddress
EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags) {
  return api("cuGetProcAddress", [&](Call& c) {
    CUdriverProcAddressQueryResult status;
    CUresult r = get_proc_address(symbol, pfn, cudaVersion, flags, &status, c);
    if (r == CUDA_SUCCESS && status != CU_GET_PROC_ADDRESS_SUCCESS) return CUDA_ERROR_NOT_FOUND;
    return r;
  });
}

// For tests: every (base, version, symbol) the table holds, one per line.
EMU_EXPORT const char* thawEmuProcAddressTable() {
  static std::string text = [] {
    std::string s;
    for (const auto& v : kVariants) {
      s += std::string(v.base) + " " + std::to_string(v.version) + " " + v.symbol + "\n";
    }
    return s;
  }();
  return text.c_str();
}
