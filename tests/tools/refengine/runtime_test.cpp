// The reference engine's runtime (tools/refengine/driver.* and allocator.*) on the emulator.
//
// The engine loads the driver itself (REFENGINE_LIBCUDA = the emulator's libcuda.so.1, set by
// the suite's ENV); this suite does not link the emulator. What the emulator holds is read
// through thaw/emu_inspect.h's thawEmuGetDeviceStats/thawEmuGetProcessStats, resolved from the
// library the engine loaded: the engine itself never sees them.
//
// Scenarios that need their own driver configuration (a trace file, a small device) run in a
// freshly executed process (EXPECT_EXIT, death test style "threadsafe"), so the suite also
// passes when run as one process.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "allocator.hpp"
#include "driver.hpp"
#include "thaw/emu_inspect.h"

namespace {

using refengine::CachingAllocator;
using refengine::Driver;
using refengine::DriverError;
using refengine::OutOfMemory;
using Mode = refengine::CachingAllocator::Mode;

constexpr std::size_t kMiB = 1 << 20;

// The driver with device 0's primary context current, as the engine sets itself up.
struct Engine {
  Driver d;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Engine() {
    d.check(d.init(0), "cuInit");
    d.check(d.device_get(&dev, 0), "cuDeviceGet");
    d.check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    d.check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  }
  ~Engine() { (void)d.primary_ctx_release(dev); }
};

// The emulator's inspection entry points, from the library the engine loaded.
void* EmuSymbol(const char* name) {
  const char* path = std::getenv("REFENGINE_LIBCUDA");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  return h ? dlsym(h, name) : nullptr;
}

ThawEmuDeviceStats DeviceStats() {
  auto f = reinterpret_cast<int (*)(int, ThawEmuDeviceStats*)>(EmuSymbol("thawEmuGetDeviceStats"));
  ThawEmuDeviceStats s{};
  EXPECT_NE(f, nullptr) << "thawEmuGetDeviceStats not found in $REFENGINE_LIBCUDA";
  if (f != nullptr) {
    EXPECT_EQ(f(0, &s), 0);
  }
  return s;
}

ThawEmuProcessStats ProcessStats() {
  auto f = reinterpret_cast<int (*)(ThawEmuProcessStats*)>(EmuSymbol("thawEmuGetProcessStats"));
  ThawEmuProcessStats s{};
  EXPECT_NE(f, nullptr) << "thawEmuGetProcessStats not found in $REFENGINE_LIBCUDA";
  if (f != nullptr) {
    EXPECT_EQ(f(&s), 0);
  }
  return s;
}

// Writes `n` bytes of a pattern to `p` and reads them back through the driver.
bool RoundTrip(Engine& e, CUdeviceptr p, std::size_t n, unsigned char seed) {
  std::vector<unsigned char> in(n), out(n, 0);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(seed + i * 7);
  if (e.d.memcpy_htod(p, in.data(), n) != CUDA_SUCCESS) return false;
  if (e.d.memcpy_dtoh(out.data(), p, n) != CUDA_SUCCESS) return false;
  return in == out;
}

std::string StateFile(const char* name) {
  const char* dir = std::getenv("THAW_EMU_STATE_DIR");
  return (std::filesystem::path(dir ? dir : "/tmp") / name).string();
}

// ---- Driver ------------------------------------------------------------------------------

TEST(RefengineDriver, LoadsTheLibraryNamedByRefengineLibcuda) {
  Driver d;
  ASSERT_NE(std::getenv("REFENGINE_LIBCUDA"), nullptr);
  EXPECT_EQ(d.source(), std::getenv("REFENGINE_LIBCUDA"));
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(d.mem_alloc), &info), 0);
  EXPECT_TRUE(std::filesystem::equivalent(info.dli_fname, std::getenv("REFENGINE_LIBCUDA")));
  d.check(d.init(0), "cuInit");
  int version = 0;
  d.check(d.driver_get_version(&version), "cuDriverGetVersion");
  EXPECT_GE(version, Driver::kCudaVersion);
}

