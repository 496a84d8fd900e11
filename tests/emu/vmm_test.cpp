// The emulator's virtual memory management (VMM) API, rule by rule.
//
// Ground truth is the doxygen of each function in CUDA 13's cuda.h; comments quote it
// where a rule is subtle. Where cuda.h says a call fails but not with which of its listed
// codes, the test accepts the listed codes that fit (EXPECT_CU_ONE_OF) and says so.
// Every test also checks, in the fixture's TearDown, that it left no bytes, handle
// references, mappings or reservations behind.
#include <gtest/gtest.h>

#include <cuda.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "thaw/emu_inspect.h"
#include "vmm_helpers.hpp"

namespace thaw_vmm_test {
namespace {

using VmmGranularity = VmmFixture;
using VmmCreate = VmmFixture;
using VmmRelease = VmmFixture;
using VmmReserve = VmmFixture;
using VmmAddressFree = VmmFixture;
using VmmMap = VmmFixture;
using VmmUnmap = VmmFixture;
using VmmSetAccess = VmmFixture;
using VmmGetAccess = VmmFixture;
using VmmRetain = VmmFixture;
using VmmProperties = VmmFixture;
using VmmExport = VmmFixture;
using VmmImport = VmmFixture;
using VmmPointerQueries = VmmFixture;
using VmmContextFree = VmmFixture;

volatile uint8_t* Bytes(CUdeviceptr p) {
  return reinterpret_cast<volatile uint8_t*>(p);
}

// A process-private directory for the emulator ledger, for child processes that need a
// device configured differently from the test binary's (size, count).
std::string FreshStateDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "thaw-vmm-child-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) return {};
  return templ;
}

// ---------------------------------------------------------------------------------------
// Calls before cuInit
// ---------------------------------------------------------------------------------------

struct PreInitCall {
  const char* name;
  std::function<CUresult()> call;
};

std::vector<PreInitCall> PreInitCalls() {
  static CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  static CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  static CUmemLocation loc = DeviceLocation(0);
  return {
      {"cuMemGetAllocationGranularity",
       [] {
         size_t g = 0;
         return cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
       }},
      {"cuMemCreate",
       [] {
         CUmemGenericAllocationHandle h = 0;
         return cuMemCreate(&h, kGranularity, &prop, 0);
       }},
      {"cuMemRelease", [] { return cuMemRelease(1); }},
      {"cuMemAddressReserve",
       [] {
         CUdeviceptr p = 0;
         return cuMemAddressReserve(&p, kGranularity, 0, 0, 0);
       }},
      {"cuMemAddressFree", [] { return cuMemAddressFree(0x200000000ull, kGranularity); }},
      {"cuMemMap", [] { return cuMemMap(0x200000000ull, kGranularity, 0, 1, 0); }},
      {"cuMemUnmap", [] { return cuMemUnmap(0x200000000ull, kGranularity); }},
      {"cuMemSetAccess", [] { return cuMemSetAccess(0x200000000ull, kGranularity, &desc, 1); }},
      {"cuMemGetAccess",
       [] {
         unsigned long long flags = 0;
         return cuMemGetAccess(&flags, &loc, 0x200000000ull);
       }},
      {"cuMemRetainAllocationHandle",
       [] {
         CUmemGenericAllocationHandle h = 0;
         return cuMemRetainAllocationHandle(&h, AsPtr(0x200000000ull));
       }},
      {"cuMemGetAllocationPropertiesFromHandle",
       [] {
         CUmemAllocationProp out{};
         return cuMemGetAllocationPropertiesFromHandle(&out, 1);
       }},
      {"cuMemExportToShareableHandle",
       [] {
         int fd = -1;
         return cuMemExportToShareableHandle(&fd, 1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
       }},
      {"cuMemImportFromShareableHandle",
       [] {
         CUmemGenericAllocationHandle h = 0;
         return cuMemImportFromShareableHandle(&h, AsOsHandle(0),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
       }},
  };
}

class VmmBeforeInit : public ::testing::TestWithParam<size_t> {};

// Every VMM entry point lists CUDA_ERROR_NOT_INITIALIZED: before cuInit it is what they
// return. The call runs in a fresh process (death-test child) so no earlier test has
// initialised the driver.
TEST_P(VmmBeforeInit, ReturnsNotInitialized) {
  PreInitCall c = PreInitCalls()[GetParam()];
  EXPECT_EXIT(
      {
        ChildChecks check;
        check.Cu(CUDA_ERROR_NOT_INITIALIZED, c.call(), c.name);
        check.Exit();
      },
      ::testing::ExitedWithCode(0), "")
      << c.name;
}

INSTANTIATE_TEST_SUITE_P(AllVmmCalls, VmmBeforeInit,
                         ::testing::Range(size_t{0}, PreInitCalls().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(PreInitCalls()[info.param].name);
                         });

// ---------------------------------------------------------------------------------------
// cuMemGetAllocationGranularity
// ---------------------------------------------------------------------------------------

TEST_F(VmmGranularity, MinimumAndRecommendedAreTwoMiB) {
  CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t minimum = 0, recommended = 0;
  ASSERT_CU_OK(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  ASSERT_CU_OK(
      cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(minimum, 2 * kMiB);
  EXPECT_EQ(recommended, 2 * kMiB);
}

TEST_F(VmmGranularity, RejectsNullOutput) {
  CUmemAllocationProp prop = DeviceProp();
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemGetAllocationGranularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

TEST_F(VmmGranularity, RejectsNullProp) {
  size_t g = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemGetAllocationGranularity(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

TEST_F(VmmGranularity, RejectsUnknownOption) {
  CUmemAllocationProp prop = DeviceProp();
  size_t g = 0;
  EXPECT_CU(
      CUDA_ERROR_INVALID_VALUE,
      cuMemGetAllocationGranularity(&g, &prop, static_cast<CUmemAllocationGranularity_flags>(7)));
}

TEST_F(VmmGranularity, RejectsInvalidLocation) {
  size_t g = 0;
  CUmemAllocationProp prop = DeviceProp();
  prop.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // The doc lists only INVALID_VALUE for this call; INVALID_DEVICE is what cuMemCreate
  // answers for the same property, so either is accepted for a bad ordinal.
  prop = DeviceProp(99);
  EXPECT_CU_ONE_OF(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE);
}

// ---------------------------------------------------------------------------------------
// cuMemCreate
// ---------------------------------------------------------------------------------------

TEST_F(VmmCreate, HandleHoldsExactlyTheRequestedBytes) {
  ThawEmuDeviceStats before = DevStats();
  CUmemGenericAllocationHandle h = Create(3 * G);
  ASSERT_NE(h, 0u);
  ThawEmuDeviceStats after = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use - before.device_bytes_in_use, 3 * G));
  THAW_EMU_CHECK(EXPECT_EQ(after.process_bytes_in_use - before.process_bytes_in_use, 3 * G));
  THAW_EMU_CHECK(EXPECT_EQ(after.physical_allocations - before.physical_allocations, 1u));
  THAW_EMU_CHECK(EXPECT_EQ(after.vmm_handle_refs - before.vmm_handle_refs, 1u));
  THAW_EMU_CHECK(EXPECT_EQ(after.vmm_mappings, before.vmm_mappings)
                 << "a new allocation has no mappings");
  EXPECT_CU_OK(cuMemRelease(h));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().physical_allocations, before.physical_allocations));
}

TEST_F(VmmCreate, MemGetInfoFreeDropsByExactlyTheCreatedSize) {
  size_t free0 = 0, total0 = 0;
  ASSERT_CU_OK(cuMemGetInfo(&free0, &total0));
  CUmemGenericAllocationHandle h = Create(5 * G);
  size_t free1 = 0, total1 = 0;
  ASSERT_CU_OK(cuMemGetInfo(&free1, &total1));
  EXPECT_EQ(free0 - free1, 5 * G);
  EXPECT_EQ(total0, total1);
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_EQ(FreeMemory(), free0);
}

TEST_F(VmmCreate, DistinctAllocationsGetDistinctHandles) {
  CUmemGenericAllocationHandle a = Create(G), b = Create(G);
  EXPECT_NE(a, b);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G));
  EXPECT_CU_OK(cuMemRelease(a));
  EXPECT_CU_OK(cuMemRelease(b));
}

TEST_F(VmmCreate, RejectsNullHandle) {
  CUmemAllocationProp prop = DeviceProp();
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(nullptr, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsNullProp) {
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, nullptr, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsZeroSize) {
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 0, &prop, 0));
}

// "The size of this allocation must be a multiple of the value given via
// cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag."
TEST_F(VmmCreate, RejectsSizeNotMultipleOfGranularity) {
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G / 2, &prop, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G + 4096, &prop, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 1, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// "flags - flags for future use, must be zero now."
TEST_F(VmmCreate, RejectsNonZeroFlags) {
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 1));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsInvalidAllocationType) {
  CUmemAllocationProp prop = DeviceProp();
  prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsInvalidLocationType) {
  CUmemAllocationProp prop = DeviceProp();
  prop.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the CUmemLocation::type will
// result in CUDA_ERROR_INVALID_VALUE."
TEST_F(VmmCreate, RejectsHostNumaCurrentLocation) {
  CUmemAllocationProp prop = DeviceProp();
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// "HOST allocations are not IPC capable and CUmemAllocationProp::requestedHandleTypes
// must be 0, any other value will result in CUDA_ERROR_INVALID_VALUE."
TEST_F(VmmCreate, RejectsHostAllocationWithShareableHandleType) {
  CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsDeviceOrdinalOutOfRange) {
  int count = 0;
  ASSERT_CU_OK(cuDeviceGetCount(&count));
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = DeviceProp(count);
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h, G, &prop, 0));
  prop = DeviceProp(-1);
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// win32HandleMetaData: "In all other cases [than CU_MEM_HANDLE_TYPE_WIN32], this field is
// required to be zero."
TEST_F(VmmCreate, RejectsWin32MetadataOnPosixHandle) {
  int dummy = 0;
  CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  prop.win32HandleMetaData = &dummy;
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, G, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// Win32 handles do not exist on Linux. cuda.h does not say which listed code the driver
// returns; NOT_SUPPORTED and INVALID_VALUE both fit.
TEST_F(VmmCreate, RejectsWin32HandleTypesOnLinux) {
  CUmemGenericAllocationHandle h = 0;
  for (auto type : {CU_MEM_HANDLE_TYPE_WIN32, CU_MEM_HANDLE_TYPE_WIN32_KMT}) {
    CUmemAllocationProp prop = DeviceProp(0, type);
    EXPECT_CU_ONE_OF(cuMemCreate(&h, G, &prop, 0), CUDA_ERROR_NOT_SUPPORTED,
                     CUDA_ERROR_INVALID_VALUE)
        << "handle type " << type;
  }
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// Fabric handles need an IMEX channel ("Applications that intend to use
// CU_MEM_HANDLE_TYPE_FABRIC based memory sharing must ensure ... at least one IMEX channel
// file accessible"); the emulated machine has none, so creation is refused: NOT_SUPPORTED
// (no fabric) or NOT_PERMITTED (no channel), the two codes NCCL checks for.
TEST_F(VmmCreate, RejectsFabricHandleTypeWithoutImexChannel) {
  CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_FABRIC);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU_ONE_OF(cuMemCreate(&h, G, &prop, 0), CUDA_ERROR_NOT_SUPPORTED,
                   CUDA_ERROR_NOT_PERMITTED);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmCreate, RejectsUnknownHandleTypeBits) {
  CUmemAllocationProp prop = DeviceProp(0, static_cast<CUmemAllocationHandleType>(0x40));
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU_ONE_OF(cuMemCreate(&h, G, &prop, 0), CUDA_ERROR_INVALID_VALUE,
                   CUDA_ERROR_NOT_SUPPORTED);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

// Out of memory is reported, never overcommitted: a request larger than what is free
// fails with CUDA_ERROR_OUT_OF_MEMORY and takes nothing.
TEST_F(VmmCreate, LargerThanFreeMemoryIsOutOfMemory) {
  size_t free = FreeMemory();
  size_t request = (free / G + 1) * G;
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, request, &prop, 0));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_EQ(FreeMemory(), free);
}

// With THAW_EMU_DEVICE_MEMORY=64M the device has 64 MiB: creations up to what is free
// succeed, the next one fails with OUT_OF_MEMORY, and a release makes room again. Runs
// in a fresh process with its own ledger, configured before cuInit.
[[noreturn]] void ExhaustSmallDeviceChild() {
  ChildChecks check;
  std::string dir = FreshStateDir();
  check.True(!dir.empty(), "mkdtemp");
  setenv("THAW_EMU_STATE_DIR", dir.c_str(), 1);
  setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
  check.Cu(CUDA_SUCCESS, cuInit(0), "cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  check.Cu(CUDA_SUCCESS, cuDeviceGet(&dev, 0), "cuDeviceGet");
  check.Cu(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
  check.Cu(CUDA_SUCCESS, cuCtxSetCurrent(ctx), "set current");
  size_t free = 0, total = 0;
  check.Cu(CUDA_SUCCESS, cuMemGetInfo(&free, &total), "cuMemGetInfo");
  check.True(total == 64 * kMiB, "total is THAW_EMU_DEVICE_MEMORY");
  CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle big = 0, a = 0, b = 0, c = 0;
  check.Cu(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&big, 66 * kMiB, &prop, 0), "create 66M of 64M");
  size_t before_fill = 0;
  check.Cu(CUDA_SUCCESS, cuMemGetInfo(&before_fill, &total), "cuMemGetInfo");
  // Fill what is free (a context may cost memory on a real GPU; the test does not
  // assume it is zero) in two allocations.
  size_t half = (before_fill / kGranularity / 2) * kGranularity;
  size_t rest = (before_fill / kGranularity) * kGranularity - half;
  check.Cu(CUDA_SUCCESS, cuMemCreate(&a, half, &prop, 0), "create first half");
  check.Cu(CUDA_SUCCESS, cuMemCreate(&b, rest, &prop, 0), "create second half");
  check.Cu(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&c, kGranularity, &prop, 0),
           "create one page on a full device");
  size_t free_full = 1;
  check.Cu(CUDA_SUCCESS, cuMemGetInfo(&free_full, &total), "cuMemGetInfo when full");
  check.True(free_full < kGranularity, "free < one page when full");
  check.Cu(CUDA_SUCCESS, cuMemRelease(a), "release first half");
  check.Cu(CUDA_SUCCESS, cuMemCreate(&c, kGranularity, &prop, 0),
           "create one page after a release");
  check.Cu(CUDA_SUCCESS, cuMemRelease(b), "release b");
  check.Cu(CUDA_SUCCESS, cuMemRelease(c), "release c");
  ThawEmuDeviceStats s{};
  check.True(thawEmuGetDeviceStats(0, &s) == CUDA_SUCCESS, "stats");
  check.True(s.capacity_bytes == 64 * kMiB, "capacity_bytes == 64M");
  check.True(s.vmm_handle_refs == 0, "no handle refs left");
  cuDevicePrimaryCtxRelease(dev);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  check.Exit();
}

TEST(VmmCreateOutOfMemory, ExhaustingSmallDeviceFailsAndReleaseMakesRoom) {
  THAW_SKIP_UNLESS_EMULATOR("sizes the device with THAW_EMU_DEVICE_MEMORY");
  EXPECT_EXIT(ExhaustSmallDeviceChild(), ::testing::ExitedWithCode(0), "");
}

// With two emulated devices, an allocation on device 1 is counted against device 1 only,
// reports location id 1, and is made accessible through a device-1 access descriptor.
[[noreturn]] void SecondDeviceChild() {
  ChildChecks check;
  std::string dir = FreshStateDir();
  setenv("THAW_EMU_STATE_DIR", dir.c_str(), 1);
  setenv("THAW_EMU_DEVICES", "2", 1);
  check.Cu(CUDA_SUCCESS, cuInit(0), "cuInit");
  CUmemAllocationProp prop = DeviceProp(1);
  CUmemGenericAllocationHandle h = 0;
  check.Cu(CUDA_SUCCESS, cuMemCreate(&h, 2 * kGranularity, &prop, 0), "create on dev 1");
  ThawEmuDeviceStats d0{}, d1{};
  thawEmuGetDeviceStats(0, &d0);
  thawEmuGetDeviceStats(1, &d1);
  check.True(d0.device_bytes_in_use == 0, "device 0 unaffected");
  check.True(d1.device_bytes_in_use == 2 * kGranularity, "device 1 holds the bytes");
  CUmemAllocationProp got{};
  check.Cu(CUDA_SUCCESS, cuMemGetAllocationPropertiesFromHandle(&got, h), "props");
  check.True(got.location.type == CU_MEM_LOCATION_TYPE_DEVICE && got.location.id == 1,
             "location is device 1");
  CUdeviceptr va = 0;
  check.Cu(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * kGranularity, 0, 0, 0), "reserve");
  check.Cu(CUDA_SUCCESS, cuMemMap(va, 2 * kGranularity, 0, h, 0), "map");
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 1);
  check.Cu(CUDA_SUCCESS, cuMemSetAccess(va, 2 * kGranularity, &desc, 1), "access dev 1");
  FillPattern(AsPtr(va), 4096, 5);
  check.True(FirstPatternMismatch(AsPtr(va), 4096, 5) < 0, "bytes read back");
  unsigned long long flags = 0;
  CUmemLocation loc1 = DeviceLocation(1);
  check.Cu(CUDA_SUCCESS, cuMemGetAccess(&flags, &loc1, va), "get access dev 1");
  check.True(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "dev 1 has read-write");
  check.Cu(CUDA_SUCCESS, cuMemUnmap(va, 2 * kGranularity), "unmap");
  check.Cu(CUDA_SUCCESS, cuMemRelease(h), "release");
  check.Cu(CUDA_SUCCESS, cuMemAddressFree(va, 2 * kGranularity), "free");
  thawEmuGetDeviceStats(1, &d1);
  check.True(d1.device_bytes_in_use == 0, "device 1 empty again");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  check.Exit();
}

