// The reference engine's kernels as CUDA C++ (nvcc -cubin -arch=sm_90). Launch geometry and
// parameters are documented in kernels.h; the host twins in kernels_twins.cpp mirror each
// kernel's arithmetic step by step (same operation order, same explicit fused multiply-adds).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.h"

namespace {

using refengine::kBlockSize;
using refengine::kMaxContext;
using refengine::kMaxHeadDim;
using refengine::kTile;

// Weight loads, widened to fp32 (exact).
struct F32 {
  using T = float;
  static __device__ __forceinline__ float load(const float* p, long i) { return p[i]; }
};
struct F16 {
  using T = unsigned short;
  static __device__ __forceinline__ float load(const unsigned short* p, long i) {
    return __half2float(reinterpret_cast<const __half*>(p)[i]);
  }
};
struct BF16 {
  using T = unsigned short;
  static __device__ __forceinline__ float load(const unsigned short* p, long i) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
  }
};

template <class D>
__device__ void embedding(const int* token, const int* pos, const typename D::T* wte,
                          const typename D::T* wpe, float* h, int num_tokens, int C) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= num_tokens || c >= C) return;
  h[long(t) * C + c] = D::load(wte, long(token[t]) * C + c) + D::load(wpe, long(pos[t]) * C + c);
}

// Tree reduction of s[0 .. blockDim.x) into s[0] (blockDim.x a power of two). Starts and ends
// with a barrier.
__device__ void block_sum(float* s) {
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
}

template <class D>
__device__ void layernorm(const float* x, const typename D::T* w, const typename D::T* b, float* y,
                          int C, float eps) {
  __shared__ float s[1024];
  const unsigned tid = threadIdx.x;
  const float* xr = x + long(blockIdx.x) * C;
  float* yr = y + long(blockIdx.x) * C;
  float sum = 0.0f;
  for (int i = tid; i < C; i += blockDim.x) sum += xr[i];
  s[tid] = sum;
  block_sum(s);
  const float mean = s[0] / float(C);
  __syncthreads();  // everyone has read s[0] before it is overwritten
  float sq = 0.0f;
  for (int i = tid; i < C; i += blockDim.x) {
    const float d = xr[i] - mean;
    sq = fmaf(d, d, sq);
  }
  s[tid] = sq;
  block_sum(s);
  const float rstd = 1.0f / sqrtf(s[0] / float(C) + eps);
  for (int i = tid; i < C; i += blockDim.x) {
    const float n = (xr[i] - mean) * rstd;
    yr[i] = fmaf(n, D::load(w, i), D::load(b, i));
  }
}

// TRANSPOSED: W is [N, K] (the tied LM head) instead of [K, N].
template <class D, bool TRANSPOSED>
__device__ void matmul(const float* X, const typename D::T* W, const typename D::T* bias, float* Y,
                       int M, int N, int K) {
  __shared__ float xs[kTile][kTile];
  __shared__ float ws[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;
  const int col = blockIdx.x * kTile + tx;
  float acc = 0.0f;
  for (int t = 0; t < (K + kTile - 1) / kTile; ++t) {
    const int xk = t * kTile + tx;
    const int wk = t * kTile + ty;
    xs[ty][tx] = (row < M && xk < K) ? X[long(row) * K + xk] : 0.0f;
    if (TRANSPOSED) {
      // ws[k][j] = W[blockIdx.x * kTile + j][t * kTile + k]; thread (tx, ty) loads k = tx, j = ty
      // so that neighbouring threads read neighbouring addresses.
      const int wrow = blockIdx.x * kTile + ty;
      ws[tx][ty] = (wrow < N && xk < K) ? D::load(W, long(wrow) * K + xk) : 0.0f;
    } else {
      ws[ty][tx] = (wk < K && col < N) ? D::load(W, long(wk) * N + col) : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc = fmaf(xs[ty][k], ws[k][tx], acc);
    __syncthreads();
  }
  if (row < M && col < N) Y[long(row) * N + col] = bias != nullptr ? acc + D::load(bias, col) : acc;
}

}  // namespace

#define REFENGINE_DEFINE(SUFFIX, D)                                                                \
  extern "C" __global__ void embedding_##SUFFIX(const int* token, const int* pos, const D::T* wte, \
                                                const D::T* wpe, float* h, int num_tokens,         \
                                                int C) {                                           \
    embedding<D>(token, pos, wte, wpe, h, num_tokens, C);                                          \
  }                                                                                                \
  extern "C" __global__ void layernorm_##SUFFIX(const float* x, const D::T* w, const D::T* b,      \
                                                float* y, int C, float eps) {                      \
    layernorm<D>(x, w, b, y, C, eps);                                                              \
  }                                                                                                \
  extern "C" __global__ void matmul_bias_##SUFFIX(const float* X, const D::T* W, const D::T* bias, \
                                                  float* Y, int M, int N, int K) {                 \
    matmul<D, false>(X, W, bias, Y, M, N, K);                                                      \
  }                                                                                                \
  extern "C" __global__ void matmul_nt_##SUFFIX(const float* X, const D::T* W, float* Y, int M,    \
                                                int N, int K) {                                    \
    matmul<D, true>(X, W, nullptr, Y, M, N, K);                                                    \
  }

