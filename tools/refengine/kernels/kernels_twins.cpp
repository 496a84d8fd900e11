// Host twins of the reference engine's kernels (kernels.cu), for thaw's CUDA driver emulator
// (see emu/include/thaw/emu_twin.h). Each twin has its kernel's extern "C" name and signature
// (kernels.h) and repeats its arithmetic in the same order: the same per-thread strided loops,
// the same tree reductions, std::fma where the kernel calls fmaf (the cubin is built with
// -fmad=false, so those are its only fused multiply-adds), and the shared scalar
// helpers of kernels.h (weight widening, exp, gelu). Kernels without barriers are per-thread
// twins; kernels with __syncthreads are per-block twins whose body runs one for_each_thread
// loop per phase between two barriers. __shared__ arrays and per-thread values that live
// across a barrier are fixed-size arrays (never std::vector): the emulator leaves a twin that
// faults by longjmp, which must not skip destructors.
//
// The matrix products and attention, nearly all of a forward pass's time, also have fast forms
// (twin_matmul.hpp, twin_attention.hpp): a matmul launch runs as one blocked product over the
// whole grid, attention as whole-block loops. They compute every value with the same operations
// in the same order as the mirrors, so they give the same bits (tests/refengine/twins_test.cpp)
// — the emulator runs those. Built with REFENGINE_TWINS_REFERENCE (the reference library of
// bench/refengine) this file runs the mirrors instead.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"
#include "thaw/emu_twin.h"
#include "twin_attention.hpp"
#include "twin_dtypes.hpp"
#include "twin_matmul.hpp"

using thaw::emu::blockDim;
using thaw::emu::blockIdx;
using thaw::emu::for_each_thread;
using thaw::emu::threadIdx;

namespace {

using refengine::kBlockSize;
using refengine::kTile;
using refengine::twin::BF16;
using refengine::twin::F16;
using refengine::twin::F32;
using refengine::twin::kMaxThreads;

// The kernels' block reductions need blockDim.x a power of two no larger than their arrays.
bool valid_reduction_block() {
  const unsigned n = blockDim.x;
  return n >= 1 && n <= kMaxThreads && (n & (n - 1)) == 0 && blockDim.y == 1 && blockDim.z == 1;
}

// block_sum of kernels.cu: tree reduction of s[0 .. blockDim.x) into s[0].
void block_sum(float* s) {
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    for_each_thread([&] {
      if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    });
  }
}

template <class D>
void embedding(const int* token, const int* pos, const typename D::T* wte, const typename D::T* wpe,
               float* h, int num_tokens, int C) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= num_tokens || c >= C) return;
  h[long(t) * C + c] = D::load(wte, long(token[t]) * C + c) + D::load(wpe, long(pos[t]) * C + c);
}

template <class D>
void layernorm(const float* x, const typename D::T* w, const typename D::T* b, float* y, int C,
               float eps) {
  if (!valid_reduction_block()) return;
  float s[kMaxThreads];  // __shared__
  const float* xr = x + long(blockIdx.x) * C;
  float* yr = y + long(blockIdx.x) * C;
  for_each_thread([&] {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) sum += xr[i];
    s[threadIdx.x] = sum;
  });
  block_sum(s);
  const float mean = s[0] / float(C);
  for_each_thread([&] {
    float sq = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      const float d = xr[i] - mean;
      sq = std::fma(d, d, sq);
    }
    s[threadIdx.x] = sq;
  });
  block_sum(s);
  const float rstd = 1.0f / std::sqrt(s[0] / float(C) + eps);
  for_each_thread([&] {
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
      const float n = (xr[i] - mean) * rstd;
      yr[i] = std::fma(n, D::load(w, i), D::load(b, i));
    }
  });
}

// One block of the kernel (the per-block twin: the extern "C" functions below; the reference
// twin library of bench/refengine registers these).
template <class D, bool TRANSPOSED>
void matmul(const float* X, const typename D::T* W, const typename D::T* bias, float* Y, int M,
            int N, int K) {
  // The kernel requires blockDim == (kTile, kTile, 1).
  if (blockDim.x != kTile || blockDim.y != kTile || blockDim.z != 1) return;
  const int row0 = int(blockIdx.y) * kTile, col0 = int(blockIdx.x) * kTile;
  if (row0 >= M || col0 >= N) return;
  refengine::twin::matmul_tile<D, TRANSPOSED>(X, W, bias, Y, M, N, K, row0, col0);
}

