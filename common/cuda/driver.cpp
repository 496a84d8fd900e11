#include "common/cuda/driver.hpp"

#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

namespace thaw::cuda {

// Every entry point the table wraps: base name and the cudaTypedefs.h version suffix
// of the ABI variant that cuGetProcAddress returns at kCudaVersion (13000), e.g.
// cuMemAlloc at 13000 is cuMemAlloc_v2, whose type is PFN_cuMemAlloc_v3020.
//
// Members are named `<base>_` because cuda.h #defines many base names to their
// versioned symbols (cuMemAlloc → cuMemAlloc_v2); pasting keeps them unexpanded.
#define THAW_CUDA_ENTRY_POINTS(X)           \
  X(cuGetErrorName, v6000)                  \
  X(cuGetErrorString, v6000)                \
  X(cuInit, v2000)                          \
  X(cuDriverGetVersion, v2020)              \
  X(cuDeviceGetCount, v2000)                \
  X(cuDeviceGet, v2000)                     \
  X(cuDeviceGetName, v2000)                 \
  X(cuDeviceTotalMem, v3020)                \
  X(cuDeviceGetAttribute, v2000)            \
  X(cuDeviceGetUuid, v11040)                \
  X(cuDevicePrimaryCtxRetain, v7000)        \
  X(cuDevicePrimaryCtxRelease, v11000)      \
  X(cuCtxSetCurrent, v4000)                 \
  X(cuCtxGetCurrent, v4000)                 \
  X(cuCtxSynchronize, v13000)               \
  X(cuMemGetInfo, v3020)                    \
  X(cuMemAlloc, v3020)                      \
  X(cuMemFree, v3020)                       \
  X(cuMemHostAlloc, v2020)                  \
  X(cuMemFreeHost, v2000)                   \
  X(cuMemcpyHtoD, v3020)                    \
  X(cuMemcpyDtoH, v3020)                    \
  X(cuMemcpyHtoDAsync, v3020)               \
  X(cuMemcpyDtoHAsync, v3020)               \
  X(cuMemsetD8, v3020)                      \
  X(cuStreamCreate, v2000)                  \
  X(cuStreamCreateWithPriority, v5050)      \
  X(cuCtxGetStreamPriorityRange, v5050)     \
  X(cuStreamDestroy, v4000)                 \
  X(cuStreamSynchronize, v2000)             \
  X(cuEventCreate, v2000)                   \
  X(cuEventRecord, v2000)                   \
  X(cuEventSynchronize, v2000)              \
  X(cuEventElapsedTime, v12080)             \
  X(cuEventDestroy, v4000)                  \
  X(cuMemGetAllocationGranularity, v10020)  \
  X(cuMemCreate, v10020)                    \
  X(cuMemRelease, v10020)                   \
  X(cuMemAddressReserve, v10020)            \
  X(cuMemAddressFree, v10020)               \
  X(cuMemMap, v10020)                       \
  X(cuMemUnmap, v10020)                     \
  X(cuMemSetAccess, v10020)                 \
  X(cuMemExportToShareableHandle, v10020)   \
  X(cuMemImportFromShareableHandle, v10020) \
  X(cuMemRetainAllocationHandle, v11000)    \
  X(cuMemGetAllocationPropertiesFromHandle, v10020)

struct Driver::EntryPoints {
  // Taken with dlsym(); all the others are resolved through it.
  PFN_cuGetProcAddress_v12000 cuGetProcAddress_ = nullptr;
#define THAW_DECLARE_ENTRY_POINT(base, version) PFN_##base##_##version base##_ = nullptr;
  THAW_CUDA_ENTRY_POINTS(THAW_DECLARE_ENTRY_POINT)
#undef THAW_DECLARE_ENTRY_POINT
};

namespace {

// Where the driver comes from: an explicit path, else $THAW_LIBCUDA, else the SONAME
// (found by the dynamic linker like any library, as the CUDA runtime does).
std::string library_path(std::string_view path) {
  if (!path.empty()) return std::string(path);
  if (const char* env = std::getenv(kLibcudaEnv); env != nullptr && *env != '\0') return env;
  return kDefaultLibcuda;
}

// Looks up `base` at kCudaVersion. CU_GET_PROC_ADDRESS_DEFAULT: thaw is not compiled
// for per-thread default streams, so this is the legacy default stream, the semantics
// of the sync copies and of stream 0 that callers of this table expect.
CUresult proc_address(PFN_cuGetProcAddress_v12000 get_proc_address, const char* base, void** pfn,
                      CUdriverProcAddressQueryResult* status) {
  *pfn = nullptr;
  *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return get_proc_address(base, pfn, kCudaVersion, CU_GET_PROC_ADDRESS_DEFAULT, status);
}

// Why `base` could not be resolved, in words an operator can act on.
CudaError unresolved(void* library, const char* base, CUresult rc,
                     CUdriverProcAddressQueryResult status) {
  if (rc == CUDA_ERROR_INVALID_VALUE) {
    // The documented answer to a cudaVersion newer than the driver. The driver's own
    // version is exported under its plain name, so it can be asked without the table.
    int version = 0;
    auto get_version =
        reinterpret_cast<PFN_cuDriverGetVersion_v2020>(dlsym(library, "cuDriverGetVersion"));
    std::string driver =
        get_version != nullptr && get_version(&version) == CUDA_SUCCESS
            ? fmt::format("the driver supports CUDA {}.{}", version / 1000, version % 1000 / 10)
            : std::string("the driver is older");
    return symbol_missing(base, kCudaVersion,
                          fmt::format("version rejected; {}, thaw needs a CUDA {}.{} driver",
                                      driver, kCudaVersion / 1000, kCudaVersion % 1000 / 10),
                          rc);
  }
  if (rc != CUDA_SUCCESS) {
    return symbol_missing(base, kCudaVersion,
                          fmt::format("cuGetProcAddress failed with {}", unnamed_result(rc)), rc);
  }
  return symbol_missing(base, kCudaVersion,
                        status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            ? "the driver has it, but not for this version"
                            : "the driver does not provide it");
}

}  // namespace

Driver::Driver(void* library, std::string path)
    : library_(library), path_(std::move(path)), fn_(std::make_unique<EntryPoints>()) {}

Driver::~Driver() {
  if (library_ != nullptr) dlclose(library_);
}

std::expected<std::shared_ptr<Driver>, CudaError> Driver::load(std::string_view path) {
  std::string resolved_path = library_path(path);
  // RTLD_NOW: a broken driver fails here, not at some later first call.
  // RTLD_NODELETE: once cuInit has run, the driver has threads and exit handlers in
  // the process (NVIDIA's and the emulator alike); unmapping its code under them would
  // crash, so dlclose() drops our reference but never unloads it (the CUDA runtime
  // never unloads libcuda either).
  void* library = dlopen(resolved_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (library == nullptr) {
    const char* reason = dlerror();
    return std::unexpected(library_not_loaded(resolved_path, reason ? reason : "unknown error"));
  }
  // From here the Driver owns the handle, so every failure below dlclose()s it.
  std::shared_ptr<Driver> driver(new Driver(library, resolved_path));

  // The only symbol taken with dlsym(): the rest come through it, as the CUDA runtime
  // does it. Plain dlsym() would give the oldest ABI of each function (cuMemAlloc is
  // the 32-bit-size v1), while cuGetProcAddress picks the variant for kCudaVersion.
  EntryPoints& fn = *driver->fn_;
  fn.cuGetProcAddress_ =
      reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(library, "cuGetProcAddress_v2"));
  if (fn.cuGetProcAddress_ == nullptr) {
    return std::unexpected(proc_address_missing(resolved_path));
  }

  // Base names, never "_v2" spellings: cuGetProcAddress maps a base name and a CUDA
  // version to the right ABI variant, and a versioned name is not a valid query.
#define THAW_RESOLVE_ENTRY_POINT(base, version)                                        \
  {                                                                                    \
    void* pfn = nullptr;                                                               \
    CUdriverProcAddressQueryResult status;                                             \
    CUresult rc = proc_address(fn.cuGetProcAddress_, #base, &pfn, &status);            \
    if (rc != CUDA_SUCCESS || pfn == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) \
      return std::unexpected(unresolved(library, #base, rc, status));                  \
    fn.base##_ = reinterpret_cast<PFN_##base##_##version>(pfn);                        \
  }
  THAW_CUDA_ENTRY_POINTS(THAW_RESOLVE_ENTRY_POINT)
#undef THAW_RESOLVE_ENTRY_POINT
  return driver;
}

void* Driver::raw(const char* base_name) const {
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status;
  if (proc_address(fn_->cuGetProcAddress_, base_name, &pfn, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS) {
    return nullptr;
  }
  return pfn;
}

void* Driver::symbol(const char* name) const {
  return dlsym(library_, name);
}

CudaError Driver::error(CUresult code, std::string_view call) const {
  CudaError err{.code = code, .call = std::string(call)};
  const char* text = nullptr;
  if (fn_->cuGetErrorName_(code, &text) == CUDA_SUCCESS && text != nullptr) {
    err.name = text;
  } else {
    err.name = unnamed_result(code);
  }
  text = nullptr;
  if (fn_->cuGetErrorString_(code, &text) == CUDA_SUCCESS && text != nullptr) {
    err.message = text;
  } else {
    err.message = "unknown error code";
  }
  return err;
}

namespace {

// Turns a driver result into the table's result types.
std::expected<void, CudaError> check(const Driver& d, CUresult rc, const char* call) {
  if (rc != CUDA_SUCCESS) return std::unexpected(d.error(rc, call));
  return {};
}

template <class T>
std::expected<T, CudaError> value_or_error(const Driver& d, CUresult rc, const char* call,
                                           T value) {
  if (rc != CUDA_SUCCESS) return std::unexpected(d.error(rc, call));
  return value;
}

}  // namespace

// ---- initialization and devices -------------------------------------------------

std::expected<void, CudaError> Driver::init(unsigned int flags) const {
  return check(*this, fn_->cuInit_(flags), "cuInit");
}

std::expected<int, CudaError> Driver::driver_version() const {
  int version = 0;
  CUresult rc = fn_->cuDriverGetVersion_(&version);
  return value_or_error(*this, rc, "cuDriverGetVersion", version);
}

std::expected<int, CudaError> Driver::device_count() const {
  int count = 0;
  CUresult rc = fn_->cuDeviceGetCount_(&count);
  return value_or_error(*this, rc, "cuDeviceGetCount", count);
}

std::expected<CUdevice, CudaError> Driver::device_get(int ordinal) const {
  CUdevice dev = 0;
  CUresult rc = fn_->cuDeviceGet_(&dev, ordinal);
  return value_or_error(*this, rc, "cuDeviceGet", dev);
}

std::expected<std::string, CudaError> Driver::device_name(CUdevice dev) const {
  char name[256] = {};
  CUresult rc = fn_->cuDeviceGetName_(name, sizeof(name), dev);
  return value_or_error(*this, rc, "cuDeviceGetName", std::string(name));
}

std::expected<size_t, CudaError> Driver::device_total_mem(CUdevice dev) const {
  size_t bytes = 0;
  CUresult rc = fn_->cuDeviceTotalMem_(&bytes, dev);
  return value_or_error(*this, rc, "cuDeviceTotalMem", bytes);
}

std::expected<int, CudaError> Driver::device_attribute(CUdevice dev,
                                                       CUdevice_attribute attr) const {
  int value = 0;
  CUresult rc = fn_->cuDeviceGetAttribute_(&value, attr, dev);
  return value_or_error(*this, rc, "cuDeviceGetAttribute", value);
}

std::expected<CUuuid, CudaError> Driver::device_uuid(CUdevice dev) const {
  CUuuid uuid{};
  CUresult rc = fn_->cuDeviceGetUuid_(&uuid, dev);
  return value_or_error(*this, rc, "cuDeviceGetUuid", uuid);
}

// ---- contexts ---------------------------------------------------------------------

std::expected<CUcontext, CudaError> Driver::primary_ctx_retain(CUdevice dev) const {
  CUcontext ctx = nullptr;
  CUresult rc = fn_->cuDevicePrimaryCtxRetain_(&ctx, dev);
  return value_or_error(*this, rc, "cuDevicePrimaryCtxRetain", ctx);
}

std::expected<void, CudaError> Driver::primary_ctx_release(CUdevice dev) const {
  return check(*this, fn_->cuDevicePrimaryCtxRelease_(dev), "cuDevicePrimaryCtxRelease");
}

std::expected<void, CudaError> Driver::ctx_set_current(CUcontext ctx) const {
  return check(*this, fn_->cuCtxSetCurrent_(ctx), "cuCtxSetCurrent");
}

std::expected<CUcontext, CudaError> Driver::ctx_get_current() const {
  CUcontext ctx = nullptr;
  CUresult rc = fn_->cuCtxGetCurrent_(&ctx);
  return value_or_error(*this, rc, "cuCtxGetCurrent", ctx);
}

std::expected<void, CudaError> Driver::ctx_synchronize(CUcontext ctx) const {
  // At 13000 this is cuCtxSynchronize_v2, which takes the context (NULL = current).
  return check(*this, fn_->cuCtxSynchronize_(ctx), "cuCtxSynchronize");
}

// ---- memory -----------------------------------------------------------------------

std::expected<MemInfo, CudaError> Driver::mem_get_info() const {
  MemInfo info;
  CUresult rc = fn_->cuMemGetInfo_(&info.free, &info.total);
  return value_or_error(*this, rc, "cuMemGetInfo", info);
}

std::expected<CUdeviceptr, CudaError> Driver::mem_alloc(size_t bytes) const {
  CUdeviceptr ptr = 0;
  CUresult rc = fn_->cuMemAlloc_(&ptr, bytes);
  return value_or_error(*this, rc, "cuMemAlloc", ptr);
}

std::expected<void, CudaError> Driver::mem_free(CUdeviceptr ptr) const {
  return check(*this, fn_->cuMemFree_(ptr), "cuMemFree");
}

std::expected<void*, CudaError> Driver::mem_host_alloc(size_t bytes, unsigned int flags) const {
  void* ptr = nullptr;
  CUresult rc = fn_->cuMemHostAlloc_(&ptr, bytes, flags);
  return value_or_error(*this, rc, "cuMemHostAlloc", ptr);
}

std::expected<void, CudaError> Driver::mem_free_host(void* ptr) const {
  return check(*this, fn_->cuMemFreeHost_(ptr), "cuMemFreeHost");
}

// ---- copies -----------------------------------------------------------------------

std::expected<void, CudaError> Driver::memcpy_htod(CUdeviceptr dst, const void* src,
                                                   size_t bytes) const {
  return check(*this, fn_->cuMemcpyHtoD_(dst, src, bytes), "cuMemcpyHtoD");
}

std::expected<void, CudaError> Driver::memcpy_dtoh(void* dst, CUdeviceptr src, size_t bytes) const {
  return check(*this, fn_->cuMemcpyDtoH_(dst, src, bytes), "cuMemcpyDtoH");
}

std::expected<void, CudaError> Driver::memcpy_htod_async(CUdeviceptr dst, const void* src,
                                                         size_t bytes, CUstream stream) const {
  return check(*this, fn_->cuMemcpyHtoDAsync_(dst, src, bytes, stream), "cuMemcpyHtoDAsync");
}

std::expected<void, CudaError> Driver::memcpy_dtoh_async(void* dst, CUdeviceptr src, size_t bytes,
                                                         CUstream stream) const {
  return check(*this, fn_->cuMemcpyDtoHAsync_(dst, src, bytes, stream), "cuMemcpyDtoHAsync");
}

std::expected<void, CudaError> Driver::memset_d8(CUdeviceptr dst, unsigned char value,
                                                 size_t count) const {
  return check(*this, fn_->cuMemsetD8_(dst, value, count), "cuMemsetD8");
}

// ---- streams and events -----------------------------------------------------------

std::expected<CUstream, CudaError> Driver::stream_create(unsigned int flags) const {
  CUstream stream = nullptr;
  CUresult rc = fn_->cuStreamCreate_(&stream, flags);
  return value_or_error(*this, rc, "cuStreamCreate", stream);
}

std::expected<CUstream, CudaError> Driver::stream_create_with_priority(unsigned int flags,
                                                                       int priority) const {
  CUstream stream = nullptr;
  CUresult rc = fn_->cuStreamCreateWithPriority_(&stream, flags, priority);
  return value_or_error(*this, rc, "cuStreamCreateWithPriority", stream);
}

std::expected<StreamPriorityRange, CudaError> Driver::stream_priority_range() const {
  StreamPriorityRange range;
  CUresult rc = fn_->cuCtxGetStreamPriorityRange_(&range.least, &range.greatest);
  return value_or_error(*this, rc, "cuCtxGetStreamPriorityRange", range);
}

std::expected<void, CudaError> Driver::stream_destroy(CUstream stream) const {
  return check(*this, fn_->cuStreamDestroy_(stream), "cuStreamDestroy");
}

std::expected<void, CudaError> Driver::stream_synchronize(CUstream stream) const {
  return check(*this, fn_->cuStreamSynchronize_(stream), "cuStreamSynchronize");
}

std::expected<CUevent, CudaError> Driver::event_create(unsigned int flags) const {
  CUevent event = nullptr;
  CUresult rc = fn_->cuEventCreate_(&event, flags);
  return value_or_error(*this, rc, "cuEventCreate", event);
}

std::expected<void, CudaError> Driver::event_record(CUevent event, CUstream stream) const {
  return check(*this, fn_->cuEventRecord_(event, stream), "cuEventRecord");
}

std::expected<void, CudaError> Driver::event_synchronize(CUevent event) const {
  return check(*this, fn_->cuEventSynchronize_(event), "cuEventSynchronize");
}

std::expected<float, CudaError> Driver::event_elapsed_ms(CUevent start, CUevent end) const {
  float ms = 0;
  CUresult rc = fn_->cuEventElapsedTime_(&ms, start, end);
  return value_or_error(*this, rc, "cuEventElapsedTime", ms);
}

std::expected<void, CudaError> Driver::event_destroy(CUevent event) const {
  return check(*this, fn_->cuEventDestroy_(event), "cuEventDestroy");
}

// ---- virtual memory management ------------------------------------------------------

std::expected<size_t, CudaError> Driver::allocation_granularity(
    const CUmemAllocationProp& prop, CUmemAllocationGranularity_flags option) const {
  size_t granularity = 0;
  CUresult rc = fn_->cuMemGetAllocationGranularity_(&granularity, &prop, option);
  return value_or_error(*this, rc, "cuMemGetAllocationGranularity", granularity);
}

std::expected<CUmemGenericAllocationHandle, CudaError> Driver::mem_create(
    size_t bytes, const CUmemAllocationProp& prop) const {
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = fn_->cuMemCreate_(&handle, bytes, &prop, /*flags: reserved, must be 0*/ 0);
  return value_or_error(*this, rc, "cuMemCreate", handle);
}

std::expected<void, CudaError> Driver::mem_release(CUmemGenericAllocationHandle handle) const {
  return check(*this, fn_->cuMemRelease_(handle), "cuMemRelease");
}

std::expected<CUdeviceptr, CudaError> Driver::address_reserve(size_t bytes, size_t alignment,
                                                              CUdeviceptr fixed_addr) const {
  CUdeviceptr ptr = 0;
  CUresult rc = fn_->cuMemAddressReserve_(&ptr, bytes, alignment, fixed_addr, /*flags*/ 0);
  return value_or_error(*this, rc, "cuMemAddressReserve", ptr);
}

std::expected<void, CudaError> Driver::address_free(CUdeviceptr ptr, size_t bytes) const {
  return check(*this, fn_->cuMemAddressFree_(ptr, bytes), "cuMemAddressFree");
}

std::expected<void, CudaError> Driver::mem_map(CUdeviceptr ptr, size_t bytes, size_t offset,
                                               CUmemGenericAllocationHandle handle) const {
  return check(*this, fn_->cuMemMap_(ptr, bytes, offset, handle, /*flags*/ 0), "cuMemMap");
}

std::expected<void, CudaError> Driver::mem_unmap(CUdeviceptr ptr, size_t bytes) const {
  return check(*this, fn_->cuMemUnmap_(ptr, bytes), "cuMemUnmap");
}

std::expected<void, CudaError> Driver::mem_set_access(
    CUdeviceptr ptr, size_t bytes, std::span<const CUmemAccessDesc> access) const {
  CUresult rc = fn_->cuMemSetAccess_(ptr, bytes, access.data(), access.size());
  return check(*this, rc, "cuMemSetAccess");
}

std::expected<void, CudaError> Driver::mem_set_access(CUdeviceptr ptr, size_t bytes,
                                                      CUdevice dev) const {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return mem_set_access(ptr, bytes, std::span<const CUmemAccessDesc>(&desc, 1));
}

std::expected<int, CudaError> Driver::export_to_fd(CUmemGenericAllocationHandle handle) const {
  // For CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the shareable handle is an int.
  int fd = -1;
  CUresult rc = fn_->cuMemExportToShareableHandle_(
      &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, /*flags: reserved*/ 0);
  return value_or_error(*this, rc, "cuMemExportToShareableHandle", fd);
}

std::expected<CUmemGenericAllocationHandle, CudaError> Driver::import_from_fd(int fd) const {
  // The POSIX fd is passed by value in the pointer argument, as NVIDIA's samples and
  // PyTorch do it.
  CUmemGenericAllocationHandle handle = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
  CUresult rc = fn_->cuMemImportFromShareableHandle_(&handle, os_handle,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  return value_or_error(*this, rc, "cuMemImportFromShareableHandle", handle);
}

std::expected<CUmemGenericAllocationHandle, CudaError> Driver::retain_allocation_handle(
    void* addr) const {
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = fn_->cuMemRetainAllocationHandle_(&handle, addr);
  return value_or_error(*this, rc, "cuMemRetainAllocationHandle", handle);
}

std::expected<CUmemAllocationProp, CudaError> Driver::allocation_properties(
    CUmemGenericAllocationHandle handle) const {
  CUmemAllocationProp prop{};
  CUresult rc = fn_->cuMemGetAllocationPropertiesFromHandle_(&prop, handle);
  return value_or_error(*this, rc, "cuMemGetAllocationPropertiesFromHandle", prop);
}

// ---- helpers ------------------------------------------------------------------------

CUmemAllocationProp device_allocation_prop(CUdevice dev, CUmemAllocationHandleType handle_types) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = handle_types;
  return prop;
}

std::string format_uuid(const CUuuid& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

}  // namespace thaw::cuda
