// The acceptance sample of emulator part 2: a program written only against the CUDA driver
// API runs real kernels. nvcc compiled tests/emu/kernels/*.cu to sm_90 cubins, which are
// embedded in this binary (emu_kernels_cubins); the program loads them with cuModuleLoadData /
// cuModuleLoad and launches them with cuLaunchKernel. On the emulator the kernels run as their
// host twins (tests/emu/kernels/*_twins.cpp, found through THAW_EMU_KERNELS); on a real GPU
// the same program runs the SASS. Results are checked against CPU references computed here.
//
// Rules quoted from CUDA 13's cuda.h where they are subtle. Only the test of a kernel without a
// twin is about the emulator itself (it is skipped on a real driver).
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "emu_kernels_cubins.h"
#include "emu_test_support.hpp"

namespace {

// Mangled names, as nvcc writes them into the cubin.
constexpr const char* kVecAdd = "vec_add";
constexpr const char* kMatmul16 = "_Z12matmul_tiledILi16EEvPKfS1_Pfi";
constexpr const char* kReduce = "_Z16block_reduce_sumPKfPfi";
constexpr const char* kNoTwin = "no_twin_fill";
constexpr const char* kAxpb = "axpb";
constexpr const char* kAddInto = "add_into";

// Device memory that frees itself.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  explicit DeviceBuffer(std::size_t bytes) { EXPECT_CU(cuMemAlloc(&ptr, bytes)); }
  ~DeviceBuffer() {
    if (ptr != 0) EXPECT_CU(cuMemFree(ptr));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A context (the primary one, as the runtime uses) with samples.cu and chain.cu loaded.
class ModuleSample : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    const ThawCubin samples = thaw_cubin_samples();
    const ThawCubin chain = thaw_cubin_chain();
    ASSERT_GT(samples.size, 0u);
    ASSERT_GT(chain.size, 0u);
    ASSERT_EQ(std::memcmp(samples.data,
                          "\x7f"
                          "ELF",
                          4),
              0)
        << "the embedded cubin is no ELF";
    ASSERT_CU(cuModuleLoadData(&samples_, samples.data));
    ASSERT_CU(cuModuleLoadData(&chain_, chain.data));
  }
  void TearDown() override {
    if (samples_ != nullptr) EXPECT_CU(cuModuleUnload(samples_));
    if (chain_ != nullptr) EXPECT_CU(cuModuleUnload(chain_));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  CUfunction Function(CUmodule mod, const char* name) {
    CUfunction f = nullptr;
    CUresult r = cuModuleGetFunction(&f, mod, name);
    EXPECT_EQ(r, CUDA_SUCCESS) << "cuModuleGetFunction(" << name
                               << "): " << thaw::test::cu_error_name(r);
    return f;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule samples_ = nullptr;
  CUmodule chain_ = nullptr;
};

// ---- results ---------------------------------------------------------------------------

TEST_F(ModuleSample, VecAddOfAMillionAndThreeFloatsIsExact) {
  constexpr int n = (1 << 20) + 3;  // not a multiple of the block: the tail threads idle
  const std::vector<float> a = thaw::test::random_floats(n, 1), b = thaw::test::random_floats(n, 2);
  DeviceBuffer da(n * sizeof(float)), db(n * sizeof(float)), dc(n * sizeof(float));
  ASSERT_CU(cuMemcpyHtoD(da.ptr, a.data(), n * sizeof(float)));
  ASSERT_CU(cuMemcpyHtoD(db.ptr, b.data(), n * sizeof(float)));
  ASSERT_CU(cuMemsetD32(dc.ptr, 0x7fc00000u, n));  // NaN: every element must be written

  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  int count = n;
  void* params[] = {&da.ptr, &db.ptr, &dc.ptr, &count};
  constexpr unsigned kBlock = 256;
  ASSERT_CU(cuLaunchKernel(f, (n + kBlock - 1) / kBlock, 1, 1, kBlock, 1, 1, 0, nullptr, params,
                           nullptr));
  ASSERT_CU(cuCtxSynchronize());

  std::vector<float> c(n);
  ASSERT_CU(cuMemcpyDtoH(c.data(), dc.ptr, n * sizeof(float)));
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    const float want = a[i] + b[i];  // one IEEE add, the same on both sides
    if (std::memcmp(&c[i], &want, sizeof want) != 0 && ++wrong <= 5)
      ADD_FAILURE() << "c[" << i << "] = " << c[i] << ", want " << want;
  }
  EXPECT_EQ(wrong, 0);
}

// "Kernel parameters can also be packaged by the application into a single buffer that is
// passed in via the extra parameter. This places the burden on the application of knowing
// each kernel parameter's size and alignment/padding within the buffer." (cuLaunchKernel)
TEST_F(ModuleSample, VecAddWithParametersInTheExtraBuffer) {
  constexpr int n = 10000;
  const std::vector<float> a = thaw::test::random_floats(n, 3), b = thaw::test::random_floats(n, 4);
  DeviceBuffer da(n * sizeof(float)), db(n * sizeof(float)), dc(n * sizeof(float));
  ASSERT_CU(cuMemcpyHtoD(da.ptr, a.data(), n * sizeof(float)));
  ASSERT_CU(cuMemcpyHtoD(db.ptr, b.data(), n * sizeof(float)));

  // vec_add(const float* a, const float* b, float* c, int n): 8-byte pointers at 0, 8, 16,
  // the int at 24; 28 bytes in all.
  alignas(8) unsigned char buf[28];
  const int count = n;
  std::memcpy(buf + 0, &da.ptr, 8);
  std::memcpy(buf + 8, &db.ptr, 8);
  std::memcpy(buf + 16, &dc.ptr, 8);
  std::memcpy(buf + 24, &count, 4);
  std::size_t size = sizeof buf;
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuMemsetD32(dc.ptr, 0x7fc00000u, n));  // NaN: every element must be written
  ASSERT_CU(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, nullptr, extra));

  std::vector<float> c(n);
  ASSERT_CU(cuMemcpyDtoH(c.data(), dc.ptr, n * sizeof(float)));
  for (int i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << "at " << i;
}