// Parameter i of a launch, of type T.
template <class T>
T arg(const ThawEmuLaunch* l, int i) {
  return *static_cast<const T*>(l->params[i]);
}

// The whole launch at once (twin_matmul.hpp): every block the grid covers, with the same bits.
// blockIdx.z repeats the same writes, so one pass serves any grid.z.
template <class D, bool TRANSPOSED>
void matmul_launch(const ThawEmuLaunch* l) {
  if (l->block.x != unsigned(kTile) || l->block.y != unsigned(kTile) || l->block.z != 1) return;
  using W = const typename D::T*;
  const int i = TRANSPOSED ? 3 : 4;  // matmul_nt has no bias parameter
  const int M = arg<int>(l, i), N = arg<int>(l, i + 1), K = arg<int>(l, i + 2);
  if (M <= 0 || N <= 0 || l->grid.z == 0) return;
  const int rows = int(std::min<long>(M, long(l->grid.y) * kTile));
  const int cols = int(std::min<long>(N, long(l->grid.x) * kTile));
  refengine::twin::matmul_grid<D, TRANSPOSED>(arg<const float*>(l, 0), arg<W>(l, 1),
                                              TRANSPOSED ? nullptr : arg<W>(l, 2),
                                              arg<float*>(l, i - 1), M, N, K, rows, cols);
}

}  // namespace

#define REFENGINE_DEFINE(SUFFIX, D)                                                               \
  extern "C" void embedding_##SUFFIX(const int* token, const int* pos, const D::T* wte,           \
                                     const D::T* wpe, float* h, int num_tokens, int C) {          \
    embedding<D>(token, pos, wte, wpe, h, num_tokens, C);                                         \
  }                                                                                               \
  extern "C" void layernorm_##SUFFIX(const float* x, const D::T* w, const D::T* b, float* y,      \
                                     int C, float eps) {                                          \
    layernorm<D>(x, w, b, y, C, eps);                                                             \
  }                                                                                               \
  extern "C" void matmul_bias_##SUFFIX(const float* X, const D::T* W, const D::T* bias, float* Y, \
                                       int M, int N, int K) {                                     \
    matmul<D, false>(X, W, bias, Y, M, N, K);                                                     \
  }                                                                                               \
  extern "C" void matmul_nt_##SUFFIX(const float* X, const D::T* W, float* Y, int M, int N,       \
                                     int K) {                                                     \
    matmul<D, true>(X, W, nullptr, Y, M, N, K);                                                   \
  }

REFENGINE_DEFINE(f32, F32)
REFENGINE_DEFINE(f16, F16)
REFENGINE_DEFINE(bf16, BF16)
#undef REFENGINE_DEFINE

// One registration per line: the macros name their registrar after __LINE__. The matrix
// products run as whole launches (matmul_launch); the reference twin library of bench/refengine
// (REFENGINE_TWINS_REFERENCE) runs them block by block as before, for its before/after.
#ifdef REFENGINE_TWINS_REFERENCE
#define REFENGINE_TWIN_MATMUL(NAME, D, TRANSPOSED) THAW_EMU_TWIN_PER_BLOCK(NAME)
#else
#define REFENGINE_TWIN_MATMUL(NAME, D, TRANSPOSED)                                 \
  static ::thaw::emu::detail::Registrar THAW_EMU_CONCAT(thaw_emu_twin_, __LINE__)( \
      reinterpret_cast<const void*>(&NAME), &matmul_launch<D, TRANSPOSED>)
