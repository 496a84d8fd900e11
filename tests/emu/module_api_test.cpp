// The module, function, launch and library API around the sample kernels: what
// module_sample_test (results of vector add / matmul / reduction, names, parameter layouts,
// enumeration) does not cover. Loading every image kind (cubin, uncompressed fatbin, files,
// JIT options) and refusing the wrong ones; __device__/__constant__ globals; lazy loading;
// function attributes and the dynamic shared memory opt-in; the launch checks of
// cuLaunchKernel / cuLaunchKernelEx / cuLaunchCooperativeKernel and the _ptsz entry points;
// a twin that faults (CUDA_ERROR_ILLEGAL_ADDRESS, sticky) versus a CPU fault (the process
// dies); the CUDA 12 library API (cuLibrary* / cuKernel*); the launch line of THAW_EMU_TRACE.
//
// Kernels: tests/emu/kernels/{samples,chain,globals}.cu, compiled by nvcc to sm_90 cubins and
// uncompressed fatbins (emu_kernels_cubins.h); images for other architectures and PTX come
// from the parser tests' testdata (THAW_MODULE_TESTDATA). Rules are quoted from CUDA 13's
// cuda.h (and the CUDA programming guide where cuda.h is silent). Tests of the emulator's own
// behaviour (no JIT, the trace) are skipped on a real driver.
//
// Tests whose environment matters (CUDA_MODULE_LOADING, THAW_EMU_TRACE), that need a process
// without any context, or that leave the context with a sticky error run their body in a
// fresh process (thaw::test::run_in_fresh_process), so the suite also passes when run as one
// process.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "emu_kernels_cubins.h"
#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

// Names as nvcc writes them into the cubins.
constexpr const char* kVecAdd = "vec_add";
constexpr const char* kMatmul16 = "_Z12matmul_tiledILi16EEvPKfS1_Pfi";
constexpr const char* kReduce = "_Z16block_reduce_sumPKfPfi";
constexpr const char* kNoTwin = "no_twin_fill";
constexpr const char* kAxpb = "axpb";
constexpr const char* kAddTo = "add_to";
constexpr std::size_t kMiB = std::size_t{1} << 20;

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

// One vec_add problem: inputs uploaded, output filled with NaN, kernelParams ready.
// Wrong() counts the elements of c that are not a + b.
class VecAddJob {
 public:
  explicit VecAddJob(int n)
      : n_(n), a_(n), b_(n), da_(Bytes()), db_(Bytes()), dc_(Bytes()), out_(dc_.ptr) {
    for (int i = 0; i < n; ++i) {
      a_[i] = 0.5f * static_cast<float>(i);
      b_[i] = 1000.0f - static_cast<float>(i);
    }
    EXPECT_CU(cuMemcpyHtoD(da_.ptr, a_.data(), Bytes()));
    EXPECT_CU(cuMemcpyHtoD(db_.ptr, b_.data(), Bytes()));
    EXPECT_CU(cuMemsetD32(dc_.ptr, 0x7fc00000u, n));  // NaN: every element must be written
    // cuMemsetD32 may run asynchronously to the host: finish it before a launch on a
    // non-blocking stream, which does not wait for the legacy default stream.
    EXPECT_CU(cuCtxSynchronize());
  }
  VecAddJob(const VecAddJob&) = delete;
  VecAddJob& operator=(const VecAddJob&) = delete;

  void** Params() { return params_; }
  // For a context that can no longer be used (a sticky error): the buffers are not freed.
  void Abandon() { da_.ptr = db_.ptr = dc_.ptr = 0; }
  // Makes the kernel write to `out` instead of the job's own output buffer.
  void SetOutput(CUdeviceptr out) { out_ = out; }
  unsigned Blocks(unsigned block) const { return (static_cast<unsigned>(n_) + block - 1) / block; }

  int Wrong() {
    std::vector<float> c(n_);
    CUresult r = cuMemcpyDtoH(c.data(), dc_.ptr, Bytes());
    EXPECT_EQ(r, CUDA_SUCCESS) << thaw::test::cu_error_name(r);
    if (r != CUDA_SUCCESS) return n_;
    int wrong = 0;
    for (int i = 0; i < n_; ++i) {
      if (!(c[i] == a_[i] + b_[i])) ++wrong;
    }
    return wrong;
  }

 private:
  std::size_t Bytes() const { return std::size_t(n_) * sizeof(float); }

  int n_;
  std::vector<float> a_, b_;
  DeviceBuffer da_, db_, dc_;
  CUdeviceptr out_;
  int count_ = n_;
  void* params_[4] = {&da_.ptr, &db_.ptr, &out_, &count_};
};

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  bytes.push_back('\0');  // PTX text must be NUL-terminated
  return bytes;
}

// An image the parser tests build (tests/emu/testdata), or "" when this build has none. The
// environment's THAW_MODULE_TESTDATA comes first: the conformance program ships the images with it.
std::string Testdata(const char* name) {
  if (const char* dir = std::getenv("THAW_MODULE_TESTDATA"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" + name;
  }
#ifdef THAW_MODULE_TESTDATA
  return std::string(THAW_MODULE_TESTDATA) + "/" + name;
#else
  (void)name;
  return "";
#endif
}
// The embedded kernels' image files as cuModuleLoad/cuLibraryLoadFromFile take them: the
// build tree's path, or the copy beside the conformance program (THAW_MODULE_TESTDATA), which
// runs where the build tree is not.
std::string KernelFile(const char* build_path) {
  if (const char* dir = std::getenv("THAW_MODULE_TESTDATA"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" + std::filesystem::path(build_path).filename().string();
  }
  return build_path;
}
#define REQUIRE_TESTDATA()                                                        \
  do {                                                                            \
    if (Testdata("x").empty()) GTEST_SKIP() << "built without the parser images"; \
  } while (0)

int DeviceAttribute(CUdevice_attribute attr, CUdevice dev = 0) {
  int v = -1;
  EXPECT_CU(cuDeviceGetAttribute(&v, attr, dev));
  return v;
}

int FuncAttribute(CUfunction f, CUfunction_attribute attr) {
  int v = -1;
  CUresult r = cuFuncGetAttribute(&v, attr, f);
  EXPECT_EQ(r, CUDA_SUCCESS) << "cuFuncGetAttribute(" << attr
                             << "): " << thaw::test::cu_error_name(r);
  return v;
}

CUfunctionLoadingState LoadingState(CUfunction f) {
  CUfunctionLoadingState s = CU_FUNCTION_LOADING_STATE_MAX;
  EXPECT_CU(cuFuncIsLoaded(&s, f));
  return s;
}

std::string FuncName(CUfunction f) {
  const char* name = nullptr;
  EXPECT_CU(cuFuncGetName(&name, f));
  return name != nullptr ? name : "";
}

// A context (the primary one, as the runtime uses) with samples.cu loaded from its cubin.
class ModuleApi : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuModuleLoadData(&samples_, thaw_cubin_samples().data));
  }
  void TearDown() override {
    if (samples_ != nullptr) EXPECT_CU(cuModuleUnload(samples_));
    if (ctx_ != nullptr) {
      EXPECT_CU(cuCtxSetCurrent(nullptr));
      EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
    }
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
};

// =======================================================================================
// Loading images
// =======================================================================================