// "The error CUDA_ERROR_INVALID_VALUE will be returned if kernel parameters are specified
// with both kernelParams and extra (i.e. both kernelParams and extra are non-NULL)."
TEST_F(ModuleSample, BothKernelParamsAndExtraIsInvalidValue) {
  DeviceBuffer dc(64 * sizeof(float));
  ASSERT_CU(cuMemsetD32(dc.ptr, 0, 64));
  int count = 64;
  void* params[] = {&dc.ptr, &dc.ptr, &dc.ptr, &count};
  alignas(8) unsigned char buf[28] = {};
  std::size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, nullptr, params, extra),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cuCtxSynchronize());
}

class TiledMatmul : public ModuleSample, public testing::WithParamInterface<int> {};

// 16 x 16 tiles in __shared__ memory with two __syncthreads per tile step; n = 100 leaves
// partial tiles at the edges.
TEST_P(TiledMatmul, MatchesTheCpuProduct) {
  const int n = GetParam();
  constexpr int kTile = 16;
  const std::size_t bytes = std::size_t(n) * n * sizeof(float);
  const std::vector<float> a = thaw::test::random_floats(std::size_t(n) * n, 5),
                           b = thaw::test::random_floats(std::size_t(n) * n, 6);
  DeviceBuffer da(bytes), db(bytes), dc(bytes);
  ASSERT_CU(cuMemcpyHtoD(da.ptr, a.data(), bytes));
  ASSERT_CU(cuMemcpyHtoD(db.ptr, b.data(), bytes));
  ASSERT_CU(cuMemsetD32(dc.ptr, 0x7fc00000u, std::size_t(n) * n));

  CUfunction f = Function(samples_, kMatmul16);
  ASSERT_NE(f, nullptr);
  int dim = n;
  void* params[] = {&da.ptr, &db.ptr, &dc.ptr, &dim};
  const unsigned grid = (n + kTile - 1) / kTile;
  ASSERT_CU(cuLaunchKernel(f, grid, grid, 1, kTile, kTile, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());

  std::vector<float> c(std::size_t(n) * n);
  ASSERT_CU(cuMemcpyDtoH(c.data(), dc.ptr, bytes));
  int wrong = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0;
      for (int k = 0; k < n; ++k) want += double(a[i * n + k]) * b[k * n + j];
      // n float FMAs of terms in [-1, 1]: far below 1e-4 off the exact sum.
      if (!(std::fabs(c[i * n + j] - want) <= 1e-4) && ++wrong <= 5)
        ADD_FAILURE() << "c[" << i << "][" << j << "] = " << c[i * n + j] << ", want " << want;
    }
  EXPECT_EQ(wrong, 0);
}
INSTANTIATE_TEST_SUITE_P(Sizes, TiledMatmul, testing::Values(128, 100));

