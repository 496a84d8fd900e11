// The host twin of paged_attention_f32 (kernels.cu), two ways that give the same bits, as
// twin_matmul.hpp's: paged_attention_threads mirrors the kernel thread by thread (one
// for_each_thread loop per phase between barriers: the readable mirror, and bench/refengine's
// "before"); paged_attention_block computes the same block with loops the compiler can
// vectorise, which is what the emulator runs.
//
// Why they agree: every value the kernel computes depends only on its own operands in a fixed
// order, never on which thread computed it or when. Score j is one fma chain over d; thread
// tid's running max and sum take the j's with j % blockDim.x == tid in increasing order, so
// walking all j in order and updating red[j % blockDim.x] repeats each thread's sequence; the
// tree reductions are the kernel's; output d is one fma chain over j in order, and a loop over
// j with d inside keeps each chain's order. tests/refengine/twins_test.cpp checks the two bit
// for bit.
#ifndef REFENGINE_TWIN_ATTENTION_HPP
#define REFENGINE_TWIN_ATTENTION_HPP

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"
#include "thaw/emu_twin.h"
#include "twin_dtypes.hpp"

namespace refengine::twin {

constexpr unsigned kMaxThreads = 1024;  // threads per block on sm_90

// The arguments of one launch (kernels.h documents them).
struct AttentionArgs {
  float* out;
  const float* q;
  int q_stride;
  const float* k_cache;
  const float* v_cache;
  const int* block_tables;
  int max_blocks;
  const int* context_lens;
  const int* query_seq;
  const int* query_pos;
  int n_head;
  int head_dim;
  float scale;
};

namespace detail {

// Context length of query token t (clipped as the kernel clips it).
inline int attention_len(const AttentionArgs& a, int t) {
  int len = a.context_lens[a.query_seq[t]];
  if (a.query_pos[t] + 1 < len) len = a.query_pos[t] + 1;
  if (len > kMaxContext) len = kMaxContext;
  return len;
}

// Where position j of the query's sequence lives in a cache.
inline const float* attention_cached(const AttentionArgs& a, const float* cache, const int* table,
                                     int h, int j) {
  return cache +
         ((long(table[j / kBlockSize]) * a.n_head + h) * kBlockSize + j % kBlockSize) * a.head_dim;
}

// dot[jj] = the fma chain over d of qs[d] * kb[jj][d], for a full cache block whose rows are a
// multiple of 8 long: the block transposed, one vector fma per d. False (nothing done) where
// that does not apply.
inline bool block_dots_vector(const float* qs, const float* kb, int nj, int head_dim, float* dot) {
#ifdef REFENGINE_TWIN_AVX2
  if (nj != kBlockSize || head_dim % 8 != 0) return false;
  static_assert(kBlockSize == 16);
  alignas(32) float kt[kMaxHeadDim][kBlockSize];
  for (int d0 = 0; d0 < head_dim; d0 += 8)
    for (int jj0 = 0; jj0 < kBlockSize; jj0 += 8)
      transpose8x8(kb + long(jj0) * head_dim + d0, head_dim, &kt[d0][jj0], kBlockSize);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int d = 0; d < head_dim; ++d) {
    const __m256 qd = _mm256_set1_ps(qs[d]);
    lo = _mm256_fmadd_ps(qd, _mm256_load_ps(kt[d]), lo);
    hi = _mm256_fmadd_ps(qd, _mm256_load_ps(kt[d] + 8), hi);
  }
  _mm256_storeu_ps(dot, lo);
  _mm256_storeu_ps(dot + 8, hi);
  return true;
#else
  (void)qs, (void)kb, (void)nj, (void)head_dim, (void)dot;
  return false;
#endif
}

#ifdef REFENGINE_TWIN_AVX2
// refengine::exp_f32 (kernels.h) on 8 lanes: the same operations in the same order, the
// branches as blends, so the same bits (twins_test checks it over every float range).
inline __m256 exp_f32_x8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269502163f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // rint
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.4286068203094173e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^e from its bits; e = 128 (the top of the range) as p * 2 * 2^127, as exp_f32 does.
  const __m256i e = _mm256_cvtps_epi32(n);  // n is an integer: exact (garbage lanes are blended)
  const __m256i top = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(127));
  const __m256i e_clamped = _mm256_min_epi32(e, _mm256_set1_epi32(127));
  const __m256 scale = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(e_clamped, _mm256_set1_epi32(127)), 23));
  p = _mm256_blendv_ps(p, _mm256_mul_ps(p, _mm256_set1_ps(2.0f)), _mm256_castsi256_ps(top));
  __m256 y = _mm256_mul_ps(p, scale);
  // x > 88.5: inf. !(x >= -87.33654) (NaN included): NaN stays itself, the rest flush to 0.
  y = _mm256_blendv_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000)),
                       _mm256_cmp_ps(x, _mm256_set1_ps(88.5f), _CMP_GT_OQ));
  const __m256 nan_or_zero =
      _mm256_blendv_ps(_mm256_setzero_ps(), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_ps(y, nan_or_zero,
                          _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_NGE_UQ));
}
#endif

}  // namespace detail

