// The reference engine's heavy host twins, before and after (issue 20, part 3): the matrix
// products of one forward pass of a GPT-2-shaped model, and its attention, run both ways in
// one process on the same inputs — the kernel-mirroring twins (twin_matmul.hpp's matmul_tile
// per block, twin_attention.hpp's paged_attention_threads: what the emulator ran before) and
// the blocked ones it runs now — with the ratio of their times and a check that their outputs
// are the same bits (NaN-free inputs, so bit for bit without exception).
//
//   thaw-twins-bench [--tokens 4] [--layers 36] [--embd 1280] [--heads 20] [--vocab 50257]
//                    [--dtype f16|bf16|f32] [--context 0] [--repeats 3]
//
// The defaults are gpt2-large's shapes and the streaming bench's 4-token profile batch
// (bench/preload/streaming_cold_start.sh). --context C adds C cached positions before the
// tokens (a decode step: each token attends to C + its position). Times are the best of
// --repeats; one thread, as the emulator runs twins.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"
#include "thaw/emu_twin.h"
#include "twin_attention.hpp"
#include "twin_dtypes.hpp"
#include "twin_matmul.hpp"

namespace {

using refengine::kBlockSize;
using refengine::kTile;

struct Options {
  int tokens = 4, layers = 36, embd = 1280, heads = 20, vocab = 50257, context = 0, repeats = 3;
  std::string dtype = "f16";
};

double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

template <class D>
std::vector<typename D::T> random_weights(std::size_t n, unsigned seed) {
  const std::vector<float> f = random_floats(n, seed);
  std::vector<typename D::T> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, refengine::twin::F32>)
      w[i] = f[i] * 0.05f;
    else if constexpr (std::is_same_v<D, refengine::twin::F16>)
      w[i] = refengine::f32_to_f16(f[i] * 0.05f);
    else
      w[i] = refengine::f32_to_bf16(f[i] * 0.05f);
  }
  return w;
}

// A copy of v in a shared memfd mapping of 4 KiB pages: how the emulator holds device memory
// (emu/src/physical.cpp), whose page size shapes how fast a twin streams the weights.
template <class T>
const T* device_copy(const std::vector<T>& v) {
  const std::size_t bytes = std::max<std::size_t>(v.size() * sizeof(T), 1);
  const int fd = memfd_create("thaw-twins-bench", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, off_t(bytes)) != 0) std::abort();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) std::abort();
  std::memcpy(p, v.data(), v.size() * sizeof(T));
  return static_cast<const T*>(p);  // lives until the process exits, as the bench does
}

// One product of the forward pass: Y[M, N] = X[M, K] @ W (+ bias).
struct Product {
  const char* name;
  int N, K;
  bool transposed;
  int per_pass;  // how many a forward pass runs (layers, or 1 for the LM head)
};

