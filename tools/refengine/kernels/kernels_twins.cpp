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
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"
#include "thaw/emu_twin.h"

using thaw::emu::blockDim;
using thaw::emu::blockIdx;
using thaw::emu::for_each_thread;
using thaw::emu::threadIdx;

namespace {

using refengine::kBlockSize;
using refengine::kMaxContext;
using refengine::kMaxHeadDim;
using refengine::kTile;

constexpr unsigned kMaxThreads = 1024;  // threads per block on sm_90

struct F32 {
  using T = float;
  static float load(const float* p, long i) { return p[i]; }
};
struct F16 {
  using T = unsigned short;
  static float load(const unsigned short* p, long i) { return refengine::f16_to_f32(p[i]); }
};
struct BF16 {
  using T = unsigned short;
  static float load(const unsigned short* p, long i) { return refengine::bf16_to_f32(p[i]); }
};

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

// The kernel's arithmetic per output element Y[row][col]: acc = 0, then one fmaf per k over
// k = 0 .. ceil(K / kTile) * kTile - 1, in order (tile by tile, k within the tile), with x and w
// zero beyond K (the shared tiles' padding: fma(0, 0, acc) turns a -0 acc into +0, which is
// why the padding steps are kept), then + bias. Each output's fma chain is independent of the
// others', so the twin computes the block's 16 x 16 outputs row by row with the 16 column
// chains side by side (vectorisable, same rounding) instead of walking the block's threads:
// the same bits as the thread-by-thread form, orders of magnitude faster on the host.
template <class D, bool TRANSPOSED>
void matmul_rows(const float* X, const typename D::T* W, const typename D::T* bias, float* Y, int M,
                 int N, int K, int row0, int col0) {
  const int cols = std::min(kTile, N - col0);
  const int padded_k = (K + kTile - 1) / kTile * kTile;
  for (int row = row0; row < std::min(row0 + kTile, M); ++row) {
    const float* x = X + long(row) * K;
    float acc[kTile] = {};
    if (TRANSPOSED) {
      // W is [N, K]: column c's weights are contiguous.
      for (int c = 0; c < cols; ++c) {
        const typename D::T* w = W + long(col0 + c) * K;
        float a = 0.0f;
        for (int k = 0; k < K; ++k) a = std::fma(x[k], D::load(w, k), a);
        acc[c] = a;
      }
    } else if (cols == kTile) {  // a full strip: the 16 chains in lock step (vectorises)
      for (int k = 0; k < K; ++k) {
        const float xk = x[k];
        const typename D::T* w = W + long(k) * N + col0;
        for (int c = 0; c < kTile; ++c) acc[c] = std::fma(xk, D::load(w, c), acc[c]);
      }
    } else {
      for (int k = 0; k < K; ++k) {
        const float xk = x[k];
        const typename D::T* w = W + long(k) * N + col0;
        for (int c = 0; c < cols; ++c) acc[c] = std::fma(xk, D::load(w, c), acc[c]);
      }
    }
    for (int k = K; k < padded_k; ++k)
      for (int c = 0; c < cols; ++c) acc[c] = std::fma(0.0f, 0.0f, acc[c]);
    for (int c = 0; c < cols; ++c)
      Y[long(row) * N + col0 + c] = bias != nullptr ? acc[c] + D::load(bias, col0 + c) : acc[c];
  }
}

template <class D, bool TRANSPOSED>
void matmul(const float* X, const typename D::T* W, const typename D::T* bias, float* Y, int M,
            int N, int K) {
  // The kernel requires blockDim == (kTile, kTile, 1).
  if (blockDim.x != kTile || blockDim.y != kTile || blockDim.z != 1) return;
  const int row0 = int(blockIdx.y) * kTile, col0 = int(blockIdx.x) * kTile;
  if (row0 >= M || col0 >= N) return;
  matmul_rows<D, TRANSPOSED>(X, W, bias, Y, M, N, K, row0, col0);
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

// One registration per line: the macros name their registrar after __LINE__.
THAW_EMU_TWIN_PER_THREAD(embedding_f32);
THAW_EMU_TWIN_PER_BLOCK(layernorm_f32);
THAW_EMU_TWIN_PER_BLOCK(matmul_bias_f32);
THAW_EMU_TWIN_PER_BLOCK(matmul_nt_f32);
THAW_EMU_TWIN_PER_THREAD(embedding_f16);
THAW_EMU_TWIN_PER_BLOCK(layernorm_f16);
THAW_EMU_TWIN_PER_BLOCK(matmul_bias_f16);
THAW_EMU_TWIN_PER_BLOCK(matmul_nt_f16);
THAW_EMU_TWIN_PER_THREAD(embedding_bf16);
THAW_EMU_TWIN_PER_BLOCK(layernorm_bf16);
THAW_EMU_TWIN_PER_BLOCK(matmul_bias_bf16);
THAW_EMU_TWIN_PER_BLOCK(matmul_nt_bf16);

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
  if (!valid_reduction_block()) return;
  float qs[kMaxHeadDim];      // __shared__
  float scores[kMaxContext];  // __shared__
  float red[kMaxThreads];     // __shared__
  const int h = blockIdx.x, t = blockIdx.y;
  if (head_dim > kMaxHeadDim) return;
  const int seq = query_seq[t];
  int len = context_lens[seq];
  if (query_pos[t] + 1 < len) len = query_pos[t] + 1;
  if (len > kMaxContext) len = kMaxContext;
  const int* table = block_tables + long(seq) * max_blocks;
  float* o = out + (long(t) * n_head + h) * head_dim;
  if (len <= 0) {
    for_each_thread([&] {
      for (int d = threadIdx.x; d < head_dim; d += blockDim.x) o[d] = 0.0f;
    });
    return;
  }
  const auto cached = [&](const float* cache, int j) {
    return cache +
           ((long(table[j / kBlockSize]) * n_head + h) * kBlockSize + j % kBlockSize) * head_dim;
  };
  for_each_thread([&] {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
      qs[d] = q[long(t) * q_stride + h * head_dim + d];
  });
  // __syncthreads()
  for_each_thread([&] {
    float m = -std::numeric_limits<float>::infinity();
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
      const float* kp = cached(k_cache, j);
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot = std::fma(qs[d], kp[d], dot);
      const float s = dot * scale;
      scores[j] = s;
      m = std::fmax(m, s);
    }
    red[threadIdx.x] = m;
  });
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    // __syncthreads() before each step
    for_each_thread([&] {
      const unsigned tid = threadIdx.x;
      if (tid < stride) red[tid] = std::fmax(red[tid], red[tid + stride]);
    });
  }
  const float mx = red[0];
  // __syncthreads()
  for_each_thread([&] {
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
      const float e = refengine::exp_f32(scores[j] - mx);
      scores[j] = e;
      sum += e;
    }
    red[threadIdx.x] = sum;
  });
  block_sum(red);
  const float total = red[0];
  for_each_thread([&] {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < len; ++j) acc = std::fma(scores[j], cached(v_cache, j)[d], acc);
      o[d] = acc / total;
    }
  });
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
