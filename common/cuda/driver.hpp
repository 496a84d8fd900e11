// The CUDA driver table every thaw component uses.
//
// thaw never links -lcuda. Driver::load() dlopen()s the driver (NVIDIA's libcuda.so.1,
// or whatever $THAW_LIBCUDA names, e.g. the emulator built from emu/) and resolves
// each entry point the way the CUDA runtime does: dlsym() of cuGetProcAddress_v2 only,
// and everything else through it. The calls are typed and return
// std::expected<T, CudaError>, with the error's name and text from the driver.
//
// A Driver is immutable after load() and safe to share between threads; the CUDA
// driver itself keeps per-thread state (the current context).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/cuda/error.hpp"

namespace thaw::cuda {

// The CUDA version whose ABI this code was written against. It is passed to
// cuGetProcAddress explicitly rather than taken from CUDA_VERSION: the version picks
// which ABI variant of a function the driver hands back (cuMemAlloc → cuMemAlloc_v2,
// cuCtxSynchronize → cuCtxSynchronize_v2 at 13000), and that must match the PFN types
// the pointers are stored as, whatever header a later build happens to use.
inline constexpr int kCudaVersion = 13000;

// Name of the environment variable that overrides the library to load.
inline constexpr const char* kLibcudaEnv = "THAW_LIBCUDA";
// What is loaded when neither a path nor $THAW_LIBCUDA is given: the driver's SONAME.
inline constexpr const char* kDefaultLibcuda = "libcuda.so.1";

// cuCtxGetStreamPriorityRange: lower numbers are higher priorities (greatest <= least).
struct StreamPriorityRange {
  int least = 0;
  int greatest = 0;
};

struct MemInfo {
  size_t free = 0;
  size_t total = 0;
};

class Driver {
 public:
  // Loads `path`, else $THAW_LIBCUDA, else libcuda.so.1 (dlopen RTLD_LOCAL, so the
  // driver's symbols never leak into the global namespace, where an LD_PRELOAD shim or
  // a second driver could pick them up), and resolves every entry point this class
  // wraps. Fails if the library cannot be loaded, is not a CUDA 12+ driver, or lacks
  // any wrapped entry point at kCudaVersion. Loading twice gives two tables over the
  // same driver instance (the dynamic linker loads a library once per process).
  static std::expected<std::shared_ptr<Driver>, CudaError> load(std::string_view path = {});

  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // The path handed to dlopen().
  const std::string& path() const { return path_; }

  // An entry point this class does not wrap, by base name ("cuMemsetD32Async"),
  // resolved at kCudaVersion; nullptr if the driver has none. Cast it to the
  // PFN_<name>_v<version> type of cudaTypedefs.h that kCudaVersion selects.
  void* raw(const char* base_name) const;
  // A non-CUDA symbol of the loaded library (e.g. the emulator's thawEmuGetDeviceStats),
  // by dlsym() on its handle: RTLD_LOCAL keeps it out of dlsym(RTLD_DEFAULT, ...).
  void* symbol(const char* name) const;

  // The error for `code` returned by `call`, named by the driver.
  CudaError error(CUresult code, std::string_view call) const;

  // Initialization and devices.
  std::expected<void, CudaError> init(unsigned int flags = 0) const;
  std::expected<int, CudaError> driver_version() const;
  std::expected<int, CudaError> device_count() const;
  std::expected<CUdevice, CudaError> device_get(int ordinal) const;
  std::expected<std::string, CudaError> device_name(CUdevice dev) const;
  std::expected<size_t, CudaError> device_total_mem(CUdevice dev) const;
  std::expected<int, CudaError> device_attribute(CUdevice dev, CUdevice_attribute attr) const;
  std::expected<CUuuid, CudaError> device_uuid(CUdevice dev) const;

  // Contexts.
  std::expected<CUcontext, CudaError> primary_ctx_retain(CUdevice dev) const;
  std::expected<void, CudaError> primary_ctx_release(CUdevice dev) const;
  std::expected<void, CudaError> ctx_set_current(CUcontext ctx) const;
  std::expected<CUcontext, CudaError> ctx_get_current() const;
  // nullptr: the calling thread's current context.
  std::expected<void, CudaError> ctx_synchronize(CUcontext ctx = nullptr) const;

  // Memory (of the current context's device).
  std::expected<MemInfo, CudaError> mem_get_info() const;
  std::expected<CUdeviceptr, CudaError> mem_alloc(size_t bytes) const;
  std::expected<void, CudaError> mem_free(CUdeviceptr ptr) const;
  std::expected<void*, CudaError> mem_host_alloc(size_t bytes, unsigned int flags = 0) const;
  std::expected<void, CudaError> mem_free_host(void* ptr) const;

