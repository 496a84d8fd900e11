// The reference engine's fast host twins (tools/refengine/kernels/twin_*.hpp) against the
// kernel-mirroring ones, bit for bit (issue 20, part 3). The emulator runs the fast ones; the
// mirrors repeat kernels.cu's arithmetic thread by thread. Equal bits on every input — random
// values, ragged shapes, partial grids, NaN, infinities, signed zeros, fp16 subnormals and
// signalling NaNs — is what lets the fast twins stand in for the kernels, and what makes the
// emulator's results the same from run to run whatever the machine's load: no result depends
// on a thread count, a buffer's alignment or a call's history. Both are compiled with the
// twins' own options (refengine_twin_code).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "thaw/emu_twin.h"
#include "twin_attention.hpp"
#include "twin_dtypes.hpp"
#include "twin_matmul.hpp"

namespace {

using refengine::kBlockSize;
using refengine::kTile;
using refengine::twin::BF16;
using refengine::twin::F16;
using refengine::twin::F32;

// The bits of each value, every NaN as one canonical NaN. A NaN's sign and payload are not
// part of what the twins promise: when several operands of an fma are NaN, x86 returns the
// payload of one of them, which one depending on the instruction form the compiler chose (a GPU
// returns a canonical NaN). Everything else — which outputs are NaN, every other bit — is.
std::vector<std::uint32_t> Bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    b[i] = v[i] != v[i] ? 0x7fc00000u : std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Random floats with a sprinkling of the values where rounding shortcuts show: signed zeros,
// infinities, NaN, tiny and huge magnitudes.
std::vector<float> Floats(std::size_t n, unsigned seed, bool specials) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 199);
  const float odd[] = {0.0f,
                       -0.0f,
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(),
                       1e-30f,
                       -3e30f,
                       6e-8f};
  std::vector<float> v(n);
  for (float& x : v) {
    const int p = pick(gen);
    x = specials && p < 8 ? odd[p] : dist(gen);
  }
  return v;
}

template <class D>
std::vector<typename D::T> Weights(std::size_t n, unsigned seed, bool specials) {
  const std::vector<float> f = Floats(n, seed, specials);
  std::vector<typename D::T> w(n);
  std::mt19937 gen(seed + 1);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, F32>) {
      w[i] = f[i];
    } else if constexpr (std::is_same_v<D, F16>) {
      w[i] = refengine::f32_to_f16(f[i]);
      if (specials && gen() % 97 == 0) w[i] = 0x0001 + gen() % 0x3ff;   // subnormal
      if (specials && gen() % 211 == 0) w[i] = 0x7c01 + gen() % 0x1ff;  // signalling NaN
    } else {
      w[i] = refengine::f32_to_bf16(f[i]);
    }
  }
  return w;
}

// ---- widening ------------------------------------------------------------------------------

TEST(TwinWiden, Fp16RunsGiveTheBitsOfTheScalarWidening) {
  std::vector<unsigned short> all(65536);
  for (unsigned i = 0; i < all.size(); ++i) all[i] = static_cast<unsigned short>(i);
  // Every offset and length mod 8, so each value passes through the vector body and the tail.
  for (int offset = 0; offset < 8; ++offset) {
    const int n = int(all.size()) - offset - 3;
    std::vector<float> out(n);
    F16::widen(all.data() + offset, n, out.data());
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]),
                std::bit_cast<std::uint32_t>(refengine::f16_to_f32(all[offset + i])))
          << "fp16 bits " << std::hex << all[offset + i];
  }
}

TEST(TwinWiden, Bf16RunsGiveTheBitsOfTheScalarWidening) {
  std::vector<unsigned short> all(65536);
  for (unsigned i = 0; i < all.size(); ++i) all[i] = static_cast<unsigned short>(i);
  std::vector<float> out(all.size());
  BF16::widen(all.data(), int(all.size()), out.data());
  for (unsigned i = 0; i < all.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(out[i]),
              std::bit_cast<std::uint32_t>(refengine::bf16_to_f32(all[i])));
}

// ---- matrix products -----------------------------------------------------------------------

struct Shape {
  int M, N, K;
  int grid_rows, grid_cols;  // rows and columns the launch's grid covers (<= M, N)
};

std::string Name(const Shape& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " grid " +
         std::to_string(s.grid_rows) + "x" + std::to_string(s.grid_cols);
}

