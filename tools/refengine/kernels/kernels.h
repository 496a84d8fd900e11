// The reference engine's kernels: one declaration shared by the CUDA sources (kernels.cu, which
// nvcc compiles to an sm_90 cubin) and their host twins (kernels_twins.cpp, which the emulator
// runs). Every kernel is extern "C", so the cubin and the twin library name it plainly (the
// names below), and its parameters are plain C++ types: device pointers as typed pointers,
// sizes as int. Weights come in three dtypes, one kernel each, named by a suffix:
//   _f32   const float*            IEEE binary32
//   _f16   const unsigned short*   IEEE binary16 bits (__half on the device)
//   _bf16  const unsigned short*   bfloat16 bits (__nv_bfloat16 on the device)
// Activations, the KV cache and all accumulation are fp32.
//
// The small scalar functions at the end (weight widening, exp, gelu) are compiled by nvcc as
// __device__ code and by g++ for the twins: one source, so both round identically. The cubin
// is compiled with -fmad=false (tools/refengine/CMakeLists.txt): no multiply-add is fused
// implicitly, by nvcc or ptxas; the kernels fuse exactly where they call fmaf (REFENGINE_FMA
// here), and the twins call std::fma at the same places.
#ifndef REFENGINE_KERNELS_H
#define REFENGINE_KERNELS_H

#ifdef __CUDACC__
#define REFENGINE_KERNEL __global__
#define REFENGINE_HD __device__ __forceinline__
#define REFENGINE_FMA(a, b, c) fmaf((a), (b), (c))
#define REFENGINE_RINT(x) rintf(x)
#define REFENGINE_FLOAT_AS_INT(x) __float_as_int(x)
#define REFENGINE_INT_AS_FLOAT(x) __int_as_float(x)
#else
#include <bit>
#include <cmath>
#define REFENGINE_KERNEL
#define REFENGINE_HD inline
#define REFENGINE_FMA(a, b, c) std::fma(float(a), float(b), float(c))
#define REFENGINE_RINT(x) std::rint(float(x))
#define REFENGINE_FLOAT_AS_INT(x) std::bit_cast<int>(float(x))
#define REFENGINE_INT_AS_FLOAT(x) std::bit_cast<float>(int(x))
#endif

namespace refengine {

// Tokens per KV-cache block (vLLM's default block size).
constexpr int kBlockSize = 16;
// Tile edge of the matmul kernels: launch with blockDim (kTile, kTile, 1).
constexpr int kTile = 16;
// Longest context paged_attention handles (its scores live in shared memory: 32 KiB).
constexpr int kMaxContext = 8192;
// Largest head_dim paged_attention handles.
constexpr int kMaxHeadDim = 256;

}  // namespace refengine

