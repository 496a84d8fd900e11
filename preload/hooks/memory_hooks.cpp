// Hooks of device-memory allocation and the queries about it: cuMemAlloc and cuMemFree are
// served by the DeterministicLayout (when on), and address-range queries answer for its
// allocations as the driver would for cuMemAlloc memory. Everything else, and every call
// while the layout is off or stopped, goes to the driver unchanged.
#include <cuda.h>

#include <algorithm>

#include "preload/hooks/capture_hooks.hpp"
#include "preload/interpose/hook_table.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

using namespace thaw::preload;

namespace {

// Answers for the layout's allocations what the driver answers without the shim. The range
// is the allocation's, or for memory the caller mapped into its own reservation that
// reservation's (the driver would give the whole region's) — where the driver knows the
// pointer at all (its answer is not 0). cuMemAlloc memory is not VMM memory to the caller:
// legacy-IPC capable (the shim translates its IPC), no shareable handle types.
void fix_attribute(CUpointer_attribute attribute, void* data, const LayoutAllocation& a) {
  if (data == nullptr) return;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      if (auto* v = static_cast<CUdeviceptr*>(data); *v != 0) *v = a.base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      if (auto* v = static_cast<size_t*>(data); *v != 0) *v = a.size;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      if (!a.reservation) *static_cast<bool*>(data) = true;
      break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      if (!a.reservation) *static_cast<unsigned long long*>(data) = 0;
      break;
    // VMM memory belongs to no context; cuMemAlloc memory to the one it was allocated in.
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      if (!a.reservation && a.ctx != nullptr) *static_cast<CUcontext*>(data) = a.ctx;
      break;
    // The mapping of cuMemAlloc memory is the allocation itself, not the layout's mapping
    // rounded up to the granularity (or a run of it, where slot pages back part of it).
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      if (auto* v = static_cast<void**>(data); *v != nullptr && !a.reservation) {
        *v = reinterpret_cast<void*>(a.base);
      }
      break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      if (auto* v = static_cast<size_t*>(data); *v != 0 && !a.reservation) *v = a.size;
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto driver_fn = real<decltype(&cuMemAlloc_v2)>(Hook::mem_alloc);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // Calls the driver refuses anyway (no pointer, no bytes) go to it as they are.
  if (ReentryGuard::inside() || config().disabled || dptr == nullptr || bytesize == 0) {
    return driver_fn(dptr, bytesize);
  }
  ReentryGuard guard;
  // A stream capture that forbids this thread to allocate: the driver answers, before it
  // would look at memory — it refuses (STREAM_CAPTURE_UNSUPPORTED) and invalidates the
  // capture, which the layout's VMM calls would not. Should it allocate after all (a
  // capture ended unseen), the memory is the driver's: correct, only not in the layout.
  if (capture_restricts_unsafe_calls()) {
    const CUresult r = driver_fn(dptr, bytesize);
    if (r == CUDA_SUCCESS) runtime().engine_memory().note_alloc(*dptr, 0, bytesize);
    return r;
  }
  runtime().lease_pool_memory_once();
  // An engine attached to a slot allocates within the budget thawd granted it: past it the
  // answer is OUT_OF_MEMORY at once, as the driver's would be on a device of that size.
  if (!runtime().engine_memory().charge(bytesize)) {
    debug("cuMemAlloc({}) = OUT_OF_MEMORY: {} of the budget of {} bytes are in use", bytesize,
          runtime().engine_memory().bytes(), runtime().engine_memory().budget().value_or(0));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  DeterministicLayout* layout = config().deterministic ? runtime().layout() : nullptr;
  if (config().deterministic) {
    counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
    runtime().on_driver_reached();
  }
  if (layout != nullptr) {
    if (auto r = layout->allocate(dptr, bytesize)) {
      if (*r == CUDA_SUCCESS) {
        auto a = layout->find(*dptr);
        runtime().engine_memory().note_alloc(*dptr, bytesize, a ? a->mapped : bytesize);
        counters().deterministic_allocations.fetch_add(1, std::memory_order_relaxed);
        debug("cuMemAlloc({}) = {:#x} (deterministic #{})", bytesize, *dptr,
              layout->allocations() - 1);
      } else {
        runtime().engine_memory().refund(bytesize);
      }
      return *r;
    }
    if (auto why = layout->stop_reason()) {
      notice_once("layout-stopped",
                  "deterministic layout off: " + *why + "; allocations use the driver's addresses");
    }
  }
  if (config().deterministic) {
    counters().passthrough_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  const CUresult r = driver_fn(dptr, bytesize);
  if (r == CUDA_SUCCESS) {
    runtime().engine_memory().note_alloc(*dptr, bytesize, bytesize);
  } else {
    runtime().engine_memory().refund(bytesize);
  }
  return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuMemFree_v2)>(Hook::mem_free);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(dptr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  std::optional<CUresult> r;
  DeterministicLayout* layout = runtime().layout();
  // Freeing is as unsafe as allocating during a restricting capture: the driver refuses it
  // (and invalidates the capture) before it looks the pointer up.
  if (layout != nullptr && capture_restricts_unsafe_calls() && layout->find(dptr)) {
    if (const CUresult refused = driver_fn(dptr);
        refused == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
      return refused;
    }
  }
  if (layout != nullptr) r = layout->free(dptr);
  if (!r) r = driver_fn(dptr);
  if (*r == CUDA_SUCCESS) runtime().engine_memory().note_free(dptr);
  return *r;
}

// Physical memory the engine creates itself (PyTorch's expandable segments, NCCL's and
// other libraries' cuMem allocations): device memory counts against the budget like
// cuMemAlloc's; host or other locations are not the device's and pass unchanged.
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto driver_fn = real<decltype(&cuMemCreate)>(Hook::mem_create);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside() || config().disabled || handle == nullptr || prop == nullptr ||
      size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return driver_fn(handle, size, prop, flags);
  }
  ReentryGuard guard;
  runtime().lease_pool_memory_once();
  if (!runtime().engine_memory().charge(size)) {
    debug("cuMemCreate({}) = OUT_OF_MEMORY: {} of the budget of {} bytes are in use", size,
          runtime().engine_memory().bytes(), runtime().engine_memory().budget().value_or(0));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult r = driver_fn(handle, size, prop, flags);
  if (r == CUDA_SUCCESS) {
    runtime().engine_memory().note_create(*handle, size, size);
  } else {
    runtime().engine_memory().refund(size);
  }
  return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto driver_fn = real<decltype(&cuMemRelease)>(Hook::mem_release);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = driver_fn(handle);
  if (r == CUDA_SUCCESS && !ReentryGuard::inside()) runtime().engine_memory().note_release(handle);
  return r;
}

// VA reservations with no fixed address (expandable segments) come from the layout's
// region, in sequence; frees of those go back to it.
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  auto driver_fn = real<decltype(&cuMemAddressReserve)>(Hook::mem_address_reserve);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside() || config().disabled || !config().deterministic || flags != 0) {
    return driver_fn(ptr, size, alignment, addr, flags);
  }
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  // A requested address in the region: the driver sees the region there and would place it
  // elsewhere, though the caller asked for VA that is free to it (issue 22).
  if (addr != 0) {
    DeterministicLayout* layout = runtime().layout();
    if (layout != nullptr && layout->in_region(addr)) {
      if (auto r = layout->reserve_at(ptr, size, alignment, addr)) return *r;
    }
    return driver_fn(ptr, size, alignment, addr, flags);
  }
  if (DeterministicLayout* layout = runtime().layout()) {
    if (auto r = layout->reserve(ptr, size, alignment)) {
      if (*r == CUDA_SUCCESS) {
        debug("cuMemAddressReserve({}) = {:#x} (deterministic #{})", size, *ptr,
              layout->allocations() - 1);
      }
      return *r;
    }
  }
  return driver_fn(ptr, size, alignment, addr, flags);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  auto driver_fn = real<decltype(&cuMemAddressFree)>(Hook::mem_address_free);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(ptr, size);
  ReentryGuard guard;
  if (DeterministicLayout* layout = runtime().layout()) {
    if (auto r = layout->release(ptr, size)) return *r;
  }
  return driver_fn(ptr, size);
}

