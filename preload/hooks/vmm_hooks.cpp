// Hooks of the VMM calls an engine makes on its own reservations (PyTorch's expandable
// segments, NCCL's buffers): cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemGetAccess,
// cuMemRetainAllocationHandle. The layout serves cuMemAddressReserve from its region, which
// the driver sees as one big reservation — so on region VA the driver alone would accept a
// range running past the end of the caller's reservation, into a freed one, or into the
// layout's cuMemAlloc memory (VMM memory to the driver, not to the caller). Such ranges are
// asked of the driver at an address it has surely not reserved: its answer, argument checks
// and error code included, is then the one it gives the caller without the shim (issue 22).
// Everything else goes to the driver unchanged.
#include <cuda.h>

#include "preload/interpose/hook_table.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

using namespace thaw::preload;

namespace {

// The layout when `ptr` lies in its region and this is the engine's call; else nullptr.
DeterministicLayout* layout_for(CUdeviceptr ptr) {
  if (ReentryGuard::inside()) return nullptr;
  DeterministicLayout* layout = runtime().layout();
  if (layout == nullptr || !layout->in_region(ptr)) return nullptr;
  return layout;
}

using Range = DeterministicLayout::CallerRange;

}  // namespace

extern "C" {

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  auto driver_fn = real<decltype(&cuMemMap)>(Hook::mem_map);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  DeterministicLayout* layout = layout_for(ptr);
  if (layout == nullptr) return driver_fn(ptr, size, offset, handle, flags);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (layout->caller_range(ptr, size) == Range::outside) {
    const CUdeviceptr alias = layout->unreserved_alias(ptr);
    const CUresult r = driver_fn(alias, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) return r;
    // Never expected (nothing is reserved there); undone all the same.
    if (auto unmap = real<decltype(&cuMemUnmap)>(Hook::mem_unmap)) (void)unmap(alias, size);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const CUresult r = driver_fn(ptr, size, offset, handle, flags);
  if (r == CUDA_SUCCESS) layout->note_caller_mapped(ptr, size);
  return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  auto driver_fn = real<decltype(&cuMemUnmap)>(Hook::mem_unmap);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  DeterministicLayout* layout = layout_for(ptr);
  if (layout == nullptr) return driver_fn(ptr, size);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  // Never the layout's own cuMemAlloc memory: to the caller that is no mapping at all.
  if (layout->caller_range(ptr, size) == Range::outside) {
    return driver_fn(layout->unreserved_alias(ptr), size);
  }
  const CUresult r = driver_fn(ptr, size);
  if (r == CUDA_SUCCESS) layout->note_caller_unmapped(ptr, size);
  return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  auto driver_fn = real<decltype(&cuMemSetAccess)>(Hook::mem_set_access);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  DeterministicLayout* layout = layout_for(ptr);
  if (layout == nullptr) return driver_fn(ptr, size, desc, count);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (layout->caller_range(ptr, size) == Range::outside) {
    // The driver still checks the descriptors first (INVALID_DEVICE before INVALID_VALUE).
    return driver_fn(layout->unreserved_alias(ptr), size, desc, count);
  }
  return driver_fn(ptr, size, desc, count);
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  auto driver_fn = real<decltype(&cuMemGetAccess)>(Hook::mem_get_access);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  DeterministicLayout* layout = layout_for(ptr);
  if (layout == nullptr) return driver_fn(flags, location, ptr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (layout->caller_range(ptr, 1) == Range::outside) ptr = layout->unreserved_alias(ptr);
  return driver_fn(flags, location, ptr);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  auto driver_fn = real<decltype(&cuMemRetainAllocationHandle)>(Hook::mem_retain_allocation_handle);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const auto ptr = reinterpret_cast<CUdeviceptr>(addr);
  DeterministicLayout* layout = layout_for(ptr);
  if (layout == nullptr) return driver_fn(handle, addr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (layout->caller_range(ptr, 1) == Range::outside) {
    addr = reinterpret_cast<void*>(layout->unreserved_alias(ptr));
  }
  return driver_fn(handle, addr);
}

}  // extern "C"