template <class D>
int run(const Options& o) {
  const int C = o.embd, M = o.tokens;
  const Product products[] = {
      {"qkv (C -> 3C)", 3 * C, C, false, o.layers},
      {"attention out (C -> C)", C, C, false, o.layers},
      {"mlp up (C -> 4C)", 4 * C, C, false, o.layers},
      {"mlp down (4C -> C)", C, 4 * C, false, o.layers},
      {"lm head (C -> vocab, tied)", o.vocab, C, true, 1},
  };
  std::printf("matrix products, %d tokens, %s weights (one layer's each; x%d layers in a pass)\n",
              M, o.dtype.c_str(), o.layers);
  std::printf("  %-28s %12s %12s %9s %10s\n", "product", "before ms", "after ms", "speed-up",
              "after GF/s");
  double before_pass = 0, after_pass = 0;
  bool same = true;
  unsigned seed = 1;
  for (const Product& p : products) {
    const std::vector<float> X = random_floats(std::size_t(M) * p.K, seed++);
    const typename D::T* W = device_copy(random_weights<D>(std::size_t(p.N) * p.K, seed++));
    const auto bias = random_weights<D>(std::size_t(p.N), seed++);
    const typename D::T* b = p.transposed ? nullptr : bias.data();
    std::vector<float> before(std::size_t(M) * p.N), after(before.size());
    const double tb = best_seconds(o.repeats, [&] {
      for (int row0 = 0; row0 < M; row0 += kTile)
        for (int col0 = 0; col0 < p.N; col0 += kTile)
          if (p.transposed)
            refengine::twin::matmul_tile<D, true>(X.data(), W, b, before.data(), M, p.N, p.K, row0,
                                                  col0);
          else
            refengine::twin::matmul_tile<D, false>(X.data(), W, b, before.data(), M, p.N, p.K, row0,
                                                   col0);
    });
    const double ta = best_seconds(o.repeats, [&] {
      if (p.transposed)
        refengine::twin::matmul_grid<D, true>(X.data(), W, b, after.data(), M, p.N, p.K, M, p.N);
      else
        refengine::twin::matmul_grid<D, false>(X.data(), W, b, after.data(), M, p.N, p.K, M, p.N);
    });
    same = same && std::memcmp(before.data(), after.data(), before.size() * 4) == 0;
    std::printf("  %-28s %12.2f %12.2f %8.1fx %10.1f\n", p.name, tb * 1e3, ta * 1e3, tb / ta,
                2.0 * M * p.N * p.K / ta / 1e9);
    before_pass += tb * p.per_pass;
    after_pass += ta * p.per_pass;
  }

  // Attention of one layer: every head of every token, as the kernel's grid (n_head, tokens)
  // with 128 threads per block (the engine's launch).
  const int head_dim = C / o.heads, threads = 128;
  const int len = o.context + M;
  const int max_blocks = (len + kBlockSize - 1) / kBlockSize;
  const std::vector<float> q = random_floats(std::size_t(M) * 3 * C, seed++);
  const std::vector<float> k_cache =
      random_floats(std::size_t(max_blocks) * o.heads * kBlockSize * head_dim, seed++);
  const std::vector<float> v_cache = random_floats(k_cache.size(), seed++);
  std::vector<int> table(max_blocks), query_seq(M, 0), query_pos(M);
  for (int i = 0; i < max_blocks; ++i) table[i] = max_blocks - 1 - i;
  for (int t = 0; t < M; ++t) query_pos[t] = o.context + t;
  const int context_lens[1] = {len};
  std::vector<float> before(std::size_t(M) * C), after(before.size());
  refengine::twin::AttentionArgs a{
      before.data(), q.data(),   3 * C,        k_cache.data(),   v_cache.data(),
      table.data(),  max_blocks, context_lens, query_seq.data(), query_pos.data(),
      o.heads,       head_dim,   0.125f};
  thaw::emu::blockDim = {unsigned(threads), 1, 1};
  const double tb = best_seconds(o.repeats, [&] {
    for (int t = 0; t < M; ++t)
      for (int h = 0; h < o.heads; ++h) refengine::twin::paged_attention_threads(a, h, t);
  });
  a.out = after.data();
  const double ta = best_seconds(o.repeats, [&] {
    for (int t = 0; t < M; ++t)
      for (int h = 0; h < o.heads; ++h)
        refengine::twin::paged_attention_block(a, h, t, unsigned(threads));
  });
  same = same && std::memcmp(before.data(), after.data(), before.size() * 4) == 0;
  std::printf("  %-28s %12.2f %12.2f %8.1fx   (context %d + %d tokens)\n", "attention (one layer)",
              tb * 1e3, ta * 1e3, tb / ta, o.context, M);
  before_pass += tb * o.layers;
  after_pass += ta * o.layers;

  std::printf("one forward pass (%d layers + lm head): before %.3f s, after %.3f s: %.1fx faster\n",
              o.layers, before_pass, after_pass, before_pass / after_pass);
  std::printf("outputs before and after: %s\n", same ? "the same bits" : "DIFFERENT");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr,
                   "%s: missing value (see the header of bench/refengine/twins_bench.cpp)\n",
                   flag.c_str());
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--dtype") {
      o.dtype = value;
      continue;
    }
    int* field = flag == "--tokens"    ? &o.tokens
                 : flag == "--layers"  ? &o.layers
                 : flag == "--embd"    ? &o.embd
                 : flag == "--heads"   ? &o.heads
                 : flag == "--vocab"   ? &o.vocab
                 : flag == "--context" ? &o.context
                 : flag == "--repeats" ? &o.repeats
                                       : nullptr;
    char* end = nullptr;
    const long v = std::strtol(value, &end, 10);
    if (field == nullptr || *end != '\0' || v < 0 || v > 1 << 20) {
      std::fprintf(stderr, "bad option %s %s\n", flag.c_str(), value);
      return 2;
    }
    *field = int(v);
  }
  if (o.tokens < 1 || o.embd < 1 || o.heads < 1 || o.embd % o.heads != 0 ||
      o.embd / o.heads > refengine::kMaxHeadDim || o.context + o.tokens > refengine::kMaxContext ||
      o.repeats < 1) {
    std::fprintf(stderr, "unsupported shape\n");
    return 2;
  }
  if (o.dtype == "f16") return run<refengine::twin::F16>(o);
  if (o.dtype == "bf16") return run<refengine::twin::BF16>(o);
  if (o.dtype == "f32") return run<refengine::twin::F32>(o);
  std::fprintf(stderr, "--dtype: f16, bf16 or f32\n");
  return 2;
}
