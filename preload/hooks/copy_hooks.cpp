// Hooks of host-to-device copies: the copy itself is the driver's, unchanged; what the shim
// adds is the record — when the source lies in a mapping of a managed model file and the
// destination in a deterministic-layout allocation, the copy map notes which file bytes
// landed where (what weight injection will know is already on the GPU).
#include <cuda.h>

#include "preload/files/file_mappings.hpp"
#include "preload/hooks/layout_instance.hpp"
#include "preload/hooks/recorder_instance.hpp"
#include "preload/interpose/hook_table.hpp"
#include "preload/shim/shim_state.hpp"

// The per-thread-default-stream variants cuda.h declares only under
// CUDA_API_PER_THREAD_DEFAULT_STREAM (same signatures as the plain ones).
extern "C" {
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
}

using namespace thaw::preload;

namespace {

void note_h2d(CUdeviceptr dst, const void* src, size_t bytes) {
  if (ReentryGuard::inside() || bytes == 0) return;
  ReentryGuard guard;
  counters().calls_intercepted.fetch_add(1, std::memory_order_relaxed);
  auto source = file_source(src, bytes);  // cheap when no model file is mapped
  if (!source) return;
  LayoutRecorder* recorder = recorder_instance();
  DeterministicLayout* layout = recorder != nullptr ? layout_instance() : nullptr;
  if (layout == nullptr) return;
  auto a = layout->find(dst);
  if (!a || dst + bytes > a->base + a->size) return;
  recorder->note_copy({a->index, dst - a->base, source->file, source->file_offset, bytes});
}

template <typename Fn>
Fn driver(Hook h) {
  return real<Fn>(h);
}

}  // namespace

extern "C" {

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  auto fn = driver<decltype(&cuMemcpyHtoD_v2)>(Hook::memcpy_htod);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = fn(dst, src, bytes);
  if (r == CUDA_SUCCESS) note_h2d(dst, src, bytes);
  return r;
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t bytes) {
  auto fn = driver<decltype(&cuMemcpyHtoD_v2_ptds)>(Hook::memcpy_htod_ptds);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = fn(dst, src, bytes);
  if (r == CUDA_SUCCESS) note_h2d(dst, src, bytes);
  return r;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  auto fn = driver<decltype(&cuMemcpyHtoDAsync_v2)>(Hook::memcpy_htod_async);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = fn(dst, src, bytes, stream);
  if (r == CUDA_SUCCESS) note_h2d(dst, src, bytes);
  return r;
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t bytes,
                                   CUstream stream) {
  auto fn = driver<decltype(&cuMemcpyHtoDAsync_v2_ptsz)>(Hook::memcpy_htod_async_ptsz);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = fn(dst, src, bytes, stream);
  if (r == CUDA_SUCCESS) note_h2d(dst, src, bytes);
  return r;
}

}  // extern "C"