// cuModuleLoadDataEx: "The image may be a cubin or fatbin as output by nvcc"; JIT options
// only matter for PTX, and none (0, NULL, NULL) is the plain load.
TEST_F(ModuleApi, LoadDataExLoadsACubinWithAndWithoutOptions) {
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&m, thaw_cubin_chain().data, 0, nullptr, nullptr));
  unsigned count = 0;
  EXPECT_CU(cuModuleGetFunctionCount(&count, m));
  EXPECT_EQ(count, 2u);
  EXPECT_CU(cuModuleUnload(m));

  CUjit_option options[] = {CU_JIT_LOG_VERBOSE};
  void* values[] = {reinterpret_cast<void*>(std::uintptr_t{0})};
  m = nullptr;
  ASSERT_CU(cuModuleLoadDataEx(&m, thaw_cubin_chain().data, 1, options, values));
  CUfunction f = nullptr;
  EXPECT_CU(cuModuleGetFunction(&f, m, kAxpb));
  EXPECT_CU(cuModuleUnload(m));
}

// numOptions says how many entries `options` and `optionValues` have: a count without the
// arrays is an invalid value, and nothing is loaded.
TEST_F(ModuleApi, LoadDataExWithAnOptionCountButNoOptionsIsInvalidValue) {
  void* values[] = {nullptr};
  CUjit_option options[] = {CU_JIT_LOG_VERBOSE};
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuModuleLoadDataEx(&m, thaw_cubin_chain().data, 1, nullptr, values));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuModuleLoadDataEx(&m, thaw_cubin_chain().data, 1, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuModuleLoadDataEx(&m, thaw_cubin_chain().data, 1, options, nullptr));
  EXPECT_EQ(m, nullptr);
}

// cuModuleLoadFatBinary: "The pointer represents a fat binary object, which is a collection
// of different cubin and/or PTX files"; cuModuleLoadData/Ex and cuModuleLoad take fatbins too.
// The fatbin's sm_90 cubin runs.
TEST_F(ModuleApi, UncompressedFatbinLoadsAndItsKernelsRun) {
  const ThawCubin fatbin = thaw_fatbin_samples();
  ASSERT_GT(fatbin.size, 16u);
  std::uint32_t magic = 0;
  std::memcpy(&magic, fatbin.data, 4);
  ASSERT_EQ(magic, 0xBA55ED50u) << "the embedded image is no fatbin container";

  const std::vector<std::pair<const char*, std::function<CUresult(CUmodule*)>>> loaders = {
      {"cuModuleLoadFatBinary", [&](CUmodule* m) { return cuModuleLoadFatBinary(m, fatbin.data); }},
      {"cuModuleLoadData", [&](CUmodule* m) { return cuModuleLoadData(m, fatbin.data); }},
      {"cuModuleLoadDataEx",
       [&](CUmodule* m) { return cuModuleLoadDataEx(m, fatbin.data, 0, nullptr, nullptr); }},
      {"cuModuleLoad",
       [&](CUmodule* m) { return cuModuleLoad(m, KernelFile(THAW_FATBIN_PATH_samples).c_str()); }},
  };
  for (const auto& [what, load] : loaders) {
    SCOPED_TRACE(what);
    CUmodule m = nullptr;
    CUresult r = load(&m);
    ASSERT_EQ(r, CUDA_SUCCESS) << thaw::test::cu_error_name(r);
    unsigned count = 0;
    EXPECT_CU(cuModuleGetFunctionCount(&count, m));
    EXPECT_EQ(count, 4u);
    CUfunction f = Function(m, kVecAdd);
    ASSERT_NE(f, nullptr);
    VecAddJob job(1000);
    EXPECT_CU(
        cuLaunchKernel(f, job.Blocks(128), 1, 1, 128, 1, 1, 0, nullptr, job.Params(), nullptr));
    EXPECT_CU(cuCtxSynchronize());
    EXPECT_EQ(job.Wrong(), 0);
    EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_BINARY_VERSION), 90);
    EXPECT_CU(cuModuleUnload(m));
  }
}

// sm_80 SASS does not run on an sm_90 device (a cubin runs on its own major version only), and
// an image without sm_90 SASS and without PTX cannot be JIT-compiled either:
// CUDA_ERROR_NO_BINARY_FOR_GPU ("no kernel image is available for execution on the device").
TEST_F(ModuleApi, ImagesWithoutSm90CodeAreNoBinaryForGpu) {
  REQUIRE_TESTDATA();
  for (const char* name : {"kernels.sm_80.cubin", "kernels.sm_100.cubin", "kernels.sm_80.fatbin"}) {
    SCOPED_TRACE(name);
    const std::string path = Testdata(name);
    const std::vector<char> image = ReadFile(path);
    CUmodule m = nullptr;
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoadData(&m, image.data()));
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                  cuModuleLoadDataEx(&m, image.data(), 0, nullptr, nullptr));
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoadFatBinary(&m, image.data()));
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoad(&m, path.c_str()));
    CUlibrary lib = nullptr;
    EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                  cuLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(lib, nullptr);
  }
  // sm_90a SASS is built for exactly this device (H100): it loads.
  const std::vector<char> sm90a = ReadFile(Testdata("kernels.sm_90a.cubin"));
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, sm90a.data()));
  EXPECT_CU(cuModuleUnload(m));
}

// The emulator has no JIT: PTX text, and fatbins that offer only PTX for sm_90, are refused
// with CUDA_ERROR_NO_BINARY_FOR_GPU (a real driver compiles them).
TEST_F(ModuleApi, PtxIsNoBinaryForGpuOnTheEmulator) {
  if (!thaw::test::on_emulator()) GTEST_SKIP() << "a real driver JIT-compiles PTX";
  REQUIRE_TESTDATA();
  const std::string ptx_path = Testdata("kernels.ptx");
  const std::vector<char> ptx = ReadFile(ptx_path);
  ASSERT_NE(std::string(ptx.data()).find(".version"), std::string::npos) << "not PTX text";
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoadData(&m, ptx.data()));
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
                cuModuleLoadDataEx(&m, ptx.data(), 0, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoad(&m, ptx_path.c_str()));
  const std::vector<char> ptx_fatbin = ReadFile(Testdata("kernels.compute_90.fatbin"));
  EXPECT_CU_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, cuModuleLoadFatBinary(&m, ptx_fatbin.data()));
  EXPECT_EQ(m, nullptr);
}

// Bytes that are no cubin, fatbin or PTX: CUDA_ERROR_INVALID_IMAGE ("the device kernel image is
// invalid"), never a crash. A cubin file cut short is invalid too (cuModuleLoad knows the file's
// size; cuModuleLoadData does not, so it is not given truncated images here).
TEST_F(ModuleApi, GarbageAndTruncatedImagesAreInvalidImage) {
  std::vector<unsigned char> garbage(4096);
  for (std::size_t i = 0; i < garbage.size(); ++i)
    garbage[i] = static_cast<unsigned char>(i * 37 + 11);
  garbage.back() = 0;
  const char text[] = "this is not a module image\n";
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, garbage.data()));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadData(&m, text));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadDataEx(&m, text, 0, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoadFatBinary(&m, garbage.data()));

  const ThawCubin cubin = thaw_cubin_samples();
  const std::string path =
      testing::TempDir() + "module_api_truncated_" + std::to_string(getpid()) + ".cubin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(cubin.data),
              static_cast<std::streamsize>(cubin.size / 2));
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_IMAGE, cuModuleLoad(&m, path.c_str()));
  std::remove(path.c_str());
  EXPECT_EQ(m, nullptr);
}

// cuModuleLoad documents CUDA_ERROR_FILE_NOT_FOUND; a NULL image is an invalid value.
TEST_F(ModuleApi, MissingFileIsFileNotFoundAndNullImageIsInvalidValue) {
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&m, "/nonexistent/thaw/module.cubin"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(nullptr, thaw_cubin_chain().data));
  EXPECT_EQ(m, nullptr);
}