// Each block reduces 2 x 256 floats in dynamic shared memory, then atomically adds its sum.
TEST_F(ModuleSample, ReductionOfAMillionFloatsMatchesTheCpuSum) {
  constexpr int n = 1 << 20;
  constexpr unsigned kBlock = 256;
  const std::vector<float> x = thaw::test::random_floats(n, 7, 0.0f, 1.0f);
  DeviceBuffer dx(n * sizeof(float)), dsum(sizeof(float));
  ASSERT_CU(cuMemcpyHtoD(dx.ptr, x.data(), n * sizeof(float)));
  ASSERT_CU(cuMemsetD32(dsum.ptr, 0, 1));

  CUfunction f = Function(samples_, kReduce);
  ASSERT_NE(f, nullptr);
  int count = n;
  void* params[] = {&dx.ptr, &dsum.ptr, &count};
  const unsigned blocks = (n + 2 * kBlock - 1) / (2 * kBlock);
  ASSERT_CU(cuLaunchKernel(f, blocks, 1, 1, kBlock, 1, 1, kBlock * sizeof(float), nullptr, params,
                           nullptr));
  float sum = 0;
  ASSERT_CU(cuMemcpyDtoH(&sum, dsum.ptr, sizeof sum));

  double want = 0;
  for (float v : x) want += v;
  // 2048 block sums (exact to ~1e-5 each) added in float to a total near 5e5, whose ulp is
  // 1/32: the worst case is ~2048 half-ulps, 32, i.e. 6e-5 relative; typical is far less.
  EXPECT_NEAR(sum, want, want * 1e-4);
}

// The chain kernels with mixed 4- and 8-byte parameters: x = a x + b (parameters in the extra
// buffer), then dst += x (kernelParams), on a stream.
TEST_F(ModuleSample, ChainKernelsOnAStream) {
  constexpr int n = 4099;
  const std::vector<float> x = thaw::test::random_floats(n, 8), d = thaw::test::random_floats(n, 9);
  DeviceBuffer dx(n * sizeof(float)), dd(n * sizeof(float));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemcpyHtoDAsync(dx.ptr, x.data(), n * sizeof(float), s));
  ASSERT_CU(cuMemcpyHtoDAsync(dd.ptr, d.data(), n * sizeof(float), s));

  // axpb(float* x, float a, float b, int n): pointer at 0, floats at 8 and 12, int at 16.
  alignas(8) unsigned char buf[20];
  const float a = 1.1f, b = 0.3f;  // inexact: a separate multiply and add would round twice
  const int count = n;
  std::memcpy(buf + 0, &dx.ptr, 8);
  std::memcpy(buf + 8, &a, 4);
  std::memcpy(buf + 12, &b, 4);
  std::memcpy(buf + 16, &count, 4);
  std::size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUfunction axpb = Function(chain_, kAxpb), add_into = Function(chain_, kAddInto);
  ASSERT_NE(axpb, nullptr);
  ASSERT_NE(add_into, nullptr);
  ASSERT_CU(cuLaunchKernel(axpb, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, nullptr, extra));
  int count2 = n;
  void* params[] = {&dd.ptr, &dx.ptr, &count2};
  ASSERT_CU(cuLaunchKernel(add_into, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
  std::vector<float> out(n);
  ASSERT_CU(cuMemcpyDtoHAsync(out.data(), dd.ptr, n * sizeof(float), s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamDestroy(s));
  for (int i = 0; i < n; ++i) {
    const float want = d[i] + std::fma(a, x[i], b);  // the device contracts a*x+b to an FMA
    ASSERT_EQ(out[i], want) << "at " << i;
  }
}

// ---- the emulator's own rule ------------------------------------------------------------

// The issue: "A launch of a kernel with no twin fails with a clear error naming the kernel."
// The documentation has no such case; the kernel exists in the cubin, so cuModuleGetFunction
// finds it, and the launch itself fails. The launch never ran, so the context stays usable.
TEST_F(ModuleSample, LaunchOfAKernelWithoutTwinFailsAndLeavesTheContextUsable) {
  if (!thaw::test::on_emulator()) GTEST_SKIP() << "a real driver runs no_twin_fill's SASS";
  DeviceBuffer dx(64 * sizeof(int));
  CUfunction f = Function(samples_, kNoTwin);
  ASSERT_NE(f, nullptr);
  int value = 7, count = 64;
  void* params[] = {&dx.ptr, &value, &count};
  testing::internal::CaptureStderr();
  const CUresult r = cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, nullptr, params, nullptr);
  const CUresult sync = cuCtxSynchronize();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r, CUDA_ERROR_NOT_FOUND) << thaw::test::cu_error_name(r);
  EXPECT_NE(err.find(kNoTwin), std::string::npos) << "stderr does not name the kernel: " << err;
  EXPECT_EQ(sync, CUDA_SUCCESS) << thaw::test::cu_error_name(sync);

  // A kernel with a twin still runs in this context.
  DeviceBuffer dc(64 * sizeof(float));
  ASSERT_CU(cuMemsetD32(dc.ptr, 0, 64));
  CUfunction add = Function(samples_, kVecAdd);
  ASSERT_NE(add, nullptr);
  void* add_params[] = {&dc.ptr, &dc.ptr, &dc.ptr, &count};
  EXPECT_CU(cuLaunchKernel(add, 1, 1, 1, 64, 1, 1, 0, nullptr, add_params, nullptr));
  EXPECT_CU(cuCtxSynchronize());
}

