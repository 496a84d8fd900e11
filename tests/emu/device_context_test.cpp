// Initialisation, devices and contexts of the emulated CUDA driver.
//
// The rules come from the doxygen comments of CUDA 13's cuda.h (quoted where a rule is
// subtle) and from the emulator's design where the documentation is silent. Tests that
// need a particular THAW_EMU_* configuration, or an uninitialised driver, run their body
// in a fresh process (thaw::test::run_in_fresh_process), so the suite also passes when run as one
// process.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

constexpr unsigned long long kMiB = 1ull << 20;
constexpr unsigned long long kGiB = 1ull << 30;

// Optional entry points (not every one is in the emulator's scope): resolved at run time
// so the suite builds either way; a test that needs a missing one is skipped.
template <class Fn>
Fn Optional(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// The emulator's counters; zeros on a real driver, where every check that reads them is left
// out (THAW_EMU_CHECK).
ThawEmuDeviceStats DeviceStats(int device = 0) {
  ThawEmuDeviceStats s{};
  if (!thaw::test::on_emulator()) return s;
  EXPECT_EQ(thawEmuGetDeviceStats(device, &s), CUDA_SUCCESS);
  return s;
}

ThawEmuProcessStats ProcessStats() {
  ThawEmuProcessStats s{};
  if (!thaw::test::on_emulator()) return s;
  EXPECT_EQ(thawEmuGetProcessStats(&s), CUDA_SUCCESS);
  return s;
}

CUcontext Current() {
  CUcontext c = reinterpret_cast<CUcontext>(0x1);
  EXPECT_EQ(cuCtxGetCurrent(&c), CUDA_SUCCESS);
  return c;
}

// The device the emulator models (its default name). On a real driver the checks of the model's
// exact figures run only on that device; anywhere else a difference is no disagreement.
constexpr const char* kModelledDevice = "NVIDIA H100 80GB HBM3";
#define SKIP_UNLESS_MODELLED_DEVICE(dev)                                                       \
  do {                                                                                         \
    char name_[256] = {};                                                                      \
    ASSERT_EQ(cuDeviceGetName(name_, sizeof name_, dev), CUDA_SUCCESS);                        \
    if (!thaw::test::on_emulator() && std::string(name_) != kModelledDevice) {                 \
      GTEST_SKIP() << "the emulator models an " << kModelledDevice << "; this is a " << name_; \
    }                                                                                          \
  } while (0)

int Attribute(CUdevice_attribute attr, CUdevice dev = 0) {
  int v = -12345;
  EXPECT_EQ(cuDeviceGetAttribute(&v, attr, dev), CUDA_SUCCESS) << "attribute " << attr;
  return v;
}

// Tests that run in this process with the default configuration.
class DeviceContextTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGet(&dev_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGetCount(&count_), CUDA_SUCCESS);
    thaw::test::clear_context_stack();
  }
  void TearDown() override { thaw::test::clear_context_stack(); }

  CUdevice dev_ = -1;
  int count_ = 0;
};

// ---------------------------------------------------------------------------------------
// Initialisation
// ---------------------------------------------------------------------------------------

