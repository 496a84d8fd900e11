// Non-VMM memory of the emulated CUDA driver: cuMemAlloc/cuMemFree, cuMemGetInfo,
// cuMemGetAddressRange, pinned host memory, memsets, memcpys and pointer attributes.
//
// Rules come from CUDA 13's cuda.h (quoted where subtle); where it is silent the
// emulator's design decides, and the comment says so. Tests that need a particular
// THAW_EMU_* configuration run in a fresh process (thaw::test::run_in_fresh_process) so the suite
// also passes when run as one process.
#include <cuda.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::vector<unsigned char> Pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) & 0xff);
  return v;
}

// The emulator's counters; zeros on a real driver, where every check that reads them is left
// out (THAW_EMU_CHECK).
ThawEmuDeviceStats DeviceStats(int device = 0) {
  ThawEmuDeviceStats s{};
  if (!thaw::test::on_emulator()) return s;
  THAW_EMU_CHECK(EXPECT_EQ(thawEmuGetDeviceStats(device, &s), CUDA_SUCCESS));
  return s;
}

unsigned long long PinnedRanges() {
  ThawEmuProcessStats s{};
  if (!thaw::test::on_emulator()) return 0;
  THAW_EMU_CHECK(EXPECT_EQ(thawEmuGetProcessStats(&s), CUDA_SUCCESS));
  return s.pinned_host_ranges;
}

size_t FreeMemory() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  return free;
}

// The primary context of device 0, current for the test; releasing it afterwards frees
// whatever a failed test left behind.
class MemoryTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGet(&dev_, 0), CUDA_SUCCESS);
    thaw::test::clear_context_stack();
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, dev_), CUDA_SUCCESS);
    retained_ = true;
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    thaw::test::clear_context_stack();
    if (retained_) cuDevicePrimaryCtxRelease(dev_);
  }

  CUdeviceptr Alloc(size_t n) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, n), CUDA_SUCCESS);
    return p;
  }
  std::vector<unsigned char> Read(CUdeviceptr p, size_t n) {
    std::vector<unsigned char> v(n, 0xee);
    EXPECT_EQ(cuMemcpyDtoH(v.data(), p, n), CUDA_SUCCESS);
    return v;
  }
  void Write(CUdeviceptr p, const std::vector<unsigned char>& v) {
    ASSERT_EQ(cuMemcpyHtoD(p, v.data(), v.size()), CUDA_SUCCESS);
  }
  CUstream Stream() {
    CUstream s = nullptr;
    EXPECT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return s;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  bool retained_ = false;
};

// ---------------------------------------------------------------------------------------
// cuMemAlloc / cuMemFree / cuMemGetInfo
// ---------------------------------------------------------------------------------------

// cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE."
TEST_F(MemoryTest, AllocOfZeroBytesIsInvalidValue) {
  const auto before = DeviceStats();
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc(nullptr, 4096), CUDA_ERROR_INVALID_VALUE);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats().legacy_allocations, before.legacy_allocations));
}

TEST_F(MemoryTest, AllocReturnsDistinctWritableAlignedMemory) {
  CUdeviceptr a = Alloc(1000), b = Alloc(1000);
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  EXPECT_NE(a, b);
  // "The allocated memory is suitably aligned for any kind of variable."
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 256, 0u);
  const auto data = Pattern(1000, 1);
  Write(a, data);
  EXPECT_EQ(Read(a, 1000), data);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

TEST_F(MemoryTest, GetInfoTotalIsTheDeviceMemory) {
  size_t free = 0, total = 0, device_total = 0;
  ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  ASSERT_EQ(cuDeviceTotalMem(&device_total, dev_), CUDA_SUCCESS);
  EXPECT_EQ(total, device_total);
  EXPECT_LE(free, total);
  EXPECT_EQ(cuMemGetInfo(nullptr, &total), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemGetInfo(&free, nullptr), CUDA_ERROR_INVALID_VALUE);
}

// The emulated device keeps an exact ledger: an allocation takes at least its size (at
// most one 2 MiB page more) from cuMemGetInfo's free memory, and cuMemFree gives it back.
TEST_F(MemoryTest, AllocTakesFromFreeMemoryAndFreeGivesItBack) {
  const size_t free0 = FreeMemory();
  const auto stats0 = DeviceStats();
  CUdeviceptr p = Alloc(64 * kMiB);
  const size_t free1 = FreeMemory();
  EXPECT_GE(free0 - free1, 64 * kMiB);
  EXPECT_LE(free0 - free1, 66 * kMiB);
  const auto stats1 = DeviceStats();
  THAW_EMU_CHECK(EXPECT_EQ(stats1.legacy_allocations, stats0.legacy_allocations + 1));
  THAW_EMU_CHECK(EXPECT_EQ(stats1.device_bytes_in_use - stats0.device_bytes_in_use, free0 - free1));
  THAW_EMU_CHECK(
      EXPECT_EQ(stats1.process_bytes_in_use - stats0.process_bytes_in_use, free0 - free1));
  ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(FreeMemory(), free0);
  const auto stats2 = DeviceStats();
  THAW_EMU_CHECK(EXPECT_EQ(stats2.legacy_allocations, stats0.legacy_allocations));
  THAW_EMU_CHECK(EXPECT_EQ(stats2.device_bytes_in_use, stats0.device_bytes_in_use));
}