TEST(RefengineDriver, ResolvesCurrentAbiAndPerThreadVariants) {
  Driver d;
  void* lib = EmuSymbol("cuInit");  // make sure the handle lookup works at all
  ASSERT_NE(lib, nullptr);
  auto same = [](void* fn, const char* symbol) { return fn == EmuSymbol(symbol); };
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.mem_alloc), "cuMemAlloc_v2"));
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.memcpy_htod_async), "cuMemcpyHtoDAsync_v2_ptsz"));
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.memcpy_htod), "cuMemcpyHtoD_v2_ptds"));
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.stream_synchronize), "cuStreamSynchronize_ptsz"));
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.launch_kernel), "cuLaunchKernel_ptsz"));
  EXPECT_TRUE(
      same(reinterpret_cast<void*>(d.stream_begin_capture), "cuStreamBeginCapture_v2_ptsz"));
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.graph_launch), "cuGraphLaunch_ptsz"));
  // Calls without a stream have no per-thread variant.
  EXPECT_TRUE(same(reinterpret_cast<void*>(d.mem_create), "cuMemCreate"));
}

TEST(RefengineDriver, CheckThrowsWithTheErrorNameAndString) {
  Driver d;
  EXPECT_NO_THROW(d.check(CUDA_SUCCESS, "cuInit"));
  try {
    d.check(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 5 bytes");
    FAIL() << "no exception";
  } catch (const DriverError& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_INVALID_VALUE);
    std::string what = e.what();
    EXPECT_EQ(what.rfind("cuMemAlloc of 5 bytes: CUDA_ERROR_INVALID_VALUE (", 0), 0u) << what;
    EXPECT_EQ(what.back(), ')') << what;
  }
}

TEST(RefengineDriver, MissingLibraryIsAClearError) {
  std::string saved = std::getenv("REFENGINE_LIBCUDA");
  setenv("REFENGINE_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  try {
    Driver d;
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libcuda.so.1"), std::string::npos)
        << e.what();
  }
  setenv("REFENGINE_LIBCUDA", saved.c_str(), 1);
}

// The trace of a fresh process: every entry point came through cuGetProcAddress with version
// 12080 and flags CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2), and the copies and
// memsets it made on streams were the per-thread variants ("ptds": true).
TEST(RefengineDriver, TraceShowsProcAddressAt12080PerThreadAndPtdsCopies) {
  std::string trace = StateFile("refengine-runtime-trace.jsonl");
  EXPECT_EXIT(
      {
        std::filesystem::remove(trace);
        setenv("THAW_EMU_TRACE", trace.c_str(), 1);
        Engine e;
        CUstream s = nullptr;
        e.d.check(e.d.stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        CUdeviceptr p = 0;
        e.d.check(e.d.mem_alloc(&p, 4096), "cuMemAlloc");
        std::vector<char> host(4096, 'x');
        e.d.check(e.d.memcpy_htod_async(p, host.data(), host.size(), s), "cuMemcpyHtoDAsync");
        e.d.check(e.d.memset_d32_async(p, 7, 16, s), "cuMemsetD32Async");
        e.d.check(e.d.memcpy_dtoh_async(host.data(), p, host.size(), s), "cuMemcpyDtoHAsync");
        e.d.check(e.d.stream_synchronize(s), "cuStreamSynchronize");
        e.d.check(e.d.memcpy_dtoh(host.data(), p, 16), "cuMemcpyDtoH");
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
  std::ifstream in(trace);
  ASSERT_TRUE(in) << "no trace at " << trace;
  std::set<std::string> resolved;
  int copies = 0, memsets = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    std::string call = j.at("call");
    const auto& args = j.at("args");
    if (call == "cuGetProcAddress") {
      EXPECT_EQ(args.at("version"), Driver::kCudaVersion) << line;
      EXPECT_EQ(args.at("flags"), 2) << line;  // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
      resolved.insert(args.at("symbol").get<std::string>());
    } else if (call.starts_with("cuMemcpy")) {
      ++copies;
      EXPECT_EQ(args.value("ptds", false), true) << line;
    } else if (call.starts_with("cuMemset")) {
      ++memsets;
      EXPECT_EQ(args.value("ptds", false), true) << line;
    }
  }
  EXPECT_EQ(copies, 3);
  EXPECT_EQ(memsets, 1);
  // Not "cuInit": the engine resolves it first, and the emulator leaves the first driver call
  // of a process out of the trace (api() builds its Call before config() opens the trace file;
  // reported to the lead).
  for (const char* s : {"cuDriverGetVersion", "cuMemAlloc", "cuMemcpyHtoDAsync",
                        "cuStreamSynchronize", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                        "cuGraphLaunch", "cuStreamBeginCapture", "cuMemExportToShareableHandle"}) {
    EXPECT_TRUE(resolved.contains(s)) << s << " was not resolved through cuGetProcAddress";
  }
}

// ---- Caching allocator, default mode ---------------------------------------------------

TEST(RefengineAllocator, RoundsTo512AndSizesSegmentsLikePyTorch) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::allocation_size(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::allocation_size(11 * kMiB + 512), 12 * kMiB);
}

TEST(RefengineAllocator, FreedBlockIsReusedOnTheSameStream) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr p = a.allocate(1000);
  ASSERT_NE(p, 0u);
  EXPECT_TRUE(RoundTrip(e, p, 1000, 1));
  a.free(p);
  auto before = DeviceStats();
  EXPECT_EQ(a.allocate(1000), p);
  EXPECT_EQ(DeviceStats().legacy_allocations, before.legacy_allocations);  // no new segment
  EXPECT_EQ(a.stats().allocated_bytes, 1024u);
}