// The driver's answer, unless thawd granted this engine a budget (it runs attached to a
// prewarm slot): then total is the budget and free what is left of it — never more than
// the device really has free. Every answer goes into the layout record.
CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  auto driver_fn = real<decltype(&cuMemGetInfo_v2)>(Hook::mem_get_info);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = driver_fn(free, total);
  if (r != CUDA_SUCCESS || ReentryGuard::inside() || free == nullptr || total == nullptr) return r;
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  runtime().lease_pool_memory_once();
  // The engine sizes its KV cache now: slot pages whose bytes it copied go back first.
  if (WeightInjector* injector = runtime().injector()) injector->poll();
  // Both may have given the driver more room than it had when first asked.
  if (const CUresult again = driver_fn(free, total); again != CUDA_SUCCESS) return again;
  if (auto budget = runtime().engine_memory().budget()) {
    const std::uint64_t used = runtime().engine_memory().bytes();
    const std::uint64_t left = *budget > used ? *budget - used : 0;
    *total = static_cast<size_t>(*budget);
    *free = static_cast<size_t>(std::min<std::uint64_t>(*free, left));
  }
  if (LayoutRecorder* recorder = runtime().recorder()) recorder->note_mem_info(*free, *total);
  return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  auto driver_fn = real<decltype(&cuMemGetAddressRange_v2)>(Hook::mem_get_address_range);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (ReentryGuard::inside()) return driver_fn(pbase, psize, dptr);
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  DeterministicLayout* layout = runtime().layout();
  if (layout == nullptr || !layout->in_region(dptr)) return driver_fn(pbase, psize, dptr);
  // The driver checks the context and knows the pointer is mapped; then the answer is the
  // allocation's, not the mapping's (memory the engine mapped into a reservation of the
  // layout keeps the driver's answer).
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = driver_fn(&base, &size, dptr); r != CUDA_SUCCESS) return r;
  auto a = layout->find(dptr);
  if (!a) return CUDA_ERROR_NOT_FOUND;
  if (!a->reservation) {
    base = a->base;
    size = a->size;
  }
  if (pbase != nullptr) *pbase = base;
  if (psize != nullptr) *psize = size;
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto driver_fn = real<decltype(&cuPointerGetAttribute)>(Hook::pointer_get_attribute);
  if (driver_fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = driver_fn(data, attribute, ptr);
  if (r != CUDA_SUCCESS || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  if (DeterministicLayout* layout = runtime().layout()) {
    if (auto a = layout->find(ptr)) fix_attribute(attribute, data, *a);
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
  if (DeterministicLayout* layout = runtime().layout()) {
    if (auto a = layout->find(ptr)) {
      for (unsigned i = 0; i < count; ++i) fix_attribute(attributes[i], data[i], *a);
    }
  }
  return r;
}

}  // extern "C"
