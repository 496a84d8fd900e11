// Hooks of context teardown. The driver frees the cuMemAlloc memory of a context when it
// destroys it (cuCtxDestroy), and of a primary context when that is released for the last
// time or reset (cuDevicePrimaryCtxRelease / cuDevicePrimaryCtxReset); VMM memory, which
// the layout's allocations are made of, belongs to no context and stays. So once the driver
// has torn a context down, the layout frees the allocations it served in it, as the driver
// would have freed them. The calls themselves pass to the driver unchanged.
#include <cuda.h>

#include "preload/interpose/hook_table.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

// The original (v1) entry points keep their plain names, which cuda.h maps to _v2.
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset

extern "C" {
CUresult cuDevicePrimaryCtxRelease(CUdevice);
CUresult cuDevicePrimaryCtxReset(CUdevice);
}

using namespace thaw::preload;

namespace {

void free_layout_memory_of(CUcontext ctx) {
  DeterministicLayout* layout = runtime().layout();
  if (layout == nullptr || ctx == nullptr) return;
  for (const LayoutAllocation& a : layout->free_context(ctx)) {
    runtime().engine_memory().note_free(a.base);
    debug("context {} torn down: its allocation {:#x} ({} bytes) is freed",
          static_cast<const void*>(ctx), a.base, a.size);
  }
}

// `dev`'s primary context, while it is active (retained at least once), without changing
// its reference count; nullptr when it is not active (then it holds no memory: its last
// release, or a reset, freed it).
CUcontext active_primary_context(CUdevice dev) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  using Retain = CUresult (*)(CUcontext*, CUdevice);
  using Release = CUresult (*)(CUdevice);
  auto get_state = reinterpret_cast<GetState>(driver_symbol("cuDevicePrimaryCtxGetState"));
  auto retain = reinterpret_cast<Retain>(driver_symbol("cuDevicePrimaryCtxRetain"));
  auto release = reinterpret_cast<Release>(driver_symbol("cuDevicePrimaryCtxRelease_v2"));
  if (release == nullptr)
    release = reinterpret_cast<Release>(driver_symbol("cuDevicePrimaryCtxRelease"));
  unsigned int flags = 0;
  int active = 0;
  if (get_state == nullptr || retain == nullptr || release == nullptr ||
      get_state(dev, &flags, &active) != CUDA_SUCCESS || active == 0) {
    return nullptr;
  }
  // Retaining an active primary context only counts one more reference (it is not
  // created), and releasing that one leaves it as it was.
  CUcontext ctx = nullptr;
  if (retain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  (void)release(dev);
  return ctx;
}

bool primary_context_active(CUdevice dev) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  auto get_state = reinterpret_cast<GetState>(driver_symbol("cuDevicePrimaryCtxGetState"));
  unsigned int flags = 0;
  int active = 1;
  return get_state == nullptr || get_state(dev, &flags, &active) != CUDA_SUCCESS || active != 0;
}

template <typename Release>
CUresult release_primary(Release release, CUdevice dev) {
  if (ReentryGuard::inside() || runtime().layout() == nullptr) return release();
  ReentryGuard guard;
  const CUcontext primary = active_primary_context(dev);
  const CUresult r = release();
  // Only the last release deactivates the context (and frees its memory).
  if (r == CUDA_SUCCESS && primary != nullptr && !primary_context_active(dev)) {
    free_layout_memory_of(primary);
  }
  return r;
}

template <typename Reset>
CUresult reset_primary(Reset reset, CUdevice dev) {
  if (ReentryGuard::inside() || runtime().layout() == nullptr) return reset();
  ReentryGuard guard;
  const CUcontext primary = active_primary_context(dev);
  const CUresult r = reset();
  if (r == CUDA_SUCCESS) free_layout_memory_of(primary);
  return r;
}

}  // namespace

extern "C" {

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  auto fn = real<decltype(&cuCtxDestroy_v2)>(Hook::ctx_destroy);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = fn(ctx);
  if (r != CUDA_SUCCESS || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  free_layout_memory_of(ctx);
  return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  auto fn = real<decltype(&cuDevicePrimaryCtxRelease)>(Hook::primary_ctx_release);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return release_primary([&] { return fn(dev); }, dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  auto fn = real<decltype(&cuDevicePrimaryCtxRelease_v2)>(Hook::primary_ctx_release_v2);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return release_primary([&] { return fn(dev); }, dev);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  auto fn = real<decltype(&cuDevicePrimaryCtxReset)>(Hook::primary_ctx_reset);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return reset_primary([&] { return fn(dev); }, dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  auto fn = real<decltype(&cuDevicePrimaryCtxReset_v2)>(Hook::primary_ctx_reset_v2);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return reset_primary([&] { return fn(dev); }, dev);
}

}  // extern "C"