TEST(RefengineAllocator, SmallRequestsSplitOneTwoMiBSegment) {
  Engine e;
  auto before = DeviceStats();
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr p = a.allocate(1000);
  CUdeviceptr q = a.allocate(4096);
  CUdeviceptr r = a.allocate(kMiB);
  EXPECT_EQ(q, p + 1024);
  EXPECT_EQ(r, q + 4096);
  auto after = DeviceStats();
  EXPECT_EQ(after.legacy_allocations - before.legacy_allocations, 1u);
  EXPECT_EQ(after.process_bytes_in_use - before.process_bytes_in_use, 2 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(a.stats().segments, 1u);
  EXPECT_EQ(a.stats().allocated_bytes, 1024 + 4096 + kMiB);
  EXPECT_TRUE(RoundTrip(e, r, kMiB, 3));
}

TEST(RefengineAllocator, LargeRequestBelowTenMiBGetsA20MiBSegmentItShares) {
  Engine e;
  auto before = DeviceStats();
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr p = a.allocate(3 * kMiB);
  CUdeviceptr q = a.allocate(2 * kMiB);
  EXPECT_EQ(q, p + 3 * kMiB);
  auto after = DeviceStats();
  EXPECT_EQ(after.legacy_allocations - before.legacy_allocations, 1u);
  EXPECT_EQ(after.process_bytes_in_use - before.process_bytes_in_use, 20 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * kMiB);
}

TEST(RefengineAllocator, LargeRequestFromTenMiBGetsASegmentRoundedTo2MiB) {
  Engine e;
  std::size_t free0 = 0, free1 = 0, total = 0;
  e.d.check(e.d.mem_get_info(&free0, &total), "cuMemGetInfo");
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  a.allocate(11 * kMiB + 1);
  e.d.check(e.d.mem_get_info(&free1, &total), "cuMemGetInfo");
  EXPECT_EQ(free0 - free1, 12 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 12 * kMiB);
}

TEST(RefengineAllocator, LargeBlockSplitsOnlyWhenMoreThanOneMiBRemains) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  a.allocate(19 * kMiB);  // a 20 MiB segment, exactly 1 MiB left: not split
  EXPECT_EQ(a.stats().allocated_bytes, 20 * kMiB);
  a.allocate(3 * kMiB);  // another 20 MiB segment, 17 MiB left: split
  EXPECT_EQ(a.stats().allocated_bytes, 23 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 40 * kMiB);
  a.allocate(17 * kMiB);  // the split-off rest
  EXPECT_EQ(a.stats().reserved_bytes, 40 * kMiB);
}