// cuInit: "If cuInit() has not been called, any function from the driver API will return
// CUDA_ERROR_NOT_INITIALIZED."
TEST(DriverInit, DriverCallsBeforeCuInitReturnNotInitialized) {
  thaw::test::run_in_fresh_process({}, [] {
    int i = 0;
    size_t s = 0, t = 0;
    char name[64];
    CUdevice dev = 0;
    CUuuid uuid;
    CUcontext ctx = nullptr;
    CUdeviceptr dptr = 0;
    void* host = nullptr;
    unsigned int flags = 0;
    EXPECT_EQ(cuDeviceGetCount(&i), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDeviceGetName(name, sizeof name, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDeviceGetUuid(&uuid, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDeviceTotalMem(&s, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDeviceGetAttribute(&i, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
              CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &i), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDevicePrimaryCtxSetFlags(0, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuDevicePrimaryCtxReset(0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxPopCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuMemAlloc(&dptr, 4096), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuMemGetInfo(&s, &t), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuMemAllocHost(&host, 4096), CUDA_ERROR_NOT_INITIALIZED);
    size_t gran = 0;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    EXPECT_EQ(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_NOT_INITIALIZED);
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(cuMemCreate(&handle, 2 * kMiB, &prop, 0), CUDA_ERROR_NOT_INITIALIZED);
    // The inspection entry points follow the same rule (emu_inspect.h).
    ThawEmuDeviceStats ds{};
    ThawEmuProcessStats ps{};
    THAW_EMU_CHECK(EXPECT_EQ(thawEmuGetDeviceStats(0, &ds), CUDA_ERROR_NOT_INITIALIZED));
    THAW_EMU_CHECK(EXPECT_EQ(thawEmuGetProcessStats(&ps), CUDA_ERROR_NOT_INITIALIZED));
  });
}

// The calls a program (or the CUDA runtime) makes before cuInit: the version, error
// strings, and cuGetProcAddress (the runtime resolves cuInit itself through it).
TEST(DriverInit, VersionErrorStringsAndEntryPointsWorkBeforeCuInit) {
  thaw::test::run_in_fresh_process({}, [] {
    int version = 0;
    EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
    EXPECT_GE(version, 13000);
    const char* text = nullptr;
    EXPECT_EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
    ASSERT_NE(text, nullptr);
    EXPECT_STREQ(text, "CUDA_ERROR_OUT_OF_MEMORY");
    text = nullptr;
    EXPECT_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &text), CUDA_SUCCESS);
    ASSERT_NE(text, nullptr);
    EXPECT_GT(std::strlen(text), 0u);

    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    ASSERT_EQ(cuGetProcAddress("cuInit", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status),
              CUDA_SUCCESS);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    ASSERT_EQ(fn, dlsym(RTLD_DEFAULT, "cuInit"));
    EXPECT_EQ(reinterpret_cast<PFN_cuInit_v2000>(fn)(0), CUDA_SUCCESS);
    int count = 0;
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_GE(count, 1);
  });
}

// cuInit: "Currently, the Flags parameter must be 0." A rejected cuInit initialises
// nothing (the documentation names no partial state; a driver that returned an error from
// cuInit is not usable).
TEST(DriverInit, NonZeroFlagsAreInvalidValueAndInitialiseNothing) {
  thaw::test::run_in_fresh_process({}, [] {
    EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuInit(0x80000000u), CUDA_ERROR_INVALID_VALUE);
    int count = -1;
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_EQ(count, 1);
  });
}

TEST_F(DeviceContextTest, RepeatedCuInitSucceeds) {
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
}

// A machine without a GPU: the real driver's cuInit answers CUDA_ERROR_NO_DEVICE there.
TEST(DriverInit, ZeroDevicesMakesCuInitReportNoDevice) {
  THAW_SKIP_UNLESS_EMULATOR("configures no device with THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "0", 1);
    EXPECT_EQ(cuInit(0), CUDA_ERROR_NO_DEVICE);
  });
}

// A configuration the emulator cannot honour must not be silently replaced by defaults:
// cuInit fails and stderr names the variable.
TEST(DriverInit, MalformedDeviceConfigurationFailsCuInitNamingTheVariable) {
  THAW_SKIP_UNLESS_EMULATOR("THAW_EMU_* settings");
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_DEVICES", "two", 1);
        std::_Exit(cuInit(0) == CUDA_SUCCESS ? 1 : 0);
      },
      testing::ExitedWithCode(0), "THAW_EMU_DEVICES");
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_DEVICE_MEMORY", "lots", 1);
        std::_Exit(cuInit(0) == CUDA_SUCCESS ? 1 : 0);
      },
      testing::ExitedWithCode(0), "THAW_EMU_DEVICE_MEMORY");
}

// ---------------------------------------------------------------------------------------
// Driver version
// ---------------------------------------------------------------------------------------

// cuDriverGetVersion: "(1000 * major + 10 * minor)"; the emulator implements CUDA 13's
// cuda.h, so it reports at least 13000 (and at least the header's CUDA_VERSION).
TEST_F(DeviceContextTest, DriverVersionIsCuda13OrNewer) {
  int version = 0;
  ASSERT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_GE(version, 13000);
  EXPECT_GE(version, CUDA_VERSION);
  EXPECT_EQ(version % 10, 0);
}

// cuDriverGetVersion: "automatically returns CUDA_ERROR_INVALID_VALUE if driverVersion is
// NULL."
TEST_F(DeviceContextTest, DriverVersionNullIsInvalidValue) {
  EXPECT_EQ(cuDriverGetVersion(nullptr), CUDA_ERROR_INVALID_VALUE);
}

// ---------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------

TEST(Devices, CountDefaultsToOne) {
  THAW_SKIP_UNLESS_EMULATOR("THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("THAW_EMU_DEVICES");
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_EQ(count, 1);
  });
}

// cuDeviceGet: "an ordinal in the range [0, cuDeviceGetCount()-1]"; others are
// CUDA_ERROR_INVALID_DEVICE.
TEST(Devices, CountAndOrdinalsFollowThawEmuDevices) {
  THAW_SKIP_UNLESS_EMULATOR("THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "3", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_EQ(count, 3);
    for (int i = 0; i < 3; ++i) {
      CUdevice dev = -1;
      EXPECT_EQ(cuDeviceGet(&dev, i), CUDA_SUCCESS);
      EXPECT_EQ(dev, i);
    }
    CUdevice dev = -1;
    EXPECT_EQ(cuDeviceGet(&dev, 3), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    size_t bytes = 0;
    EXPECT_EQ(cuDeviceTotalMem(&bytes, 3), CUDA_ERROR_INVALID_DEVICE);
  });
}