// The module calls load "into the current context": without one, CUDA_ERROR_INVALID_CONTEXT.
TEST_F(ModuleApi, ModuleLoadsWithoutACurrentContextAreInvalidContext) {
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  const ThawCubin cubin = thaw_cubin_chain();
  const ThawCubin fatbin = thaw_fatbin_chain();
  CUmodule m = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuModuleLoadData(&m, cubin.data));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT,
                cuModuleLoadDataEx(&m, cubin.data, 0, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT, cuModuleLoadFatBinary(&m, fatbin.data));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_CONTEXT,
                cuModuleLoad(&m, KernelFile(THAW_CUBIN_PATH_chain).c_str()));
  EXPECT_EQ(m, nullptr);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
}

TEST(ModuleApiNoInit, ModuleAndLibraryLoadsBeforeCuInitAreNotInitialized) {
  thaw::test::run_in_fresh_process({}, [] {
    CUmodule m = nullptr;
    CUlibrary lib = nullptr;
    EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED, cuModuleLoadData(&m, thaw_cubin_chain().data));
    EXPECT_CU_ERR(CUDA_ERROR_NOT_INITIALIZED,
                  cuModuleLoad(&m, KernelFile(THAW_CUBIN_PATH_chain).c_str()));
    EXPECT_CU_ERR(
        CUDA_ERROR_NOT_INITIALIZED,
        cuLibraryLoadData(&lib, thaw_cubin_chain().data, nullptr, nullptr, 0, nullptr, nullptr, 0));
  });
}

// The emulator's handles are ids, so a stale module is safe to pass (design; cuda.h calls the
// use of a destroyed handle undefined): a second unload is CUDA_ERROR_INVALID_HANDLE, and a
// function of an unloaded module no longer launches (cuLaunchKernel documents
// CUDA_ERROR_INVALID_HANDLE).
TEST_F(ModuleApi, UnloadTwiceAndLaunchAfterUnloadAreInvalidHandle) {
  if (!thaw::test::on_emulator())
    GTEST_SKIP() << "use of a destroyed module is undefined on a real driver";
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
  CUfunction f = Function(m, kVecAdd);
  ASSERT_NE(f, nullptr);
  ASSERT_CU(cuModuleUnload(m));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));

  VecAddJob job(64);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE,
                cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, nullptr, job.Params(), nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(job.Wrong(), 64) << "the stale function ran";
}

// A module's globals live in device memory for the module's life: unloading gives it back.
TEST_F(ModuleApi, UnloadReleasesTheModulesGlobals) {
  if (!thaw::test::on_emulator()) GTEST_SKIP() << "uses the emulator's inspection API";
  ThawEmuDeviceStats before{}, loaded{}, after{};
  ASSERT_EQ(thawEmuGetDeviceStats(0, &before), CUDA_SUCCESS);
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_globals().data));
  ASSERT_EQ(thawEmuGetDeviceStats(0, &loaded), CUDA_SUCCESS);
  EXPECT_GT(loaded.process_bytes_in_use, before.process_bytes_in_use);
  ASSERT_CU(cuModuleUnload(m));
  ASSERT_EQ(thawEmuGetDeviceStats(0, &after), CUDA_SUCCESS);
  EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use);
  EXPECT_EQ(after.legacy_allocations, before.legacy_allocations);
}

// =======================================================================================
// Globals (cuModuleGetGlobal)
// =======================================================================================

// "Returns in *dptr and *bytes the base pointer and size of the global of name name located in
// module hmod. If no variable of that name exists, cuModuleGetGlobal() returns
// CUDA_ERROR_NOT_FOUND." Globals start with their initialisers (zero when there is none).
TEST_F(ModuleApi, GetGlobalReturnsInitialisedDeviceAndConstantVariables) {
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_globals().data));

  CUdeviceptr p = 0;
  size_t bytes = 0;
  ASSERT_CU(cuModuleGetGlobal(&p, &bytes, m, "counter"));
  EXPECT_NE(p, 0u);
  EXPECT_EQ(bytes, sizeof(int));
  int counter = 0;
  ASSERT_CU(cuMemcpyDtoH(&counter, p, sizeof counter));
  EXPECT_EQ(counter, 42);

  ASSERT_CU(cuModuleGetGlobal(&p, &bytes, m, "zeros"));
  EXPECT_EQ(bytes, 16 * sizeof(float));
  std::vector<float> zeros(16, -1.0f);
  ASSERT_CU(cuMemcpyDtoH(zeros.data(), p, 16 * sizeof(float)));
  for (float z : zeros) EXPECT_EQ(z, 0.0f);

  ASSERT_CU(cuModuleGetGlobal(&p, &bytes, m, "coeffs"));
  EXPECT_EQ(bytes, 4 * sizeof(float));
  float coeffs[4] = {};
  ASSERT_CU(cuMemcpyDtoH(coeffs, p, sizeof coeffs));
  EXPECT_EQ(coeffs[0], 1.5f);
  EXPECT_EQ(coeffs[1], 2.5f);
  EXPECT_EQ(coeffs[2], 3.5f);
  EXPECT_EQ(coeffs[3], 4.5f);

  // "One of the parameters dptr or bytes (not both) can be NULL in which case it is ignored."
  bytes = 0;
  EXPECT_CU(cuModuleGetGlobal(nullptr, &bytes, m, "counter"));
  EXPECT_EQ(bytes, sizeof(int));
  p = 0;
  EXPECT_CU(cuModuleGetGlobal(&p, nullptr, m, "counter"));
  EXPECT_NE(p, 0u);

  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&p, &bytes, m, "no_such_variable"));
  // A kernel is not a variable; a variable of another module is not in this one.
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&p, &bytes, m, kAddTo));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuModuleGetGlobal(&p, &bytes, samples_, "counter"));
  EXPECT_CU(cuModuleUnload(m));
}

// "(not both)": a call that asks for neither is an invalid value; so is a NULL name.
TEST_F(ModuleApi, GetGlobalWithNeitherOutputOrNoNameIsInvalidValue) {
  CUmodule m = nullptr;
  ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_globals().data));
  CUdeviceptr p = 0;
  size_t bytes = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetGlobal(nullptr, nullptr, m, "counter"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuModuleGetGlobal(&p, &bytes, m, nullptr));
  EXPECT_CU(cuModuleUnload(m));
}