TEST(RefengineAllocator, SmallAndLargePoolsDoNotShareSegments) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  a.free(a.allocate(512));                 // a cached 2 MiB small segment
  CUdeviceptr big = a.allocate(2 * kMiB);  // large: never from the small pool
  EXPECT_EQ(a.stats().segments, 2u);
  EXPECT_EQ(a.stats().reserved_bytes, 22 * kMiB);
  a.free(big);
  CUdeviceptr small = a.allocate(512);  // small: from the small segment, not the cached 20 MiB
  EXPECT_EQ(a.stats().segments, 2u);
  EXPECT_NE(small, big);
}

TEST(RefengineAllocator, BestFitPicksTheSmallestFreeBlockThatFits) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr x = a.allocate(8192);
  CUdeviceptr guard1 = a.allocate(512);
  CUdeviceptr y = a.allocate(2048);
  CUdeviceptr guard2 = a.allocate(512);
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.allocate(2000), y);
  EXPECT_EQ(a.allocate(4096), x);
  (void)guard1;
  (void)guard2;
}

TEST(RefengineAllocator, FreedNeighboursMerge) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr p = a.allocate(1024);
  CUdeviceptr q = a.allocate(1024);
  CUdeviceptr r = a.allocate(1024);
  a.free(p);
  a.free(r);
  a.free(q);  // joins both neighbours and the segment's free rest
  // One free block covers the whole segment again: two 1 MiB blocks from its start.
  EXPECT_EQ(a.allocate(kMiB), p);
  EXPECT_EQ(a.allocate(kMiB), p + kMiB);
  EXPECT_EQ(a.stats().segments, 1u);
}

TEST(RefengineAllocator, CachedBlocksStayWithTheirStream) {
  Engine e;
  CUstream s = nullptr;
  e.d.check(e.d.stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  {
    CachingAllocator a(e.d, e.dev, Mode::kDefault);
    CUdeviceptr p = a.allocate(1000, nullptr);
    a.free(p);
    CUdeviceptr q = a.allocate(1000, s);
    EXPECT_NE(q, p);
    EXPECT_EQ(a.stats().segments, 2u);
    a.free(q);
    EXPECT_EQ(a.allocate(1000, s), q);
  }
  e.d.check(e.d.stream_destroy(s), "cuStreamDestroy");
}

TEST(RefengineAllocator, EmptyCacheReturnsFreeSegmentsAndKeepsUsedOnes) {
  Engine e;
  auto before = DeviceStats();
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  std::vector<CUdeviceptr> ptrs;
  for (std::size_t sz : {512ul, 3 * kMiB, 11 * kMiB, 40 * kMiB}) ptrs.push_back(a.allocate(sz));
  CUdeviceptr kept = a.allocate(kMiB);
  for (auto p : ptrs) a.free(p);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 2 * kMiB);  // the small segment holding `kept`
  a.free(kept);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().segments, 0u);
  auto after = DeviceStats();
  EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use);
  EXPECT_EQ(after.legacy_allocations, before.legacy_allocations);
}

TEST(RefengineAllocator, DestructorReturnsEverything) {
  Engine e;
  auto before = DeviceStats();
  {
    CachingAllocator a(e.d, e.dev, Mode::kDefault);
    a.allocate(5000);
    a.allocate(30 * kMiB);
  }
  EXPECT_EQ(DeviceStats().process_bytes_in_use, before.process_bytes_in_use);
}

TEST(RefengineAllocator, FreeOfAForeignPointerThrows) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kDefault);
  CUdeviceptr p = a.allocate(4096);
  EXPECT_THROW(a.free(p + 512), std::invalid_argument);
  a.free(p);
  EXPECT_THROW(a.free(p), std::invalid_argument);  // double free
}