TEST(VmmCreateSecondDevice, AllocationBelongsToTheRequestedDevice) {
  THAW_SKIP_UNLESS_EMULATOR("makes a second device with THAW_EMU_DEVICES");
  EXPECT_EXIT(SecondDeviceChild(), ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------------------
// cuMemRelease
// ---------------------------------------------------------------------------------------

// cuda.h: "If handle is not a valid handle the behavior is undefined." The emulator is
// strict instead of undefined: a handle it never issued, or one already released, is
// refused with CUDA_ERROR_INVALID_VALUE (first listed error) and nothing else changes.
TEST_F(VmmRelease, RejectsHandleNeverIssued) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRelease(0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRelease(0xdeadbeef00ull));
}

TEST_F(VmmRelease, RejectsSecondReleaseOfTheSameReference) {
  CUmemGenericAllocationHandle h = Create(G);
  CUmemGenericAllocationHandle other = Create(G);
  ASSERT_CU_OK(cuMemRelease(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G) << "the other allocation is untouched");
  EXPECT_CU_OK(cuMemRelease(other));
}

// "The generic memory handle can be freed when there are still outstanding mappings made
// with this handle." The memory stays allocated until the last mapping is gone.
TEST_F(VmmRelease, WhileMappedKeepsMemoryAliveUntilUnmap) {
  Mapped m = CreateMapped(2 * G);
  WritePattern(m.va, 2 * G, 11);
  ThawEmuDeviceStats before = DevStats();
  ASSERT_CU_OK(cuMemRelease(m.handle));
  ThawEmuDeviceStats released = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(released.vmm_handle_refs, before.vmm_handle_refs - 1));
  THAW_EMU_CHECK(EXPECT_EQ(released.vmm_mappings, before.vmm_mappings));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G) << "still mapped, so still allocated");
  EXPECT_EQ(CheckPattern(m.va, 2 * G, 11), -1) << "bytes survive the release";
  ASSERT_CU_OK(cuMemUnmap(m.va, m.size));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u) << "last mapping gone: memory freed");
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().physical_allocations, baseline_.physical_allocations));
  EXPECT_CU_OK(cuMemAddressFree(m.va, m.size));
}