// A global is device memory: a kernel given its address updates it, and each loaded module has
// its own instance of the variable.
TEST_F(ModuleApi, KernelUpdatesAGlobalAndEachModuleHasItsOwn) {
  CUmodule m1 = nullptr, m2 = nullptr;
  ASSERT_CU(cuModuleLoadData(&m1, thaw_cubin_globals().data));
  ASSERT_CU(cuModuleLoadData(&m2, thaw_cubin_globals().data));
  CUdeviceptr c1 = 0, c2 = 0;
  ASSERT_CU(cuModuleGetGlobal(&c1, nullptr, m1, "counter"));
  ASSERT_CU(cuModuleGetGlobal(&c2, nullptr, m2, "counter"));
  EXPECT_NE(c1, c2);

  CUfunction add_to = Function(m1, kAddTo);
  ASSERT_NE(add_to, nullptr);
  int by = 3;
  void* params[] = {&c1, &by};
  ASSERT_CU(cuLaunchKernel(add_to, 2, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  int v1 = 0, v2 = 0;
  ASSERT_CU(cuMemcpyDtoH(&v1, c1, sizeof v1));
  ASSERT_CU(cuMemcpyDtoH(&v2, c2, sizeof v2));
  EXPECT_EQ(v1, 42 + 64 * 3);
  EXPECT_EQ(v2, 42);
  EXPECT_CU(cuModuleUnload(m1));
  EXPECT_CU(cuModuleUnload(m2));
}

// =======================================================================================
// Lazy loading
// =======================================================================================

// cuModuleEnumerateFunctions: "When function loading mode is set to LAZY the function retrieved
// may be partially loaded. The loading state of a function can be queried using
// cuFunctionIsLoaded. CUDA APIs may load the function automatically when called with partially
// loaded function handle [...]. Alternatively, cuFunctionLoad can be used to explicitly load a
// function." LAZY is the default (CUDA 12.2+).
TEST(ModuleApiLazy, EnumeratedFunctionsLoadOnFirstLaunchOrCuFuncLoad) {
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("CUDA_MODULE_LOADING");
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
    unsigned count = 0;
    ASSERT_CU(cuModuleGetFunctionCount(&count, m));
    std::vector<CUfunction> fs(count);
    ASSERT_CU(cuModuleEnumerateFunctions(fs.data(), count, m));
    CUfunction vec_add = nullptr, reduce = nullptr;
    for (CUfunction f : fs) {
      EXPECT_EQ(LoadingState(f), CU_FUNCTION_LOADING_STATE_UNLOADED) << FuncName(f);
      if (FuncName(f) == kVecAdd) vec_add = f;
      if (FuncName(f) == kReduce) reduce = f;
    }
    ASSERT_NE(vec_add, nullptr);
    ASSERT_NE(reduce, nullptr);

    // The first launch loads the function; the others stay as they were.
    {
      VecAddJob job(256);
      ASSERT_CU(cuLaunchKernel(vec_add, 2, 1, 1, 128, 1, 1, 0, nullptr, job.Params(), nullptr));
      ASSERT_CU(cuCtxSynchronize());
      EXPECT_EQ(job.Wrong(), 0);
    }
    EXPECT_EQ(LoadingState(vec_add), CU_FUNCTION_LOADING_STATE_LOADED);
    EXPECT_EQ(LoadingState(reduce), CU_FUNCTION_LOADING_STATE_UNLOADED);

    // cuFuncLoad: "Finalizes function loading for function. Calling this API with a fully
    // loaded function has no effect."
    ASSERT_CU(cuFuncLoad(reduce));
    EXPECT_EQ(LoadingState(reduce), CU_FUNCTION_LOADING_STATE_LOADED);
    ASSERT_CU(cuFuncLoad(reduce));
    EXPECT_EQ(LoadingState(reduce), CU_FUNCTION_LOADING_STATE_LOADED);

    CUfunctionLoadingState s{};
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncIsLoaded(nullptr, vec_add));
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncIsLoaded(&s, nullptr));
    EXPECT_CU(cuModuleUnload(m));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  });
}

// The CUDA programming guide, "Lazy Loading": "loading a module (cuModuleLoad*() family of
// functions) will not be loading kernels immediately, instead it will delay loading of a kernel
// until cuModuleGetFunction() is called." So the handle cuModuleGetFunction returns is loaded,
// while the module's other functions are not.
TEST(ModuleApiLazy, GetFunctionLoadsThatFunctionOnly) {
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("CUDA_MODULE_LOADING");
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleGetFunction(&f, m, kVecAdd));
    EXPECT_EQ(LoadingState(f), CU_FUNCTION_LOADING_STATE_LOADED);
    unsigned count = 0;
    ASSERT_CU(cuModuleGetFunctionCount(&count, m));
    std::vector<CUfunction> fs(count);
    ASSERT_CU(cuModuleEnumerateFunctions(fs.data(), count, m));
    for (CUfunction g : fs) {
      if (FuncName(g) != kVecAdd) {
        EXPECT_EQ(LoadingState(g), CU_FUNCTION_LOADING_STATE_UNLOADED) << FuncName(g);
      }
    }
    EXPECT_CU(cuModuleUnload(m));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  });
}

// With CUDA_MODULE_LOADING=EAGER every function is loaded when its module is.
TEST(ModuleApiLazy, EagerLoadingLoadsEveryFunctionAtOnce) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
    unsigned count = 0;
    ASSERT_CU(cuModuleGetFunctionCount(&count, m));
    std::vector<CUfunction> fs(count);
    ASSERT_CU(cuModuleEnumerateFunctions(fs.data(), count, m));
    for (CUfunction f : fs) {
      EXPECT_EQ(LoadingState(f), CU_FUNCTION_LOADING_STATE_LOADED) << FuncName(f);
    }
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleGetFunction(&f, m, kMatmul16));
    EXPECT_EQ(LoadingState(f), CU_FUNCTION_LOADING_STATE_LOADED);
    EXPECT_CU(cuModuleUnload(m));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  });
}

// cuFuncGetAttribute: "CUDA_ERROR_FUNCTION_NOT_LOADED is returned if the attribute requires a
// fully loaded function but the function is not loaded. [...] cuFuncLoad may be called to
// explicitly load a function before querying the following attributes that require the
// function to be loaded: MAX_THREADS_PER_BLOCK, CONST_SIZE_BYTES, MAX_DYNAMIC_SHARED_SIZE_BYTES".
// Other attributes may be queried on unloaded handles.
TEST(ModuleApiLazy, AttributesThatNeedALoadedFunctionAreFunctionNotLoadedBeforeLoading) {
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("CUDA_MODULE_LOADING");
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_chain().data));
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleEnumerateFunctions(&f, 1, m));
    ASSERT_EQ(LoadingState(f), CU_FUNCTION_LOADING_STATE_UNLOADED);
    int v = -1;
    for (CUfunction_attribute a :
         {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
          CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES}) {
      EXPECT_EQ(cuFuncGetAttribute(&v, a, f), CUDA_ERROR_FUNCTION_NOT_LOADED) << "attribute " << a;
    }
    EXPECT_CU(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
    ASSERT_CU(cuFuncLoad(f));
    EXPECT_CU(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
    EXPECT_EQ(v, 1024);
    EXPECT_CU(cuModuleUnload(m));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  });
}

// =======================================================================================
// Function attributes
// =======================================================================================

// vec_add: no __launch_bounds__, no shared or local memory, compiled by nvcc 13 for sm_90
// ("major * 10 + minor": 90 for both the PTX and the binary version).
TEST_F(ModuleApi, FuncGetAttributeDescribesVecAdd) {
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  const int regs = FuncAttribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS);
  EXPECT_GT(regs, 0) << "EIATTR_REGCOUNT not read from the cubin";
  EXPECT_LE(regs, 255);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES), 0);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), 0);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_PTX_VERSION), 90);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_BINARY_VERSION), 90);
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
            DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));

  int v = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuFuncGetAttribute(nullptr, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX, f));
}

// matmul_tiled<16> has two 16 x 16 float tiles of static shared memory: 2048 bytes. The 1 KiB
// the driver reserves per block on sm_80+ is not part of it: it is the device attribute
// CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, which NVIDIA's occupancy calculator
// (cuda_occupancy.h) adds to the function's sharedSizeBytes itself. Without an opt-in, static
// plus dynamic shared memory fit the default 48 KiB per block.
TEST_F(ModuleApi, FuncGetAttributeReportsTheMatmulsStaticSharedMemory) {
  CUfunction f = Function(samples_, kMatmul16);
  ASSERT_NE(f, nullptr);
  const int shared = FuncAttribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  EXPECT_EQ(shared, 2 * 16 * 16 * int(sizeof(float)));
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) + shared,
            DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
}

// cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES): "The sum of this value and the function
// attribute CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES cannot exceed the device attribute
// CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN."
TEST_F(ModuleApi, DynamicSharedMemoryOptInIsBoundedByTheDeviceLimit) {
  const int optin = DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  ASSERT_GT(optin, 48 * 1024);
  for (const char* name : {kReduce, kMatmul16}) {
    SCOPED_TRACE(name);
    CUfunction f = Function(samples_, name);
    ASSERT_NE(f, nullptr);
    const int shared = FuncAttribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
    EXPECT_CU_ERR(
        CUDA_ERROR_INVALID_VALUE,
        cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - shared + 1));
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                  cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, -1));
    ASSERT_CU(
        cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - shared));
    EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), optin - shared);
  }
}