TEST_F(DeviceContextTest, NullOutputPointersAreInvalidValue) {
  EXPECT_EQ(cuDeviceGetCount(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGet(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetName(nullptr, 64, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetUuid(nullptr, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceTotalMem(nullptr, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev_),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(DeviceContextTest, InvalidDeviceHandlesAreInvalidDevice) {
  for (CUdevice bad : {count_, count_ + 7, -1}) {
    char name[64];
    CUuuid uuid;
    size_t bytes = 0;
    int v = 0;
    CUcontext ctx = nullptr;
    unsigned int flags = 0;
    EXPECT_EQ(cuDeviceGetName(name, sizeof name, bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDeviceGetUuid(&uuid, bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDeviceTotalMem(&bytes, bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, bad),
              CUDA_ERROR_INVALID_DEVICE)
        << bad;
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDevicePrimaryCtxRelease(bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDevicePrimaryCtxGetState(bad, &flags, &v), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDevicePrimaryCtxSetFlags(bad, 0), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuDevicePrimaryCtxReset(bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0, bad), CUDA_ERROR_INVALID_DEVICE) << bad;
    EXPECT_EQ(Current(), nullptr) << "a failed cuCtxCreate pushed something";
  }
}

TEST(Devices, MemoryDefaultsTo80GiB) {
  THAW_SKIP_UNLESS_EMULATOR("the emulated device size");
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("THAW_EMU_DEVICE_MEMORY");
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    size_t bytes = 0;
    ASSERT_EQ(cuDeviceTotalMem(&bytes, 0), CUDA_SUCCESS);
    EXPECT_EQ(bytes, 80 * kGiB);
  });
}

TEST(Devices, OneMemorySizeAppliesToEveryDevice) {
  THAW_SKIP_UNLESS_EMULATOR("THAW_EMU_DEVICE_MEMORY");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "2", 1);
    setenv("THAW_EMU_DEVICE_MEMORY", "512M", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    for (CUdevice dev : {0, 1}) {
      size_t bytes = 0;
      ASSERT_EQ(cuDeviceTotalMem(&bytes, dev), CUDA_SUCCESS);
      EXPECT_EQ(bytes, 512 * kMiB) << "device " << dev;
    }
  });
}

// cuMemGetInfo's total is the current context's device memory: the same figure as
// cuDeviceTotalMem, per device.
TEST(Devices, MemorySizesPerDeviceFromACommaList) {
  THAW_SKIP_UNLESS_EMULATOR("THAW_EMU_DEVICE_MEMORY");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "2", 1);
    setenv("THAW_EMU_DEVICE_MEMORY", "1G,2G", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    const size_t expected[] = {1 * kGiB, 2 * kGiB};
    for (CUdevice dev : {0, 1}) {
      size_t bytes = 0;
      ASSERT_EQ(cuDeviceTotalMem(&bytes, dev), CUDA_SUCCESS);
      EXPECT_EQ(bytes, expected[dev]);
      CUcontext ctx = nullptr;
      ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev), CUDA_SUCCESS);
      size_t free = 0, total = 0;
      ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
      EXPECT_EQ(total, expected[dev]);
      EXPECT_LE(free, total);
      EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
    }
  });
}

TEST_F(DeviceContextTest, NameIsAnH100AndNulTerminated) {
  SKIP_UNLESS_MODELLED_DEVICE(dev_);
  char name[256];
  std::memset(name, 'x', sizeof name);
  ASSERT_EQ(cuDeviceGetName(name, sizeof name, dev_), CUDA_SUCCESS);
  ASSERT_NE(std::memchr(name, '\0', sizeof name), nullptr);
  EXPECT_GT(std::strlen(name), 0u);
  EXPECT_NE(std::string(name).find("H100"), std::string::npos) << name;
}

// cuDeviceGetName: "name is shortened to the specified len, if len is less than the
// device name" (and stays NUL-terminated: it is a "NULL-terminated string").
TEST_F(DeviceContextTest, NameIsShortenedToLen) {
  char full[256];
  ASSERT_EQ(cuDeviceGetName(full, sizeof full, dev_), CUDA_SUCCESS);
  ASSERT_GT(std::strlen(full), 6u);
  char buf[16];
  std::memset(buf, 'x', sizeof buf);
  ASSERT_EQ(cuDeviceGetName(buf, 7, dev_), CUDA_SUCCESS);
  EXPECT_EQ(buf[7], 'x') << "wrote past len";
  ASSERT_NE(std::memchr(buf, '\0', 7), nullptr) << "not NUL-terminated within len";
  EXPECT_EQ(std::string(full).rfind(buf, 0), 0u) << buf << " is not a prefix of " << full;
}

