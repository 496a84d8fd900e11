// Hooks of host-to-device copies. When the source lies in a mapping of a managed model file:
// - attached to a prewarmed slot, the copy may be weight injection's (preload/inject): a
//   device-to-device copy from the slot's pages, or — zero-copy — nothing at all because
//   the destination already holds the bytes; otherwise the driver copies as usual;
// - with the deterministic layout, the copy map notes which file bytes landed where (what
//   the next prewarm of this model lays out the same way).
#include <cuda.h>

#include "preload/files/file_mappings.hpp"
#include "preload/interpose/hook_table.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"

// The per-thread-default-stream variants cuda.h declares only under
// CUDA_API_PER_THREAD_DEFAULT_STREAM (same signatures as the plain ones).
extern "C" {
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
}

using namespace thaw::preload;

namespace {

// How a hooked copy orders: on `stream`, and whether the call returns only once it is done.
struct Ordering {
  CUstream stream;
  bool synchronous;
};

template <typename Real>
CUresult h2d(Real real_copy, CUdeviceptr dst, const void* src, size_t bytes, Ordering order) {
  if (ReentryGuard::inside() || bytes == 0) return real_copy();
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  auto source = runtime().file_mappings().source(src, bytes);  // cheap when no model file is mapped
  if (!source) return real_copy();
  DeterministicLayout* layout = runtime().layout();
  std::optional<LayoutAllocation> a;
  if (layout != nullptr) {
    a = layout->find(dst);
    // Copies into a reservation placed at the caller's requested address are not in the
    // sequence the copy map indexes.
    if (a && (dst + bytes > a->base + a->size || a->index == LayoutAllocation::kOutOfSequence)) {
      a.reset();
    }
  }
  const std::optional<std::uint64_t> region_offset =
      a ? std::optional(dst - layout->base()) : std::nullopt;
  const bool backed = a && a->backed;
  CUresult r = CUDA_SUCCESS;
  std::optional<CUresult> injected;
  WeightInjector* injector = runtime().injector();
  if (injector != nullptr) {
    injected = injector->copy(dst, region_offset, backed, source->model, source->file,
                              source->file_offset, bytes, order.stream, order.synchronous);
  }
  if (injected) {
    r = *injected;
  } else {
    r = real_copy();
    if (r == CUDA_SUCCESS && backed && injector != nullptr)
      injector->note_write(*region_offset, bytes);
  }
  if (r == CUDA_SUCCESS && a) {
    if (LayoutRecorder* recorder = runtime().recorder()) {
      recorder->note_copy({a->index, dst - a->base, source->file, source->file_offset, bytes});
    }
  }
  return r;
}

}  // namespace

extern "C" {

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  auto fn = real<decltype(&cuMemcpyHtoD_v2)>(Hook::memcpy_htod);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return h2d([&] { return fn(dst, src, bytes); }, dst, src, bytes, {nullptr, true});
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes) {
  auto fn = real<decltype(&cuMemcpyHtoD_v2_ptds)>(Hook::memcpy_htod_ptds);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return h2d([&] { return fn(dst, src, bytes); }, dst, src, bytes, {CU_STREAM_PER_THREAD, true});
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  auto fn = real<decltype(&cuMemcpyHtoDAsync_v2)>(Hook::memcpy_htod_async);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return h2d([&] { return fn(dst, src, bytes, stream); }, dst, src, bytes, {stream, false});
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t bytes,
                                   CUstream stream) {
  auto fn = real<decltype(&cuMemcpyHtoDAsync_v2_ptsz)>(Hook::memcpy_htod_async_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  // In the per-thread-default-stream build, stream 0 means this thread's default stream.
  const CUstream s = stream == nullptr ? CU_STREAM_PER_THREAD : stream;
  return h2d([&] { return fn(dst, src, bytes, stream); }, dst, src, bytes, {s, false});
}

}  // extern "C"