TEST_F(VmmRelease, LastOfSeveralMappingsFreesTheMemory) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  ASSERT_CU_OK(cuMemMap(va + G, G, 0, h, 0));
  ASSERT_CU_OK(cuMemRelease(h));
  ASSERT_CU_OK(cuMemUnmap(va, G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G) << "one mapping left");
  ASSERT_CU_OK(cuMemUnmap(va + G, G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

// ---------------------------------------------------------------------------------------
// cuMemAddressReserve
// ---------------------------------------------------------------------------------------

// The emulator places reservations at granularity-aligned addresses when no alignment is
// requested ("alignment must be a power of two or zero for default alignment"), so the
// start of a reservation can always be mapped. A reservation takes no device memory.
TEST_F(VmmReserve, DefaultAlignmentIsTheGranularityAndTakesNoMemory) {
  ThawEmuProcessStats p0 = ProcStats();
  CUdeviceptr va = Reserve(8 * G);
  ASSERT_NE(va, 0u);
  EXPECT_EQ(va % G, 0u);
  ThawEmuProcessStats p1 = ProcStats();
  THAW_EMU_CHECK(EXPECT_EQ(p1.reservations, p0.reservations + 1));
  THAW_EMU_CHECK(EXPECT_EQ(p1.reserved_bytes, p0.reserved_bytes + 8 * G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(va, 8 * G));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reserved_bytes, p0.reserved_bytes));
}

TEST_F(VmmReserve, HonoursPowerOfTwoAlignment) {
  for (size_t alignment : {4 * G, 64 * kMiB, size_t{1} << 30}) {
    CUdeviceptr va = Reserve(2 * G, alignment);
    EXPECT_EQ(va % alignment, 0u) << "alignment " << alignment;
    EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
  }
}

// "If addr is 0, then the driver chooses the address ... when it is non-zero then the
// driver treats it as a hint": a free hint is honoured, a taken one is not clobbered.
TEST_F(VmmReserve, HonoursFreeRequestedAddressAndNeverClobbersATakenOne) {
  CUdeviceptr first = Reserve(4 * G);
  ASSERT_CU_OK(cuMemAddressFree(first, 4 * G));
  CUdeviceptr again = 0;
  ASSERT_CU_OK(cuMemAddressReserve(&again, 4 * G, 0, first, 0));
  EXPECT_EQ(again, first) << "a free requested address is used";
  CUdeviceptr other = 0;
  ASSERT_CU_OK(cuMemAddressReserve(&other, 4 * G, 0, first, 0));
  EXPECT_NE(other, first) << "a taken address is only a hint";
  EXPECT_TRUE(other + 4 * G <= first || first + 4 * G <= other) << "ranges must not overlap";
  EXPECT_CU_OK(cuMemAddressFree(again, 4 * G));
  EXPECT_CU_OK(cuMemAddressFree(other, 4 * G));
}

TEST_F(VmmReserve, RejectsNullOutput) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(nullptr, G, 0, 0, 0));
}

TEST_F(VmmReserve, RejectsZeroSize) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, 0, 0, 0, 0));
}

// "The size and address parameters must be a multiple of the host page size."
TEST_F(VmmReserve, RejectsSizeNotMultipleOfPageSize) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, G + 1, 0, 0, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, 100, 0, 0, 0));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations));
}

TEST_F(VmmReserve, RejectsRequestedAddressNotMultipleOfPageSize) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, G, 0, 0x7f0000000001ull, 0));
}

// "the alignment must be a power of two or zero"
TEST_F(VmmReserve, RejectsAlignmentNotPowerOfTwo) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, G, 3 * G, 0, 0));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations));
}

// "flags - Currently unused, must be zero"
TEST_F(VmmReserve, RejectsNonZeroFlags) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, G, 0, 0, 1));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations));
}