// sharedMemBytes beyond the function's MAX_DYNAMIC_SHARED_SIZE_BYTES fails the launch with
// CUDA_ERROR_INVALID_VALUE; after the opt-in, a launch with the whole opt-in size runs.
TEST_F(ModuleApi, LaunchWithDynamicSharedMemoryUpToTheOptInRuns) {
  CUfunction f = Function(samples_, kReduce);
  ASSERT_NE(f, nullptr);
  constexpr int n = 512;
  constexpr unsigned kBlock = 256;
  std::vector<float> ones(n, 1.0f);
  DeviceBuffer dx(n * sizeof(float)), dsum(sizeof(float));
  ASSERT_CU(cuMemcpyHtoD(dx.ptr, ones.data(), n * sizeof(float)));
  int count = n;
  void* params[] = {&dx.ptr, &dsum.ptr, &count};
  auto run = [&](unsigned shared) {
    EXPECT_CU(cuMemsetD32(dsum.ptr, 0, 1));
    return cuLaunchKernel(f, 1, 1, 1, kBlock, 1, 1, shared, nullptr, params, nullptr);
  };
  auto sum = [&] {
    float s = -1;
    EXPECT_CU(cuMemcpyDtoH(&s, dsum.ptr, sizeof s));
    return s;
  };

  const int default_max = FuncAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  ASSERT_GT(default_max, 0);
  EXPECT_CU(run(default_max));
  EXPECT_EQ(sum(), float(n));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, run(default_max + 1));
  EXPECT_EQ(sum(), 0.0f) << "the refused launch ran";

  const int optin = DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  ASSERT_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin));
  EXPECT_CU(run(optin));
  EXPECT_EQ(sum(), float(n));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, run(optin + 1));
  EXPECT_EQ(sum(), 0.0f) << "the refused launch ran";
  EXPECT_CU(cuCtxSynchronize());
}

// "Not all attributes can have values set. Attempting to set a value on a read-only attribute
// will result in an error (CUDA_ERROR_INVALID_VALUE)." The value stays what it was.
TEST_F(ModuleApi, SettingAReadOnlyAttributeIsInvalidValue) {
  CUfunction f = Function(samples_, kMatmul16);
  ASSERT_NE(f, nullptr);
  for (CUfunction_attribute a :
       {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_NUM_REGS, CU_FUNC_ATTRIBUTE_PTX_VERSION, CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET}) {
    const int before = FuncAttribute(f, a);
    EXPECT_EQ(cuFuncSetAttribute(f, a, 7), CUDA_ERROR_INVALID_VALUE) << "attribute " << a;
    EXPECT_EQ(FuncAttribute(f, a), before) << "attribute " << a;
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX, 1));
  // A settable one, within range, is accepted: the carveout is a percentage (or -1, default).
  EXPECT_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50));
  EXPECT_EQ(FuncAttribute(f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT), 50);
}

// =======================================================================================
// Launch checks
// =======================================================================================

// Grid and block dimensions are at least 1 and within the device's limits
// (CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_* 1024/1024/64, MAX_GRID_DIM_Y/Z 65535, at most
// MAX_THREADS_PER_BLOCK 1024 threads in all): anything else is CUDA_ERROR_INVALID_VALUE and
// runs nothing.
TEST_F(ModuleApi, LaunchGeometryOutsideTheDeviceLimitsIsInvalidValue) {
  ASSERT_EQ(DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z), 64);
  ASSERT_EQ(DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  VecAddJob job(256);
  struct Geometry {
    unsigned g[3], b[3];
  };
  const Geometry bad[] = {
      {{0, 1, 1}, {64, 1, 1}},     {{1, 0, 1}, {64, 1, 1}},     {{1, 1, 0}, {64, 1, 1}},
      {{1, 1, 1}, {0, 1, 1}},      {{1, 1, 1}, {64, 0, 1}},     {{1, 1, 1}, {64, 1, 0}},
      {{1, 1, 1}, {1025, 1, 1}},   {{1, 1, 1}, {32, 33, 1}},  // 1056 threads
      {{1, 1, 1}, {1, 1, 65}},     {{1, 1, 1}, {8, 8, 32}},   // 2048 threads, z within 64
      {{1, 65536, 1}, {64, 1, 1}}, {{1, 1, 65536}, {64, 1, 1}},
  };
  for (const auto& g : bad) {
    EXPECT_EQ(cuLaunchKernel(f, g.g[0], g.g[1], g.g[2], g.b[0], g.b[1], g.b[2], 0, nullptr,
                             job.Params(), nullptr),
              CUDA_ERROR_INVALID_VALUE)
        << "grid " << g.g[0] << "x" << g.g[1] << "x" << g.g[2] << ", block " << g.b[0] << "x"
        << g.b[1] << "x" << g.b[2];
  }
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(job.Wrong(), 256) << "a refused launch ran";

  // The limits themselves are fine: 1024 threads, z = 64.
  EXPECT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 64, 0, nullptr, job.Params(), nullptr));
  EXPECT_CU(cuLaunchKernel(f, 1, 1, 1, 16, 16, 4, 0, nullptr, job.Params(), nullptr));
  EXPECT_CU(cuLaunchKernel(f, 1, 1, 1, 1024, 1, 1, 0, nullptr, job.Params(), nullptr));
  EXPECT_CU(cuCtxSynchronize());
}

// "If f has N parameters, then kernelParams needs to be an array of N pointers": a kernel with
// parameters launched with neither kernelParams nor extra is an invalid value.
TEST_F(ModuleApi, LaunchWithoutParametersForAKernelThatHasSomeIsInvalidValue) {
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr));
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 32;
  config.blockDimY = config.blockDimZ = 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&config, f, nullptr, nullptr));
  EXPECT_CU(cuCtxSynchronize());
}

CUlaunchConfig Config(unsigned grid, unsigned block, CUstream stream,
                      CUlaunchAttribute* attrs = nullptr, unsigned num_attrs = 0) {
  CUlaunchConfig c{};
  c.gridDimX = grid;
  c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = block;
  c.blockDimY = c.blockDimZ = 1;
  c.sharedMemBytes = 0;
  c.hStream = stream;
  c.attrs = attrs;
  c.numAttrs = num_attrs;
  return c;
}

// cuLaunchKernelEx takes the geometry and stream from its CUlaunchConfig, plus attributes:
// COOPERATIVE "causes the kernel launch to be a cooperative launch, with exactly the same usage
// and semantics of cuLaunchCooperativeKernel"; others (priority) are hints.
TEST_F(ModuleApi, LaunchKernelExRunsWithAndWithoutAttributes) {
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  {
    VecAddJob job(1000);
    CUlaunchConfig c = Config(job.Blocks(128), 128, s);
    ASSERT_CU(cuLaunchKernelEx(&c, f, job.Params(), nullptr));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(job.Wrong(), 0);
  }
  {
    VecAddJob job(1000);
    CUlaunchAttribute attrs[2] = {};
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[0].value.cooperative = 1;
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attrs[1].value.priority = 0;
    CUlaunchConfig c = Config(job.Blocks(128), 128, s, attrs, 2);
    ASSERT_CU(cuLaunchKernelEx(&c, f, job.Params(), nullptr));
    ASSERT_CU(cuStreamSynchronize(s));
    EXPECT_EQ(job.Wrong(), 0);
  }
  EXPECT_CU(cuStreamDestroy(s));
}