// Every shape class the blocking has a path for: K below, at and across the k-block (128) and
// the kernel's padding (K % 16), rows below, at and across the register tile (6), columns
// below, at and across the panel (64) and its sub-panels (16), grids that cover less than the
// matrix (the kernel's blocks outside the grid write nothing), K = 0.
const Shape kShapes[] = {{1, 1, 1, 1, 1},       {4, 64, 128, 4, 64},    {5, 37, 19, 5, 37},
                         {6, 16, 16, 6, 16},    {7, 70, 200, 7, 70},    {13, 130, 300, 13, 130},
                         {17, 99, 257, 16, 64}, {3, 200, 129, 3, 96},   {2, 5, 0, 2, 5},
                         {33, 48, 31, 33, 48},  {4, 1000, 640, 4, 1000}};

template <class D, bool TRANSPOSED>
void ExpectSameBits(const Shape& s, bool with_bias, bool specials, unsigned seed) {
  const std::vector<float> X = Floats(std::size_t(s.M) * s.K, seed, specials);
  const auto W = Weights<D>(std::size_t(s.N) * s.K, seed + 7, specials);
  const auto bias = Weights<D>(std::size_t(s.N), seed + 13, specials);
  const typename D::T* b = with_bias ? bias.data() : nullptr;
  // Outputs start as a marker NaN: what the grid does not cover must stay untouched.
  const float marker = std::bit_cast<float>(0x7fc0dead);
  std::vector<float> want(std::size_t(s.M) * s.N, marker), got = want;
  for (int row0 = 0; row0 < s.grid_rows; row0 += kTile)
    for (int col0 = 0; col0 < s.grid_cols; col0 += kTile)
      refengine::twin::matmul_tile<D, TRANSPOSED>(X.data(), W.data(), b, want.data(), s.M, s.N, s.K,
                                                  row0, col0);
  // The grid's last block row and column may reach past grid_rows/grid_cols (to a multiple of
  // kTile, clipped to M, N): the launch covers whole blocks.
  const int rows = std::min(s.M, (s.grid_rows + kTile - 1) / kTile * kTile);
  const int cols = std::min(s.N, (s.grid_cols + kTile - 1) / kTile * kTile);
  refengine::twin::matmul_grid<D, TRANSPOSED>(X.data(), W.data(), b, got.data(), s.M, s.N, s.K,
                                              rows, cols);
  ASSERT_EQ(Bits(got), Bits(want))
      << Name(s) << (with_bias ? " bias" : "") << (specials ? " specials" : "");
}

template <class D>
void ExpectSameBitsEverywhere() {
  unsigned seed = 1;
  for (const Shape& s : kShapes)
    for (bool specials : {false, true}) {
      ExpectSameBits<D, false>(s, false, specials, seed++);
      ExpectSameBits<D, false>(s, true, specials, seed++);
      ExpectSameBits<D, true>(s, false, specials, seed++);
    }
}

TEST(TwinMatmul, BlockedF32GivesTheKernelMirrorsBits) {
  ExpectSameBitsEverywhere<F32>();
}
TEST(TwinMatmul, BlockedF16GivesTheKernelMirrorsBits) {
  ExpectSameBitsEverywhere<F16>();
}
TEST(TwinMatmul, BlockedBf16GivesTheKernelMirrorsBits) {
  ExpectSameBitsEverywhere<BF16>();
}

// Run to run: the same inputs at other addresses (unaligned, after other calls) give the same
// bits. Nothing in the twin depends on alignment, history or timing.
TEST(TwinMatmul, SameBitsRunToRunAndAtAnyAlignment) {
  const int M = 9, N = 77, K = 300;
  const std::vector<float> X = Floats(std::size_t(M) * K, 5, true);
  const auto W = Weights<F16>(std::size_t(N) * K, 6, true);
  std::vector<float> first(std::size_t(M) * N);
  refengine::twin::matmul_grid<F16, false>(X.data(), W.data(), nullptr, first.data(), M, N, K, M,
                                           N);
  for (int shift = 1; shift < 8; ++shift) {
    std::vector<float> xs(X.size() + shift), ys(first.size() + shift);
    std::vector<unsigned short> ws(W.size() + shift);
    std::copy(X.begin(), X.end(), xs.begin() + shift);
    std::copy(W.begin(), W.end(), ws.begin() + shift);
    refengine::twin::matmul_grid<F16, false>(xs.data() + shift, ws.data() + shift, nullptr,
                                             ys.data() + shift, M, N, K, M, N);
    ASSERT_EQ(Bits(std::vector<float>(ys.begin() + shift, ys.end())), Bits(first))
        << "shift " << shift;
  }
}

// ---- attention -----------------------------------------------------------------------------