extern "C" {

// Declares one kernel per weight dtype: NAME_f32 (W = float), NAME_f16 and NAME_bf16
// (W = unsigned short); PARAMS is the parameter list in terms of W.
#define REFENGINE_PER_DTYPE(NAME, PARAMS_F32, PARAMS_U16) \
  REFENGINE_KERNEL void NAME##_f32 PARAMS_F32;            \
  REFENGINE_KERNEL void NAME##_f16 PARAMS_U16;            \
  REFENGINE_KERNEL void NAME##_bf16 PARAMS_U16;

// h[t][c] = wte[token[t]][c] + wpe[pos[t]][c] for t < num_tokens, c < C. wte is [vocab, C],
// wpe [n_positions, C], h [num_tokens, C]. No barriers. Launch: grid (ceil(C / blockDim.x),
// num_tokens), any 1-D block.
REFENGINE_PER_DTYPE(embedding,
                    (const int* token, const int* pos, const float* wte, const float* wpe, float* h,
                     int num_tokens, int C),
                    (const int* token, const int* pos, const unsigned short* wte,
                     const unsigned short* wpe, float* h, int num_tokens, int C))

// y[r] = (x[r] - mean) / sqrt(var + eps) * w + b for each row r of [rows, C] (biased variance,
// as torch.nn.LayerNorm). y may be x. Launch: grid (rows), blockDim.x a power of two <= 1024
// (a shared-memory tree reduction).
REFENGINE_PER_DTYPE(layernorm,
                    (const float* x, const float* w, const float* b, float* y, int C, float eps),
                    (const float* x, const unsigned short* w, const unsigned short* b, float* y,
                     int C, float eps))

// Y[M, N] = X[M, K] @ W[K, N] + bias[N] (Hugging Face Conv1D layout: W is [in, out]); bias
// may be null. Y must not alias X. Launch: grid (ceil(N / kTile), ceil(M / kTile)),
// block (kTile, kTile).
REFENGINE_PER_DTYPE(matmul_bias,
                    (const float* X, const float* W, const float* bias, float* Y, int M, int N,
                     int K),
                    (const float* X, const unsigned short* W, const unsigned short* bias, float* Y,
                     int M, int N, int K))

// Y[M, N] = X[M, K] @ W[N, K]^T: the tied LM head (W = wte, [vocab, C]). Launch as matmul_bias.
REFENGINE_PER_DTYPE(matmul_nt, (const float* X, const float* W, float* Y, int M, int N, int K),
                    (const float* X, const unsigned short* W, float* Y, int M, int N, int K))

#undef REFENGINE_PER_DTYPE

// x[i] = gelu_new(x[i]) for i < n (GPT-2's tanh approximation). Any 1-D launch covering n.
REFENGINE_KERNEL void gelu_new_f32(float* x, int n);

// x[i] += y[i] for i < n. Any 1-D launch covering n.
REFENGINE_KERNEL void residual_add_f32(float* x, const float* y, int n);

// Writes the keys and values of num_tokens tokens into their cache slots. Token t's key for
// head h is k[t * stride + h * head_dim + d] (value likewise from v); stride is the distance
// between two tokens' rows in elements (3 * C when k and v point into a fused qkv buffer). Its
// slot s = slot_mapping[t] lies in cache block s / kBlockSize at offset s % kBlockSize; a
// negative slot (a padding token) is skipped. Caches are [num_blocks, n_head, kBlockSize,
// head_dim]. No barriers. Launch: grid (num_tokens), any 1-D block (threads stride over
// n_head * head_dim).
REFENGINE_KERNEL void reshape_and_cache_f32(const float* k, const float* v, int stride,
                                            float* k_cache, float* v_cache, const int* slot_mapping,
                                            int num_tokens, int n_head, int head_dim);

// Causal attention over the paged KV cache, for decode and prefill alike. Query token t
// belongs to sequence query_seq[t] at position query_pos[t] and attends to that sequence's
// cached positions 0 .. min(query_pos[t], context_lens[seq] - 1): out = softmax(q K^T * scale)
// V per head. Position j of sequence s is in cache block block_tables[s * max_blocks +
// j / kBlockSize] at offset j % kBlockSize. q[t * q_stride + h * head_dim + d]; out is
// [num_tokens, n_head * head_dim]. head_dim <= kMaxHeadDim, contexts <= kMaxContext; a query
// with an empty context gets zeros. Launch: grid (n_head, num_tokens), blockDim.x a power of
// two <= 1024.
REFENGINE_KERNEL void paged_attention_f32(float* out, const float* q, int q_stride,
                                          const float* k_cache, const float* v_cache,
                                          const int* block_tables, int max_blocks,
                                          const int* context_lens, const int* query_seq,
                                          const int* query_pos, int n_head, int head_dim,
                                          float scale);

// out[r] = the index of the largest of logits[r][0 .. n) (the lowest such index on ties; NaNs
// are never chosen unless the whole row is NaN, then 0). Launch: grid (rows), blockDim.x a
// power of two <= 1024.
REFENGINE_KERNEL void argmax_f32(const float* logits, int* out, int n);

}  // extern "C"

// ---- scalar helpers shared by kernels and twins ------------------------------------------