// A small device: the second segment does not fit, the error names the request and the
// limits, and the allocator retries after returning its cache.
TEST(RefengineAllocator, OutOfMemoryIsReportedCleanlyAndCacheIsReturnedFirst) {
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
        Engine e;
        CachingAllocator a(e.d, e.dev, Mode::kDefault);
        CUdeviceptr p = a.allocate(40 * kMiB);
        try {
          a.allocate(40 * kMiB);
          std::fprintf(stderr, "no exception\n");
          std::exit(1);
        } catch (const OutOfMemory& oom) {
          std::fprintf(stderr, "%s\n", oom.what());
        }
        a.free(p);
        // 50 MiB does not fit beside the cached 40 MiB segment: empty the cache, retry.
        CUdeviceptr q = a.allocate(50 * kMiB);
        std::exit(q != 0 && a.stats().reserved_bytes == 50 * kMiB ? 0 : 2);
      },
      testing::ExitedWithCode(0),
      "CUDA out of memory: tried to allocate 40.00 MiB \\(41943040 bytes\\); device total 64.00 "
      "MiB.*40.00 MiB reserved, 40.00 MiB allocated.*CUDA_ERROR_OUT_OF_MEMORY");
}

// ---- Caching allocator, expandable segments ----------------------------------------------

TEST(RefengineExpandable, ReservesOneAndAnEighthOfDeviceMemoryOnce) {
  Engine e;
  std::size_t total = 0;
  e.d.check(e.d.device_total_mem(&total, e.dev), "cuDeviceTotalMem");
  auto p0 = ProcessStats();
  CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
  a.allocate(1000);
  a.allocate(5 * kMiB);
  auto p1 = ProcessStats();
  std::size_t want = (total + total / 8 + 20 * kMiB - 1) / (20 * kMiB) * (20 * kMiB);
  EXPECT_EQ(p1.reservations - p0.reservations, 1u);
  EXPECT_EQ(p1.reserved_bytes - p0.reserved_bytes, want);
  EXPECT_EQ(a.stats().address_reserved_bytes, want);
  EXPECT_EQ(a.stats().mapped_pages, 1u);
}

TEST(RefengineExpandable, GrowsBy20MiBPagesContiguously) {
  Engine e;
  auto d0 = DeviceStats();
  CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
  CUdeviceptr p = a.allocate(30 * kMiB);  // 2 pages
  auto d1 = DeviceStats();
  EXPECT_EQ(d1.vmm_mappings - d0.vmm_mappings, 2u);
  EXPECT_EQ(d1.process_bytes_in_use - d0.process_bytes_in_use, 40 * kMiB);
  EXPECT_EQ(d1.legacy_allocations, d0.legacy_allocations);  // no cuMemAlloc at all
  CUdeviceptr q = a.allocate(15 * kMiB);                    // 10 MiB left at the end: one more page
  EXPECT_EQ(q, p + 30 * kMiB);
  auto d2 = DeviceStats();
  EXPECT_EQ(d2.vmm_mappings - d0.vmm_mappings, 3u);
  EXPECT_EQ(a.stats().reserved_bytes, 60 * kMiB);
  // Mapped with access: the driver reads and writes across the page boundaries.
  EXPECT_TRUE(RoundTrip(e, q, 15 * kMiB, 9));
  a.free(q);
  EXPECT_EQ(a.allocate(12 * kMiB), q);  // reused, no new page
  EXPECT_EQ(DeviceStats().vmm_mappings - d0.vmm_mappings, 3u);
}