#ifdef REFENGINE_TWIN_AVX2
// The vector exp against kernels.h's exp_f32: every float in [-100, 100] at a fine step (its
// whole working range and both cut-offs on either side), random bit patterns, and the specials.
TEST(TwinAttention, VectorExpGivesTheBitsOfExpF32) {
  std::vector<float> xs;
  for (float x = -100.0f; x <= 100.0f; x = std::nextafter(x, 200.0f) + 1e-4f) xs.push_back(x);
  std::mt19937 gen(7);
  for (int i = 0; i < 1 << 20; ++i) xs.push_back(std::bit_cast<float>(std::uint32_t(gen())));
  for (float x : {0.0f, -0.0f, 88.5f, std::nextafter(88.5f, 100.0f), -87.33654f,
                  std::nextafter(-87.33654f, -100.0f), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::bit_cast<float>(0x7fc01234u),
                  std::bit_cast<float>(0xffa00001u), 1e-40f, -1e-40f})
    xs.push_back(x);
  while (xs.size() % 8 != 0) xs.push_back(1.0f);
  for (std::size_t i = 0; i < xs.size(); i += 8) {
    alignas(32) float out[8];
    _mm256_store_ps(out, refengine::twin::detail::exp_f32_x8(_mm256_loadu_ps(&xs[i])));
    for (int l = 0; l < 8; ++l)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(out[l]),
                std::bit_cast<std::uint32_t>(refengine::exp_f32(xs[i + l])))
          << "x = " << xs[i + l] << " (bits " << std::hex << std::bit_cast<std::uint32_t>(xs[i + l])
          << ")";
  }
}
#endif

struct AttentionCase {
  int n_head, head_dim, threads;
  std::vector<int> prompt_lens;  // one sequence each; every token of each is a query
};

void ExpectSameAttentionBits(const AttentionCase& c, bool specials, unsigned seed) {
  const int seqs = int(c.prompt_lens.size());
  int max_len = 0, tokens = 0;
  for (int l : c.prompt_lens) {
    max_len = std::max(max_len, l);
    tokens += l;
  }
  const int max_blocks = std::max(1, (max_len + kBlockSize - 1) / kBlockSize);
  const int num_blocks = seqs * max_blocks + 3;
  const long row = long(c.n_head) * c.head_dim;
  const std::vector<float> q = Floats(std::size_t(tokens) * 3 * row, seed, specials);
  const std::vector<float> k_cache =
      Floats(std::size_t(num_blocks) * c.n_head * kBlockSize * c.head_dim, seed + 1, specials);
  const std::vector<float> v_cache = Floats(k_cache.size(), seed + 2, specials && seed % 2 == 0);
  // Blocks handed out in a shuffled order, as a paged cache does.
  std::vector<int> free_blocks(num_blocks);
  for (int i = 0; i < num_blocks; ++i) free_blocks[i] = i;
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(seed));
  std::vector<int> tables(std::size_t(seqs) * max_blocks), context_lens, query_seq, query_pos;
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < max_blocks; ++b)
      tables[s * max_blocks + b] = free_blocks[s * max_blocks + b];
    // Now and then a sequence with no cached context: its queries get zeros.
    context_lens.push_back(s == 0 && seed % 3 == 0 ? 0 : c.prompt_lens[s]);
    for (int p = 0; p < c.prompt_lens[s]; ++p) {
      query_seq.push_back(s);
      query_pos.push_back(p);
    }
  }
  const float marker = std::bit_cast<float>(0x7fc0dead);
  std::vector<float> want(std::size_t(tokens) * row, marker), got = want;
  refengine::twin::AttentionArgs a{want.data(),
                                   q.data(),
                                   int(3 * row),
                                   k_cache.data(),
                                   v_cache.data(),
                                   tables.data(),
                                   max_blocks,
                                   context_lens.data(),
                                   query_seq.data(),
                                   query_pos.data(),
                                   c.n_head,
                                   c.head_dim,
                                   0.125f};
  thaw::emu::blockDim = {unsigned(c.threads), 1, 1};
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < c.n_head; ++h) refengine::twin::paged_attention_threads(a, h, t);
  a.out = got.data();
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < c.n_head; ++h)
      refengine::twin::paged_attention_block(a, h, t, unsigned(c.threads));
  ASSERT_EQ(Bits(got), Bits(want)) << "heads " << c.n_head << " head_dim " << c.head_dim
                                   << " threads " << c.threads << (specials ? " specials" : "");
}

TEST(TwinAttention, WholeBlockLoopsGiveTheThreadMirrorsBits) {
  const AttentionCase cases[] = {
      {2, 64, 128, {1, 5, 16, 17, 40}},
      {3, 80, 32, {33, 2}},
      {1, 256, 1024, {70}},
      {4, 16, 1, {9, 0, 3}},
      {2, 24, 256, {100}},
      {1, 8, 64, {200}},
  };
  unsigned seed = 100;
  for (const AttentionCase& c : cases)
    for (bool specials : {false, true}) ExpectSameAttentionBits(c, specials, seed++);
}

}  // namespace