TEST_F(VmmReserve, ImpossibleSizeIsOutOfMemory) {
  CUdeviceptr va = 0;
  EXPECT_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAddressReserve(&va, size_t{1} << 62, 0, 0, 0));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations));
}

// ---------------------------------------------------------------------------------------
// cuMemAddressFree
// ---------------------------------------------------------------------------------------

// "The size must match what was given to memAddressReserve and the ptr given must match
// what was returned from memAddressReserve."
TEST_F(VmmAddressFree, RejectsSizeDifferentFromTheReservation) {
  CUdeviceptr va = Reserve(4 * G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 2 * G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 6 * G));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations + 1));
  EXPECT_CU_OK(cuMemAddressFree(va, 4 * G));
}

TEST_F(VmmAddressFree, RejectsPointerInsideTheReservation) {
  CUdeviceptr va = Reserve(4 * G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va + G, 3 * G));
  EXPECT_CU_OK(cuMemAddressFree(va, 4 * G));
}

TEST_F(VmmAddressFree, RejectsAddressNeverReserved) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(0, G));
  int local = 0;
  CUdeviceptr stack = reinterpret_cast<CUdeviceptr>(&local) & ~CUdeviceptr{G - 1};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(stack, G));
}

TEST_F(VmmAddressFree, RejectsSecondFree) {
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemAddressFree(va, 2 * G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 2 * G));
}

// A reservation that still has mappings cannot be freed (cuda.h does not name the code;
// INVALID_VALUE and NOT_PERMITTED are the listed ones that fit); the mapping survives.
TEST_F(VmmAddressFree, RejectsReservationThatIsStillMapped) {
  Mapped m = CreateMapped(2 * G);
  WritePattern(m.va, 4096, 3);
  EXPECT_CU_ONE_OF(cuMemAddressFree(m.va, m.size), CUDA_ERROR_INVALID_VALUE,
                   CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(CheckPattern(m.va, 4096, 3), -1) << "mapping intact after the refused free";
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations + 1));
  Destroy(m);
}

TEST_F(VmmAddressFree, FreedRangeCanBeReservedAgain) {
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemAddressFree(va, 2 * G));
  THAW_EMU_CHECK(EXPECT_EQ(ProcStats().reservations, proc_baseline_.reservations));
  CUdeviceptr again = 0;
  ASSERT_CU_OK(cuMemAddressReserve(&again, 2 * G, 0, va, 0));
  EXPECT_EQ(again, va);
  EXPECT_CU_OK(cuMemAddressFree(again, 2 * G));
}

// ---------------------------------------------------------------------------------------
// cuMemMap
// ---------------------------------------------------------------------------------------

// Shared setup for the cuMemMap misuse tests: a 4-page reservation and a 2-page handle.
class VmmMapMisuse : public VmmFixture {
 protected:
  void SetUp() override {
    VmmFixture::SetUp();
    if (HasFatalFailure()) return;
    h_ = Create(2 * G);
    va_ = Reserve(4 * G);
    mappings_before_ = DevStats().vmm_mappings;
  }
  void TearDown() override {
    THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, mappings_before_)
                   << "a refused map must map nothing");
    THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G));
    if (h_ != 0) {
      EXPECT_CU_OK(cuMemRelease(h_));
    }
    if (va_ != 0) {
      EXPECT_CU_OK(cuMemAddressFree(va_, 4 * G));
    }
    VmmFixture::TearDown();
  }
  CUmemGenericAllocationHandle h_ = 0;
  CUdeviceptr va_ = 0;
  unsigned long long mappings_before_ = 0;
};

TEST_F(VmmMapMisuse, RejectsZeroSize) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, 0, 0, h_, 0));
}

// "Both ptr, size, and offset must be a multiple of the value given via
// cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag."
TEST_F(VmmMapMisuse, RejectsAddressNotMultipleOfGranularity) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + 4096, G, 0, h_, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + G / 2, G, 0, h_, 0));
}

TEST_F(VmmMapMisuse, RejectsSizeNotMultipleOfGranularity) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G / 2, 0, h_, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G + 4096, 0, h_, 0));
}

TEST_F(VmmMapMisuse, RejectsOffsetNotMultipleOfGranularity) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G, 4096, h_, 0));
}

// "offset + size must be less than [or equal to] the size of the memory allocation"
TEST_F(VmmMapMisuse, RejectsOffsetPlusSizeBeyondTheAllocation) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, 2 * G, G, h_, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G, 2 * G, h_, 0));
}

TEST_F(VmmMapMisuse, RejectsSizeLargerThanTheAllocation) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, 4 * G, 0, h_, 0));
}

TEST_F(VmmMapMisuse, RejectsNonZeroFlags) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, 2 * G, 0, h_, 1));
}

TEST_F(VmmMapMisuse, RejectsInvalidHandle) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G, 0, 0, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G, 0, 0xdeadbeef00ull, 0));
}

TEST_F(VmmMapMisuse, RejectsHandleAlreadyReleased) {
  CUmemGenericAllocationHandle gone = Create(G);
  ASSERT_CU_OK(cuMemRelease(gone));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, G, 0, gone, 0));
}

// "This range must be an address reservation previously reserved with
// cuMemAddressReserve."
TEST_F(VmmMapMisuse, RejectsAddressOutsideAnyReservation) {
  CUdeviceptr freed = Reserve(2 * G);
  ASSERT_CU_OK(cuMemAddressFree(freed, 2 * G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(freed, G, 0, h_, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(0, G, 0, h_, 0));
  // Host memory that the driver never reserved, even if aligned.
  void* host = mmap(nullptr, 4 * G, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(host, MAP_FAILED);
  CUdeviceptr aligned = (reinterpret_cast<CUdeviceptr>(host) + G - 1) & ~CUdeviceptr{G - 1};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(aligned, G, 0, h_, 0));
  munmap(host, 4 * G);
}

TEST_F(VmmMapMisuse, RejectsRangeRunningPastTheReservationEnd) {
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + 3 * G, 2 * G, 0, h_, 0));
}

// "cuMemMap can only create mappings on VA range reservations that are not currently
// mapped."
TEST_F(VmmMapMisuse, RejectsRangeAlreadyMapped) {
  ASSERT_CU_OK(cuMemMap(va_ + G, 2 * G, 0, h_, 0));
  ++mappings_before_;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + G, 2 * G, 0, h_, 0)) << "same range";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_, 2 * G, 0, h_, 0)) << "overlaps the start";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + 2 * G, 2 * G, 0, h_, 0)) << "overlaps the end";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemMap(va_ + 2 * G, G, 0, h_, 0)) << "inside";
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, mappings_before_));
  ASSERT_CU_OK(cuMemUnmap(va_ + G, 2 * G));
  --mappings_before_;
}

// "Please note calling cuMemMap does not make the address accessible": a CPU touch of a
// mapping without cuMemSetAccess faults like a GPU fault would.
TEST_F(VmmMap, GrantsNoAccessUntilSetAccess) {
  THAW_SKIP_UNLESS_EMULATOR("touches device memory from the host");
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  EXPECT_DEATH({ Bytes(va)[0] = 1; }, "");
  EXPECT_DEATH({ (void)Bytes(va)[G - 1]; }, "");
  SetAccess(va, G);
  Bytes(va)[0] = 1;
  EXPECT_EQ(Bytes(va)[0], 1);
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
}

TEST_F(VmmMap, TwoMappingsOfOneAllocationSeeTheSameBytes) {
  CUmemGenericAllocationHandle h = Create(2 * G);
  CUdeviceptr a = Reserve(2 * G), b = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(a, 2 * G, 0, h, 0));
  ASSERT_CU_OK(cuMemMap(b, 2 * G, 0, h, 0));
  SetAccess(a, 2 * G);
  SetAccess(b, 2 * G);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G) << "a second mapping is not a second allocation");
  WritePattern(a, 2 * G, 21);
  EXPECT_EQ(CheckPattern(b, 2 * G, 21), -1);
  THAW_EMU_CHECK(Bytes(b)[G + 5] = 0x5a; EXPECT_EQ(Bytes(a)[G + 5], 0x5a));
  EXPECT_CU_OK(cuMemUnmap(a, 2 * G));
  EXPECT_CU_OK(cuMemUnmap(b, 2 * G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(a, 2 * G));
  EXPECT_CU_OK(cuMemAddressFree(b, 2 * G));
}