TEST(Devices, UuidsAreDistinctNonZeroAndStable) {
  THAW_SKIP_UNLESS_EMULATOR("makes four devices with THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "4", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    std::set<std::string> seen;
    const CUuuid zero{};
    auto legacy = Optional<PFN_cuDeviceGetUuid_v9020>("cuDeviceGetUuid");
    for (CUdevice dev = 0; dev < 4; ++dev) {
      CUuuid a{}, b{};
      ASSERT_EQ(cuDeviceGetUuid(&a, dev), CUDA_SUCCESS);
      ASSERT_EQ(cuDeviceGetUuid(&b, dev), CUDA_SUCCESS);
      EXPECT_EQ(std::memcmp(a.bytes, b.bytes, sizeof a.bytes), 0) << "UUID changed";
      EXPECT_NE(std::memcmp(a.bytes, zero.bytes, sizeof a.bytes), 0) << "all-zero UUID";
      seen.insert(std::string(a.bytes, sizeof a.bytes));
      if (legacy != nullptr) {  // the pre-11.4 entry point: same UUID outside MIG mode
        CUuuid c{};
        ASSERT_EQ(legacy(&c, dev), CUDA_SUCCESS);
        EXPECT_EQ(std::memcmp(a.bytes, c.bytes, sizeof a.bytes), 0);
      }
    }
    EXPECT_EQ(seen.size(), 4u);
  });
}

// The Hopper (H100 SXM) values programs and libraries actually branch on.
TEST_F(DeviceContextTest, AttributesDescribeAnH100) {
  SKIP_UNLESS_MODELLED_DEVICE(dev_);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 9);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), 0);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 132);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), 1024);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y), 1024);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z), 64);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), 2147483647);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y), 65535);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z), 65535);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), 2048);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK), 48 * 1024);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK), 65536);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), 1);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED), 1);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING), 1);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY), 1);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_INTEGRATED), 0);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE), CU_COMPUTEMODE_DEFAULT);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS), 1);
  EXPECT_EQ(Attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED), 1);
  // The timing model overlaps an H2D and a D2H copy: at least two copy engines.
  EXPECT_GE(Attribute(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT), 2);
}

// Relations any real device satisfies, whatever the exact figures.
TEST_F(DeviceContextTest, AttributesAreMutuallyConsistent) {
  const int per_block = Attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  EXPECT_LE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), per_block);
  EXPECT_LE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y), per_block);
  EXPECT_LE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z), per_block);
  EXPECT_GE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), per_block);
  EXPECT_EQ(per_block % Attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 0);
  const int smem_block = Attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  const int smem_optin = Attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  EXPECT_GE(smem_optin, smem_block);
  EXPECT_GE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR), smem_optin);
  EXPECT_GE(Attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
            Attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK));
  EXPECT_GT(Attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE), 0);
  EXPECT_GT(Attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE), 0);
  EXPECT_GT(Attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE), 0);
  EXPECT_GT(Attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH), 0);
  EXPECT_GT(Attribute(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY), 0);
}

// A program may query any attribute its cuda.h defines (PyTorch and vLLM query dozens);
// the driver for that header answers every one of them.
TEST_F(DeviceContextTest, EveryAttributeOfTheHeaderIsAnswered) {
  for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int v = -12345;
    EXPECT_EQ(cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), dev_), CUDA_SUCCESS)
        << "attribute " << a;
  }
}

// Values that are not attributes (kept inside the enum's value range, 0..255, since a C++
// caller cannot form others without undefined behaviour).
TEST_F(DeviceContextTest, UnknownAttributesAreInvalidValue) {
  for (int a : {0, static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX), 200, 255}) {
    int v = 0;
    EXPECT_EQ(cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), dev_),
              CUDA_ERROR_INVALID_VALUE)
        << "attribute " << a;
  }
}

// cuCtxGetStreamPriorityRange "will return '0' in both ... if the current context's
// device does not support stream priorities"; lower numbers are greater priorities.
TEST_F(DeviceContextTest, StreamPriorityRangeMatchesTheAttribute) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  int least = 12345, greatest = 12345;
  ASSERT_EQ(cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);
  EXPECT_EQ(least, 0);
  if (Attribute(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED) == 1) {
    EXPECT_LT(greatest, least);
  } else {
    EXPECT_EQ(greatest, 0);
  }
  // "A NULL may be passed in for *leastPriority or *greatestPriority".
  int only = 12345;
  EXPECT_EQ(cuCtxGetStreamPriorityRange(nullptr, &only), CUDA_SUCCESS);
  EXPECT_EQ(only, greatest);
  EXPECT_EQ(cuCtxGetStreamPriorityRange(&only, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(only, least);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// Primary context
// ---------------------------------------------------------------------------------------

// cuDevicePrimaryCtxRetain: "Unlike cuCtxCreate() the newly retained context is not pushed
// onto the stack." The primary context is "unique per device".
TEST_F(DeviceContextTest, PrimaryRetainReturnsOneHandleAndPushesNothing) {
  CUcontext a = nullptr, b = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&a, dev_), CUDA_SUCCESS);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(Current(), nullptr);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&b, dev_), CUDA_SUCCESS);
  EXPECT_EQ(a, b);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(nullptr, dev_), CUDA_ERROR_INVALID_VALUE);
}

// The primary context is active from the first retain until the last release.
TEST_F(DeviceContextTest, PrimaryStateIsActiveWhileRetained) {
  unsigned int flags = 0;
  int active = -1;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  const auto contexts = ProcessStats().contexts;

  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().contexts, contexts + 1));

  ASSERT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1) << "one reference is still held";

  ASSERT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().contexts, contexts));
}

