// The reference engine's kernels (tools/refengine/kernels), run through the CUDA driver API
// only: the embedded sm_90 cubin is loaded with cuModuleLoadData and each kernel launched with
// cuLaunchKernel on small random inputs (fixed seeds). On the emulator the kernels run as their
// host twins (THAW_EMU_KERNELS); on a GPU the same program runs the SASS. Every result is
// compared with a plain CPU implementation in double precision written here.
//
// Tolerances: a result that is a sum of terms (dot products, means, softmax-weighted values) is
// checked to 1e-5 of the sum of the terms' magnitudes, the relative accuracy an fp32
// accumulation of up to a few hundred terms keeps even where the terms cancel. Weights in fp16
// or bf16 get the same tolerance: the kernels widen them exactly to fp32, so the reference
// computes with exactly the weights the kernel sees (their rounding from the random floats is
// not an error of the kernel).
#include <cuda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"
#include "refengine_kernels_cubins.h"

namespace {

using refengine::kBlockSize;
using refengine::kTile;

const char* ErrorName(CUresult r) {
  const char* s = nullptr;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "?";
}

#define ASSERT_CU(call)                                                    \
  do {                                                                     \
    CUresult r_ = (call);                                                  \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #call << " returned " << ErrorName(r_); \
  } while (0)
#define EXPECT_CU(call)                                                    \
  do {                                                                     \
    CUresult r_ = (call);                                                  \
    EXPECT_EQ(r_, CUDA_SUCCESS) << #call << " returned " << ErrorName(r_); \
  } while (0)

constexpr unsigned kNaN = 0x7fc00000u;  // fill for outputs: every element must be written

// Device memory holding a copy of a host vector; frees itself.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    EXPECT_CU(cuMemAlloc(&ptr, bytes));
    if (ptr != 0) EXPECT_CU(cuMemsetD32(ptr, kNaN, bytes / 4));
  }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size() * sizeof(T)) {
    if (ptr != 0) EXPECT_CU(cuMemcpyHtoD(ptr, v.data(), bytes));
  }
  ~DeviceBuffer() {
    if (ptr != 0) EXPECT_CU(cuMemFree(ptr));
  }
  template <class T>
  std::vector<T> Read() const {
    std::vector<T> v(bytes / sizeof(T));
    EXPECT_CU(cuMemcpyDtoH(v.data(), ptr, bytes));
    return v;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::vector<float> RandomFloats(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// ---- weight dtypes -------------------------------------------------------------------------

enum class Dtype { kF32, kF16, kBF16 };

std::string DtypeSuffix(Dtype d) {
  switch (d) {
    case Dtype::kF32:
      return "f32";
    case Dtype::kF16:
      return "f16";
    case Dtype::kBF16:
      return "bf16";
  }
  return "?";
}

void PrintTo(Dtype d, std::ostream* os) {
  *os << DtypeSuffix(d);
}

// Weights as stored in a checkpoint of the given dtype: the bytes the kernel reads, and the
// values they hold (for the reference).
struct Weights {
  std::vector<unsigned char> bytes;
  std::vector<double> values;
};

// Decodes IEEE binary16 independently of kernels.h (the reference must not share the code
// under test): sign, 5-bit exponent, 10-bit fraction.
double HalfValue(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int frac = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(frac, -24);
  if (exp == 31) return frac ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + frac, exp - 25);
}

double Bf16Value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Weights MakeWeights(Dtype d, const std::vector<float>& v) {
  Weights w;
  if (d == Dtype::kF32) {
    w.bytes.resize(v.size() * 4);
    std::memcpy(w.bytes.data(), v.data(), w.bytes.size());
    w.values.assign(v.begin(), v.end());
    return w;
  }
  w.bytes.resize(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t u =
        d == Dtype::kF16 ? refengine::f32_to_f16(v[i]) : refengine::f32_to_bf16(v[i]);
    std::memcpy(w.bytes.data() + 2 * i, &u, 2);
    w.values.push_back(d == Dtype::kF16 ? HalfValue(u) : Bf16Value(u));
  }
  return w;
}

// The narrowing helpers that write fp16/bf16 weights round to nearest even.
TEST(RefengineConversion, HalfRoundsToNearestEven) {
  EXPECT_EQ(refengine::f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(refengine::f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(refengine::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(refengine::f32_to_f16(65519.0f), 0x7bff);         // below the midpoint to 65536
  EXPECT_EQ(refengine::f32_to_f16(65520.0f), 0x7c00);         // the midpoint rounds to even: inf
  EXPECT_EQ(refengine::f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie, to even (down)
  EXPECT_EQ(refengine::f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie, to even (up)
  EXPECT_EQ(refengine::f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie
  EXPECT_EQ(refengine::f32_to_f16(0x1p-24f), 0x0001);                    // smallest subnormal
  EXPECT_EQ(refengine::f32_to_f16(0x1p-25f), 0x0000);                    // tie to even: 0
  EXPECT_EQ(refengine::f32_to_f16(0x1.8p-24f), 0x0002);                  // tie to even: 2
  EXPECT_EQ(refengine::f32_to_f16(0x1.ffcp-15f),
            0x0400);  // 1023.5 units of 2^-24: up  // rounds up into the normals
  EXPECT_EQ(refengine::f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(refengine::f32_to_f16(std::nanf("")) & 0x7e00, 0x7e00);
  // Widening is exact for every half, subnormals included.
  for (unsigned h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf/NaN
    ASSERT_EQ(double(refengine::f16_to_f32(std::uint16_t(h))), HalfValue(std::uint16_t(h)))
        << std::hex << h;
    ASSERT_EQ(refengine::f32_to_f16(refengine::f16_to_f32(std::uint16_t(h))), h) << std::hex << h;
  }
}

TEST(RefengineConversion, Bf16RoundsToNearestEven) {
  EXPECT_EQ(refengine::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(refengine::f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);             // tie, to even (down)
  EXPECT_EQ(refengine::f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie, to even (up)
  EXPECT_EQ(refengine::f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(refengine::f32_to_bf16(-3.0e38f), 0xff62);
  EXPECT_EQ(refengine::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows
  EXPECT_EQ(refengine::f32_to_bf16(std::nanf("")) & 0x7fc0, 0x7fc0);
}

// The exp and gelu helpers the kernels share with their twins: accurate to a few ulp.
TEST(RefengineConversion, ExpAndGeluAreAccurate) {
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double want = std::exp(double(x));
    ASSERT_NEAR(refengine::exp_f32(x), want, want * 3e-7) << x;
  }
  EXPECT_EQ(refengine::exp_f32(-88.0f), 0.0f);  // below the normal floats: flushed to 0
  EXPECT_EQ(refengine::exp_f32(-1000.0f), 0.0f);
  EXPECT_EQ(refengine::exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(refengine::exp_f32(1000.0f)));
}

// ---- fixture -------------------------------------------------------------------------------

class RefengineKernels : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    const ThawCubin cubin = thaw_cubin_kernels();
    ASSERT_GT(cubin.size, 0u);
    ASSERT_CU(cuModuleLoadData(&module_, cubin.data));
  }
  void TearDown() override {
    if (module_ != nullptr) EXPECT_CU(cuModuleUnload(module_));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  // Launches `name` and waits for it.
  void Launch(const std::string& name, unsigned gx, unsigned gy, unsigned bx, unsigned by,
              std::vector<void*> params) {
    CUfunction f = nullptr;
    CUresult r = cuModuleGetFunction(&f, module_, name.c_str());
    ASSERT_EQ(r, CUDA_SUCCESS) << "cuModuleGetFunction(" << name << "): " << ErrorName(r);
    ASSERT_CU(cuLaunchKernel(f, gx, gy, 1, bx, by, 1, 0, nullptr, params.data(), nullptr));
    ASSERT_CU(cuCtxSynchronize());
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
};

// Counts (and reports the first few) results off the reference by more than tol[i].
int CountMismatches(const std::vector<float>& got, const std::vector<double>& want,
                    const std::vector<double>& tol, const char* what) {
  EXPECT_EQ(got.size(), want.size());
  int wrong = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol[i]) && ++wrong <= 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " ± "
                    << tol[i];
  }
  return wrong;
}

constexpr double kRel = 1e-5;

class RefengineWeightKernels : public RefengineKernels,
                               public testing::WithParamInterface<Dtype> {};

// ---- embedding -------------------------------------------------------------------------------

TEST_P(RefengineWeightKernels, EmbeddingAddsTokenAndPositionRows) {
  const Dtype dt = GetParam();
  constexpr int kVocab = 50, kPositions = 20, kC = 300, kTokens = 7;
  const Weights wte = MakeWeights(dt, RandomFloats(kVocab * kC, 11));
  const Weights wpe = MakeWeights(dt, RandomFloats(kPositions * kC, 12));
  const std::vector<int> token = {3, 49, 0, 3, 17, 25, 8};
  const std::vector<int> pos = {0, 1, 2, 19, 4, 5, 0};
  DeviceBuffer dwte(wte.bytes), dwpe(wpe.bytes), dtok(token), dpos(pos),
      dh(kTokens * kC * sizeof(float));
  int n = kTokens, c = kC;
  Launch("embedding_" + DtypeSuffix(dt), (kC + 127) / 128, kTokens, 128, 1,
         {&dtok.ptr, &dpos.ptr, &dwte.ptr, &dwpe.ptr, &dh.ptr, &n, &c});
  const std::vector<float> h = dh.Read<float>();
  std::vector<double> want, tol;
  for (int t = 0; t < kTokens; ++t)
    for (int i = 0; i < kC; ++i) {
      const double a = wte.values[token[t] * kC + i], b = wpe.values[pos[t] * kC + i];
      want.push_back(a + b);
      tol.push_back(kRel * (std::fabs(a) + std::fabs(b)));
    }
  EXPECT_EQ(CountMismatches(h, want, tol, "h"), 0);
}

// ---- layernorm -------------------------------------------------------------------------------

TEST_P(RefengineWeightKernels, LayerNormNormalizesEachRow) {
  const Dtype dt = GetParam();
  constexpr int kRows = 5, kC = 300;  // 300: threads stride unevenly over the row
  constexpr float kEps = 1e-5f;
  std::vector<float> x = RandomFloats(kRows * kC, 21, -2.0f, 3.0f);
  for (int i = 0; i < kC; ++i) x[2 * kC + i] += 100.0f;  // a row with a large mean
  const Weights w = MakeWeights(dt, RandomFloats(kC, 22, 0.5f, 1.5f));
  const Weights b = MakeWeights(dt, RandomFloats(kC, 23));
  DeviceBuffer dx(x), dw(w.bytes), db(b.bytes), dy(x.size() * sizeof(float));
  int c = kC;
  float eps = kEps;
  Launch("layernorm_" + DtypeSuffix(dt), kRows, 1, 128, 1,
         {&dx.ptr, &dw.ptr, &db.ptr, &dy.ptr, &c, &eps});
  std::vector<double> want, tol;
  for (int r = 0; r < kRows; ++r) {
    double mean = 0, var = 0, amax = 0;
    for (int i = 0; i < kC; ++i) mean += x[r * kC + i];
    mean /= kC;
    for (int i = 0; i < kC; ++i) var += (x[r * kC + i] - mean) * (x[r * kC + i] - mean);
    var /= kC;
    for (int i = 0; i < kC; ++i) amax = std::max(amax, std::fabs(double(x[r * kC + i])));
    const double rstd = 1.0 / std::sqrt(var + kEps);
    for (int i = 0; i < kC; ++i) {
      want.push_back((x[r * kC + i] - mean) * rstd * w.values[i] + b.values[i]);
      // x - mean carries float rounding of the row's magnitude, not of the difference.
      tol.push_back(kRel * ((amax + std::fabs(mean)) * rstd * std::fabs(w.values[i]) +
                            std::fabs(b.values[i])));
    }
  }
  EXPECT_EQ(CountMismatches(dy.Read<float>(), want, tol, "y"), 0);

  // In place (y == x), as the engine may run it.
  Launch("layernorm_" + DtypeSuffix(dt), kRows, 1, 64, 1,
         {&dx.ptr, &dw.ptr, &db.ptr, &dx.ptr, &c, &eps});
  EXPECT_EQ(CountMismatches(dx.Read<float>(), want, tol, "x in place"), 0);
}

// ---- matmuls ---------------------------------------------------------------------------------

// Y = X @ W + b with W [K, N] (Conv1D); sizes that are not multiples of the tile.
TEST_P(RefengineWeightKernels, MatmulBiasMatchesTheCpuProduct) {
  const Dtype dt = GetParam();
  constexpr int kM = 37, kN = 50, kK = 70;
  const std::vector<float> x = RandomFloats(kM * kK, 31);
  const Weights w = MakeWeights(dt, RandomFloats(kK * kN, 32));
  const Weights b = MakeWeights(dt, RandomFloats(kN, 33));
  DeviceBuffer dx(x), dw(w.bytes), db(b.bytes), dy(kM * kN * sizeof(float));
  int m = kM, n = kN, k = kK;
  const unsigned gx = (kN + kTile - 1) / kTile, gy = (kM + kTile - 1) / kTile;
  Launch("matmul_bias_" + DtypeSuffix(dt), gx, gy, kTile, kTile,
         {&dx.ptr, &dw.ptr, &db.ptr, &dy.ptr, &m, &n, &k});
  std::vector<double> want, tol;
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double s = b.values[j], mag = std::fabs(b.values[j]);
      for (int p = 0; p < kK; ++p) {
        s += x[i * kK + p] * w.values[p * kN + j];
        mag += std::fabs(x[i * kK + p] * w.values[p * kN + j]);
      }
      want.push_back(s);
      tol.push_back(kRel * mag);
    }
  EXPECT_EQ(CountMismatches(dy.Read<float>(), want, tol, "Y"), 0);

  // Without a bias (a null pointer).
  CUdeviceptr null = 0;
  Launch("matmul_bias_" + DtypeSuffix(dt), gx, gy, kTile, kTile,
         {&dx.ptr, &dw.ptr, &null, &dy.ptr, &m, &n, &k});
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) want[i * kN + j] -= b.values[j];
  EXPECT_EQ(CountMismatches(dy.Read<float>(), want, tol, "Y without bias"), 0);
}

// The tied LM head: logits = X @ wte^T with wte [vocab, C].
TEST_P(RefengineWeightKernels, MatmulNtIsTheTiedLmHead) {
  const Dtype dt = GetParam();
  constexpr int kM = 5, kVocab = 301, kC = 48;
  const std::vector<float> x = RandomFloats(kM * kC, 41);
  const Weights wte = MakeWeights(dt, RandomFloats(kVocab * kC, 42));
  DeviceBuffer dx(x), dw(wte.bytes), dy(kM * kVocab * sizeof(float));
  int m = kM, n = kVocab, k = kC;
  Launch("matmul_nt_" + DtypeSuffix(dt), (kVocab + kTile - 1) / kTile, (kM + kTile - 1) / kTile,
         kTile, kTile, {&dx.ptr, &dw.ptr, &dy.ptr, &m, &n, &k});
  std::vector<double> want, tol;
  for (int i = 0; i < kM; ++i)
    for (int v = 0; v < kVocab; ++v) {
      double s = 0, mag = 0;
      for (int p = 0; p < kC; ++p) {
        s += x[i * kC + p] * wte.values[v * kC + p];
        mag += std::fabs(x[i * kC + p] * wte.values[v * kC + p]);
      }
      want.push_back(s);
      tol.push_back(kRel * mag);
    }
  EXPECT_EQ(CountMismatches(dy.Read<float>(), want, tol, "logits"), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RefengineWeightKernels,
                         testing::Values(Dtype::kF32, Dtype::kF16, Dtype::kBF16),
                         [](const testing::TestParamInfo<Dtype>& info) {
                           return DtypeSuffix(info.param);
                         });

// ---- elementwise -----------------------------------------------------------------------------

TEST_F(RefengineKernels, GeluNewIsGpt2sTanhApproximation) {
  constexpr int kN = 3001;
  std::vector<float> x = RandomFloats(kN, 51, -8.0f, 8.0f);
  x[0] = 0.0f;
  x[1] = -20.0f;
  x[2] = 30.0f;
  DeviceBuffer dx(x);
  int n = kN;
  Launch("gelu_new_f32", (kN + 255) / 256, 1, 256, 1, {&dx.ptr, &n});
  std::vector<double> want, tol;
  for (float v : x) {
    const double u = std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * double(v) * v * v);
    // 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)); the latter does not cancel for u << 0.
    const double g = v / (1.0 + std::exp(-2.0 * u));
    ASSERT_NEAR(g, 0.5 * v * (1.0 + std::tanh(u)), 1e-12);
    want.push_back(g);
    // gelu_new(x) = x / (1 + e) with e = e^(-2u): fp32 rounding of u (relative ~1e-7) moves e
    // by |2u| times that, which moves the result by e / (1 + e) of it.
    const double e = std::exp(-2.0 * u);
    const double cond = std::isinf(e) ? 2.0 * std::fabs(u) : 2.0 * std::fabs(u) * e / (1.0 + e);
    tol.push_back(kRel * std::fabs(g) * (1.0 + cond) + 1e-30);
  }
  EXPECT_EQ(CountMismatches(dx.Read<float>(), want, tol, "gelu"), 0);
}

TEST_F(RefengineKernels, ResidualAddIsOneRoundedAdd) {
  constexpr int kN = 1000;
  const std::vector<float> x = RandomFloats(kN, 61), y = RandomFloats(kN, 62);
  DeviceBuffer dx(x), dy(y);
  int n = kN;
  Launch("residual_add_f32", (kN + 127) / 128, 1, 128, 1, {&dx.ptr, &dy.ptr, &n});
  const std::vector<float> got = dx.Read<float>();
  // The double sum of two floats, rounded once to float, is what one float add gives.
  for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], float(double(x[i]) + y[i])) << i;
}

// ---- greedy sampling ---------------------------------------------------------------------------

TEST_F(RefengineKernels, ArgmaxPicksTheLowestIndexOfTheMaximum) {
  constexpr int kRows = 6, kVocab = 1000;
  std::vector<float> logits = RandomFloats(kRows * kVocab, 71, -10.0f, 10.0f);
  float* row = logits.data();
  row[3 * kVocab + 700] = 50.0f;  // row 3: a tie between 700 and 211 → 211
  row[3 * kVocab + 211] = 50.0f;
  std::fill(row + 4 * kVocab, row + 5 * kVocab, -1.5f);  // row 4: all equal → 0
  row[5 * kVocab + 999] = 1e30f;                         // row 5: the last one
  row[5 * kVocab + 0] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer dl(logits), dout(kRows * sizeof(int));
  int n = kVocab;
  Launch("argmax_f32", kRows, 1, 128, 1, {&dl.ptr, &dout.ptr, &n});
  const std::vector<int> got = dout.Read<int>();
  for (int r = 0; r < kRows; ++r) {
    int want = -1;
    for (int j = 0; j < kVocab; ++j)
      if (!std::isnan(row[r * kVocab + j]) &&
          (want < 0 || row[r * kVocab + j] > row[r * kVocab + want]))
        want = j;
    EXPECT_EQ(got[r], want) << "row " << r;
  }
  EXPECT_EQ(got[3], 211);
  EXPECT_EQ(got[4], 0);
  EXPECT_EQ(got[5], 999);
}

// ---- paged attention ---------------------------------------------------------------------------

// A negative slot marks a padding token (vLLM pads batches to a captured size): it writes
// nothing, while the real token beside it lands in its slot.
TEST_F(RefengineKernels, ReshapeAndCacheSkipsPaddingSlots) {
  constexpr int kHeads = 2, kHeadDim = 8, kC = kHeads * kHeadDim, kBlocks = 2;
  const std::vector<float> k = RandomFloats(2 * kC, 101), v = RandomFloats(2 * kC, 102);
  const std::vector<int> slots = {-1, 21};  // block 1, offset 5
  DeviceBuffer dk(k), dv(v), dslots(slots),
      kc(std::size_t(kBlocks) * kHeads * kBlockSize * kHeadDim * 4),
      vc(std::size_t(kBlocks) * kHeads * kBlockSize * kHeadDim * 4);
  int stride = kC, tokens = 2, heads = kHeads, head_dim = kHeadDim;
  Launch("reshape_and_cache_f32", 2, 1, 32, 1,
         {&dk.ptr, &dv.ptr, &stride, &kc.ptr, &vc.ptr, &dslots.ptr, &tokens, &heads, &head_dim});
  const std::vector<float> kcache = kc.Read<float>(), vcache = vc.Read<float>();
  int written = 0;
  for (std::size_t i = 0; i < kcache.size(); ++i) {
    const std::size_t d = i % kHeadDim, offset = i / kHeadDim % kBlockSize,
                      h = i / (kHeadDim * kBlockSize) % kHeads,
                      block = i / (kHeadDim * kBlockSize * kHeads);
    if (block == 1 && offset == 5) {
      EXPECT_EQ(kcache[i], k[kC + h * kHeadDim + d]) << i;
      EXPECT_EQ(vcache[i], v[kC + h * kHeadDim + d]) << i;
      ++written;
    } else {
      EXPECT_TRUE(std::isnan(kcache[i]) && std::isnan(vcache[i]))
          << "slot element " << i << " written";
    }
  }
  EXPECT_EQ(written, kC);
}

// Several sequences of different lengths in a paged KV cache whose blocks are scattered
// (a shuffled block table): prefill of every prompt token at once, then one decode step.
class RefenginePagedAttention : public RefengineKernels {
 protected:
  static constexpr int kHeads = 3, kHeadDim = 40, kC = kHeads * kHeadDim;
  static constexpr int kNumBlocks = 16, kMaxBlocks = 6;
  static constexpr unsigned kThreads = 32;  // fewer threads than keys: strided loops

  // One step: tokens of sequences `seq` at positions `pos`, with fused qkv rows [T, 3C];
  // context_lens per sequence after the step.
  void Step(const std::vector<int>& seq, const std::vector<int>& pos,
            const std::vector<int>& context_lens, unsigned seed) {
    const int T = int(seq.size());
    const std::vector<float> qkv = RandomFloats(std::size_t(T) * 3 * kC, seed);
    std::vector<int> slots(T);
    for (int t = 0; t < T; ++t) {
      slots[t] =
          table_[seq[t] * kMaxBlocks + pos[t] / kBlockSize] * kBlockSize + pos[t] % kBlockSize;
      // The host copy of the cache, in token order, for the reference.
      for (int i = 0; i < kC; ++i) {
        keys_[seq[t]][pos[t]][i] = qkv[t * 3 * kC + kC + i];
        values_[seq[t]][pos[t]][i] = qkv[t * 3 * kC + 2 * kC + i];
      }
    }
    DeviceBuffer dqkv(qkv), dslots(slots), dseq(seq), dpos(pos), dlens(context_lens),
        dout(std::size_t(T) * kC * sizeof(float));
    CUdeviceptr k = dqkv.ptr + kC * sizeof(float), v = dqkv.ptr + 2 * kC * sizeof(float);
    int stride = 3 * kC, tokens = T, heads = kHeads, head_dim = kHeadDim, max_blocks = kMaxBlocks;
    Launch(
        "reshape_and_cache_f32", T, 1, 64, 1,
        {&k, &v, &stride, &kcache_->ptr, &vcache_->ptr, &dslots.ptr, &tokens, &heads, &head_dim});

    // The cache holds each token's key and value at its slot: [block, head, offset, d].
    const std::vector<float> kc = kcache_->Read<float>(), vc = vcache_->Read<float>();
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
          const std::size_t at = ((std::size_t(slots[t] / kBlockSize) * kHeads + h) * kBlockSize +
                                  slots[t] % kBlockSize) *
                                     kHeadDim +
                                 d;
          ASSERT_EQ(kc[at], qkv[t * 3 * kC + kC + h * kHeadDim + d]) << "token " << t;
          ASSERT_EQ(vc[at], qkv[t * 3 * kC + 2 * kC + h * kHeadDim + d]) << "token " << t;
        }

    float scale = float(1.0 / std::sqrt(double(kHeadDim)));
    Launch("paged_attention_f32", kHeads, T, kThreads, 1,
           {&dout.ptr, &dqkv.ptr, &stride, &kcache_->ptr, &vcache_->ptr, &dtable_->ptr, &max_blocks,
            &dlens.ptr, &dseq.ptr, &dpos.ptr, &heads, &head_dim, &scale});

    std::vector<double> want, tol;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < kHeads; ++h) {
        const int len = std::min(pos[t] + 1, context_lens[seq[t]]);  // causal
        std::vector<double> p(len);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < len; ++j) {
          double dot = 0;
          for (int d = 0; d < kHeadDim; ++d)
            dot += double(qkv[t * 3 * kC + h * kHeadDim + d]) * keys_[seq[t]][j][h * kHeadDim + d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j < len; ++j) sum += p[j] = std::exp(p[j] - mx);
        for (int d = 0; d < kHeadDim; ++d) {
          double o = 0, mag = 0;
          for (int j = 0; j < len; ++j) {
            o += p[j] / sum * values_[seq[t]][j][h * kHeadDim + d];
            mag += p[j] / sum * std::fabs(values_[seq[t]][j][h * kHeadDim + d]);
          }
          want.push_back(o);
          tol.push_back(kRel * mag);
        }
      }
    EXPECT_EQ(CountMismatches(dout.Read<float>(), want, tol, "attention out"), 0);
  }

  void SetUp() override {
    RefengineKernels::SetUp();
    if (HasFatalFailure()) return;
    // Blocks handed out in a scrambled order: sequence s's logical block i is table_[s][i].
    std::vector<int> blocks(kNumBlocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), std::mt19937(81));
    table_.assign(kSeqs * kMaxBlocks, -1);
    int next = 0;
    for (int s = 0; s < kSeqs; ++s)
      for (int i = 0; i < (kLens[s] + 1 + kBlockSize - 1) / kBlockSize; ++i)
        table_[s * kMaxBlocks + i] = blocks[next++];
    ASSERT_LE(next, kNumBlocks);
    dtable_ = std::make_unique<DeviceBuffer>(table_);
    // Unwritten slots hold NaN: reading one would poison the output.
    const std::size_t cache_bytes = std::size_t(kNumBlocks) * kHeads * kBlockSize * kHeadDim * 4;
    kcache_ = std::make_unique<DeviceBuffer>(cache_bytes);
    vcache_ = std::make_unique<DeviceBuffer>(cache_bytes);
    keys_.assign(kSeqs,
                 std::vector<std::vector<float>>(kMaxBlocks * kBlockSize, std::vector<float>(kC)));
    values_ = keys_;
  }
  void TearDown() override {
    dtable_.reset();
    kcache_.reset();
    vcache_.reset();
    RefengineKernels::TearDown();
  }

  // Prompt lengths: inside one block, exactly one block, several blocks.
  static constexpr int kSeqs = 3;
  static constexpr int kLens[kSeqs] = {5, 16, 70};
  std::vector<int> table_;
  std::unique_ptr<DeviceBuffer> dtable_, kcache_, vcache_;
  std::vector<std::vector<std::vector<float>>> keys_, values_;  // [seq][pos][C]
};

TEST_F(RefenginePagedAttention, PrefillThenDecodeMatchesCausalAttention) {
  // Prefill: every prompt token of every sequence in one batch, each attending causally to
  // its own sequence's earlier tokens.
  std::vector<int> seq, pos, lens(kLens, kLens + kSeqs);
  for (int s = 0; s < kSeqs; ++s)
    for (int p = 0; p < kLens[s]; ++p) {
      seq.push_back(s);
      pos.push_back(p);
    }
  ASSERT_NO_FATAL_FAILURE(Step(seq, pos, lens, 91));

  // Decode: one new token per sequence (in another order), attending to all of its context;
  // sequence 1's token opens a new block.
  const std::vector<int> dseq = {2, 0, 1};
  std::vector<int> dpos, dlens = lens;
  for (int s : dseq) dpos.push_back(kLens[s]);
  for (int& l : dlens) ++l;
  ASSERT_NO_FATAL_FAILURE(Step(dseq, dpos, dlens, 92));
}

}  // namespace
