// Contexts: primary contexts (retained by reference count), created contexts, and the
// per-thread context stack.
#include <algorithm>

#include "api_common.hpp"
#include "graph.hpp"

// The original (v1) entry points are exported under their plain names, which cuda.h
// maps to the newest variant: undo that here.
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxSetFlags

using namespace emu;

namespace {

bool valid_ctx_flags(unsigned flags) {
  if (flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) return false;
  unsigned sched = flags & CU_CTX_SCHED_MASK;
  // At most one scheduling policy.
  return sched == CU_CTX_SCHED_AUTO || sched == CU_CTX_SCHED_SPIN || sched == CU_CTX_SCHED_YIELD ||
         sched == CU_CTX_SCHED_BLOCKING_SYNC;
}

CUresult create_context(CUcontext* pctx, unsigned flags, CUdevice dev, Call& c) {
  c.arg("flags", flags).arg("dev", dev);
  EMU_REQUIRE_INIT();
  if (pctx == nullptr || !valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(driver().mu);
  auto ctx = std::make_shared<Context>();
  ctx->device = dev;
  ctx->flags = flags;
  ctx->handle = driver().contexts.add(ctx);
  context_stack().push_back(ctx->handle);
  *pctx = to_handle<CUcontext>(ctx->handle);
  c.out_ptr("ctx", ctx->handle);
  return CUDA_SUCCESS;
}

// Primary context release/reset: everything it owns goes; it can be retained again.
void deactivate_primary(Context& ctx, std::unique_lock<std::mutex>& lock, bool keep_active) {
  release_context_resources(ctx, lock);
  ctx.sticky = std::make_shared<std::atomic<int>>(CUDA_SUCCESS);
  ctx.active = keep_active;
}

}  // namespace

EMU_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return api("cuCtxCreate", [&](Call& c) { return create_context(pctx, flags, dev, c); });
}