// Block (h, t) of the kernel, thread by thread: thaw::emu::blockDim.x threads (a power of two
// <= kMaxThreads, checked by the caller), head_dim <= kMaxHeadDim.
inline void paged_attention_threads(const AttentionArgs& a, int h, int t) {
  using thaw::emu::blockDim;
  using thaw::emu::for_each_thread;
  using thaw::emu::threadIdx;
  float qs[kMaxHeadDim];      // __shared__
  float scores[kMaxContext];  // __shared__
  float red[kMaxThreads];     // __shared__
  const int head_dim = a.head_dim;
  const int len = detail::attention_len(a, t);
  const int* table = a.block_tables + long(a.query_seq[t]) * a.max_blocks;
  float* o = a.out + (long(t) * a.n_head + h) * head_dim;
  if (len <= 0) {
    for_each_thread([&] {
      for (int d = threadIdx.x; d < head_dim; d += blockDim.x) o[d] = 0.0f;
    });
    return;
  }
  for_each_thread([&] {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
      qs[d] = a.q[long(t) * a.q_stride + h * head_dim + d];
  });
  // __syncthreads()
  for_each_thread([&] {
    float m = -std::numeric_limits<float>::infinity();
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
      const float* kp = detail::attention_cached(a, a.k_cache, table, h, j);
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot = std::fma(qs[d], kp[d], dot);
      const float s = dot * a.scale;
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
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {  // block_sum
    for_each_thread([&] {
      if (threadIdx.x < stride) red[threadIdx.x] += red[threadIdx.x + stride];
    });
  }
  const float total = red[0];
  for_each_thread([&] {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < len; ++j)
        acc = std::fma(scores[j], detail::attention_cached(a, a.v_cache, table, h, j)[d], acc);
      o[d] = acc / total;
    }
  });
}