TEST_F(ModuleApi, LaunchKernelExRejectsBadConfigs) {
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  VecAddJob job(256);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(nullptr, f, job.Params(), nullptr));

  CUlaunchAttribute unknown{};
  unknown.id = static_cast<CUlaunchAttributeID>(1000);
  CUlaunchConfig c = Config(2, 128, nullptr, &unknown, 1);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&c, f, job.Params(), nullptr));

  // numAttrs entries but no array.
  c = Config(2, 128, nullptr, nullptr, 1);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&c, f, job.Params(), nullptr));

  c = Config(0, 128, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLaunchKernelEx(&c, f, job.Params(), nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(job.Wrong(), 256) << "a refused launch ran";
}

// cuLaunchCooperativeKernel: "The total number of blocks launched cannot exceed the maximum
// number of blocks per multiprocessor [...] times the number of multiprocessors"
// (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE). With 1024-thread blocks at most
// MAX_THREADS_PER_MULTIPROCESSOR / 1024 = 2 fit on each of the 132 SMs.
TEST_F(ModuleApi, CooperativeLaunchRunsSmallGridsAndRefusesOnesThatCannotBeResident) {
  ASSERT_NE(DeviceAttribute(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH), 0);
  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  const int sms = DeviceAttribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  EXPECT_EQ(sms, 132);
  const int per_sm = DeviceAttribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / 1024;
  ASSERT_GT(per_sm, 0);
  const int too_many = sms * per_sm + 1;
  {
    VecAddJob job(sms * 256);
    ASSERT_CU(cuLaunchCooperativeKernel(f, sms, 1, 1, 256, 1, 1, 0, nullptr, job.Params()));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(job.Wrong(), 0);
  }
  {
    VecAddJob job(too_many * 1024);
    EXPECT_CU_ERR(
        CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
        cuLaunchCooperativeKernel(f, too_many, 1, 1, 1024, 1, 1, 0, nullptr, job.Params()));
    CUlaunchAttribute coop{};
    coop.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    coop.value.cooperative = 1;
    CUlaunchConfig c = Config(too_many, 1024, nullptr, &coop, 1);
    EXPECT_CU_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                  cuLaunchKernelEx(&c, f, job.Params(), nullptr));
    // The same grid is an ordinary launch without the attribute.
    c.numAttrs = 0;
    c.attrs = nullptr;
    EXPECT_CU(cuLaunchKernelEx(&c, f, job.Params(), nullptr));
    EXPECT_CU(cuCtxSynchronize());
    EXPECT_EQ(job.Wrong(), 0);
  }
}

// cuGetProcAddress with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM returns the per-thread
// (_ptsz) launch entry points; with them the NULL stream is the per-thread default stream.
TEST_F(ModuleApi, PerThreadStreamLaunchEntryPointsRun) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_CU(cuGetProcAddress("cuLaunchKernel", &fn, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  ASSERT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_NE(fn, nullptr);
  if (thaw::test::on_emulator()) {
    EXPECT_EQ(fn, dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"));
  }
  auto launch = reinterpret_cast<PFN_cuLaunchKernel_v7000_ptsz>(fn);

  void* fn_ex = nullptr;
  ASSERT_CU(cuGetProcAddress("cuLaunchKernelEx", &fn_ex, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  ASSERT_NE(fn_ex, nullptr);
  if (thaw::test::on_emulator()) {
    EXPECT_EQ(fn_ex, dlsym(RTLD_DEFAULT, "cuLaunchKernelEx_ptsz"));
  }
  auto launch_ex = reinterpret_cast<PFN_cuLaunchKernelEx_v11060_ptsz>(fn_ex);

  void* fn_coop = nullptr;
  ASSERT_CU(cuGetProcAddress("cuLaunchCooperativeKernel", &fn_coop, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
  ASSERT_NE(fn_coop, nullptr);
  if (thaw::test::on_emulator()) {
    EXPECT_EQ(fn_coop, dlsym(RTLD_DEFAULT, "cuLaunchCooperativeKernel_ptsz"));
  }
  auto launch_coop = reinterpret_cast<PFN_cuLaunchCooperativeKernel_v9000_ptsz>(fn_coop);

  CUfunction f = Function(samples_, kVecAdd);
  ASSERT_NE(f, nullptr);
  VecAddJob a(3000), b(3000), c(3000);
  ASSERT_CU(launch(f, a.Blocks(256), 1, 1, 256, 1, 1, 0, nullptr, a.Params(), nullptr));
  CUlaunchConfig config = Config(b.Blocks(256), 256, nullptr);
  ASSERT_CU(launch_ex(&config, f, b.Params(), nullptr));
  ASSERT_CU(launch_coop(f, c.Blocks(256), 1, 1, 256, 1, 1, 0, nullptr, c.Params()));
  ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  EXPECT_EQ(a.Wrong(), 0);
  EXPECT_EQ(b.Wrong(), 0);
  EXPECT_EQ(c.Wrong(), 0);
}

// =======================================================================================
// Faults: a twin versus the CPU
// =======================================================================================

CUmemAllocationProp DeviceMemoryProp() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

// 2 MiB of device memory mapped at a reserved address, without cuMemSetAccess: no access.
struct MappedWithoutAccess {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  static constexpr std::size_t kSize = 2 * kMiB;
  MappedWithoutAccess() {
    const CUmemAllocationProp prop = DeviceMemoryProp();
    EXPECT_CU(cuMemCreate(&handle, kSize, &prop, 0));
    EXPECT_CU(cuMemAddressReserve(&va, kSize, 0, 0, 0));
    EXPECT_CU(cuMemMap(va, kSize, 0, handle, 0));
  }
};

// A kernel that touches memory it has no access to faults on the device, not in the process:
// the launch's stream fails with CUDA_ERROR_ILLEGAL_ADDRESS, which is sticky ("the context
// cannot be used anymore": cuCtxSynchronize and later calls return it), and the process lives.
TEST(ModuleApiFault, TwinTouchingMemoryWithoutAccessIsAStickyIllegalAddress) {
  thaw::test::run_in_fresh_process({}, [] {
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleGetFunction(&f, m, kVecAdd));
    CUstream s = nullptr;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    MappedWithoutAccess out;
    VecAddJob job(1024);
    job.SetOutput(out.va);
    const CUresult launch = cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, job.Params(), nullptr);
    // A launch is asynchronous: the fault shows at the launch or, at the latest, when the
    // stream is synchronised.
    EXPECT_TRUE(launch == CUDA_SUCCESS || launch == CUDA_ERROR_ILLEGAL_ADDRESS)
        << thaw::test::cu_error_name(launch);
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    CUdeviceptr p = 0;
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc(&p, 4096));
    EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_ADDRESS,
                  cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, job.Params(), nullptr));
    job.Abandon();
    // Still alive: the fault was the kernel's, not the process's (thaw::test::run_and_exit exits
    // 0).
  });
}

// How a process that touched memory without access ends: killed by SIGSEGV (or SIGBUS), or,
// under AddressSanitizer, by ASan's own SEGV report, which exits with a non-zero code.
bool DiedOfAFault(int status) {
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS;
#if defined(__SANITIZE_ADDRESS__)
  return WIFEXITED(status) && WEXITSTATUS(status) != 0;
#else
  return false;
#endif
}

// The twin fault handler only catches faults inside twins: the CPU touching the same memory
// still kills the process, even after twins have run (and the handler is installed).
TEST(ModuleApiFault, CpuTouchingMemoryWithoutAccessStillKillsTheProcess) {
  EXPECT_EXIT(
      {
        if (cuInit(0) != CUDA_SUCCESS) std::_Exit(2);
        CUcontext ctx = nullptr;
        if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) std::_Exit(3);
        if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) std::_Exit(4);
        CUmodule m = nullptr;
        CUfunction f = nullptr;
        if (cuModuleLoadData(&m, thaw_cubin_samples().data) != CUDA_SUCCESS) std::_Exit(5);
        if (cuModuleGetFunction(&f, m, kVecAdd) != CUDA_SUCCESS) std::_Exit(6);
        {
          VecAddJob job(256);  // a twin runs, on ordinary device memory
          if (cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, nullptr, job.Params(), nullptr) !=
                  CUDA_SUCCESS ||
              cuCtxSynchronize() != CUDA_SUCCESS || job.Wrong() != 0) {
            std::_Exit(7);
          }
        }
        MappedWithoutAccess mem;
        volatile int value = *reinterpret_cast<volatile int*>(mem.va);
        (void)value;
        std::_Exit(0);  // not reached
      },
      DiedOfAFault, "");
}

