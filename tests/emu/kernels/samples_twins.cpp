// Host twins of the kernels in samples.cu (see thaw/emu_twin.h). Each twin has its kernel's
// exact name and signature, so it mangles to the name the cubin gives the kernel. A kernel
// without __syncthreads becomes a per-thread twin; one with barriers a per-block twin whose
// body runs one for_each_thread loop per phase between two __syncthreads. __shared__ arrays
// become locals of the block body, per-thread registers that live across a barrier become
// arrays indexed by thread. They are fixed-size arrays for the largest block (1024 threads),
// not std::vector: when a twin touches memory it may not, the emulator leaves it by longjmp,
// which must not skip non-trivial destructors. Where nvcc contracts `x * y + z` into one fused
// multiply-add (it does by default, -fmad=true), the twin calls std::fma, so it rounds as the H100
// does.
//
// This file also exports the library's table (THAW_EMU_TWIN_LIBRARY), for chain_twins.cpp too.
#include <atomic>
#include <cmath>

#include "thaw/emu_twin.h"

using thaw::emu::blockDim;
using thaw::emu::blockIdx;
using thaw::emu::for_each_thread;
using thaw::emu::threadIdx;

constexpr unsigned kMaxThreads = 1024;  // threads per block on sm_90

extern "C" void vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
THAW_EMU_TWIN_PER_THREAD(vec_add);

template <int TILE>
void matmul_tiled(const float* a, const float* b, float* c, int n) {
  float ta[TILE][TILE];  // __shared__
  float tb[TILE][TILE];  // __shared__
  // The kernel requires blockDim == (TILE, TILE, 1) (on a GPU another shape indexes past its
  // tiles); the twin does nothing rather than overrun its arrays.
  if (blockDim.x != TILE || blockDim.y != TILE || blockDim.z != 1) return;
  // Each thread's accumulator lives across the barriers: an array over the block's threads.
  float acc[kMaxThreads] = {};
  const auto thread = [] { return threadIdx.y * TILE + threadIdx.x; };
  for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
    for_each_thread([&] {
      const int tx = threadIdx.x, ty = threadIdx.y;
      const int row = blockIdx.y * TILE + ty;
      const int col = blockIdx.x * TILE + tx;
      const int ac = t * TILE + tx;
      const int br = t * TILE + ty;
      ta[ty][tx] = (row < n && ac < n) ? a[row * n + ac] : 0.0f;
      tb[ty][tx] = (br < n && col < n) ? b[br * n + col] : 0.0f;
    });
    // __syncthreads()
    for_each_thread([&] {
      const int tx = threadIdx.x, ty = threadIdx.y;
      for (int k = 0; k < TILE; ++k) acc[thread()] = std::fma(ta[ty][k], tb[k][tx], acc[thread()]);
    });
    // __syncthreads()
  }
  for_each_thread([&] {
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    if (row < n && col < n) c[row * n + col] = acc[thread()];
  });
}
THAW_EMU_TWIN_PER_BLOCK(matmul_tiled<16>);

void block_reduce_sum(const float* x, float* sum, int n) {
  float s[kMaxThreads];  // extern __shared__ float s[] (blockDim.x floats)
  for_each_thread([&] {
    const unsigned tid = threadIdx.x;
    const unsigned i = blockIdx.x * blockDim.x * 2 + tid;
    float v = 0.0f;
    if (i < unsigned(n)) v += x[i];
    if (i + blockDim.x < unsigned(n)) v += x[i + blockDim.x];
    s[tid] = v;
  });
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    // __syncthreads() before each step: a step reads only what the previous one wrote.
    for_each_thread([&] {
      const unsigned tid = threadIdx.x;
      if (tid < stride) s[tid] += s[tid + stride];
    });
  }
  // atomicAdd(sum, s[0]) from thread 0. The emulator runs the blocks of one launch one after
  // another, so a plain add would do for them; the atomic keeps the twin correct when launches
  // on two streams add into the same sum concurrently, as the device's atomicAdd does.
  for_each_thread([&] {
    if (threadIdx.x == 0) std::atomic_ref<float>(*sum).fetch_add(s[0]);
  });
}
THAW_EMU_TWIN_PER_BLOCK(block_reduce_sum);

// no_twin_fill has no twin on purpose.

THAW_EMU_TWIN_LIBRARY()