// The rule is "offset+size within the allocation". (cuda.h's parameter note
// "currently must be zero" predates the offset support that the same comment's alignment
// rule for offset describes; real drivers accept granularity-aligned offsets.)
TEST_F(VmmMap, NonZeroOffsetMapsThatPartOfTheAllocation) {
  Mapped whole = CreateMapped(3 * G);
  WritePattern(whole.va, 3 * G, 31);
  CUdeviceptr part = Reserve(G);
  ASSERT_CU_OK(cuMemMap(part, G, 2 * G, whole.handle, 0));
  SetAccess(part, G);
  EXPECT_EQ(CheckPattern(part, G, 31, 2 * G), -1) << "sees the third page";
  EXPECT_CU_OK(cuMemUnmap(part, G));
  EXPECT_CU_OK(cuMemAddressFree(part, G));
  Destroy(whole);
}

TEST_F(VmmMap, MapsIntoPartOfAReservationAndCountsAMapping) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(4 * G);
  unsigned long long before = DevStats().vmm_mappings;
  ASSERT_CU_OK(cuMemMap(va + 2 * G, G, 0, h, 0));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, before + 1));
  SetAccess(va + 2 * G, G);
  WritePattern(va + 2 * G, G, 41);
  EXPECT_EQ(CheckPattern(va + 2 * G, G, 41), -1);
  EXPECT_CU_OK(cuMemUnmap(va + 2 * G, G));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, before));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 4 * G));
}

// ---------------------------------------------------------------------------------------
// cuMemUnmap
// ---------------------------------------------------------------------------------------

// "The range must be the entire contiguous address range that was mapped to. In other
// words, cuMemUnmap cannot unmap a sub-range of an address range mapped by
// cuMemCreate / cuMemMap."
TEST_F(VmmUnmap, RejectsSubRangeOfAMapping) {
  Mapped m = CreateMapped(3 * G);
  WritePattern(m.va, 3 * G, 51);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va, G)) << "head";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va + G, G)) << "middle";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va + G, 2 * G)) << "tail";
  EXPECT_EQ(CheckPattern(m.va, 3 * G, 51), -1) << "the mapping is intact";
  Destroy(m);
}

TEST_F(VmmUnmap, RejectsRangeThatWasNeverMapped) {
  CUdeviceptr va = Reserve(2 * G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 2 * G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(0, G));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmUnmap, RejectsRangeExtendingBeyondTheMapping) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 2 * G));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, baseline_.vmm_mappings + 1));
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmUnmap, RejectsZeroSizeAndUnalignedRanges) {
  Mapped m = CreateMapped(G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va + 4096, G - 4096));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(m.va, G - 4096));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, baseline_.vmm_mappings + 1));
  Destroy(m);
}

TEST_F(VmmUnmap, RejectsSecondUnmap) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  ASSERT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
}

// Several whole mappings that are adjacent form one contiguous mapped range and can be
// unmapped by one call; allocations already released are freed by it.
TEST_F(VmmUnmap, UnmapsSeveralWholeAdjacentMappingsInOneCall) {
  CUdeviceptr va = Reserve(4 * G);
  CUmemGenericAllocationHandle a = Create(G), b = Create(2 * G), c = Create(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, a, 0));
  ASSERT_CU_OK(cuMemMap(va + G, 2 * G, 0, b, 0));
  ASSERT_CU_OK(cuMemMap(va + 3 * G, G, 0, c, 0));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, baseline_.vmm_mappings + 3));
  ASSERT_CU_OK(cuMemRelease(a));
  ASSERT_CU_OK(cuMemRelease(b));
  ASSERT_CU_OK(cuMemRelease(c));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 4 * G));
  ASSERT_CU_OK(cuMemUnmap(va, 4 * G));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_mappings, baseline_.vmm_mappings));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(va, 4 * G));
}

// "When cuMemUnmap returns successfully the address range is converted to an address
// reservation and can be used for a future calls to cuMemMap. Any new mapping to this
// virtual address will need to have access granted through cuMemSetAccess, as all
// mappings start with no accessibility setup."
TEST_F(VmmUnmap, RangeBecomesAReservationAgainWithNoAccess) {
  Mapped m = CreateMapped(G);
  ASSERT_CU_OK(cuMemUnmap(m.va, G));
  THAW_EMU_CHECK(EXPECT_DEATH({ (void)Bytes(m.va)[0]; }, "")
                 << "unmapped memory is not accessible");
  ASSERT_CU_OK(cuMemMap(m.va, G, 0, m.handle, 0));
  THAW_EMU_CHECK(EXPECT_DEATH({ Bytes(m.va)[0] = 7; }, "")
                 << "the new mapping starts without access");
  unsigned long long flags = 99;
  CUmemLocation loc = DeviceLocation();
  EXPECT_CU_OK(cuMemGetAccess(&flags, &loc, m.va));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  SetAccess(m.va, G);
  Destroy(m);
}

// ---------------------------------------------------------------------------------------
// cuMemSetAccess
// ---------------------------------------------------------------------------------------

TEST_F(VmmSetAccess, RejectsNullDescriptorAndZeroCount) {
  Mapped m = CreateMapped(G);
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, G, nullptr, 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, G, &desc, 0));
  Destroy(m);
}

TEST_F(VmmSetAccess, RejectsZeroSize) {
  Mapped m = CreateMapped(2 * G);
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, 0, &desc, 1));
  Destroy(m);
}

// "The range must be a fully mapped address range containing all allocations created by
// cuMemMap / cuMemCreate."
TEST_F(VmmSetAccess, RejectsRangeThatIsNotMapped) {
  CUdeviceptr va = Reserve(2 * G);
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 2 * G, &desc, 1));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(0, G, &desc, 1));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmSetAccess, RejectsRangeThatIsOnlyPartlyMapped) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 2 * G, &desc, 1));
  // The refused call granted nothing, not even on the mapped half.
  THAW_EMU_CHECK(EXPECT_DEATH({ Bytes(va)[0] = 1; }, ""));
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmSetAccess, RejectsInvalidDevice) {
  Mapped m = CreateMapped(G);
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 42);
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, cuMemSetAccess(m.va, G, &desc, 1));
  desc.location.id = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, cuMemSetAccess(m.va, G, &desc, 1));
  Destroy(m);
}

TEST_F(VmmSetAccess, RejectsInvalidLocationTypeAndFlags) {
  Mapped m = CreateMapped(G);
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  desc.location.type = CU_MEM_LOCATION_TYPE_INVALID;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, G, &desc, 1));
  desc = AccessDesc(static_cast<CUmemAccess_flags>(2));  // write-only is not a CUmemAccess_flags
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, G, &desc, 1));
  desc = AccessDesc(static_cast<CUmemAccess_flags>(0x10));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(m.va, G, &desc, 1));
  Destroy(m);
}

TEST_F(VmmSetAccess, ReadWriteAllowsCpuReadsAndWrites) {
  Mapped m = CreateMapped(4 * G);
  WritePattern(m.va, 4 * G, 61);
  EXPECT_EQ(CheckPattern(m.va, 4 * G, 61), -1);
  Destroy(m);
}