TEST_F(DeviceContextTest, PrimaryGetStateNullOutputsAreInvalidValue) {
  unsigned int flags = 0;
  int active = 0;
  EXPECT_EQ(cuDevicePrimaryCtxGetState(dev_, nullptr, &active), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// cuDevicePrimaryCtxRelease: "Releasing a primary context that has not been previously
// retained will fail with CUDA_ERROR_INVALID_CONTEXT."
TEST_F(DeviceContextTest, PrimaryReleaseWithoutRetainIsInvalidContext) {
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_ERROR_INVALID_CONTEXT);
}

// cuDevicePrimaryCtxRelease: "The context is automatically reset once the last reference
// to it is released": the allocations made in it are freed.
TEST_F(DeviceContextTest, PrimaryReleaseToZeroFreesItsAllocations) {
  const auto before = DeviceStats(dev_);
  const auto pinned_before = ProcessStats().pinned_host_ranges;
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr a = 0, b = 0;
  void* host = nullptr;
  ASSERT_EQ(cuMemAlloc(&a, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&b, 6 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocHost(&host, 64 * 1024), CUDA_SUCCESS);
  const auto during = DeviceStats(dev_);
  THAW_EMU_CHECK(EXPECT_EQ(during.legacy_allocations, before.legacy_allocations + 2));
  THAW_EMU_CHECK(EXPECT_GE(during.process_bytes_in_use, before.process_bytes_in_use + 10 * kMiB));
  THAW_EMU_CHECK(EXPECT_GE(during.device_bytes_in_use, before.device_bytes_in_use + 10 * kMiB));
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().pinned_host_ranges, pinned_before + 1));

  ASSERT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  const auto after = DeviceStats(dev_);
  THAW_EMU_CHECK(EXPECT_EQ(after.legacy_allocations, before.legacy_allocations));
  THAW_EMU_CHECK(EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().pinned_host_ranges, pinned_before));
}

// cuDevicePrimaryCtxReset: "Destroy all allocations and reset all state on the primary
// context" ... "Resetting the primary context does not release it ... it is safe for
// other modules to call cuDevicePrimaryCtxRelease() even after resetting the device."
TEST_F(DeviceContextTest, PrimaryResetFreesAllocationsButKeepsTheRetain) {
  const auto before = DeviceStats(dev_);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc(&p, 8 * kMiB), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats(dev_).legacy_allocations, before.legacy_allocations + 1));

  ASSERT_EQ(cuDevicePrimaryCtxReset(dev_), CUDA_SUCCESS);
  const auto after = DeviceStats(dev_);
  THAW_EMU_CHECK(EXPECT_EQ(after.legacy_allocations, before.legacy_allocations));
  THAW_EMU_CHECK(EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use));

  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS) << "the reset dropped the retain";
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_ERROR_INVALID_CONTEXT);
}

// cuDevicePrimaryCtxSetFlags "overwrit[es] previously set ones"; cuDevicePrimaryCtxGetState
// returns them; "Only one of the scheduling flags can be set".
TEST_F(DeviceContextTest, PrimarySetFlagsIsReportedByGetState) {
  ASSERT_EQ(cuDevicePrimaryCtxSetFlags(dev_, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
  unsigned int flags = 0;
  int active = 0;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags & CU_CTX_SCHED_MASK, CU_CTX_SCHED_BLOCKING_SYNC);

  // Allowed while the context is active too (since CUDA 11), and seen by cuCtxGetFlags.
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxSetFlags(dev_, CU_CTX_SCHED_YIELD), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags & CU_CTX_SCHED_MASK, CU_CTX_SCHED_YIELD);
  EXPECT_EQ(active, 1);
  if (auto get_flags = Optional<PFN_cuCtxGetFlags_v7000>("cuCtxGetFlags")) {
    ASSERT_EQ(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
    unsigned int ctx_flags = 0;
    EXPECT_EQ(get_flags(&ctx_flags), CUDA_SUCCESS);
    EXPECT_EQ(ctx_flags & CU_CTX_SCHED_MASK, CU_CTX_SCHED_YIELD);
    ASSERT_EQ(cuCtxPopCurrent(&ctx), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(dev_, 0), CUDA_SUCCESS);
}

TEST_F(DeviceContextTest, PrimarySetFlagsRejectsInvalidFlags) {
  ASSERT_EQ(cuDevicePrimaryCtxSetFlags(dev_, CU_CTX_SCHED_SPIN), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(dev_, 0x100), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(dev_, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD),
            CUDA_ERROR_INVALID_VALUE);
  unsigned int flags = 0;
  int active = 0;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(dev_, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags & CU_CTX_SCHED_MASK, CU_CTX_SCHED_SPIN) << "a rejected call changed the flags";
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(dev_, 0), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// cuCtxCreate / cuCtxDestroy
// ---------------------------------------------------------------------------------------

// cuCtxCreate: "Creates a new CUDA context and associates it with the calling thread."
TEST_F(DeviceContextTest, CreatePushesTheNewContext) {
  const auto contexts = ProcessStats().contexts;
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(Current(), ctx);
  CUdevice dev = -1;
  EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, dev_);
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().contexts, contexts + 1));
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  EXPECT_EQ(Current(), nullptr);
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().contexts, contexts));
}

