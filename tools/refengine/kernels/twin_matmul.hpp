// The host twins' matrix products (matmul_bias_*, matmul_nt_* of kernels.cu), two ways that
// give the same bits:
//   matmul_tile  the kernel's own structure, one kTile x kTile block of outputs per call: the
//                readable mirror, and the "before" of bench/refengine (reference twins);
//   matmul_grid  a whole launch at once, blocked for the host's caches and registers: what the
//                emulator runs (~1-2 GFLOP/s became tens: the emulator's bottleneck, issue 20).
// Both compute every output Y[row][col] with the kernel's own arithmetic, which is what makes
// them interchangeable: acc = 0, one fma per k over k = 0 .. K - 1 in order, then one fma(0, 0,
// acc) per padding k up to the next multiple of kTile (it turns -0 into +0 and nothing else),
// then + bias once. Only which outputs are computed when, and where a partial acc waits
// between two k blocks (in Y, exactly), differ. tests/refengine/twins_test.cpp checks the two
// bit for bit; no result depends on timing, threads or the machine's load.
#ifndef REFENGINE_TWIN_MATMUL_HPP
#define REFENGINE_TWIN_MATMUL_HPP

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "kernels.h"
#include "twin_dtypes.hpp"

namespace refengine::twin {

// Y[row][col] for rows row0 .. row0 + kTile and cols col0 .. col0 + kTile (clipped to M, N):
// one block of the kernel. TRANSPOSED: W is [N, K] (the tied LM head), else [K, N].
template <class D, bool TRANSPOSED>
void matmul_tile(const float* X, const typename D::T* W, const typename D::T* bias, float* Y, int M,
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

namespace detail {

// Blocking: a register tile of kMr rows x kNr columns (two vectors per row: 12 or 16
// accumulators, enough independent fma chains to hide the fma latency), a panel of kNc columns
// x kKc k's widened to fp32 once and reused by every row tile (32 KiB: the L1 cache). The panel
// is on the stack: the emulator leaves a faulting twin by longjmp, which must not skip a
// destructor. The vector width changes only which outputs are computed side by side.
#ifdef REFENGINE_TWIN_AVX512
constexpr int kMr = 8;
constexpr int kNr = 32;
#else
constexpr int kMr = 6;
constexpr int kNr = 16;
#endif
constexpr int kNc = 64;
constexpr int kKc = 128;
constexpr int kPrefetchRows = 16;

// acc[r][c] = fma(x[r][k], panel[k][c], acc[r][c]) for k = 0 .. kc - 1 in order, r < MR, c < kNr.
template <int MR>
void micro_kernel(const float* x, long ldx, const float* panel, int kc, float (*acc)[kNr]) {
#if defined(REFENGINE_TWIN_AVX512)
  __m512 a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) {
    a0[r] = _mm512_loadu_ps(acc[r]);
    a1[r] = _mm512_loadu_ps(acc[r] + 16);
  }
  for (int k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_load_ps(panel + k * kNr);
    const __m512 w1 = _mm512_load_ps(panel + k * kNr + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 xk = _mm512_set1_ps(x[r * ldx + k]);
      a0[r] = _mm512_fmadd_ps(xk, w0, a0[r]);
      a1[r] = _mm512_fmadd_ps(xk, w1, a1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(acc[r], a0[r]);
    _mm512_storeu_ps(acc[r] + 16, a1[r]);
  }
#elif defined(REFENGINE_TWIN_AVX2)
  __m256 a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) {
    a0[r] = _mm256_loadu_ps(acc[r]);
    a1[r] = _mm256_loadu_ps(acc[r] + 8);
  }
  for (int k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * kNr);
    const __m256 w1 = _mm256_load_ps(panel + k * kNr + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xk = _mm256_broadcast_ss(x + r * ldx + k);
      a0[r] = _mm256_fmadd_ps(xk, w0, a0[r]);
      a1[r] = _mm256_fmadd_ps(xk, w1, a1[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(acc[r], a0[r]);
    _mm256_storeu_ps(acc[r] + 8, a1[r]);
  }
#else
  for (int k = 0; k < kc; ++k)
    for (int r = 0; r < MR; ++r) {
      const float xk = x[r * ldx + k];
      for (int c = 0; c < kNr; ++c) acc[r][c] = std::fma(xk, panel[k * kNr + c], acc[r][c]);
    }
#endif
}

// micro_kernel<mr> for a run-time mr in 1 .. kMr.
inline void micro_kernel(int mr, const float* x, long ldx, const float* panel, int kc,
                         float (*acc)[kNr]) {
  using Fn = void (*)(const float*, long, const float*, int, float(*)[kNr]);
  static constexpr auto table = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array<Fn, sizeof...(I)>{&micro_kernel<I + 1>...};
  }
  (std::make_integer_sequence<int, kMr>{});
  table[mr - 1](x, ldx, panel, kc, acc);
}

// panel[p][k][c] = W's element (k0 + k, c0 + p * kNr + c) widened, for k < kc and p * kNr + c
// < nc; the other columns of the last sub-panel are 0 (computed, never stored).
template <class D, bool TRANSPOSED>
void pack(const typename D::T* W, int N, int K, int k0, int kc, int c0, int nc,
          float (*panel)[kKc][kNr]) {
  const int subpanels = (nc + kNr - 1) / kNr;
  if (nc % kNr != 0)
    for (int k = 0; k < kc; ++k)
      std::fill(panel[subpanels - 1][k] + nc % kNr, panel[subpanels - 1][k] + kNr, 0.0f);
  if (TRANSPOSED) {  // W[c][k]: one column's k's are contiguous; transposed 8 x 8 at a time
    alignas(32) float rows[8][kKc];
    for (int c8 = 0; c8 < nc; c8 += 8) {
      const int n8 = std::min(8, nc - c8);
      for (int c = 0; c < n8; ++c) D::widen(W + long(c0 + c8 + c) * K + k0, kc, rows[c]);
      for (int c = n8; c < 8; ++c) std::fill_n(rows[c], kc, 0.0f);
      float(*sub)[kNr] = panel[c8 / kNr];
      const int lane = c8 % kNr;
      int k = 0;
#ifdef REFENGINE_TWIN_AVX2
      for (; k + 8 <= kc; k += 8) transpose8x8(&rows[0][k], kKc, &sub[k][lane], kNr);
#endif
      for (; k < kc; ++k)
        for (int c = 0; c < 8; ++c) sub[k][lane + c] = rows[c][k];
    }
  } else {  // W[k][c]: one k's columns are contiguous
    for (int k = 0; k < kc; ++k) {
      // Consecutive rows are N elements apart, often more than a page (the emulator's device
      // memory has 4 KiB pages), where no hardware prefetcher follows: ask for the columns of
      // the row kPrefetchRows ahead while widening this one (x1.3-1.4 for gpt2-large's products).
      if (k0 + k + kPrefetchRows < K) {
        const char* ahead =
            reinterpret_cast<const char*>(W + long(k0 + k + kPrefetchRows) * N + c0);
        for (int b = 0; b < nc * int(sizeof(typename D::T)); b += 64) __builtin_prefetch(ahead + b);
      }
      for (int p = 0; p < subpanels; ++p)
        D::widen(W + long(k0 + k) * N + c0 + p * kNr, std::min(kNr, nc - p * kNr), panel[p][k]);
    }
  }
}

}  // namespace detail

// Y[row][col] for row < rows <= M, col < cols <= N: every block of a launch whose grid covers
// rows x cols. Same results as matmul_tile over those blocks, bit for bit.
template <class D, bool TRANSPOSED>
void matmul_grid(const float* X, const typename D::T* W, const typename D::T* bias, float* Y, int M,
                 int N, int K, int rows, int cols) {
  using namespace detail;
  (void)M;
  if (K <= 0) {  // the kernel's loop over k tiles never runs: acc stays 0
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        Y[long(r) * N + c] = bias != nullptr ? 0.0f + D::load(bias, c) : 0.0f;
    return;
  }
  const bool padded = K % kTile != 0;
  alignas(64) float panel[kNc / kNr][kKc][kNr];
  for (int c0 = 0; c0 < cols; c0 += kNc) {
    const int nc = std::min(kNc, cols - c0);
    for (int k0 = 0; k0 < K; k0 += kKc) {
      const int kc = std::min(kKc, K - k0);
      const bool first = k0 == 0, last = k0 + kc == K;
      pack<D, TRANSPOSED>(W, N, K, k0, kc, c0, nc, panel);
      for (int p = 0; p * kNr < nc; ++p) {
        const int pc = c0 + p * kNr, pn = std::min(kNr, nc - p * kNr);
        for (int r0 = 0; r0 < rows; r0 += kMr) {
          const int mr = std::min(kMr, rows - r0);
          alignas(64) float acc[kMr][kNr] = {};
          if (!first)  // the partial sums of the k's before k0, stored exactly in Y
            for (int r = 0; r < mr; ++r) std::copy_n(Y + long(r0 + r) * N + pc, pn, acc[r]);
          micro_kernel(mr, X + long(r0) * K + k0, K, &panel[p][0][0], kc, acc);
          for (int r = 0; r < mr; ++r) {
            float* y = Y + long(r0 + r) * N + pc;
            for (int c = 0; c < pn; ++c) {
              float v = acc[r][c];
              if (last) {
                if (padded)
                  v = std::fma(0.0f, 0.0f, v);  // the kernel's zero padding, once is enough
                if (bias != nullptr) v = v + D::load(bias, pc + c);
              }
              y[c] = v;
            }
          }
        }
      }
    }
  }
}

}  // namespace refengine::twin

#endif  // REFENGINE_TWIN_MATMUL_HPP