// =======================================================================================
// Libraries (CUDA 12): cuLibrary* and cuKernel*
// =======================================================================================

// cuLibraryGetKernelCount / cuLibraryEnumerateKernels ("a maximum of numKernels kernel
// handles"), cuKernelGetName ("may return a mangled name"), cuLibraryGetKernel ("If kernel
// handle is not found, the call returns CUDA_ERROR_NOT_FOUND").
TEST_F(ModuleApi, LibraryListsAndNamesItsKernels) {
  CUlibrary lib = nullptr;
  ASSERT_CU(
      cuLibraryLoadData(&lib, thaw_cubin_samples().data, nullptr, nullptr, 0, nullptr, nullptr, 0));
  unsigned count = 0;
  ASSERT_CU(cuLibraryGetKernelCount(&count, lib));
  ASSERT_EQ(count, 4u);
  std::vector<CUkernel> ks(count + 1, nullptr);
  ASSERT_CU(cuLibraryEnumerateKernels(ks.data(), count, lib));
  EXPECT_EQ(ks[count], nullptr) << "wrote past numKernels";
  std::set<std::string> names;
  for (unsigned i = 0; i < count; ++i) {
    const char* name = nullptr;
    ASSERT_CU(cuKernelGetName(&name, ks[i]));
    ASSERT_NE(name, nullptr);
    names.insert(name);
    CUkernel again = nullptr;
    ASSERT_CU(cuLibraryGetKernel(&again, lib, name));
    const char* again_name = nullptr;
    ASSERT_CU(cuKernelGetName(&again_name, again));
    EXPECT_STREQ(again_name, name);
  }
  EXPECT_EQ(names, (std::set<std::string>{kVecAdd, kMatmul16, kReduce, kNoTwin}));

  std::vector<CUkernel> one(2, nullptr);
  ASSERT_CU(cuLibraryEnumerateKernels(one.data(), 1, lib));
  EXPECT_NE(one[0], nullptr);
  EXPECT_EQ(one[1], nullptr) << "wrote past numKernels";

  CUkernel k = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&k, lib, "no_such_kernel"));
  EXPECT_CU_ERR(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&k, lib, "block_reduce_sum"));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLibraryGetKernel(nullptr, lib, kVecAdd));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLibraryGetKernel(&k, lib, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLibraryGetKernelCount(nullptr, lib));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuLibraryEnumerateKernels(nullptr, 1, lib));
  const char* name = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuKernelGetName(nullptr, ks[0]));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuKernelGetName(&name, nullptr));
  EXPECT_CU(cuLibraryUnload(lib));
}

// cuKernelGetParamInfo: the device-side parameter layout, as cuFuncGetParamInfo gives it.
TEST_F(ModuleApi, KernelGetParamInfoMatchesTheSignature) {
  CUlibrary lib = nullptr;
  ASSERT_CU(
      cuLibraryLoadData(&lib, thaw_cubin_chain().data, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&k, lib, kAxpb));
  // axpb(float* x, float a, float b, int n)
  const std::pair<size_t, size_t> want[] = {{0, 8}, {8, 4}, {12, 4}, {16, 4}};
  for (size_t i = 0; i < std::size(want); ++i) {
    size_t offset = ~size_t{0}, size = ~size_t{0};
    ASSERT_CU(cuKernelGetParamInfo(k, i, &offset, &size));
    EXPECT_EQ(offset, want[i].first) << "parameter " << i;
    EXPECT_EQ(size, want[i].second) << "parameter " << i;
    offset = ~size_t{0};
    ASSERT_CU(cuKernelGetParamInfo(k, i, &offset, nullptr));  // "paramSize can be set to NULL"
    EXPECT_EQ(offset, want[i].first) << "parameter " << i;
  }
  size_t offset = 0, size = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuKernelGetParamInfo(k, 4, &offset, &size));
  EXPECT_CU(cuLibraryUnload(lib));
}