// ---- names, parameter layouts, enumeration ----------------------------------------------

// "If no function of that name exists, cuModuleGetFunction() returns CUDA_ERROR_NOT_FOUND."
TEST_F(ModuleSample, GetFunctionOfAnUnknownNameIsNotFound) {
  CUfunction f = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&f, samples_, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
  // The unmangled name of a C++ kernel is not its name either.
  EXPECT_EQ(cuModuleGetFunction(&f, samples_, "block_reduce_sum"), CUDA_ERROR_NOT_FOUND);
  // A kernel of another module is not in this one.
  EXPECT_EQ(cuModuleGetFunction(&f, samples_, kAxpb), CUDA_ERROR_NOT_FOUND);
}

// "This API may return a mangled name if the function is not declared as having C linkage."
TEST_F(ModuleSample, FuncGetNameReturnsTheCubinsMangledName) {
  for (const char* name : {kVecAdd, kMatmul16, kReduce, kNoTwin}) {
    CUfunction f = Function(samples_, name);
    ASSERT_NE(f, nullptr);
    const char* got = nullptr;
    ASSERT_CU(cuFuncGetName(&got, f));
    ASSERT_NE(got, nullptr);
    EXPECT_STREQ(got, name);
  }
  // "If either **name or hfunc is NULL, CUDA_ERROR_INVALID_VALUE is returned."
  const char* got = nullptr;
  EXPECT_EQ(cuFuncGetName(&got, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuFuncGetName(nullptr, Function(samples_, kVecAdd)), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(ModuleSample, FuncGetModuleReturnsTheLoadingModule) {
  CUmodule m = nullptr;
  ASSERT_CU(cuFuncGetModule(&m, Function(samples_, kMatmul16)));
  EXPECT_EQ(m, samples_);
  ASSERT_CU(cuFuncGetModule(&m, Function(chain_, kAddInto)));
  EXPECT_EQ(m, chain_);
}

struct Param {
  std::size_t offset, size;
};

// Offsets and sizes of the device-side parameter layout: each parameter at its natural
// alignment (pointers 8, float and int 4).
TEST_F(ModuleSample, FuncGetParamInfoMatchesTheKernelSignatures) {
  const std::vector<std::pair<std::pair<CUmodule, const char*>, std::vector<Param>>> kernels = {
      {{samples_, kVecAdd}, {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
      {{samples_, kMatmul16}, {{0, 8}, {8, 8}, {16, 8}, {24, 4}}},
      {{samples_, kReduce}, {{0, 8}, {8, 8}, {16, 4}}},
      {{samples_, kNoTwin}, {{0, 8}, {8, 4}, {12, 4}}},
      {{chain_, kAxpb}, {{0, 8}, {8, 4}, {12, 4}, {16, 4}}},
      {{chain_, kAddInto}, {{0, 8}, {8, 8}, {16, 4}}},
  };
  for (const auto& [where, params] : kernels) {
    SCOPED_TRACE(where.second);
    CUfunction f = Function(where.first, where.second);
    ASSERT_NE(f, nullptr);
    for (std::size_t i = 0; i < params.size(); ++i) {
      std::size_t offset = ~std::size_t{0}, size = ~std::size_t{0};
      ASSERT_CU(cuFuncGetParamInfo(f, i, &offset, &size));
      EXPECT_EQ(offset, params[i].offset) << "parameter " << i;
      EXPECT_EQ(size, params[i].size) << "parameter " << i;
      // "paramSize can be set to NULL if only the parameter offset is desired."
      offset = ~std::size_t{0};
      ASSERT_CU(cuFuncGetParamInfo(f, i, &offset, nullptr));
      EXPECT_EQ(offset, params[i].offset) << "parameter " << i;
    }
    // "paramIndex must be less than the number of parameters that func takes."
    std::size_t offset = 0, size = 0;
    EXPECT_EQ(cuFuncGetParamInfo(f, params.size(), &offset, &size), CUDA_ERROR_INVALID_VALUE);
  }
}

TEST_F(ModuleSample, ModuleEnumerationListsEveryKernel) {
  const std::vector<std::pair<CUmodule, std::set<std::string>>> modules = {
      {samples_, {kVecAdd, kMatmul16, kReduce, kNoTwin}},
      {chain_, {kAxpb, kAddInto}},
  };
  for (const auto& [mod, names] : modules) {
    unsigned count = 0;
    ASSERT_CU(cuModuleGetFunctionCount(&count, mod));
    ASSERT_EQ(count, names.size());
    std::vector<CUfunction> fs(count + 2, nullptr);
    ASSERT_CU(cuModuleEnumerateFunctions(fs.data(), count, mod));
    std::set<std::string> got;
    for (unsigned i = 0; i < count; ++i) {
      ASSERT_NE(fs[i], nullptr);
      const char* name = nullptr;
      ASSERT_CU(cuFuncGetName(&name, fs[i]));
      got.insert(name);
      // An enumerated handle is a usable function of the module.
      CUmodule owner = nullptr;
      ASSERT_CU(cuFuncGetModule(&owner, fs[i]));
      EXPECT_EQ(owner, mod);
    }
    EXPECT_EQ(got, names);
    EXPECT_EQ(fs[count], nullptr) << "wrote past numFunctions";

    // "Returns in functions a maximum number of numFunctions function handles."
    std::vector<CUfunction> one(2, nullptr);
    ASSERT_CU(cuModuleEnumerateFunctions(one.data(), 1, mod));
    EXPECT_NE(one[0], nullptr);
    EXPECT_EQ(one[1], nullptr) << "wrote past numFunctions";
  }
}

// cuModuleGetFunctionCount and cuModuleEnumerateFunctions document CUDA_ERROR_INVALID_VALUE
// and CUDA_ERROR_INVALID_HANDLE: a null output array is the former; a module that was unloaded
// the latter (the emulator's handles are ids, so a stale one is safe to pass).
TEST_F(ModuleSample, EnumerationRejectsNullOutputsAndUnloadedModules) {
  unsigned count = 0;
  EXPECT_EQ(cuModuleGetFunctionCount(nullptr, samples_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuModuleEnumerateFunctions(nullptr, 1, samples_), CUDA_ERROR_INVALID_VALUE);

  CUmodule stale = nullptr;
  ASSERT_CU(cuModuleLoadData(&stale, thaw_cubin_chain().data));
  ASSERT_CU(cuModuleUnload(stale));
  EXPECT_EQ(cuModuleGetFunctionCount(&count, stale), CUDA_ERROR_INVALID_HANDLE);
  CUfunction f = nullptr;
  EXPECT_EQ(cuModuleEnumerateFunctions(&f, 1, stale), CUDA_ERROR_INVALID_HANDLE);
}

// An enumerated handle launches like one from cuModuleGetFunction.
TEST_F(ModuleSample, EnumeratedFunctionLaunches) {
  unsigned count = 0;
  ASSERT_CU(cuModuleGetFunctionCount(&count, chain_));
  std::vector<CUfunction> fs(count);
  ASSERT_CU(cuModuleEnumerateFunctions(fs.data(), count, chain_));
  CUfunction axpb = nullptr;
  for (CUfunction f : fs) {
    const char* name = nullptr;
    ASSERT_CU(cuFuncGetName(&name, f));
    if (std::string(name) == kAxpb) axpb = f;
  }
  ASSERT_NE(axpb, nullptr);
  constexpr int n = 100;
  std::vector<float> x(n, 3.0f);
  DeviceBuffer dx(n * sizeof(float));
  ASSERT_CU(cuMemcpyHtoD(dx.ptr, x.data(), n * sizeof(float)));
  float a = 0.5f, b = -1.0f;
  int count2 = n;
  void* params[] = {&dx.ptr, &a, &b, &count2};
  ASSERT_CU(cuLaunchKernel(axpb, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuMemcpyDtoH(x.data(), dx.ptr, n * sizeof(float)));
  for (float v : x) ASSERT_EQ(v, 0.5f);
}

// cuModuleLoad reads the same cubin from its file.
TEST_F(ModuleSample, ModuleLoadFromTheCubinFile) {
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoad(&m, THAW_CUBIN_PATH_chain));
  unsigned count = 0;
  EXPECT_CU(cuModuleGetFunctionCount(&count, m));
  EXPECT_EQ(count, 2u);
  CUfunction f = nullptr;
  EXPECT_CU(cuModuleGetFunction(&f, m, kAddInto));
  EXPECT_NE(f, nullptr);
  EXPECT_CU(cuModuleUnload(m));
}

}  // namespace