TEST(RefengineExpandable, EmptyCacheUnmapsFreePagesAndKeepsTheReservation) {
  Engine e;
  auto d0 = DeviceStats();
  auto p0 = ProcessStats();
  CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
  CUdeviceptr p = a.allocate(10 * kMiB);
  CUdeviceptr q = a.allocate(50 * kMiB);  // pages 0..2
  a.free(q);
  a.empty_cache();  // page 0 still holds p
  EXPECT_EQ(DeviceStats().vmm_mappings - d0.vmm_mappings, 1u);
  EXPECT_EQ(a.stats().reserved_bytes, 20 * kMiB);
  a.free(p);
  a.empty_cache();
  auto d1 = DeviceStats();
  EXPECT_EQ(d1.vmm_mappings, d0.vmm_mappings);
  EXPECT_EQ(d1.process_bytes_in_use, d0.process_bytes_in_use);
  EXPECT_EQ(d1.vmm_handle_refs, d0.vmm_handle_refs);
  EXPECT_EQ(ProcessStats().reservations - p0.reservations, 1u);
  // It grows again from the start of the same reservation.
  EXPECT_EQ(a.allocate(kMiB), p);
  EXPECT_TRUE(RoundTrip(e, p, kMiB, 5));
}

TEST(RefengineExpandable, PagesAreExportableAsPosixFileDescriptors) {
  Engine e;
  CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
  a.allocate(25 * kMiB);
  auto handles = a.page_handles();
  ASSERT_EQ(handles.size(), 2u);
  for (auto h : handles) {
    int fd = -1;
    ASSERT_EQ(
        e.d.mem_export_to_shareable_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        CUDA_SUCCESS);
    ASSERT_GE(fd, 0);
    CUmemGenericAllocationHandle imported = 0;
    EXPECT_EQ(e.d.mem_import_from_shareable_handle(
                  &imported, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    if (imported != 0) {
      EXPECT_EQ(e.d.mem_release(imported), CUDA_SUCCESS);
    }
    close(fd);
  }
}

TEST(RefengineExpandable, SeparateStreamsGetSeparateSegments) {
  Engine e;
  CUstream s = nullptr;
  e.d.check(e.d.stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  {
    auto p0 = ProcessStats();
    CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
    a.allocate(kMiB, nullptr);
    a.allocate(kMiB, s);
    EXPECT_EQ(ProcessStats().reservations - p0.reservations, 2u);
    EXPECT_EQ(a.stats().mapped_pages, 2u);
  }
  e.d.check(e.d.stream_destroy(s), "cuStreamDestroy");
}

TEST(RefengineExpandable, OutOfMemoryRollsBackThePagesOfTheFailedGrowth) {
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
        Engine e;
        CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
        a.allocate(20 * kMiB);  // page 0; pages 1..3 would be 80 MiB in all
        try {
          a.allocate(60 * kMiB);
          std::fprintf(stderr, "no exception\n");
          std::exit(1);
        } catch (const OutOfMemory& oom) {
          std::fprintf(stderr, "%s\n", oom.what());
        }
        bool ok = a.stats().mapped_pages == 1 && DeviceStats().vmm_mappings == 1 &&
                  DeviceStats().process_bytes_in_use == 20 * kMiB;
        a.allocate(40 * kMiB);  // still fits: 3 pages of 60 MiB
        ok = ok && a.stats().mapped_pages == 3;
        std::exit(ok ? 0 : 2);
      },
      testing::ExitedWithCode(0), "CUDA out of memory: tried to allocate 60.00 MiB");
}

// Another stream's cached pages are returned when a growth runs out of memory.
TEST(RefengineExpandable, OutOfMemoryReturnsTheCacheAndRetries) {
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_DEVICE_MEMORY", "64M", 1);
        Engine e;
        CUstream s = nullptr;
        e.d.check(e.d.stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        CachingAllocator a(e.d, e.dev, Mode::kExpandableSegments);
        a.free(a.allocate(40 * kMiB, nullptr));    // two pages cached for the default stream
        CUdeviceptr p = a.allocate(40 * kMiB, s);  // needs two more: only one fits at first
        bool ok = p != 0 && a.stats().mapped_pages == 2 && DeviceStats().vmm_mappings == 2;
        std::exit(ok ? 0 : 2);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