// "Note that the API can also be used to launch context-less kernel CUkernel by querying the
// handle using cuLibraryGetKernel() and then passing it to the API by casting to CUfunction."
TEST_F(ModuleApi, LibraryFromFileLaunchesAKernelCastToCUfunction) {
  CUlibrary lib = nullptr;
  ASSERT_CU(cuLibraryLoadFromFile(&lib, KernelFile(THAW_CUBIN_PATH_samples).c_str(), nullptr,
                                  nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&k, lib, kVecAdd));
  VecAddJob job(2000);
  ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(k), job.Blocks(256), 1, 1, 256, 1, 1, 0,
                           nullptr, job.Params(), nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(job.Wrong(), 0);

  VecAddJob job2(2000);
  CUlaunchConfig c = Config(job2.Blocks(256), 256, nullptr);
  ASSERT_CU(cuLaunchKernelEx(&c, reinterpret_cast<CUfunction>(k), job2.Params(), nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(job2.Wrong(), 0);
  EXPECT_CU(cuLibraryUnload(lib));

  CUlibrary missing = nullptr;
  EXPECT_NE(cuLibraryLoadFromFile(&missing, "/nonexistent/thaw/library.cubin", nullptr, nullptr, 0,
                                  nullptr, nullptr, 0),
            CUDA_SUCCESS);
}

// cuKernelGetFunction: "the handle of the function for the requested kernel kernel and the
// current context" — one CUfunction per context, each in that context's module of the library
// (cuLibraryGetModule: "the module handle associated with the current context").
TEST_F(ModuleApi, KernelGetFunctionGivesOneFunctionPerContext) {
  CUlibrary lib = nullptr;
  ASSERT_CU(
      cuLibraryLoadData(&lib, thaw_cubin_samples().data, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&k, lib, kVecAdd));

  CUfunction fa = nullptr, fb = nullptr;
  CUmodule ma = nullptr, mb = nullptr, owner = nullptr;
  ASSERT_CU(cuKernelGetFunction(&fa, k));
  ASSERT_CU(cuLibraryGetModule(&ma, lib));
  ASSERT_CU(cuFuncGetModule(&owner, fa));
  EXPECT_EQ(owner, ma);
  EXPECT_EQ(FuncName(fa), kVecAdd);

  CUcontext other = nullptr;
  ASSERT_CU(cuCtxCreate(&other, nullptr, 0, dev_));  // made current
  ASSERT_CU(cuKernelGetFunction(&fb, k));
  ASSERT_CU(cuLibraryGetModule(&mb, lib));
  ASSERT_CU(cuFuncGetModule(&owner, fb));
  EXPECT_EQ(owner, mb);
  EXPECT_NE(fa, fb);
  EXPECT_NE(ma, mb);
  EXPECT_EQ(FuncName(fb), kVecAdd);
  {
    // The function of the other context runs there.
    VecAddJob job(500);
    ASSERT_CU(
        cuLaunchKernel(fb, job.Blocks(128), 1, 1, 128, 1, 1, 0, nullptr, job.Params(), nullptr));
    ASSERT_CU(cuCtxSynchronize());
    EXPECT_EQ(job.Wrong(), 0);
  }
  // The module of a library is the library's to unload: "Attempting to unload a module which
  // was obtained from the Library Management API such as cuLibraryGetModule will return
  // CUDA_ERROR_NOT_PERMITTED."
  EXPECT_CU_ERR(CUDA_ERROR_NOT_PERMITTED, cuModuleUnload(mb));
  EXPECT_CU(cuCtxDestroy(other));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  EXPECT_CU(cuLibraryUnload(lib));
}

// After cuLibraryUnload, "The returned kernel handle becomes invalid": cuKernelGetFunction and a
// launch of the kernel report CUDA_ERROR_INVALID_HANDLE (both document it; the emulator's
// handles are ids, so the stale handle is safe to pass).
TEST_F(ModuleApi, KernelOfAnUnloadedLibraryIsInvalidHandle) {
  if (!thaw::test::on_emulator())
    GTEST_SKIP() << "use of an unloaded library's kernel is undefined on a real driver";
  CUlibrary lib = nullptr;
  ASSERT_CU(
      cuLibraryLoadData(&lib, thaw_cubin_samples().data, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel k = nullptr;
  ASSERT_CU(cuLibraryGetKernel(&k, lib, kVecAdd));
  CUfunction f = nullptr;
  ASSERT_CU(cuKernelGetFunction(&f, k));
  ASSERT_CU(cuLibraryUnload(lib));

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE, cuKernelGetFunction(&f, k));
  VecAddJob job(64);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE,
                cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, 64, 1, 1, 0, nullptr,
                               job.Params(), nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_HANDLE,
                cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, nullptr, job.Params(), nullptr));
  EXPECT_CU(cuCtxSynchronize());
  EXPECT_EQ(job.Wrong(), 64) << "a stale kernel ran";
}

// Libraries are context-independent: one loaded before any context exists (cuInit only) works
// once a context is current ("loaded when a function is needed for that context, such as a
// kernel launch").
TEST(ModuleApiLibrary, LibraryLoadedBeforeAnyContextWorksOnceOneIsCurrent) {
  thaw::test::run_in_fresh_process({}, [] {
    ASSERT_CU(cuInit(0));
    CUcontext current = reinterpret_cast<CUcontext>(0x1);
    ASSERT_CU(cuCtxGetCurrent(&current));
    ASSERT_EQ(current, nullptr);
    CUlibrary lib = nullptr;
    ASSERT_CU(cuLibraryLoadData(&lib, thaw_cubin_samples().data, nullptr, nullptr, 0, nullptr,
                                nullptr, 0));
    CUkernel k = nullptr;
    ASSERT_CU(cuLibraryGetKernel(&k, lib, kVecAdd));
    const char* name = nullptr;
    ASSERT_CU(cuKernelGetName(&name, k));
    EXPECT_STREQ(name, kVecAdd);

    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    {
      VecAddJob job(777);
      ASSERT_CU(cuLaunchKernel(reinterpret_cast<CUfunction>(k), job.Blocks(128), 1, 1, 128, 1, 1, 0,
                               nullptr, job.Params(), nullptr));
      ASSERT_CU(cuCtxSynchronize());
      EXPECT_EQ(job.Wrong(), 0);
      CUfunction f = nullptr;
      ASSERT_CU(cuKernelGetFunction(&f, k));
      EXPECT_EQ(FuncName(f), kVecAdd);
    }
    EXPECT_CU(cuLibraryUnload(lib));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  });
}

// =======================================================================================
// THAW_EMU_TRACE: the launch line
// =======================================================================================

// A trace value that is a number: written as a JSON number or as a decimal / 0x-hex string.
long long AsInt(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_string()) return std::stoll(v.get<std::string>(), nullptr, 0);
  ADD_FAILURE() << "not a number: " << v.dump();
  return -1;
}

// Each launch is one trace line whose args name the kernel (its mangled name, "kernel") and its
// geometry (grid_x..z, block_x..z, shared); a _ptsz launch is traced under the base name.
TEST(ModuleApiTrace, LaunchLinesNameTheKernelAndItsGeometry) {
  if (!thaw::test::on_emulator()) GTEST_SKIP() << "THAW_EMU_TRACE is the emulator's";
  thaw::test::run_in_fresh_process({}, [] {
    const std::string path =
        testing::TempDir() + "module_api_trace_" + std::to_string(getpid()) + ".jsonl";
    std::remove(path.c_str());
    setenv("THAW_EMU_TRACE", path.c_str(), 1);
    ASSERT_CU(cuInit(0));
    CUcontext ctx = nullptr;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx));
    CUmodule m = nullptr;
    ASSERT_CU(cuModuleLoadData(&m, thaw_cubin_samples().data));
    CUfunction vec_add = nullptr, matmul = nullptr;
    ASSERT_CU(cuModuleGetFunction(&vec_add, m, kVecAdd));
    ASSERT_CU(cuModuleGetFunction(&matmul, m, kMatmul16));
    {
      VecAddJob job(3 * 128);
      ASSERT_CU(cuLaunchKernel(vec_add, 3, 1, 1, 128, 1, 1, 0, nullptr, job.Params(), nullptr));
      // matmul on 16 x 16 tiles, n = 32: a 2 x 2 grid of 16 x 16 blocks.
      DeviceBuffer da(32 * 32 * 4), db(32 * 32 * 4), dc(32 * 32 * 4);
      ASSERT_CU(cuMemsetD32(da.ptr, 0, 32 * 32));
      ASSERT_CU(cuMemsetD32(db.ptr, 0, 32 * 32));
      int n = 32;
      void* params[] = {&da.ptr, &db.ptr, &dc.ptr, &n};
      void* fn = nullptr;
      ASSERT_CU(cuGetProcAddress("cuLaunchKernel", &fn, 13000,
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
      ASSERT_CU(reinterpret_cast<PFN_cuLaunchKernel_v7000_ptsz>(fn)(matmul, 2, 2, 1, 16, 16, 1, 128,
                                                                    nullptr, params, nullptr));
      ASSERT_CU(cuCtxSynchronize());
      ASSERT_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    }
    EXPECT_CU(cuModuleUnload(m));
    EXPECT_CU(cuDevicePrimaryCtxRelease(0));

    std::vector<nlohmann::json> launches;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
      EXPECT_EQ(j.value("call", "").find("_ptsz"), std::string::npos) << line;
      if (j.value("call", "") == "cuLaunchKernel") launches.push_back(j);
    }
    std::remove(path.c_str());
    ASSERT_EQ(launches.size(), 2u);
    struct Want {
      const char* kernel;
      int grid[3], block[3], shared;
    };
    const Want want[] = {{kVecAdd, {3, 1, 1}, {128, 1, 1}, 0},
                         {kMatmul16, {2, 2, 1}, {16, 16, 1}, 128}};
    const char* keys[] = {"grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"};
    for (int i = 0; i < 2; ++i) {
      const auto& l = launches[i];
      SCOPED_TRACE(l.dump());
      EXPECT_EQ(l.value("result", ""), "CUDA_SUCCESS");
      ASSERT_TRUE(l.contains("args") && l["args"].is_object());
      const auto& args = l["args"];
      EXPECT_EQ(args.value("kernel", ""), want[i].kernel);
      for (int d = 0; d < 6; ++d) {
        const int expected = d < 3 ? want[i].grid[d] : want[i].block[d - 3];
        ASSERT_TRUE(args.contains(keys[d])) << keys[d];
        EXPECT_EQ(AsInt(args[keys[d]]), expected) << keys[d];
      }
      ASSERT_TRUE(args.contains("shared"));
      EXPECT_EQ(AsInt(args["shared"]), want[i].shared);
    }
  });
}

}  // namespace