EMU_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int numParams,
                                   unsigned int flags, CUdevice dev) {
  return api("cuCtxCreate", [&](Call& c) {
    if (numParams < 0 || (numParams > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    // SM-count affinity needs MPS on real hardware; the emulator has none.
    if (numParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
    return create_context(pctx, flags, dev, c);
  });
}

EMU_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                   CUdevice dev) {
  return api("cuCtxCreate", [&](Call& c) {
    if (params != nullptr) {
      if (params->numExecAffinityParams < 0 ||
          (params->numExecAffinityParams > 0 && params->execAffinityParams == nullptr)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (params->numExecAffinityParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
      if (params->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    }
    return create_context(pctx, flags, dev, c);
  });
}

EMU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return api("cuCtxDestroy", [&](Call& c) {
    c.ptr("ctx", handle_value(ctx));
    EMU_REQUIRE_INIT();
    std::unique_lock lock(driver().mu);
    auto found = driver().contexts.find(handle_value(ctx));
    if (!found || found->destroyed || found->primary) return CUDA_ERROR_INVALID_CONTEXT;
    found->destroyed = true;
    release_context_resources(*found, lock);
    auto& stack = context_stack();
    if (!stack.empty() && stack.back() == found->handle) stack.pop_back();
    return CUDA_SUCCESS;
  });
}

static CUresult primary_retain(CUcontext* pctx, CUdevice dev, Call& c) {
  c.arg("dev", dev);
  EMU_REQUIRE_INIT();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(driver().mu);
  Device& d = driver().device(dev);
  auto ctx = driver().contexts.find(d.primary);
  if (d.primary_refs++ == 0) {
    ctx->active = true;
    ctx->flags = d.primary_flags;
  }
  *pctx = to_handle<CUcontext>(d.primary);
  c.out_ptr("ctx", d.primary).out("refs", d.primary_refs);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return api("cuDevicePrimaryCtxRetain", [&](Call& c) { return primary_retain(pctx, dev, c); });
}

static CUresult primary_release(CUdevice dev, Call& c) {
  c.arg("dev", dev);
  EMU_REQUIRE_INIT();
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::unique_lock lock(driver().mu);
  Device& d = driver().device(dev);
  if (d.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d.primary_refs == 0) {
    auto ctx = driver().contexts.find(d.primary);
    deactivate_primary(*ctx, lock, false);
  }
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return api("cuDevicePrimaryCtxRelease", [&](Call& c) { return primary_release(dev, c); });
}
EMU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return api("cuDevicePrimaryCtxRelease", [&](Call& c) { return primary_release(dev, c); });
}

static CUresult primary_reset(CUdevice dev, Call& c) {
  c.arg("dev", dev);
  EMU_REQUIRE_INIT();
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::unique_lock lock(driver().mu);
  Device& d = driver().device(dev);
  auto ctx = driver().contexts.find(d.primary);
  // All allocations and state go; the reference count is left alone, so the context
  // stays usable for those who retained it, re-initialised.
  deactivate_primary(*ctx, lock, d.primary_refs > 0);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return api("cuDevicePrimaryCtxReset", [&](Call& c) { return primary_reset(dev, c); });
}
EMU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return api("cuDevicePrimaryCtxReset", [&](Call& c) { return primary_reset(dev, c); });
}

EMU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return api("cuDevicePrimaryCtxGetState", [&](Call& c) {
    c.arg("dev", dev);
    EMU_REQUIRE_INIT();
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(driver().mu);
    Device& d = driver().device(dev);
    *flags = d.primary_flags;
    *active = d.primary_refs > 0 ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

static CUresult primary_set_flags(CUdevice dev, unsigned flags, bool v2, Call& c) {
  c.arg("dev", dev).arg("flags", flags);
  EMU_REQUIRE_INIT();
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  Device& d = driver().device(dev);
  // The original entry point refused while the context was active; _v2 (CUDA 11) allows it.
  if (!v2 && d.primary_refs > 0) return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
  d.primary_flags = flags;
  if (auto ctx = driver().contexts.find(d.primary); ctx && ctx->active) ctx->flags = flags;
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return api("cuDevicePrimaryCtxSetFlags",
             [&](Call& c) { return primary_set_flags(dev, flags, false, c); });
}
EMU_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return api("cuDevicePrimaryCtxSetFlags",
             [&](Call& c) { return primary_set_flags(dev, flags, true, c); });
}

EMU_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  return api("cuCtxGetCurrent", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& stack = context_stack();
    *pctx = stack.empty() ? nullptr : to_handle<CUcontext>(stack.back());
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  return api("cuCtxSetCurrent", [&](Call& c) {
    c.ptr("ctx", handle_value(ctx));
    EMU_REQUIRE_INIT();
    auto& stack = context_stack();
    if (ctx == nullptr) {
      if (!stack.empty()) stack.pop_back();
      return CUDA_SUCCESS;
    }
    std::lock_guard lock(driver().mu);
    auto found = context_from_handle_locked(ctx);
    if (!found) return found.error();
    if (stack.empty()) {
      stack.push_back(handle_value(ctx));
    } else {
      stack.back() = handle_value(ctx);
    }
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return api("cuCtxPushCurrent", [&](Call& c) {
    c.ptr("ctx", handle_value(ctx));
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto found = context_from_handle_locked(ctx);
    if (!found) return found.error();
    context_stack().push_back(handle_value(ctx));
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  return api("cuCtxPopCurrent", [&](Call&) {
    EMU_REQUIRE_INIT();
    auto& stack = context_stack();
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx != nullptr) *pctx = to_handle<CUcontext>(stack.back());
    stack.pop_back();
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  return api("cuCtxGetDevice", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    *device = (*ctx)->device;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxGetFlags(unsigned int* flags) {
  return api("cuCtxGetFlags", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    *flags = (*ctx)->flags;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return api("cuCtxGetApiVersion", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto found = ctx == nullptr ? current_context_locked() : context_from_handle_locked(ctx);
    if (!found) return found.error();
    *version = 3020;  // the context ABI of every context since CUDA 3.2
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return api("cuCtxGetStreamPriorityRange", [&](Call&) {
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    if (leastPriority != nullptr) *leastPriority = kLeastStreamPriority;
    if (greatestPriority != nullptr) *greatestPriority = kGreatestStreamPriority;
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuCtxSynchronize() {
  return api("cuCtxSynchronize", [&](Call&) {
    EMU_REQUIRE_INIT();
    std::unique_lock lock(driver().mu);
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    if (CUresult r = check_unsafe_during_capture_locked(); r != CUDA_SUCCESS) return r;
    auto streams = context_streams_locked(**ctx);
    StickyError sticky = (*ctx)->sticky;
    lock.unlock();
    drain(streams);
    return static_cast<CUresult>(sticky->load());
  });
}

// CUDA 13 forms that name the context instead of using the current one.
EMU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  return api("cuCtxSynchronize", [&](Call& c) {
    c.ptr("ctx", handle_value(ctx));
    EMU_REQUIRE_INIT();
    std::unique_lock lock(driver().mu);
    auto found = ctx == nullptr ? current_context_locked() : context_from_handle_locked(ctx);
    if (!found) return found.error();
    auto streams = context_streams_locked(**found);
    StickyError sticky = (*found)->sticky;
    lock.unlock();
    drain(streams);
    return static_cast<CUresult>(sticky->load());
  });
}

EMU_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return api("cuCtxGetDevice", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver().mu);
    auto found = ctx == nullptr ? current_context_locked() : context_from_handle_locked(ctx);
    if (!found) return found.error();
    *device = (*found)->device;
    return CUDA_SUCCESS;
  });
}