#endif
THAW_EMU_TWIN_PER_THREAD(embedding_f32);
THAW_EMU_TWIN_PER_BLOCK(layernorm_f32);
REFENGINE_TWIN_MATMUL(matmul_bias_f32, F32, false);
REFENGINE_TWIN_MATMUL(matmul_nt_f32, F32, true);
THAW_EMU_TWIN_PER_THREAD(embedding_f16);
THAW_EMU_TWIN_PER_BLOCK(layernorm_f16);
REFENGINE_TWIN_MATMUL(matmul_bias_f16, F16, false);
REFENGINE_TWIN_MATMUL(matmul_nt_f16, F16, true);
THAW_EMU_TWIN_PER_THREAD(embedding_bf16);
THAW_EMU_TWIN_PER_BLOCK(layernorm_bf16);
REFENGINE_TWIN_MATMUL(matmul_bias_bf16, BF16, false);
REFENGINE_TWIN_MATMUL(matmul_nt_bf16, BF16, true);
#undef REFENGINE_TWIN_MATMUL

extern "C" void gelu_new_f32(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = refengine::gelu_new(x[i]);
}
THAW_EMU_TWIN_PER_THREAD(gelu_new_f32);

extern "C" void residual_add_f32(float* x, const float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}
THAW_EMU_TWIN_PER_THREAD(residual_add_f32);

extern "C" void reshape_and_cache_f32(const float* k, const float* v, int stride, float* k_cache,
                                      float* v_cache, const int* slot_mapping, int num_tokens,
                                      int n_head, int head_dim) {
  const int t = blockIdx.x;
  if (t >= num_tokens) return;
  const int slot = slot_mapping[t];
  if (slot < 0) return;
  const long block = slot / kBlockSize;
  const int offset = slot % kBlockSize;
  for (int i = threadIdx.x; i < n_head * head_dim; i += blockDim.x) {
    const int h = i / head_dim, d = i % head_dim;
    const long dst = ((block * n_head + h) * kBlockSize + offset) * head_dim + d;
    k_cache[dst] = k[long(t) * stride + i];
    v_cache[dst] = v[long(t) * stride + i];
  }
}
THAW_EMU_TWIN_PER_THREAD(reshape_and_cache_f32);

extern "C" void paged_attention_f32(float* out, const float* q, int q_stride, const float* k_cache,
                                    const float* v_cache, const int* block_tables, int max_blocks,
                                    const int* context_lens, const int* query_seq,
                                    const int* query_pos, int n_head, int head_dim, float scale) {
  if (!valid_reduction_block() || head_dim > refengine::kMaxHeadDim) return;
  const refengine::twin::AttentionArgs a{
      out,          q,         q_stride,  k_cache, v_cache,  block_tables, max_blocks,
      context_lens, query_seq, query_pos, n_head,  head_dim, scale};
#ifdef REFENGINE_TWINS_REFERENCE
  refengine::twin::paged_attention_threads(a, int(blockIdx.x), int(blockIdx.y));
#else
  refengine::twin::paged_attention_block(a, int(blockIdx.x), int(blockIdx.y), blockDim.x);
#endif
}
THAW_EMU_TWIN_PER_BLOCK(paged_attention_f32);

extern "C" void argmax_f32(const float* logits, int* out, int n) {
  if (!valid_reduction_block()) return;
  float bv[kMaxThreads];  // __shared__
  int bi[kMaxThreads];    // __shared__
  const float* row = logits + long(blockIdx.x) * n;
  for_each_thread([&] {
    float best = -std::numeric_limits<float>::infinity();
    int at = -1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = row[j];
      if (v > best || (at < 0 && v == v)) {
        best = v;
        at = j;
      }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = at;
  });
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    // __syncthreads() before each step
    for_each_thread([&] {
      const unsigned tid = threadIdx.x;
      if (tid < stride) {
        const float ov = bv[tid + stride];
        const int oi = bi[tid + stride];
        const int mi = bi[tid];
        if (oi >= 0 && (mi < 0 || ov > bv[tid] || (ov == bv[tid] && oi < mi))) {
          bv[tid] = ov;
          bi[tid] = oi;
        }
      }
    });
  }
  out[blockIdx.x] = bi[0] < 0 ? 0 : bi[0];
}
THAW_EMU_TWIN_PER_BLOCK(argmax_f32);

THAW_EMU_TWIN_LIBRARY()