TEST_F(VmmSetAccess, ReadOnlyAllowsReadsAndFaultsWrites) {
  Mapped m = CreateMapped(G);
  WritePattern(m.va, G, 71);
  SetAccess(m.va, G, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_EQ(CheckPattern(m.va, G, 71), -1) << "reads still work";
  THAW_EMU_CHECK(EXPECT_DEATH({ Bytes(m.va)[100] = 1; }, ""));
  Destroy(m);
}

TEST_F(VmmSetAccess, ProtNoneRevokesAccess) {
  THAW_SKIP_UNLESS_EMULATOR("touches device memory from the host");
  Mapped m = CreateMapped(G);
  Bytes(m.va)[0] = 1;
  SetAccess(m.va, G, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  EXPECT_DEATH({ (void)Bytes(m.va)[0]; }, "");
  SetAccess(m.va, G);
  EXPECT_EQ(Bytes(m.va)[0], 1) << "revoking access keeps the bytes";
  Destroy(m);
}

TEST_F(VmmSetAccess, OneCallCoversSeveralAdjacentMappings) {
  CUdeviceptr va = Reserve(3 * G);
  CUmemGenericAllocationHandle a = Create(G), b = Create(2 * G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, a, 0));
  ASSERT_CU_OK(cuMemMap(va + G, 2 * G, 0, b, 0));
  SetAccess(va, 3 * G);
  WritePattern(va, 3 * G, 81);
  EXPECT_EQ(CheckPattern(va, 3 * G, 81), -1);
  EXPECT_CU_OK(cuMemUnmap(va, 3 * G));
  EXPECT_CU_OK(cuMemRelease(a));
  EXPECT_CU_OK(cuMemRelease(b));
  EXPECT_CU_OK(cuMemAddressFree(va, 3 * G));
}

// A driver write into mapped memory the device may not access is a device fault:
// CUDA_ERROR_ILLEGAL_ADDRESS, sticky for the context. A memset "exhibits asynchronous
// behavior for most use cases" (\note_memset), so the fault may surface at the memset or
// at the next synchronisation; from then on every call on the context reports it. A
// synchronous copy reports it at once. Run in a child: the context stays broken.
[[noreturn]] void NoAccessWriteChild(CUdeviceptr va) {
  ChildChecks check;
  CUresult memset = cuMemsetD8(va, 1, 4096);
  check.True(memset == CUDA_SUCCESS || memset == CUDA_ERROR_ILLEGAL_ADDRESS,
             "memset without access: SUCCESS (reported later) or ILLEGAL_ADDRESS");
  check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize(), "synchronize after the fault");
  check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize(), "the error is sticky");
  std::vector<uint8_t> bytes(64, 1);
  check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoD(va, bytes.data(), bytes.size()),
           "a later copy on the broken context");
  check.Exit();
}

[[noreturn]] void NoAccessCopyChild(CUdeviceptr va) {
  ChildChecks check;
  std::vector<uint8_t> bytes(64, 1);
  check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoD(va, bytes.data(), bytes.size()),
           "synchronous copy into a mapping without access");
  check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize(), "the error is sticky");
  check.Exit();
}

TEST_F(VmmSetAccess, DriverWriteWithoutAccessIsStickyIllegalAddress) {
  CUmemGenericAllocationHandle h = Create(G);
  CUdeviceptr va = Reserve(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  EXPECT_EXIT(NoAccessWriteChild(va), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(NoAccessCopyChild(va), ::testing::ExitedWithCode(0), "");
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
}

// Read-only access: "writes to this memory are considered invalid accesses" (doc of
// CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ); a driver write faults like a kernel's would.
TEST_F(VmmSetAccess, DriverWriteToReadOnlyMappingIsIllegalAddress) {
  Mapped m = CreateMapped(G);
  SetAccess(m.va, G, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_EXIT(
      {
        ChildChecks check;
        std::vector<uint8_t> bytes(64, 0xab);
        check.Cu(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoD(m.va, bytes.data(), bytes.size()),
                 "copy into read-only mapping");
        check.Exit();
      },
      ::testing::ExitedWithCode(0), "");
  std::vector<uint8_t> out(64, 0);
  EXPECT_CU_OK(cuMemcpyDtoH(out.data(), m.va, out.size())) << "reads through the driver work";
  Destroy(m);
}

// ---------------------------------------------------------------------------------------
// cuMemGetAccess
// ---------------------------------------------------------------------------------------

TEST_F(VmmGetAccess, ReportsTheFlagsLastSet) {
  CUmemGenericAllocationHandle h = Create(2 * G);
  CUdeviceptr va = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(va, 2 * G, 0, h, 0));
  CUmemLocation loc = DeviceLocation();
  unsigned long long flags = 99;
  ASSERT_CU_OK(cuMemGetAccess(&flags, &loc, va));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE) << "a mapping starts without access";
  SetAccess(va, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU_OK(cuMemGetAccess(&flags, &loc, va + G + 12345));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  SetAccess(va, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READ);
  ASSERT_CU_OK(cuMemGetAccess(&flags, &loc, va + 2 * G - 1));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_CU_OK(cuMemUnmap(va, 2 * G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmGetAccess, RejectsNullArguments) {
  Mapped m = CreateMapped(G);
  CUmemLocation loc = DeviceLocation();
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAccess(nullptr, &loc, m.va));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAccess(&flags, nullptr, m.va));
  Destroy(m);
}

TEST_F(VmmGetAccess, RejectsAddressThatIsNotMapped) {
  CUdeviceptr va = Reserve(G);
  CUmemLocation loc = DeviceLocation();
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAccess(&flags, &loc, va));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAccess(&flags, &loc, 0));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
}

TEST_F(VmmGetAccess, RejectsInvalidDevice) {
  Mapped m = CreateMapped(G);
  CUmemLocation loc = DeviceLocation(42);
  unsigned long long flags = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_DEVICE, cuMemGetAccess(&flags, &loc, m.va));
  Destroy(m);
}

// ---------------------------------------------------------------------------------------
// cuMemRetainAllocationHandle
// ---------------------------------------------------------------------------------------

// "The handle is guaranteed to be the same handle value used to map the memory." and
// "The address addr, can be any address in a range previously mapped by cuMemMap, and
// not necessarily the start address."
TEST_F(VmmRetain, AnyAddressInsideAMappingGivesTheMappedHandle) {
  Mapped m = CreateMapped(3 * G);
  for (CUdeviceptr addr : {m.va, m.va + 1, m.va + G + 12345, m.va + 3 * G - 1}) {
    CUmemGenericAllocationHandle got = 0;
    ASSERT_CU_OK(cuMemRetainAllocationHandle(&got, AsPtr(addr))) << Hex(addr - m.va);
    EXPECT_EQ(got, m.handle);
    EXPECT_CU_OK(cuMemRelease(got));
  }
  Destroy(m);
}

// "The returned handle must be released with corresponding number of calls to
// cuMemRelease."
TEST_F(VmmRetain, RetainedReferenceNeedsItsOwnRelease) {
  Mapped m = CreateMapped(G);
  unsigned long long refs = DevStats().vmm_handle_refs;
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU_OK(cuMemRetainAllocationHandle(&got, AsPtr(m.va + 100)));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_handle_refs, refs + 1));
  ASSERT_CU_OK(cuMemRelease(m.handle));
  ASSERT_CU_OK(cuMemUnmap(m.va, G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G) << "the retained reference keeps the allocation");
  CUdeviceptr again = m.va;
  ASSERT_CU_OK(cuMemMap(again, G, 0, got, 0)) << "the retained handle is usable";
  ASSERT_CU_OK(cuMemUnmap(again, G));
  ASSERT_CU_OK(cuMemRelease(got));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRelease(got)) << "no reference left";
  EXPECT_CU_OK(cuMemAddressFree(m.va, G));
}

// The guarantee holds also when the process released its own reference while the
// mapping lives on (PyTorch's expandable segments retain from the address to find the
// handle again): the value retained is still the one the memory was mapped with.
TEST_F(VmmRetain, AfterReleaseWhileMappedGivesTheHandleValueUsedToMap) {
  Mapped m = CreateMapped(G);
  ASSERT_CU_OK(cuMemRelease(m.handle));
  CUmemGenericAllocationHandle got = 0;
  ASSERT_CU_OK(cuMemRetainAllocationHandle(&got, AsPtr(m.va + 64)));
  EXPECT_EQ(got, m.handle) << "the handle is guaranteed to be the same handle value used to "
                              "map the memory";
  EXPECT_CU_OK(cuMemUnmap(m.va, G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G) << "the retained reference holds the memory");
  EXPECT_CU_OK(cuMemRelease(got));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(m.va, G));
}

TEST_F(VmmRetain, RejectsNullOutput) {
  Mapped m = CreateMapped(G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(nullptr, AsPtr(m.va)));
  Destroy(m);
}