TEST_F(MemoryTest, AllocLargerThanTheDeviceIsOutOfMemory) {
  size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem(&total, dev_), CUDA_SUCCESS);
  const auto before = DeviceStats();
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, total + 2 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAlloc(&p, ~size_t{0} - 4096), CUDA_ERROR_OUT_OF_MEMORY);
  const auto after = DeviceStats();
  THAW_EMU_CHECK(EXPECT_EQ(after.legacy_allocations, before.legacy_allocations));
  THAW_EMU_CHECK(EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use));
}

// Out of memory is reported, never overcommitted: with 64 MiB of device memory, the
// allocations that succeed never add up to more than 64 MiB.
TEST(MemoryLimits, AllocationsBeyondDeviceMemoryAreOutOfMemory) {
  THAW_SKIP_UNLESS_EMULATOR("sizes the device with THAW_EMU_DEVICE_MEMORY");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);

    CUdeviceptr big = 0, second = 0;
    ASSERT_EQ(cuMemAlloc(&big, 40 * kMiB), CUDA_SUCCESS);
    ThawEmuDeviceStats before{};
    ASSERT_EQ(thawEmuGetDeviceStats(0, &before), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAlloc(&second, 40 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
    ThawEmuDeviceStats after{};
    ASSERT_EQ(thawEmuGetDeviceStats(0, &after), CUDA_SUCCESS);
    EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use);
    EXPECT_EQ(after.legacy_allocations, before.legacy_allocations);
    ASSERT_EQ(cuMemFree(big), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc(&second, 40 * kMiB), CUDA_SUCCESS) << "freed memory is usable again";
    ASSERT_EQ(cuMemFree(second), CUDA_SUCCESS);

    std::vector<CUdeviceptr> pages;
    CUresult r = CUDA_SUCCESS;
    while (pages.size() < 64) {
      CUdeviceptr p = 0;
      r = cuMemAlloc(&p, 2 * kMiB);
      if (r != CUDA_SUCCESS) break;
      pages.push_back(p);
    }
    EXPECT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_LE(pages.size(), 32u) << "more than 64 MiB handed out";
    EXPECT_GE(pages.size(), 28u) << "the device lost memory somewhere";
    size_t free = 0, total = 0;
    ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
    EXPECT_LT(free, 2 * kMiB);
    EXPECT_EQ(total, 64 * kMiB);
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// The device is shared by every process using the same state directory, as a real GPU
// is: another process's allocations count against this one's, and a process that dies
// gives back what it held.
TEST(MemoryLimits, OtherProcessesAllocationsCountAndDieWithThem) {
  THAW_SKIP_UNLESS_EMULATOR("sizes the device with THAW_EMU_DEVICE_MEMORY");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
    int go[2], done[2];
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(done), 0);
    pid_t child = fork();  // before cuInit: the child initialises its own driver
    ASSERT_GE(child, 0);
    if (child == 0) {
      char c;
      if (read(go[0], &c, 1) != 1) _exit(10);
      if (cuInit(0) != CUDA_SUCCESS) _exit(11);
      CUcontext ctx = nullptr;
      if (cuCtxCreate(&ctx, nullptr, 0, 0) != CUDA_SUCCESS) _exit(12);
      CUdeviceptr p = 0;
      // The parent holds 40 MiB of the 64: this one cannot have 40 more.
      if (cuMemAlloc(&p, 40 * kMiB) != CUDA_ERROR_OUT_OF_MEMORY) _exit(13);
      if (cuMemAlloc(&p, 16 * kMiB) != CUDA_SUCCESS) _exit(14);
      if (write(done[1], "x", 1) != 1) _exit(15);
      if (read(go[0], &c, 1) != 1) _exit(16);
      _exit(0);  // dies holding 16 MiB
    }
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
    CUdeviceptr held = 0, p = 0;
    ASSERT_EQ(cuMemAlloc(&held, 40 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(write(go[1], "x", 1), 1);
    char c;
    ASSERT_EQ(read(done[0], &c, 1), 1);
    // 40 here + 16 there: 8 MiB left.
    EXPECT_EQ(cuMemAlloc(&p, 16 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free = 0, total = 0;
    ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
    EXPECT_LE(free, 8 * kMiB);
    ASSERT_EQ(write(go[1], "x", 1), 1);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
    EXPECT_GE(free, 24 * kMiB) << "the dead process's 16 MiB were not given back";
    EXPECT_EQ(cuMemAlloc(&p, 16 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// cuMemFree: dptr "must have been returned by a previous call to" an allocation API.
TEST_F(MemoryTest, FreeTwiceIsInvalidValue) {
  CUdeviceptr p = Alloc(4096);
  ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(MemoryTest, FreeOfAnInteriorPointerIsInvalidValueAndFreesNothing) {
  const auto before = DeviceStats();
  CUdeviceptr p = Alloc(4 * kMiB);
  EXPECT_EQ(cuMemFree(p + 4096), CUDA_ERROR_INVALID_VALUE);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats().legacy_allocations, before.legacy_allocations + 1));
  const auto data = Pattern(4096, 3);
  Write(p + 4096, data);  // still allocated and usable
  EXPECT_EQ(Read(p + 4096, 4096), data);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

TEST_F(MemoryTest, FreeOfMemoryNotFromCuMemAllocIsInvalidValue) {
  std::vector<unsigned char> host(4096);
  EXPECT_EQ(cuMemFree(reinterpret_cast<CUdeviceptr>(host.data())), CUDA_ERROR_INVALID_VALUE);
  void* pinned = nullptr;
  ASSERT_EQ(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(reinterpret_cast<CUdeviceptr>(pinned)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// cuMemGetAddressRange
// ---------------------------------------------------------------------------------------

// "Returns the base address in *pbase and size in *psize of the allocation by
// cuMemAlloc() ... that contains the input pointer dptr. Both parameters pbase and psize
// are optional."
TEST_F(MemoryTest, AddressRangeOfAnInteriorPointer) {
  CUdeviceptr p = Alloc(4 * kMiB);
  for (size_t offset : {size_t{0}, size_t{1}, size_t{12345}, 4 * kMiB - 1}) {
    CUdeviceptr base = 0;
    size_t size = 0;
    ASSERT_EQ(cuMemGetAddressRange(&base, &size, p + offset), CUDA_SUCCESS) << offset;
    EXPECT_EQ(base, p) << offset;
    EXPECT_EQ(size, 4 * kMiB) << offset;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  EXPECT_EQ(cuMemGetAddressRange(&base, nullptr, p + 77), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_EQ(cuMemGetAddressRange(nullptr, &size, p + 77), CUDA_SUCCESS);
  EXPECT_EQ(size, 4 * kMiB);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

TEST_F(MemoryTest, AddressRangeOfAnOddSizedAllocationCoversIt) {
  CUdeviceptr p = Alloc(1000);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(cuMemGetAddressRange(&base, &size, p + 999), CUDA_SUCCESS);
  EXPECT_EQ(base, p);
  EXPECT_GE(size, 1000u);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// cuda.h lists both CUDA_ERROR_NOT_FOUND and CUDA_ERROR_INVALID_VALUE without saying which
// answers a pointer outside every allocation; either is an error, never a made-up range.
TEST_F(MemoryTest, AddressRangeOfAPointerOutsideAllocationsIsAnError) {
  CUdeviceptr p = Alloc(4 * kMiB);
  ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
  std::vector<unsigned char> host(64);
  for (CUdeviceptr q : {p, reinterpret_cast<CUdeviceptr>(host.data())}) {
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult r = cuMemGetAddressRange(&base, &size, q);
    EXPECT_TRUE(r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_INVALID_VALUE) << r;
  }
}

// ---------------------------------------------------------------------------------------
// Pinned host memory
// ---------------------------------------------------------------------------------------

// cuMemHostAlloc: "All of these flags are orthogonal to one another".
TEST_F(MemoryTest, HostAllocAcceptsEachDocumentedFlagCombination) {
  const auto ranges = PinnedRanges();
  for (unsigned int flags = 0; flags < 8; ++flags) {
    void* p = nullptr;
    ASSERT_EQ(cuMemHostAlloc(&p, 64 * 1024, flags), CUDA_SUCCESS) << "flags " << flags;
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5a, 64 * 1024);  // host memory: the CPU may touch it
    THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges + 1));
    EXPECT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
    THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
  }
}

TEST_F(MemoryTest, HostAllocRejectsUnknownFlagsAndNullOutput) {
  const auto ranges = PinnedRanges();
  void* p = nullptr;
  EXPECT_EQ(cuMemHostAlloc(&p, 4096, 0x8), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostAlloc(&p, 4096, 0x80000000u), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostAlloc(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAllocHost(nullptr, 4096), CUDA_ERROR_INVALID_VALUE);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
}

TEST_F(MemoryTest, AllocHostGivesWritablePinnedMemory) {
  const auto ranges = PinnedRanges();
  void* p = nullptr;
  ASSERT_EQ(cuMemAllocHost(&p, 1 * kMiB), CUDA_SUCCESS);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x11, 1 * kMiB);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges + 1));
  EXPECT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
}

// cuMemFreeHost: p "must have been returned by a previous call to cuMemAllocHost()".
TEST_F(MemoryTest, FreeHostOfAnythingElseIsInvalidValue) {
  void* p = nullptr;
  ASSERT_EQ(cuMemAllocHost(&p, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE) << "double free";
  std::vector<unsigned char> pageable(4096);
  EXPECT_EQ(cuMemFreeHost(pageable.data()), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr d = Alloc(4096);
  EXPECT_EQ(cuMemFreeHost(reinterpret_cast<void*>(d)), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(d), CUDA_SUCCESS);
}

// Page-aligned anonymous memory for cuMemHostRegister.
struct HostPages {
  explicit HostPages(size_t n) : size(n) {
    ptr = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~HostPages() { munmap(ptr, size); }
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr); }
  void* ptr;
  size_t size;
};

// cuMemHostRegister lists CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; cuMemHostUnregister
// lists CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.
TEST_F(MemoryTest, HostRegisterAndUnregister) {
  HostPages pages(256 * 1024);
  const auto ranges = PinnedRanges();
  ASSERT_EQ(cuMemHostRegister(pages.ptr, pages.size, 0), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges + 1));
  EXPECT_EQ(cuMemHostRegister(pages.ptr, pages.size, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(cuMemHostRegister(pages.bytes() + 4096, 8192, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
      << "a range overlapping a registered one";
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges + 1));
  ASSERT_EQ(cuMemHostUnregister(pages.ptr), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

TEST_F(MemoryTest, HostUnregisterOfMemoryNeverRegisteredIsNotRegistered) {
  HostPages pages(64 * 1024);
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

// cuMemHostUnregister: "The base address must be the same one specified to
// cuMemHostRegister()." An interior pointer names no registration.
TEST_F(MemoryTest, HostUnregisterNeedsTheBaseAddress) {
  HostPages pages(64 * 1024);
  ASSERT_EQ(cuMemHostRegister(pages.ptr, pages.size, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(pages.bytes() + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_SUCCESS);
}

TEST_F(MemoryTest, HostRegisterRejectsBadArguments) {
  HostPages pages(64 * 1024);
  const auto ranges = PinnedRanges();
  EXPECT_EQ(cuMemHostRegister(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(pages.ptr, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostRegister(pages.ptr, pages.size, 0x100), CUDA_ERROR_INVALID_VALUE);
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
}

TEST_F(MemoryTest, HostRegisterAcceptsPortableAndDeviceMap) {
  HostPages pages(64 * 1024);
  ASSERT_EQ(cuMemHostRegister(pages.ptr, pages.size,
                              CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
            CUDA_SUCCESS);
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_SUCCESS);
}

// cuMemHostGetDevicePointer: "Passes back the device pointer ... corresponding to the
// mapped, pinned host buffer p allocated by cuMemHostAlloc"; with unified addressing and
// without WRITECOMBINED the device pointer "is always equal to the returned host pointer".
TEST_F(MemoryTest, HostGetDevicePointerOfMappedHostAllocIsUsable) {
  void* p = nullptr;
  ASSERT_EQ(cuMemHostAlloc(&p, 64 * 1024, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  ASSERT_EQ(cuMemHostGetDevicePointer(&d, p, 0), CUDA_SUCCESS);
  EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(p));
  // Interior pointers map to the same offset.
  CUdeviceptr interior = 0;
  ASSERT_EQ(cuMemHostGetDevicePointer(&interior, static_cast<char*>(p) + 100, 0), CUDA_SUCCESS);
  EXPECT_EQ(interior, d + 100);
  // The device pointer is valid for the driver's copies.
  const auto data = Pattern(4096, 9);
  ASSERT_EQ(cuMemcpyHtoD(d, data.data(), data.size()), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(p, data.data(), data.size()), 0);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
}

// "Flags provides for future releases. For now, it must be set to 0."
TEST_F(MemoryTest, HostGetDevicePointerRejectsFlagsAndUnknownMemory) {
  void* p = nullptr;
  ASSERT_EQ(cuMemHostAlloc(&p, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  EXPECT_EQ(cuMemHostGetDevicePointer(&d, p, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemHostGetDevicePointer(nullptr, p, 0), CUDA_ERROR_INVALID_VALUE);
  std::vector<unsigned char> pageable(4096);
  EXPECT_EQ(cuMemHostGetDevicePointer(&d, pageable.data(), 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
}

// cuMemHostRegister: "If all devices visible to the application have a non-zero value for
// [CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM], the device pointer returned by
// cuMemHostGetDevicePointer() will match the original pointer".
TEST_F(MemoryTest, HostGetDevicePointerOfRegisteredMemory) {
  HostPages pages(64 * 1024);
  ASSERT_EQ(cuMemHostRegister(pages.ptr, pages.size, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
  CUdeviceptr d = 0;
  ASSERT_EQ(cuMemHostGetDevicePointer(&d, pages.ptr, 0), CUDA_SUCCESS);
  int same = 0;
  ASSERT_EQ(cuDeviceGetAttribute(&same, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                                 dev_),
            CUDA_SUCCESS);
  if (same) {
    EXPECT_EQ(d, reinterpret_cast<CUdeviceptr>(pages.ptr));
  }
  std::memset(pages.ptr, 0x42, 4096);
  std::vector<unsigned char> out(4096);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), d, out.size()), CUDA_SUCCESS);
  EXPECT_EQ(out, std::vector<unsigned char>(4096, 0x42));
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// Memsets
// ---------------------------------------------------------------------------------------

// Each memset writes exactly N elements and nothing around them.
TEST_F(MemoryTest, MemsetsWriteExactlyTheirRange) {
  CUdeviceptr p = Alloc(4096);
  ASSERT_EQ(cuMemsetD8(p, 0, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8(p + 1, 0xab, 3), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD16(p + 8, 0x1234, 3), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32(p + 32, 0xdeadbeef, 2), CUDA_SUCCESS);
  const auto got = Read(p, 64);
  std::vector<unsigned char> want(64, 0);
  want[1] = want[2] = want[3] = 0xab;
  for (int i = 0; i < 3; ++i) {
    uint16_t v = 0x1234;
    std::memcpy(&want[8 + 2 * i], &v, 2);
  }
  for (int i = 0; i < 2; ++i) {
    uint32_t v = 0xdeadbeef;
    std::memcpy(&want[32 + 4 * i], &v, 4);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

TEST_F(MemoryTest, AsyncMemsetsCompleteOnTheirStream) {
  CUdeviceptr p = Alloc(1 * kMiB);
  CUstream s = Stream();
  ASSERT_EQ(cuMemsetD8Async(p, 0x01, 1 * kMiB, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD16Async(p + 1024, 0x0202, 8, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32Async(p + 2048, 0x03030303, 8, s), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  auto got = Read(p, 4096);
  std::vector<unsigned char> want(4096, 0x01);
  std::fill(want.begin() + 1024, want.begin() + 1040, 0x02);
  std::fill(want.begin() + 2048, want.begin() + 2080, 0x03);
  EXPECT_EQ(got, want);
  // The legacy default stream too.
  ASSERT_EQ(cuMemsetD32Async(p, 0x04040404, 1024, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(Read(p, 4096), std::vector<unsigned char>(4096, 0x04));
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// cuMemsetD16: "The dstDevice pointer must be two byte aligned"; cuMemsetD32: "must be
// four byte aligned".
TEST_F(MemoryTest, MisalignedMemsetsAreInvalidValue) {
  CUdeviceptr p = Alloc(4096);
  ASSERT_EQ(cuMemsetD8(p, 0, 4096), CUDA_SUCCESS);
  CUstream s = Stream();
  EXPECT_EQ(cuMemsetD16(p + 1, 0xffff, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32(p + 2, 0xffffffff, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32(p + 1, 0xffffffff, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD16Async(p + 1, 0xffff, 4, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32Async(p + 2, 0xffffffff, 4, s), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(Read(p, 64), std::vector<unsigned char>(64, 0)) << "a rejected memset wrote";
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// A memset that runs past the end of its allocation is rejected whole, before writing.
TEST_F(MemoryTest, MemsetsPastTheEndOfAnAllocationAreInvalidValue) {
  CUdeviceptr p = Alloc(4096);
  ASSERT_EQ(cuMemsetD8(p, 0, 4096), CUDA_SUCCESS);
  CUstream s = Stream();
  EXPECT_EQ(cuMemsetD8(p + 4090, 0xff, 7), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD16(p + 4090, 0xffff, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32(p + 4088, 0xffffffff, 3), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD8Async(p + 4090, 0xff, 7, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32Async(p + 4088, 0xffffffff, 3, s), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(Read(p + 4032, 64), std::vector<unsigned char>(64, 0));
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// Design: a pointer that is not device memory at all is CUDA_ERROR_INVALID_VALUE.
TEST_F(MemoryTest, MemsetsOfMemoryThatIsNotDeviceMemoryAreInvalidValue) {
  std::vector<unsigned char> pageable(4096, 0);
  const auto host = reinterpret_cast<CUdeviceptr>(pageable.data());
  EXPECT_EQ(cuMemsetD8(host, 0xff, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32(host, 0xffffffff, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pageable, std::vector<unsigned char>(4096, 0));
  CUdeviceptr freed = Alloc(4096);
  ASSERT_EQ(cuMemFree(freed), CUDA_SUCCESS);
  EXPECT_EQ(cuMemsetD8(freed, 0xff, 16), CUDA_ERROR_INVALID_VALUE);
}

// ---------------------------------------------------------------------------------------
// Copies
// ---------------------------------------------------------------------------------------

TEST_F(MemoryTest, SynchronousCopiesMoveTheBytes) {
  const size_t n = 3 * kMiB + 17;
  CUdeviceptr a = Alloc(n), b = Alloc(n);
  const auto data = Pattern(n, 5);
  ASSERT_EQ(cuMemcpyHtoD(a, data.data(), n), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoD(b, a, n), CUDA_SUCCESS);
  std::vector<unsigned char> out(n, 0);
  ASSERT_EQ(cuMemcpyDtoH(out.data(), b, n), CUDA_SUCCESS);
  EXPECT_EQ(out, data);
  // Interior offsets.
  std::vector<unsigned char> part(1000, 0);
  ASSERT_EQ(cuMemcpyDtoH(part.data(), b + 12345, part.size()), CUDA_SUCCESS);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + 12345));
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

// cuMemcpy "infers the type of the transfer ... from the pointer values" (unified
// addressing): host-to-device, device-to-device, device-to-host and host-to-host.
TEST_F(MemoryTest, GenericCopyInfersTheDirection) {
  const size_t n = 64 * 1024;
  CUdeviceptr a = Alloc(n), b = Alloc(n);
  const auto data = Pattern(n, 6);
  std::vector<unsigned char> out(n, 0), out2(n, 0);
  ASSERT_EQ(cuMemcpy(a, reinterpret_cast<CUdeviceptr>(data.data()), n), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpy(b, a, n), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), b, n), CUDA_SUCCESS);
  EXPECT_EQ(out, data);
  ASSERT_EQ(cuMemcpy(reinterpret_cast<CUdeviceptr>(out2.data()),
                     reinterpret_cast<CUdeviceptr>(out.data()), n),
            CUDA_SUCCESS);
  EXPECT_EQ(out2, data);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

TEST_F(MemoryTest, AsyncCopiesCompleteOnTheirStream) {
  const size_t n = 2 * kMiB + 5;
  CUdeviceptr a = Alloc(n), b = Alloc(n), c = Alloc(n);
  const auto data = Pattern(n, 7);
  void* pinned = nullptr;
  ASSERT_EQ(cuMemAllocHost(&pinned, n), CUDA_SUCCESS);
  std::memcpy(pinned, data.data(), n);
  std::vector<unsigned char> out(n, 0), out2(n, 0);
  CUstream s = Stream();
  ASSERT_EQ(cuMemcpyHtoDAsync(a, pinned, n, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoDAsync(b, a, n, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyAsync(c, b, n, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(out.data(), c, n, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(out2.data()), a, n, s), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(out, data);
  EXPECT_EQ(out2, data);
  // Pageable source on the legacy default stream.
  const auto data2 = Pattern(n, 8);
  ASSERT_EQ(cuMemcpyHtoDAsync(a, data2.data(), n, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoHAsync(out.data(), a, n, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(out, data2);
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);
  for (CUdeviceptr p : {a, b, c}) EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// A copy whose range runs past the end of its allocation is rejected before it moves a
// byte (the same rule for every synchronous and asynchronous form).
TEST_F(MemoryTest, CopiesCrossingTheEndOfAnAllocationAreInvalidValue) {
  const size_t n = 4096;
  CUdeviceptr a = Alloc(n), b = Alloc(n);
  ASSERT_EQ(cuMemsetD8(a, 0, n), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8(b, 0, n), CUDA_SUCCESS);
  std::vector<unsigned char> host(2 * n, 0xff);
  CUstream s = Stream();
  const CUdeviceptr a_tail = a + n - 10, b_tail = b + n - 10;
  EXPECT_EQ(cuMemcpyHtoD(a_tail, host.data(), 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(host.data(), a_tail, 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoD(b_tail, a, 20), CUDA_ERROR_INVALID_VALUE) << "destination crosses";
  EXPECT_EQ(cuMemcpyDtoD(b, a_tail, 20), CUDA_ERROR_INVALID_VALUE) << "source crosses";
  EXPECT_EQ(cuMemcpy(b_tail, a, 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpy(b, a_tail, 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoD(a, host.data(), n + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyHtoDAsync(a_tail, host.data(), 20, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoHAsync(host.data(), a_tail, 20, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoDAsync(b_tail, a, 20, s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyAsync(b_tail, a, 20, s), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(Read(a + n - 64, 64), std::vector<unsigned char>(64, 0)) << "a rejected copy wrote";
  EXPECT_EQ(Read(b + n - 64, 64), std::vector<unsigned char>(64, 0)) << "a rejected copy wrote";
  EXPECT_EQ(host, std::vector<unsigned char>(2 * n, 0xff)) << "a rejected copy wrote";
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

// Design: a device-side pointer that is not device memory (freed, or plain host memory
// handed to a DtoX/XtoD copy) is CUDA_ERROR_INVALID_VALUE.
TEST_F(MemoryTest, CopiesNamingMemoryThatIsNotDeviceMemoryAreInvalidValue) {
  CUdeviceptr live = Alloc(4096), freed = Alloc(4096);
  ASSERT_EQ(cuMemFree(freed), CUDA_SUCCESS);
  std::vector<unsigned char> host(4096, 0);
  const auto host_as_device = reinterpret_cast<CUdeviceptr>(host.data());
  EXPECT_EQ(cuMemcpyHtoD(freed, host.data(), 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(host.data(), freed, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoD(live, freed, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoD(host_as_device, live, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemcpyDtoH(host.data(), host_as_device + 64, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(live), CUDA_SUCCESS);
}

TEST_F(MemoryTest, AsyncCopyOnADestroyedStreamIsInvalidHandle) {
  THAW_SKIP_UNLESS_EMULATOR("a destroyed stream's handle is undefined on a real driver");
  CUdeviceptr p = Alloc(4096);
  std::vector<unsigned char> host(4096, 1);
  CUstream s = Stream();
  ASSERT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoDAsync(p, host.data(), host.size(), s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemsetD8Async(p, 0, 16, s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// Pointer attributes
// ---------------------------------------------------------------------------------------

TEST_F(MemoryTest, PointerAttributesOfDeviceMemory) {
  CUdeviceptr p = Alloc(4 * kMiB);
  const CUdeviceptr q = p + 5000;
  unsigned int type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, q), CUDA_SUCCESS);
  EXPECT_EQ(ctx, ctx_);
  CUdeviceptr dptr = 0;
  ASSERT_EQ(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q), CUDA_SUCCESS);
  EXPECT_EQ(dptr, q);
  CUdeviceptr start = 0;
  ASSERT_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q), CUDA_SUCCESS);
  EXPECT_EQ(start, p);
  size_t size = 0;
  ASSERT_EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q), CUDA_SUCCESS);
  EXPECT_EQ(size, 4 * kMiB);
  int ordinal = -1;
  ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, 0);
  // HOST_POINTER: "If there exists no host pointer value through which the host program
  // may directly access ptr then CUDA_ERROR_INVALID_VALUE is returned." Device memory has
  // none on a real GPU, so code that dereferences it on the host must not be encouraged.
  void* host = nullptr;
  EXPECT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, q),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// cuMemAllocHost: the device pointer "is always equal to the returned host pointer".
TEST_F(MemoryTest, PointerAttributesOfPinnedHostMemory) {
  void* p = nullptr;
  ASSERT_EQ(cuMemAllocHost(&p, 64 * 1024), CUDA_SUCCESS);
  const auto q = reinterpret_cast<CUdeviceptr>(p) + 100;
  unsigned int type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  void* host = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, q), CUDA_SUCCESS);
  EXPECT_EQ(host, reinterpret_cast<void*>(q));
  CUdeviceptr dptr = 0;
  ASSERT_EQ(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q), CUDA_SUCCESS);
  EXPECT_EQ(dptr, q);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, q), CUDA_SUCCESS);
  EXPECT_EQ(ctx, ctx_);
  EXPECT_EQ(cuMemFreeHost(p), CUDA_SUCCESS);
}

TEST_F(MemoryTest, PointerAttributesOfRegisteredHostMemory) {
  HostPages pages(64 * 1024);
  ASSERT_EQ(cuMemHostRegister(pages.ptr, pages.size, 0), CUDA_SUCCESS);
  const auto q = reinterpret_cast<CUdeviceptr>(pages.bytes() + 8);
  unsigned int type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  void* host = nullptr;
  ASSERT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, q), CUDA_SUCCESS);
  EXPECT_EQ(host, reinterpret_cast<void*>(q));
  EXPECT_EQ(cuMemHostUnregister(pages.ptr), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q),
            CUDA_ERROR_INVALID_VALUE)
      << "still known after cuMemHostUnregister";
}

// cuPointerGetAttribute: "If ptr was not allocated by, mapped by, or registered with a
// CUcontext which uses unified virtual addressing then CUDA_ERROR_INVALID_VALUE is
// returned."
TEST_F(MemoryTest, PointerAttributeOfUnknownOrFreedMemoryIsInvalidValue) {
  std::vector<unsigned char> pageable(64);
  CUdeviceptr freed = Alloc(4096);
  ASSERT_EQ(cuMemFree(freed), CUDA_SUCCESS);
  for (CUdeviceptr q : {reinterpret_cast<CUdeviceptr>(pageable.data()), freed}) {
    unsigned int type = 0;
    CUcontext ctx = nullptr;
    EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, q),
              CUDA_ERROR_INVALID_VALUE);
  }
}

TEST_F(MemoryTest, PointerAttributeRejectsBadArguments) {
  CUdeviceptr p = Alloc(4096);
  EXPECT_EQ(cuPointerGetAttribute(nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
            CUDA_ERROR_INVALID_VALUE);
  unsigned long long v = 0;
  EXPECT_EQ(cuPointerGetAttribute(&v, static_cast<CUpointer_attribute>(30), p),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// cuPointerGetAttributes: "Unlike cuPointerGetAttribute, this function will not return an
// error when the ptr encountered is not a valid CUDA pointer. Instead, the attributes are
// assigned default NULL values and CUDA_SUCCESS is returned."
TEST_F(MemoryTest, PointerAttributesOfAnUnknownPointerAreNullDefaults) {
  std::vector<unsigned char> pageable(64);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  CUcontext ctx = reinterpret_cast<CUcontext>(0x1);
  unsigned int type = 77;
  CUdeviceptr dptr = 0x1234;
  void* host = reinterpret_cast<void*>(0x5678);
  void* data[] = {&ctx, &type, &dptr, &host};
  ASSERT_EQ(cuPointerGetAttributes(4, attrs, data, reinterpret_cast<CUdeviceptr>(pageable.data())),
            CUDA_SUCCESS);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(dptr, 0u);
  EXPECT_EQ(host, nullptr);
}

TEST_F(MemoryTest, PointerAttributesAgreeWithTheSingleQueries) {
  CUdeviceptr p = Alloc(6 * kMiB);
  const CUdeviceptr q = p + 3 * kMiB;
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_CONTEXT,        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
      CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE,     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  CUcontext ctx = nullptr;
  unsigned int type = 0;
  CUdeviceptr dptr = 0, start = 0;
  size_t size = 0;
  int ordinal = -1;
  void* data[] = {&ctx, &type, &dptr, &start, &size, &ordinal};
  ASSERT_EQ(cuPointerGetAttributes(6, attrs, data, q), CUDA_SUCCESS);
  EXPECT_EQ(ctx, ctx_);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(dptr, q);
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, 6 * kMiB);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(cuPointerGetAttributes(6, attrs, nullptr, q), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuPointerGetAttributes(6, nullptr, data, q), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// DEVICE_ORDINAL: "a device ordinal of a device against which the memory was allocated";
// CONTEXT: "the CUcontext in which ptr was allocated".
TEST(PointerAttributes, NameTheDeviceAndContextOfTheAllocation) {
  THAW_SKIP_UNLESS_EMULATOR("makes a second device with THAW_EMU_DEVICES");
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_DEVICES", "2", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext c1 = nullptr, c0 = nullptr;
    ASSERT_EQ(cuCtxCreate(&c1, nullptr, 0, 1), CUDA_SUCCESS);
    CUdeviceptr p = 0;
    ASSERT_EQ(cuMemAlloc(&p, 4 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxCreate(&c0, nullptr, 0, 0), CUDA_SUCCESS);  // another context is current
    int ordinal = -1;
    ASSERT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
              CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 1);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
    EXPECT_EQ(ctx, c1);
    EXPECT_EQ(cuCtxDestroy(c0), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxDestroy(c1), CUDA_SUCCESS);
  });
}

// ---------------------------------------------------------------------------------------
// Context destruction
// ---------------------------------------------------------------------------------------

// cuCtxDestroy cleans up "memory allocations by cuMemAlloc(), cuMemAllocHost()"; other
// contexts' allocations are untouched.
TEST_F(MemoryTest, DestroyingAContextFreesOnlyItsMemory) {
  const auto before = DeviceStats();
  const auto ranges = PinnedRanges();
  const size_t free0 = FreeMemory();
  CUdeviceptr keep = Alloc(2 * kMiB);  // in the primary context
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxCreate(&ctx, nullptr, 0, dev_), CUDA_SUCCESS);
  std::vector<CUdeviceptr> gone;
  for (int i = 0; i < 3; ++i) gone.push_back(Alloc(4 * kMiB));
  void* host = nullptr;
  ASSERT_EQ(cuMemAllocHost(&host, 4096), CUDA_SUCCESS);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats().legacy_allocations, before.legacy_allocations + 4));
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges + 1));

  ASSERT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);  // pops it: the primary is current again
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats().legacy_allocations, before.legacy_allocations + 1));
  THAW_EMU_CHECK(EXPECT_EQ(PinnedRanges(), ranges));
  unsigned int type = 0;
  for (CUdeviceptr p : gone) {
    EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
              CUDA_ERROR_INVALID_VALUE);
  }
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, keep), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  ASSERT_EQ(cuMemFree(keep), CUDA_SUCCESS);
  EXPECT_EQ(FreeMemory(), free0);
  THAW_EMU_CHECK(EXPECT_EQ(DeviceStats().device_bytes_in_use, before.device_bytes_in_use));
}

}  // namespace
