// The reference engine's access to the CUDA driver, the way the CUDA runtime gets it.
//
// Default build: dlopen("libcuda.so.1") (or $REFENGINE_LIBCUDA), dlsym("cuGetProcAddress_v2"),
// then every other entry point through cuGetProcAddress_v2 with cudaVersion 12080 (a CUDA 12.8
// runtime's view) and CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, so calls taking a stream
// resolve to their _ptsz/_ptds variants. Built with REFENGINE_LINK_DRIVER (target
// refengine_runtime_linked) it calls the cu* functions directly instead, linked against
// libcuda.so.1 at link time (per-thread default stream too: CUDA_API_PER_THREAD_DEFAULT_STREAM).
//
// The engine is a third-party program: nothing here knows about thaw.
#pragma once

#ifdef REFENGINE_LINK_DRIVER
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#endif
#endif
#include <cuda.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace refengine {

// Every entry point the engine uses: X(member, base name). The member's type is the function
// type cuda.h declares for the base name's current ABI (the same as the PFN_<name>_v<N> type
// of cudaTypedefs.h for the variant cuGetProcAddress returns at version 12080).
#define REFENGINE_DRIVER_FUNCTIONS(X)                                       \
  X(init, cuInit)                                                           \
  X(driver_get_version, cuDriverGetVersion)                                 \
  X(get_error_name, cuGetErrorName)                                         \
  X(get_error_string, cuGetErrorString)                                     \
  X(device_get, cuDeviceGet)                                                \
  X(device_get_count, cuDeviceGetCount)                                     \
  X(device_get_name, cuDeviceGetName)                                       \
  X(device_get_attribute, cuDeviceGetAttribute)                             \
  X(device_total_mem, cuDeviceTotalMem)                                     \
  X(primary_ctx_retain, cuDevicePrimaryCtxRetain)                           \
  X(primary_ctx_release, cuDevicePrimaryCtxRelease)                         \
  X(ctx_set_current, cuCtxSetCurrent)                                       \
  X(ctx_get_current, cuCtxGetCurrent)                                       \
  X(mem_alloc, cuMemAlloc)                                                  \
  X(mem_free, cuMemFree)                                                    \
  X(mem_get_info, cuMemGetInfo)                                             \
  X(mem_get_address_range, cuMemGetAddressRange)                            \
  X(mem_host_alloc, cuMemHostAlloc)                                         \
  X(mem_free_host, cuMemFreeHost)                                           \
  X(memcpy_htod, cuMemcpyHtoD)                                              \
  X(memcpy_dtoh, cuMemcpyDtoH)                                              \
  X(memcpy_htod_async, cuMemcpyHtoDAsync)                                   \
  X(memcpy_dtoh_async, cuMemcpyDtoHAsync)                                   \
  X(memcpy_dtod_async, cuMemcpyDtoDAsync)                                   \
  X(memset_d8, cuMemsetD8)                                                  \
  X(memset_d8_async, cuMemsetD8Async)                                       \
  X(memset_d32_async, cuMemsetD32Async)                                     \
  X(stream_create, cuStreamCreate)                                          \
  X(stream_destroy, cuStreamDestroy)                                        \
  X(stream_synchronize, cuStreamSynchronize)                                \
  X(stream_wait_event, cuStreamWaitEvent)                                   \
  X(event_create, cuEventCreate)                                            \
  X(event_destroy, cuEventDestroy)                                          \
  X(event_record, cuEventRecord)                                            \
  X(event_synchronize, cuEventSynchronize)                                  \
  X(event_elapsed_time, cuEventElapsedTime)                                 \
  X(module_load_data, cuModuleLoadData)                                     \
  X(module_unload, cuModuleUnload)                                          \
  X(module_get_function, cuModuleGetFunction)                               \
  X(library_load_data, cuLibraryLoadData)                                   \
  X(library_unload, cuLibraryUnload)                                        \
  X(library_get_kernel, cuLibraryGetKernel)                                 \
  X(kernel_get_function, cuKernelGetFunction)                               \
  X(launch_kernel, cuLaunchKernel)                                          \
  X(stream_begin_capture, cuStreamBeginCapture)                             \
  X(stream_end_capture, cuStreamEndCapture)                                 \
  X(stream_is_capturing, cuStreamIsCapturing)                               \
  X(thread_exchange_stream_capture_mode, cuThreadExchangeStreamCaptureMode) \
  X(graph_instantiate, cuGraphInstantiateWithFlags)                         \
  X(graph_launch, cuGraphLaunch)                                            \
  X(graph_exec_destroy, cuGraphExecDestroy)                                 \
  X(graph_destroy, cuGraphDestroy)                                          \
  X(mem_get_allocation_granularity, cuMemGetAllocationGranularity)          \
  X(mem_create, cuMemCreate)                                                \
  X(mem_release, cuMemRelease)                                              \
  X(mem_address_reserve, cuMemAddressReserve)                               \
  X(mem_address_free, cuMemAddressFree)                                     \
  X(mem_map, cuMemMap)                                                      \
  X(mem_unmap, cuMemUnmap)                                                  \
  X(mem_set_access, cuMemSetAccess)                                         \
  X(mem_export_to_shareable_handle, cuMemExportToShareableHandle)           \
  X(mem_import_from_shareable_handle, cuMemImportFromShareableHandle)       \
  X(mem_retain_allocation_handle, cuMemRetainAllocationHandle)

// A driver call that failed: the call's description and the driver's name/string for the code.
class DriverError : public std::runtime_error {
 public:
  DriverError(CUresult code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  CUresult code() const { return code_; }

 private:
  CUresult code_;
};

class Driver {
 public:
  // The CUDA version whose ABI this engine asks cuGetProcAddress for.
  static constexpr int kCudaVersion = 12080;

  // Loads the driver and resolves every entry point; throws std::runtime_error when the
  // library or cuGetProcAddress_v2 cannot be found, or a required entry point is missing.
  Driver();
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // "what: CUDA_ERROR_X (description)"; for CUDA_SUCCESS just "what: CUDA_SUCCESS".
  std::string error_message(CUresult r, std::string_view what) const;
  // Throws DriverError(error_message(r, what)) unless r is CUDA_SUCCESS.
  void check(CUresult r, std::string_view what) const;

  // Where the entry points came from: the dlopen'ed file, or "linked".
  const std::string& source() const { return source_; }
  // A symbol the driver exports beside the CUDA API (thaw's emulator's thawEmu* inspection
  // calls), or null: looked up with dlsym(RTLD_DEFAULT), then in the library this table was
  // loaded from (dlopen'ed RTLD_LOCAL, so the first lookup does not see it).
  void* extension(const char* name) const;

#define REFENGINE_DRIVER_MEMBER(member, sym) decltype(&::sym) member = nullptr;
  REFENGINE_DRIVER_FUNCTIONS(REFENGINE_DRIVER_MEMBER)
#undef REFENGINE_DRIVER_MEMBER

 private:
  void* handle_ = nullptr;
  std::string source_;
};

}  // namespace refengine