// Block (h, t) of the kernel with `threads` threads, as whole-block loops: the same bits as
// paged_attention_threads.
inline void paged_attention_block(const AttentionArgs& a, int h, int t, unsigned threads) {
  float qs[kMaxHeadDim];
  float scores[kMaxContext];
  float red[kMaxThreads];
  const int head_dim = a.head_dim;
  const int len = detail::attention_len(a, t);
  const int* table = a.block_tables + long(a.query_seq[t]) * a.max_blocks;
  float* o = a.out + (long(t) * a.n_head + h) * head_dim;
  if (len <= 0) {
    for (int d = 0; d < head_dim; ++d) o[d] = 0.0f;
    return;
  }
  for (int d = 0; d < head_dim; ++d) qs[d] = a.q[long(t) * a.q_stride + h * head_dim + d];
  // Scores, one cache block (kBlockSize positions, contiguous rows) at a time: kBlockSize
  // independent fma chains over d, side by side.
  for (int j0 = 0; j0 < len; j0 += kBlockSize) {
    const float* kb = detail::attention_cached(a, a.k_cache, table, h, j0);
    const int nj = std::min(kBlockSize, len - j0);
    alignas(32) float dot[kBlockSize] = {};
    if (!detail::block_dots_vector(qs, kb, nj, head_dim, dot))
      for (int d = 0; d < head_dim; ++d)  // only the filled positions of a last, partial block
        for (int jj = 0; jj < nj; ++jj)
          dot[jj] = std::fma(qs[d], kb[long(jj) * head_dim + d], dot[jj]);
    for (int jj = 0; jj < nj; ++jj) scores[j0 + jj] = dot[jj] * a.scale;
  }
  const unsigned lanes = threads - 1;  // threads is a power of two
  for (unsigned tid = 0; tid < threads; ++tid) red[tid] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < len; ++j) red[j & lanes] = std::fmax(red[j & lanes], scores[j]);
  for (unsigned stride = threads / 2; stride > 0; stride /= 2)
    for (unsigned tid = 0; tid < stride; ++tid) red[tid] = std::fmax(red[tid], red[tid + stride]);
  const float mx = red[0];
  {  // exponentials, 8 at a time where the vector exp is there, then each thread's sum
    int j = 0;
#ifdef REFENGINE_TWIN_AVX2
    for (const __m256 m = _mm256_set1_ps(mx); j + 8 <= len; j += 8)
      _mm256_storeu_ps(scores + j,
                       detail::exp_f32_x8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), m)));
#endif
    for (; j < len; ++j) scores[j] = refengine::exp_f32(scores[j] - mx);
  }
  for (unsigned tid = 0; tid < threads; ++tid) red[tid] = 0.0f;
  for (int j = 0; j < len; ++j) red[j & lanes] += scores[j];
  for (unsigned stride = threads / 2; stride > 0; stride /= 2)
    for (unsigned tid = 0; tid < stride; ++tid) red[tid] += red[tid + stride];
  const float total = red[0];
  // Output d: one fma chain over j per d, kChunk d's side by side in registers (a fixed count,
  // so that the compiler keeps them there and vectorises).
  constexpr int kChunk = 64;
  for (int d0 = 0; d0 < head_dim; d0 += kChunk) {
    const int nd = std::min(kChunk, head_dim - d0);
    if (nd == kChunk) {
      alignas(32) float acc[kChunk] = {};
#ifdef REFENGINE_TWIN_AVX2
      __m256 v[kChunk / 8];
      for (int i = 0; i < kChunk / 8; ++i) v[i] = _mm256_setzero_ps();
      for (int j = 0; j < len; ++j) {
        const float* vp = detail::attention_cached(a, a.v_cache, table, h, j) + d0;
        const __m256 s = _mm256_set1_ps(scores[j]);
        for (int i = 0; i < kChunk / 8; ++i)
          v[i] = _mm256_fmadd_ps(s, _mm256_loadu_ps(vp + 8 * i), v[i]);
      }
      for (int i = 0; i < kChunk / 8; ++i) _mm256_store_ps(acc + 8 * i, v[i]);
#else
      for (int j = 0; j < len; ++j) {
        const float* vp = detail::attention_cached(a, a.v_cache, table, h, j) + d0;
        const float s = scores[j];
        for (int d = 0; d < kChunk; ++d) acc[d] = std::fma(s, vp[d], acc[d]);
      }
#endif
      for (int d = 0; d < kChunk; ++d) o[d0 + d] = acc[d] / total;
    } else {
      float acc[kChunk] = {};
      for (int j = 0; j < len; ++j) {
        const float* vp = detail::attention_cached(a, a.v_cache, table, h, j) + d0;
        const float s = scores[j];
        for (int d = 0; d < nd; ++d) acc[d] = std::fma(s, vp[d], acc[d]);
      }
      for (int d = 0; d < nd; ++d) o[d0 + d] = acc[d] / total;
    }
  }
}

}  // namespace refengine::twin

#endif  // REFENGINE_TWIN_ATTENTION_HPP