  // Copies and memset. The synchronous forms use the legacy default stream.
  std::expected<void, CudaError> memcpy_htod(CUdeviceptr dst, const void* src, size_t bytes) const;
  std::expected<void, CudaError> memcpy_dtoh(void* dst, CUdeviceptr src, size_t bytes) const;
  std::expected<void, CudaError> memcpy_htod_async(CUdeviceptr dst, const void* src, size_t bytes,
                                                   CUstream stream) const;
  std::expected<void, CudaError> memcpy_dtoh_async(void* dst, CUdeviceptr src, size_t bytes,
                                                   CUstream stream) const;
  std::expected<void, CudaError> memset_d8(CUdeviceptr dst, unsigned char value,
                                           size_t count) const;

  // Streams and events.
  std::expected<CUstream, CudaError> stream_create(unsigned int flags = CU_STREAM_DEFAULT) const;
  // Priority between stream_priority_range()'s greatest and least (the current context's).
  std::expected<CUstream, CudaError> stream_create_with_priority(unsigned int flags,
                                                                 int priority) const;
  std::expected<StreamPriorityRange, CudaError> stream_priority_range() const;
  std::expected<void, CudaError> stream_destroy(CUstream stream) const;
  std::expected<void, CudaError> stream_synchronize(CUstream stream) const;
  std::expected<CUevent, CudaError> event_create(unsigned int flags = CU_EVENT_DEFAULT) const;
  std::expected<void, CudaError> event_record(CUevent event, CUstream stream = nullptr) const;
  std::expected<void, CudaError> event_synchronize(CUevent event) const;
  std::expected<float, CudaError> event_elapsed_ms(CUevent start, CUevent end) const;
  std::expected<void, CudaError> event_destroy(CUevent event) const;

  // Virtual memory management (cuMem*): physical allocations mapped into reserved VA.
  std::expected<size_t, CudaError> allocation_granularity(
      const CUmemAllocationProp& prop,
      CUmemAllocationGranularity_flags option = CU_MEM_ALLOC_GRANULARITY_MINIMUM) const;
  std::expected<CUmemGenericAllocationHandle, CudaError> mem_create(
      size_t bytes, const CUmemAllocationProp& prop) const;
  std::expected<void, CudaError> mem_release(CUmemGenericAllocationHandle handle) const;
  std::expected<CUdeviceptr, CudaError> address_reserve(size_t bytes, size_t alignment = 0,
                                                        CUdeviceptr fixed_addr = 0) const;
  std::expected<void, CudaError> address_free(CUdeviceptr ptr, size_t bytes) const;
  std::expected<void, CudaError> mem_map(CUdeviceptr ptr, size_t bytes, size_t offset,
                                         CUmemGenericAllocationHandle handle) const;
  std::expected<void, CudaError> mem_unmap(CUdeviceptr ptr, size_t bytes) const;
  std::expected<void, CudaError> mem_set_access(CUdeviceptr ptr, size_t bytes,
                                                std::span<const CUmemAccessDesc> access) const;
  // Read-write access for one device: what nearly every caller wants.
  std::expected<void, CudaError> mem_set_access(CUdeviceptr ptr, size_t bytes, CUdevice dev) const;
  // A POSIX file descriptor for the allocation (the caller owns and closes it). The
  // allocation must have been created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
  std::expected<int, CudaError> export_to_fd(CUmemGenericAllocationHandle handle) const;
  // A new handle for the allocation behind `fd` (which stays open: the caller closes
  // it). Each imported handle needs its own mem_release().
  std::expected<CUmemGenericAllocationHandle, CudaError> import_from_fd(int fd) const;
  // A new reference to the allocation mapped at `addr` (any address inside a mapping).
  std::expected<CUmemGenericAllocationHandle, CudaError> retain_allocation_handle(void* addr) const;
  std::expected<CUmemAllocationProp, CudaError> allocation_properties(
      CUmemGenericAllocationHandle handle) const;

 private:
  struct EntryPoints;  // typed function pointers (cudaTypedefs.h), defined in driver.cpp

  Driver(void* library, std::string path);

  void* library_ = nullptr;  // dlopen() handle, dlclose()d by the destructor
  std::string path_;
  std::unique_ptr<EntryPoints> fn_;
};

// Pinned device memory on `dev`, exportable as `handle_types` (a bit set of
// CUmemAllocationHandleType; CU_MEM_HANDLE_TYPE_NONE for an allocation that cannot
// be shared).
CUmemAllocationProp device_allocation_prop(
    CUdevice dev,
    CUmemAllocationHandleType handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi prints.
std::string format_uuid(const CUuuid& uuid);

}  // namespace thaw::cuda