REFENGINE_DEFINE(f32, F32)
REFENGINE_DEFINE(f16, F16)
REFENGINE_DEFINE(bf16, BF16)

extern "C" __global__ void gelu_new_f32(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = refengine::gelu_new(x[i]);
}

extern "C" __global__ void residual_add_f32(float* x, const float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

extern "C" __global__ void reshape_and_cache_f32(const float* k, const float* v, int stride,
                                                 float* k_cache, float* v_cache,
                                                 const int* slot_mapping, int num_tokens,
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

extern "C" __global__ void paged_attention_f32(float* out, const float* q, int q_stride,
                                               const float* k_cache, const float* v_cache,
                                               const int* block_tables, int max_blocks,
                                               const int* context_lens, const int* query_seq,
                                               const int* query_pos, int n_head, int head_dim,
                                               float scale) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float scores[kMaxContext];
  __shared__ float red[1024];
  const int h = blockIdx.x, t = blockIdx.y;
  const unsigned tid = threadIdx.x;
  if (head_dim > kMaxHeadDim) return;
  const int seq = query_seq[t];
  int len = context_lens[seq];
  if (query_pos[t] + 1 < len) len = query_pos[t] + 1;
  if (len > kMaxContext) len = kMaxContext;
  const int* table = block_tables + long(seq) * max_blocks;
  float* o = out + (long(t) * n_head + h) * head_dim;
  if (len <= 0) {
    for (int d = tid; d < head_dim; d += blockDim.x) o[d] = 0.0f;
    return;
  }
  for (int d = tid; d < head_dim; d += blockDim.x) qs[d] = q[long(t) * q_stride + h * head_dim + d];
  __syncthreads();
  // Scores, and each thread's maximum.
  float m = __int_as_float(0xff800000);
  for (int j = tid; j < len; j += blockDim.x) {
    const float* kp =
        k_cache +
        ((long(table[j / kBlockSize]) * n_head + h) * kBlockSize + j % kBlockSize) * head_dim;
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot = fmaf(qs[d], kp[d], dot);
    const float s = dot * scale;
    scores[j] = s;
    m = fmaxf(m, s);
  }
  red[tid] = m;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) red[tid] = fmaxf(red[tid], red[tid + stride]);
    __syncthreads();
  }
  const float mx = red[0];
  __syncthreads();
  // Exponentials and their sum.
  float sum = 0.0f;
  for (int j = tid; j < len; j += blockDim.x) {
    const float e = refengine::exp_f32(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  red[tid] = sum;
  block_sum(red);
  const float total = red[0];
  // Weighted values: thread d owns output element d.
  for (int d = tid; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < len; ++j) {
      const float* vp =
          v_cache +
          ((long(table[j / kBlockSize]) * n_head + h) * kBlockSize + j % kBlockSize) * head_dim;
      acc = fmaf(scores[j], vp[d], acc);
    }
    o[d] = acc / total;
  }
}

extern "C" __global__ void argmax_f32(const float* logits, int* out, int n) {
  __shared__ float bv[1024];
  __shared__ int bi[1024];
  const unsigned tid = threadIdx.x;
  const float* row = logits + long(blockIdx.x) * n;
  float best = __int_as_float(0xff800000);
  int at = -1;
  for (int j = tid; j < n; j += blockDim.x) {
    const float v = row[j];
    if (v > best || (at < 0 && v == v)) {  // the first non-NaN, then strictly larger ones
      best = v;
      at = j;
    }
  }
  bv[tid] = best;
  bi[tid] = at;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) {
      const float ov = bv[tid + stride];
      const int oi = bi[tid + stride];
      const int mi = bi[tid];
      if (oi >= 0 && (mi < 0 || ov > bv[tid] || (ov == bv[tid] && oi < mi))) {
        bv[tid] = ov;
        bi[tid] = oi;
      }
    }
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = bi[0] < 0 ? 0 : bi[0];
}
