// Hooks of device-memory allocation and the queries about it: cuMemAlloc and cuMemFree are
// served by the DeterministicLayout (when on), and address-range queries answer for its
// allocations as the driver would for cuMemAlloc memory. Everything else, and every call
// while the layout is off or stopped, goes to the driver unchanged.
#include <cuda.h>

#include "preload/hooks/layout_instance.hpp"
#include "preload/interpose/hook_table.hpp"
#include "preload/shim/shim_state.hpp"

using namespace thaw::preload;

namespace {

// Answers RANGE_START_ADDR / RANGE_SIZE for the layout's allocations (the driver would give
// the whole region's reservation).
void fix_range_attribute(CUpointer_attribute attribute, void* data, const LayoutAllocation& a) {
  if (data == nullptr) return;
  if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *static_cast<CUdeviceptr*>(data) = a.base;
  if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *static_cast<size_t*>(data) = a.size;
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto driver_fn = real<decltype(&cuMemAlloc_v2)>(Hook::mem_alloc);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside() || config().disabled || !config().deterministic) {
    return driver_fn(dptr, bytesize);
  }
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  DeterministicLayout* layout = layout_instance();
  if (layout != nullptr) {
    if (auto r = layout->allocate(dptr, bytesize)) {
      if (*r == CUDA_SUCCESS) {
        counters().deterministic_allocations.fetch_add(1, std::memory_order_relaxed);
        debug("cuMemAlloc({}) = {:#x} (deterministic #{})", bytesize, *dptr,
              layout->allocations() - 1);
      }
      return *r;
    }
    if (auto why = layout->stop_reason()) {
      notice_once("layout-stopped",
                  "deterministic layout off: " + *why + "; allocations use the driver's addresses");
    }
  }
  counters().passthrough_allocations.fetch_add(1, std::memory_order_relaxed);
  return driver_fn(dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuMemFree_v2)>(Hook::mem_free);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(dptr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (DeterministicLayout* layout = layout_instance()) {
    if (auto r = layout->free(dptr)) return *r;
  }
  return driver_fn(dptr);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuMemGetAddressRange_v2)>(Hook::mem_get_address_range);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(pbase, psize, dptr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  DeterministicLayout* layout = layout_instance();
  if (layout == nullptr || !layout->in_region(dptr)) return driver_fn(pbase, psize, dptr);
  // The driver checks the context and knows the pointer is mapped; then the answer is the
  // allocation's, not the region's.
  CUdeviceptr region_base = 0;
  if (CUresult r = driver_fn(&region_base, nullptr, dptr); r != CUDA_SUCCESS) return r;
  auto a = layout->find(dptr);
  if (!a) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = a->base;
  if (psize != nullptr) *psize = a->size;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto driver_fn = real<decltype(&cuPointerGetAttribute)>(Hook::pointer_get_attribute);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = driver_fn(data, attribute, ptr);
  if (r != CUDA_SUCCESS || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (DeterministicLayout* layout = layout_instance()) {
    if (auto a = layout->find(ptr)) fix_range_attribute(attribute, data, *a);
  }
  return r;
}

CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  auto driver_fn = real<decltype(&cuPointerGetAttributes)>(Hook::pointer_get_attributes);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = driver_fn(count, attributes, data, ptr);
  if (r != CUDA_SUCCESS || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (DeterministicLayout* layout = layout_instance()) {
    if (auto a = layout->find(ptr)) {
      for (unsigned i = 0; i < count; ++i) fix_range_attribute(attributes[i], data[i], *a);
    }
  }
  return r;
}

}  // extern "C"
