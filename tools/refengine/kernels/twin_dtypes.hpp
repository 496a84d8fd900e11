// Weight loads for the host twins (kernels_twins.cpp, twin_matmul.hpp): one element at a time
// (load) as the kernels read them, or a contiguous run at once (widen), which the fast twins
// use to fill their fp32 panels. Both are exact and give the same bits: widen is only faster.
// Also the fast twins' one layout helper, an 8 x 8 transpose (moves values, no arithmetic).
#ifndef REFENGINE_TWIN_DTYPES_HPP
#define REFENGINE_TWIN_DTYPES_HPP

#include <cstring>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define REFENGINE_TWIN_AVX2 1
#if defined(__AVX512F__)
#define REFENGINE_TWIN_AVX512 1
#endif
#endif

namespace refengine::twin {

struct F32 {
  using T = float;
  static float load(const float* p, long i) { return p[i]; }
  static void widen(const float* p, int n, float* out) { std::memcpy(out, p, sizeof(float) * n); }
};

struct F16 {
  using T = unsigned short;
  static float load(const unsigned short* p, long i) { return refengine::f16_to_f32(p[i]); }
  static void widen(const unsigned short* p, int n, float* out) {
    int i = 0;
#ifdef REFENGINE_TWIN_AVX2
    // vcvtph2ps is exact, but it quiets signalling NaNs, which f16_to_f32 (and so the twins
    // until now) keep bit for bit: those lanes are rebuilt from their bits.
    const __m256i exp_mask = _mm256_set1_epi32(0x7fff);
    const __m256i inf = _mm256_set1_epi32(0x7c00);
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      __m256 f = _mm256_cvtph_ps(h);
      const __m256i u = _mm256_cvtepu16_epi32(h);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, exp_mask), inf);
      if (!_mm256_testz_si256(nan, nan)) {
        const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x8000)), 16);
        const __m256i man = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x3ff)), 13);
        const __m256i bits =
            _mm256_or_si256(_mm256_or_si256(sign, _mm256_set1_epi32(0x7f800000)), man);
        f = _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
      }
      _mm256_storeu_ps(out + i, f);
    }
#endif
    for (; i < n; ++i) out[i] = refengine::f16_to_f32(p[i]);
  }
};

struct BF16 {
  using T = unsigned short;
  static float load(const unsigned short* p, long i) { return refengine::bf16_to_f32(p[i]); }
  static void widen(const unsigned short* p, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = refengine::bf16_to_f32(p[i]);  // a shift: vectorises
  }
};

#ifdef REFENGINE_TWIN_AVX2
// out[k * ld_out + c] = in[c * ld_in + k] for c, k < 8: moves values, no arithmetic.
inline void transpose8x8(const float* in, int ld_in, float* out, int ld_out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * ld_in);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * ld_out, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * ld_out, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

}  // namespace refengine::twin

#endif  // REFENGINE_TWIN_DTYPES_HPP