// "If the address requested is not mapped, the function will fail."
TEST_F(VmmRetain, RejectsAddressThatIsNotMapped) {
  CUdeviceptr va = Reserve(2 * G);
  CUmemGenericAllocationHandle h = Create(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&got, AsPtr(va + G)))
      << "reserved, not mapped";
  int local = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&got, &local))
      << "host stack memory";
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&got, nullptr));
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&got, AsPtr(va)))
      << "after unmap";
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmRetain, RejectsLegacyAllocation) {
  CUdeviceptr p = 0;
  ASSERT_CU_OK(cuMemAlloc(&p, G));
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&got, AsPtr(p)));
  EXPECT_CU_OK(cuMemFree(p));
}

// ---------------------------------------------------------------------------------------
// cuMemGetAllocationPropertiesFromHandle
// ---------------------------------------------------------------------------------------

TEST_F(VmmProperties, ReportTheCreationProperties) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemGenericAllocationHandle plain = Create(G);
  CUmemAllocationProp got{};
  ASSERT_CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(got.location.id, 0);
  EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ASSERT_CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, plain));
  EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemRelease(plain));
}

TEST_F(VmmProperties, RejectNullOutput) {
  CUmemGenericAllocationHandle h = Create(G);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAllocationPropertiesFromHandle(nullptr, h));
  EXPECT_CU_OK(cuMemRelease(h));
}

TEST_F(VmmProperties, RejectInvalidOrReleasedHandle) {
  CUmemAllocationProp got{};
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAllocationPropertiesFromHandle(&got, 0));
  CUmemGenericAllocationHandle h = Create(G);
  ASSERT_CU_OK(cuMemRelease(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE, cuMemGetAllocationPropertiesFromHandle(&got, h));
}

// ---------------------------------------------------------------------------------------
// cuMemExportToShareableHandle
// ---------------------------------------------------------------------------------------

TEST_F(VmmExport, GivesANewDescriptorEachCallAndChangesNoAccounting) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ThawEmuDeviceStats before = DevStats();
  int fd1 = -1, fd2 = -1;
  ASSERT_CU_OK(cuMemExportToShareableHandle(&fd1, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_CU_OK(cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_GE(fd1, 0);
  EXPECT_GE(fd2, 0);
  EXPECT_NE(fd1, fd2);
  EXPECT_NE(fcntl(fd1, F_GETFD), -1) << "a real, open descriptor";
  ThawEmuDeviceStats after = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use));
  THAW_EMU_CHECK(EXPECT_EQ(after.vmm_handle_refs, before.vmm_handle_refs));
  EXPECT_EQ(close(fd1), 0) << "the caller owns the descriptor";
  EXPECT_EQ(close(fd2), 0);
  EXPECT_CU_OK(cuMemRelease(h));
}

TEST_F(VmmExport, RejectsNullOutputAndNonZeroFlags) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(nullptr, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1));
  EXPECT_EQ(fd, -1);
  EXPECT_CU_OK(cuMemRelease(h));
}

TEST_F(VmmExport, RejectsInvalidOrReleasedHandle) {
  int fd = -1;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ASSERT_CU_OK(cuMemRelease(h));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

// An allocation can be exported only as a type requested at creation (requestedHandleTypes;
// vLLM's sleep-mode allocations, created without one, cannot be exported). cuda.h does not
// name the code; INVALID_VALUE, NOT_PERMITTED and NOT_SUPPORTED are the listed ones that fit.
TEST_F(VmmExport, RejectsTypeNotRequestedAtCreation) {
  CUmemGenericAllocationHandle plain = Create(G);
  int fd = -1;
  EXPECT_CU_ONE_OF(
      cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(fd, -1);
  CUmemGenericAllocationHandle posix = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemFabricHandle fabric{};
  EXPECT_CU_ONE_OF(cuMemExportToShareableHandle(&fabric, posix, CU_MEM_HANDLE_TYPE_FABRIC, 0),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED);
  void* win32 = nullptr;
  EXPECT_CU_ONE_OF(cuMemExportToShareableHandle(&win32, posix, CU_MEM_HANDLE_TYPE_WIN32, 0),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemExportToShareableHandle(&fd, posix, CU_MEM_HANDLE_TYPE_NONE, 0));
  EXPECT_CU_OK(cuMemRelease(plain));
  EXPECT_CU_OK(cuMemRelease(posix));
}

// ---------------------------------------------------------------------------------------
// cuMemImportFromShareableHandle
// ---------------------------------------------------------------------------------------

// Importing an export gives a handle to the same memory: not a new allocation, but a
// reference of its own that "needs to pair it with cuMemRelease".
TEST_F(VmmImport, ImportedHandleSharesTheMemoryAndNeedsItsOwnRelease) {
  Mapped m = CreateMapped(2 * G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  WritePattern(m.va, 2 * G, 91);
  int fd = -1;
  ASSERT_CU_OK(
      cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ThawEmuDeviceStats before = DevStats();
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU_OK(cuMemImportFromShareableHandle(&imported, AsOsHandle(fd),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  EXPECT_EQ(close(fd), 0) << "import does not take the descriptor";
  ThawEmuDeviceStats after = DevStats();
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use) << "same memory");
  THAW_EMU_CHECK(EXPECT_EQ(after.physical_allocations, before.physical_allocations)
                 << "same allocation");
  THAW_EMU_CHECK(EXPECT_EQ(after.vmm_handle_refs, before.vmm_handle_refs + 1));

  CUdeviceptr other = Reserve(2 * G);
  ASSERT_CU_OK(cuMemMap(other, 2 * G, 0, imported, 0));
  SetAccess(other, 2 * G);
  EXPECT_EQ(CheckPattern(other, 2 * G, 91), -1);
  Destroy(m);
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G) << "the imported reference and its mapping remain");
  EXPECT_EQ(CheckPattern(other, 2 * G, 91), -1);
  ASSERT_CU_OK(cuMemUnmap(other, 2 * G));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 2 * G) << "the imported reference remains");
  ASSERT_CU_OK(cuMemRelease(imported));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(other, 2 * G));
}

TEST_F(VmmImport, SameDescriptorImportedTwiceGivesTwoReferences) {
  Mapped m = CreateMapped(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  WritePattern(m.va, G, 101);
  int fd = -1;
  ASSERT_CU_OK(
      cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle a = 0, b = 0;
  ASSERT_CU_OK(
      cuMemImportFromShareableHandle(&a, AsOsHandle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ASSERT_CU_OK(
      cuMemImportFromShareableHandle(&b, AsOsHandle(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_handle_refs, baseline_.vmm_handle_refs + 3));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G));
  Destroy(m);
  ASSERT_CU_OK(cuMemRelease(a));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), G) << "the second import still holds the memory");
  CUdeviceptr va = Reserve(G);
  ASSERT_CU_OK(cuMemMap(va, G, 0, b, 0));
  SetAccess(va, G);
  EXPECT_EQ(CheckPattern(va, G, 101), -1);
  ASSERT_CU_OK(cuMemUnmap(va, G));
  ASSERT_CU_OK(cuMemRelease(b));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
}