// cuCtxCreate: "If a context is already current to the thread, it is supplanted by the
// newly created context"; cuCtxDestroy: "If ctx is current to the calling thread then ctx
// will also be popped from the current thread's context stack".
TEST_F(DeviceContextTest, CreateSupplantsAndDestroyRestoresThePreviousContext) {
  CUcontext primary = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&primary, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(primary), CUDA_SUCCESS);
  CUcontext a = nullptr, b = nullptr;
  ASSERT_EQ(cuCtxCreate(&a, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&b, nullptr, 0, dev_), CUDA_SUCCESS);
  EXPECT_NE(a, b);
  EXPECT_NE(a, primary);
  EXPECT_EQ(Current(), b);
  EXPECT_EQ(cuCtxDestroy(b), CUDA_SUCCESS);
  EXPECT_EQ(Current(), a);
  EXPECT_EQ(cuCtxDestroy(a), CUDA_SUCCESS);
  EXPECT_EQ(Current(), primary);
  thaw::test::clear_context_stack();
  EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
}

// cuCtxCreate: "Context creation will fail with CUDA_ERROR_INVALID_VALUE if invalid
// parameter was passed"; "Only one of the scheduling flags can be set".
TEST_F(DeviceContextTest, CreateRejectsInvalidFlagsWithoutSideEffects) {
  const auto contexts = ProcessStats().contexts;
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0x100, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, 0x80000000u, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxCreate(&ctx, nullptr, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD, dev_),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxCreate(nullptr, nullptr, 0, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Current(), nullptr);
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().contexts, contexts));
}

TEST_F(DeviceContextTest, CreateAcceptsEachDocumentedFlag) {
  for (unsigned int flags :
       {unsigned{CU_CTX_SCHED_AUTO}, unsigned{CU_CTX_SCHED_SPIN}, unsigned{CU_CTX_SCHED_YIELD},
        unsigned{CU_CTX_SCHED_BLOCKING_SYNC}, unsigned{CU_CTX_MAP_HOST},
        unsigned{CU_CTX_LMEM_RESIZE_TO_MAX}, unsigned{CU_CTX_SYNC_MEMOPS},
        unsigned{CU_CTX_SCHED_BLOCKING_SYNC | CU_CTX_MAP_HOST | CU_CTX_SYNC_MEMOPS}}) {
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuCtxCreate(&ctx, nullptr, flags, dev_), CUDA_SUCCESS) << "flags " << flags;
    if (auto get_flags = Optional<PFN_cuCtxGetFlags_v7000>("cuCtxGetFlags")) {
      unsigned int got = 0;
      EXPECT_EQ(get_flags(&got), CUDA_SUCCESS);
      EXPECT_EQ(got & CU_CTX_SCHED_MASK, flags & CU_CTX_SCHED_MASK) << "flags " << flags;
    }
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  }
}