namespace refengine {

// Widening of stored weights: exact.
REFENGINE_HD float f16_to_f32(unsigned short h) {
  const unsigned sign = (h & 0x8000u) << 16;
  const unsigned exp = (h >> 10) & 0x1fu;
  const unsigned man = h & 0x3ffu;
  unsigned bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man * 2^-24, exact in float
    int e = -1;
    unsigned m = man;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | ((112u - unsigned(e)) << 23) | ((m & 0x3ffu) << 13);
  }
  return REFENGINE_INT_AS_FLOAT(int(bits));
}

REFENGINE_HD float bf16_to_f32(unsigned short b) {
  return REFENGINE_INT_AS_FLOAT(int(unsigned(b) << 16));
}

// Narrowing, round to nearest even (what __float2half_rn / __float2bfloat16_rn do). Host-side
// helpers for writing weights; no kernel narrows.
REFENGINE_HD unsigned short f32_to_bf16(float f) {
  const unsigned u = unsigned(REFENGINE_FLOAT_AS_INT(f));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

REFENGINE_HD unsigned short f32_to_f16(float f) {
  const unsigned u = unsigned(REFENGINE_FLOAT_AS_INT(f));
  const unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
  const unsigned a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf
  if (a >= 0x38800000u) {                                         // normal half (>= 2^-14)
    const unsigned r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (unsigned short)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // < 2^-25 (half of the smallest subnormal): zero
  // Subnormal half: the value in units of 2^-24, rounded to nearest even.
  const unsigned e = a >> 23;  // 102 .. 112
  const unsigned m = (a & 0x7fffffu) | 0x800000u;
  const unsigned shift = 126u - e;  // m * 2^(e - 150) / 2^-24 = m >> (126 - e)
  const unsigned q = m >> shift;
  const unsigned rem = m & ((1u << shift) - 1u);
  const unsigned half = 1u << (shift - 1u);
  const unsigned rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return (unsigned short)(sign | rounded);
}

// e^x to within a few ulp, from IEEE operations only (so device and host agree bit for bit,
// unlike the libraries' expf): x = n ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor polynomial of
// e^r, times 2^n built from its bits.
REFENGINE_HD float exp_f32(float x) {
  // NaN stays NaN; results below the normal floats (x < ln 2^-126) are flushed to 0.
  if (!(x >= -87.33654f)) return x != x ? x : 0.0f;
  if (x > 88.5f) return REFENGINE_INT_AS_FLOAT(0x7f800000);
  const float n = REFENGINE_RINT(x * 1.44269502163f);
  float r = REFENGINE_FMA(n, -0.693145751953125f, x);  // ln2 high part (exact product)
  r = REFENGINE_FMA(n, -1.4286068203094173e-06f, r);   // ln2 low part
  float p = 1.0f / 5040.0f;
  p = REFENGINE_FMA(p, r, 1.0f / 720.0f);
  p = REFENGINE_FMA(p, r, 1.0f / 120.0f);
  p = REFENGINE_FMA(p, r, 1.0f / 24.0f);
  p = REFENGINE_FMA(p, r, 1.0f / 6.0f);
  p = REFENGINE_FMA(p, r, 0.5f);
  p = REFENGINE_FMA(p, r, 1.0f);
  p = REFENGINE_FMA(p, r, 1.0f);
  const int e = int(n);  // -126 .. 128
  if (e > 127) return p * 2.0f * REFENGINE_INT_AS_FLOAT((e - 1 + 127) << 23);
  return p * REFENGINE_INT_AS_FLOAT((e + 127) << 23);
}

// GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written as the identical
// x / (1 + e^(-2u)), which keeps its relative accuracy where 1 + tanh(u) would cancel.
REFENGINE_HD float gelu_new(float x) {
  const float x3 = x * x * x;
  const float u = 0.7978845608028654f * REFENGINE_FMA(0.044715f, x3, x);
  return x / (1.0f + exp_f32(-2.0f * u));
}

}  // namespace refengine

#endif  // REFENGINE_KERNELS_H