TEST_F(VmmImport, ImportedHandleReportsTheExportersProperties) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  ASSERT_CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_CU_OK(cuMemImportFromShareableHandle(&imported, AsOsHandle(fd),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUmemAllocationProp got{};
  ASSERT_CU_OK(cuMemGetAllocationPropertiesFromHandle(&got, imported));
  EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(got.location.id, 0);
  EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_CU_OK(cuMemRelease(imported));
  EXPECT_CU_OK(cuMemRelease(h));
}

TEST_F(VmmImport, RejectsNullOutput) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  ASSERT_CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemImportFromShareableHandle(nullptr, AsOsHandle(fd),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  EXPECT_CU_OK(cuMemRelease(h));
}

TEST_F(VmmImport, RejectsClosedOrNegativeDescriptor) {
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemImportFromShareableHandle(&got, AsOsHandle(-1),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  int closed = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(closed, 0);
  close(closed);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemImportFromShareableHandle(&got, AsOsHandle(closed),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_handle_refs, baseline_.vmm_handle_refs));
}

// A descriptor that is not an emulator export (a file, a pipe, a memfd someone else made)
// describes no allocation: refused (INVALID_VALUE, or NOT_SUPPORTED: "If the current
// process cannot support the memory described by this shareable handle"), nothing made.
TEST_F(VmmImport, RejectsDescriptorThatIsNotAnExport) {
  CUmemGenericAllocationHandle got = 0;
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  EXPECT_CU_ONE_OF(cuMemImportFromShareableHandle(&got, AsOsHandle(null_fd),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED)
      << "/dev/null";
  close(null_fd);
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  EXPECT_CU_ONE_OF(cuMemImportFromShareableHandle(&got, AsOsHandle(pipe_fds[0]),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED)
      << "pipe";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  int foreign = memfd_create("not-from-the-driver", MFD_CLOEXEC);
  ASSERT_GE(foreign, 0);
  ASSERT_EQ(ftruncate(foreign, static_cast<off_t>(G)), 0);
  EXPECT_CU_ONE_OF(cuMemImportFromShareableHandle(&got, AsOsHandle(foreign),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED)
      << "foreign memfd";
  close(foreign);
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_handle_refs, baseline_.vmm_handle_refs));
  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));
}

TEST_F(VmmImport, RejectsUnsupportedHandleTypes) {
  CUmemGenericAllocationHandle h = Create(G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  ASSERT_CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle got = 0;
  EXPECT_CU_ONE_OF(cuMemImportFromShareableHandle(&got, AsOsHandle(fd), CU_MEM_HANDLE_TYPE_WIN32),
                   CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_INVALID_VALUE);
  CUmemFabricHandle fabric{};
  EXPECT_CU_ONE_OF(cuMemImportFromShareableHandle(&got, &fabric, CU_MEM_HANDLE_TYPE_FABRIC),
                   CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(CUDA_ERROR_INVALID_VALUE,
            cuMemImportFromShareableHandle(&got, AsOsHandle(fd), CU_MEM_HANDLE_TYPE_NONE));
  close(fd);
  THAW_EMU_CHECK(EXPECT_EQ(DevStats().vmm_handle_refs, baseline_.vmm_handle_refs + 1));
  EXPECT_CU_OK(cuMemRelease(h));
}

// ---------------------------------------------------------------------------------------
// cuMemGetAddressRange and cuPointerGetAttribute on VMM memory
// ---------------------------------------------------------------------------------------

// Reads an attribute of any width up to 8 bytes into a zeroed little-endian buffer.
uint64_t PointerAttribute(CUpointer_attribute attr, CUdeviceptr p, CUresult* rc) {
  unsigned char buf[16] = {};
  *rc = cuPointerGetAttribute(buf, attr, p);
  uint64_t v = 0;
  std::memcpy(&v, buf, sizeof v);
  return v;
}

// CU_POINTER_ATTRIBUTE_RANGE_SIZE: "To retrieve the size of the mapped region, see
// cuMemGetAddressRange" — for VMM memory, cuMemGetAddressRange answers the mapping.
TEST_F(VmmPointerQueries, AddressRangeOfAVmmPointerIsItsMapping) {
  CUdeviceptr va = Reserve(8 * G);
  CUmemGenericAllocationHandle h = Create(4 * G);
  ASSERT_CU_OK(cuMemMap(va + 2 * G, 4 * G, 0, h, 0));
  SetAccess(va + 2 * G, 4 * G);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU_OK(cuMemGetAddressRange(&base, &size, va + 3 * G + 17));
  EXPECT_EQ(base, va + 2 * G);
  EXPECT_EQ(size, 4 * G);
  ASSERT_CU_OK(cuMemGetAddressRange(nullptr, &size, va + 2 * G)) << "pbase is optional";
  EXPECT_EQ(size, 4 * G);
  EXPECT_CU_OK(cuMemUnmap(va + 2 * G, 4 * G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 8 * G));
}

TEST_F(VmmPointerQueries, AddressRangeOfReservedButUnmappedAddressFails) {
  CUdeviceptr va = Reserve(2 * G);
  CUdeviceptr base = 0;
  size_t size = 0;
  // cuda.h lists CUDA_ERROR_NOT_FOUND and CUDA_ERROR_INVALID_VALUE for a pointer that is
  // not inside an allocation without saying which applies here.
  EXPECT_CU_ONE_OF(cuMemGetAddressRange(&base, &size, va), CUDA_ERROR_NOT_FOUND,
                   CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU_OK(cuMemAddressFree(va, 2 * G));
}

TEST_F(VmmPointerQueries, CoreAttributesOfVmmMemory) {
  CUdeviceptr va = Reserve(8 * G);
  CUmemGenericAllocationHandle h = Create(2 * G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ASSERT_CU_OK(cuMemMap(va + 4 * G, 2 * G, 0, h, 0));
  SetAccess(va + 4 * G, 2 * G);
  CUdeviceptr p = va + 5 * G + 3;
  CUresult rc;
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, &rc), CU_MEMORYTYPE_DEVICE);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p, &rc), p);
  EXPECT_CU_OK(rc);
  // "Note that this is not necessarily the address of the mapped region, but the address
  // of the mappable address range ptr references (e.g. from cuMemAddressReserve)."
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p, &rc), va);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_RANGE_SIZE, p, &rc), 8 * G);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p, &rc), 0u);
  EXPECT_CU_OK(rc);
  EXPECT_CU_OK(cuMemUnmap(va + 4 * G, 2 * G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 8 * G));
}

TEST_F(VmmPointerQueries, MappingAndHandleAttributesOfVmmMemory) {
  CUdeviceptr va = Reserve(8 * G);
  CUmemGenericAllocationHandle h = Create(2 * G, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ASSERT_CU_OK(cuMemMap(va + 4 * G, 2 * G, 0, h, 0));
  SetAccess(va + 4 * G, 2 * G);
  CUdeviceptr p = va + 5 * G + 3;
  CUresult rc;
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_MAPPED, p, &rc) & 0xff, 1u);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p, &rc), va + 4 * G);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p, &rc), 2 * G);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p, &rc),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p, &rc) & 0xff, 0u)
      << "VMM memory cannot be shared with cuIpcGetMemHandle";
  EXPECT_CU_OK(rc);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p, &rc),
            CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
  EXPECT_CU_OK(rc);
  SetAccess(va + 4 * G, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READ);
  EXPECT_EQ(PointerAttribute(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, p, &rc),
            CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ);
  EXPECT_CU_OK(rc);
  EXPECT_CU_OK(cuMemUnmap(va + 4 * G, 2 * G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, 8 * G));
}

// ---------------------------------------------------------------------------------------
// VMM calls need cuInit but no current context
// ---------------------------------------------------------------------------------------

TEST_F(VmmContextFree, FullRoundTripWorksWithoutACurrentContext) {
  ASSERT_CU_OK(cuCtxSetCurrent(nullptr));
  CUmemAllocationProp prop = DeviceProp(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t g = 0;
  EXPECT_CU_OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0;
  ASSERT_CU_OK(cuMemCreate(&h, G, &prop, 0));
  CUdeviceptr va = 0;
  ASSERT_CU_OK(cuMemAddressReserve(&va, G, 0, 0, 0));
  ASSERT_CU_OK(cuMemMap(va, G, 0, h, 0));
  CUmemAccessDesc desc = AccessDesc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_CU_OK(cuMemSetAccess(va, G, &desc, 1));
  // The bytes only on the emulator: a driver copy would need the context this test goes without.
  THAW_EMU_CHECK(WritePattern(va, G, 111); EXPECT_EQ(CheckPattern(va, G, 111), -1));
  int fd = -1;
  EXPECT_CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  if (fd >= 0) close(fd);
  EXPECT_CU_OK(cuMemUnmap(va, G));
  EXPECT_CU_OK(cuMemRelease(h));
  EXPECT_CU_OK(cuMemAddressFree(va, G));
  EXPECT_CU_OK(cuCtxSetCurrent(ctx_));
}

}  // namespace
}  // namespace thaw_vmm_test