// cuCtxCreate_v2 (CUDA 3.2) and cuCtxCreate_v3 (11.4), as an older runtime obtains them.
TEST_F(DeviceContextTest, OlderCreateVariantsFromCuGetProcAddressWork) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  ASSERT_EQ(cuGetProcAddress("cuCtxCreate", &fn, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  CUcontext ctx = nullptr;
  ASSERT_EQ(reinterpret_cast<PFN_cuCtxCreate_v3020>(fn)(&ctx, 0, dev_), CUDA_SUCCESS);
  EXPECT_EQ(Current(), ctx);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);

  ASSERT_EQ(cuGetProcAddress("cuCtxCreate", &fn, 11040, CU_GET_PROC_ADDRESS_DEFAULT, &status),
            CUDA_SUCCESS);
  ASSERT_NE(fn, nullptr);
  auto v3 = reinterpret_cast<PFN_cuCtxCreate_v11040>(fn);
  ASSERT_EQ(v3(&ctx, nullptr, 0, 0, dev_), CUDA_SUCCESS);
  EXPECT_EQ(Current(), ctx);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  EXPECT_EQ(v3(&ctx, nullptr, 0, 0, count_), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(v3(&ctx, nullptr, 0, 0x100, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Current(), nullptr);
}

// The handles are ids: passing a destroyed context again is an error, never a crash.
TEST_F(DeviceContextTest, DestroyedContextPassedAgainIsInvalidContext) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxPushCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(Current(), nullptr);
  if (auto api_version = Optional<PFN_cuCtxGetApiVersion_v3020>("cuCtxGetApiVersion")) {
    unsigned int v = 0;
    EXPECT_EQ(api_version(ctx, &v), CUDA_ERROR_INVALID_CONTEXT);
  }
}

// cuCtxDestroy: "If ctx is current to other threads, then ctx will remain current to those
// threads, and attempting to access ctx from those threads will result in the error
// CUDA_ERROR_CONTEXT_IS_DESTROYED."
TEST_F(DeviceContextTest, DestroyedContextStillCurrentOnAnotherThreadIsDestroyed) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  std::promise<void> bound, destroyed;
  CUresult bind = CUDA_ERROR_UNKNOWN, sync = CUDA_SUCCESS, alloc = CUDA_SUCCESS;
  CUresult get_device = CUDA_SUCCESS;
  std::thread other([&] {
    bind = cuCtxSetCurrent(ctx);
    bound.set_value();
    destroyed.get_future().wait();
    sync = cuCtxSynchronize();
    CUdeviceptr p = 0;
    alloc = cuMemAlloc(&p, 4096);
    CUdevice dev = -1;
    get_device = cuCtxGetDevice(&dev);
    cuCtxSetCurrent(nullptr);
  });
  bound.get_future().wait();
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  destroyed.set_value();
  other.join();
  EXPECT_EQ(bind, CUDA_SUCCESS);
  EXPECT_EQ(sync, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(alloc, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(get_device, CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

// cuCtxDestroy "Destroys and cleans up all resources associated with the context ...
// These resources also include memory allocations by cuMemAlloc(), cuMemAllocHost()".
TEST_F(DeviceContextTest, DestroyFreesTheContextsAllocations) {
  const auto before = DeviceStats(dev_);
  const auto pinned_before = ProcessStats().pinned_host_ranges;
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  void* host = nullptr;
  ASSERT_EQ(cuMemAlloc(&p, 16 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocHost(&host, 4096), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats(dev_).legacy_allocations, before.legacy_allocations + 1));
  ASSERT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  const auto after = DeviceStats(dev_);
  THAW_EMU_CHECK(EXPECT_EQ(after.legacy_allocations, before.legacy_allocations));
  THAW_EMU_CHECK(EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(ProcessStats().pinned_host_ranges, pinned_before));
}

TEST(Contexts, ContextsAreBoundToTheirDevice) {
  THAW_SKIP_UNLESS_EMULATOR("makes a second device with THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "2", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext p0 = nullptr, p1 = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&p0, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
    EXPECT_NE(p0, p1);
    CUdevice dev = -1;
    ASSERT_EQ(cuCtxSetCurrent(p1), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 1);
    CUcontext c = nullptr;
    ASSERT_EQ(cuCtxCreate(&c, nullptr, 0, 1), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 1);
    // Device stats are per device: an allocation on device 1 leaves device 0 untouched.
    ThawEmuDeviceStats d0{}, d1{};
    ASSERT_EQ(thawEmuGetDeviceStats(0, &d0), CUDA_SUCCESS);
    CUdeviceptr ptr = 0;
    ASSERT_EQ(cuMemAlloc(&ptr, 4 * kMiB), CUDA_SUCCESS);
    ThawEmuDeviceStats d0_after{};
    ASSERT_EQ(thawEmuGetDeviceStats(0, &d0_after), CUDA_SUCCESS);
    ASSERT_EQ(thawEmuGetDeviceStats(1, &d1), CUDA_SUCCESS);
    EXPECT_EQ(d0_after.legacy_allocations, d0.legacy_allocations);
    EXPECT_EQ(d1.legacy_allocations, 1u);
    EXPECT_EQ(cuCtxDestroy(c), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
    ThawEmuDeviceStats bad{};
    EXPECT_EQ(thawEmuGetDeviceStats(2, &bad), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(thawEmuGetDeviceStats(0, nullptr), CUDA_ERROR_INVALID_VALUE);
  });
}

TEST_F(DeviceContextTest, ApiVersionOfAContext) {
  auto api_version = Optional<PFN_cuCtxGetApiVersion_v3020>("cuCtxGetApiVersion");
  if (api_version == nullptr) GTEST_SKIP() << "cuCtxGetApiVersion is not exported";
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  unsigned int v = 0;
  EXPECT_EQ(api_version(ctx, &v), CUDA_SUCCESS);
  EXPECT_GE(v, 3020u) << "contexts have had API version 3020 since CUDA 3.2";
  EXPECT_EQ(api_version(ctx, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// Current context: per thread, push/pop/set
// ---------------------------------------------------------------------------------------

TEST_F(DeviceContextTest, CurrentContextIsPerThread) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  CUcontext seen = reinterpret_cast<CUcontext>(0x1);
  CUresult get = CUDA_ERROR_UNKNOWN, sync = CUDA_SUCCESS, alloc = CUDA_SUCCESS;
  CUresult get_device = CUDA_SUCCESS, mem_info = CUDA_SUCCESS;
  std::thread([&] {
    get = cuCtxGetCurrent(&seen);
    sync = cuCtxSynchronize();
    CUdeviceptr p = 0;
    alloc = cuMemAlloc(&p, 4096);
    CUdevice dev = -1;
    get_device = cuCtxGetDevice(&dev);
    size_t free = 0, total = 0;
    mem_info = cuMemGetInfo(&free, &total);
  }).join();
  EXPECT_EQ(get, CUDA_SUCCESS);
  EXPECT_EQ(seen, nullptr) << "a new thread starts with no current context";
  EXPECT_EQ(sync, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(alloc, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(get_device, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(mem_info, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(Current(), ctx) << "the other thread changed this thread's context";
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

// cuCtxPopCurrent: the popped context "may then be made current to a different CPU thread
// by calling cuCtxPushCurrent()".
TEST_F(DeviceContextTest, PoppedContextCanBePushedOnAnotherThread) {
  CUcontext ctx = nullptr, popped = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, ctx);
  EXPECT_EQ(Current(), nullptr);
  CUresult push = CUDA_ERROR_UNKNOWN, alloc = CUDA_ERROR_UNKNOWN, free_result = CUDA_ERROR_UNKNOWN;
  CUcontext there = nullptr;
  std::thread([&] {
    push = cuCtxPushCurrent(ctx);
    cuCtxGetCurrent(&there);
    CUdeviceptr p = 0;
    alloc = cuMemAlloc(&p, 4096);
    free_result = cuMemFree(p);
    CUcontext c = nullptr;
    cuCtxPopCurrent(&c);
  }).join();
  EXPECT_EQ(push, CUDA_SUCCESS);
  EXPECT_EQ(there, ctx);
  EXPECT_EQ(alloc, CUDA_SUCCESS);
  EXPECT_EQ(free_result, CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

TEST_F(DeviceContextTest, PushAndPopFormAStack) {
  CUcontext a = nullptr, b = nullptr, popped = nullptr;
  ASSERT_EQ(cuCtxCreate(&a, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&b, nullptr, 0, dev_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(Current(), nullptr);

  ASSERT_EQ(cuCtxPushCurrent(a), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(b), CUDA_SUCCESS);
  EXPECT_EQ(Current(), b);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, b);
  EXPECT_EQ(Current(), a);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, a);
  EXPECT_EQ(Current(), nullptr);
  EXPECT_EQ(cuCtxDestroy(a), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(b), CUDA_SUCCESS);
}

// cuCtxPopCurrent lists CUDA_ERROR_INVALID_CONTEXT: there is nothing to pop.
TEST_F(DeviceContextTest, PopOnAnEmptyStackIsInvalidContext) {
  CUcontext popped = reinterpret_cast<CUcontext>(0x1);
  EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
}

// cuCtxSetCurrent: "If there exists a CUDA context stack on the calling CPU thread, this
// will replace the top of that stack with ctx. If ctx is NULL then this will be equivalent
// to popping the top of the calling CPU thread's CUDA context stack (or a no-op if the
// calling CPU thread's CUDA context stack is empty)."
TEST_F(DeviceContextTest, SetCurrentReplacesTheTopOfTheStack) {
  CUcontext a = nullptr, b = nullptr, c = nullptr, popped = nullptr;
  for (CUcontext* x : {&a, &b, &c}) {
    ASSERT_EQ(cuCtxCreate(x, nullptr, 0, dev_), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  ASSERT_EQ(cuCtxPushCurrent(a), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(b), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(c), CUDA_SUCCESS);
  EXPECT_EQ(Current(), c);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, c);
  EXPECT_EQ(Current(), a) << "SetCurrent pushed instead of replacing the top";

  ASSERT_EQ(cuCtxPushCurrent(b), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(Current(), a) << "SetCurrent(NULL) pops the top";
  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(Current(), nullptr);
  EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS) << "no-op on an empty stack";
  for (CUcontext x : {a, b, c}) EXPECT_EQ(cuCtxDestroy(x), CUDA_SUCCESS);
}

// cuCtxGetCurrent: "If no context is bound to the calling CPU thread then *pctx is set to
// NULL and CUDA_SUCCESS is returned."
TEST_F(DeviceContextTest, GetCurrentWithNoContextIsNull) {
  EXPECT_EQ(Current(), nullptr);
  EXPECT_EQ(cuCtxGetCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);
}

// Calls that act on the current context, with none current.
TEST_F(DeviceContextTest, CallsNeedingAContextWithoutOneAreInvalidContext) {
  CUdevice dev = -1;
  CUdeviceptr p = 0;
  void* host = nullptr;
  size_t free = 0, total = 0;
  CUstream stream = nullptr;
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuMemGetInfo(&free, &total), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuMemAllocHost(&host, 4096), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuMemHostAlloc(&host, 4096, 0), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuStreamCreate(&stream, CU_STREAM_DEFAULT), CUDA_ERROR_INVALID_CONTEXT);
  if (auto get_flags = Optional<PFN_cuCtxGetFlags_v7000>("cuCtxGetFlags")) {
    unsigned int flags = 0;
    EXPECT_EQ(get_flags(&flags), CUDA_ERROR_INVALID_CONTEXT);
  }
}

TEST_F(DeviceContextTest, SynchronizeWithACurrentContextSucceeds) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
}

}  // namespace
