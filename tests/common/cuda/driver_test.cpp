// thaw's CUDA driver table (common/cuda) against the emulator, loaded exactly as thaw
// loads a real driver: dlopen of $THAW_LIBCUDA (ctest sets it to the built emulator),
// entry points through cuGetProcAddress_v2. Nothing here links libcuda.
#include "common/cuda/driver.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "emu/include/thaw/emu_inspect.h"

namespace {

using ::testing::HasSubstr;
using thaw::cuda::CudaError;
using thaw::cuda::Driver;

constexpr size_t kMiB = size_t{1} << 20;

// ctest sets THAW_LIBCUDA; when the binary is run by hand, default to the emulator of
// the same build tree (build/<preset>/tests/common/ → build/<preset>/emu/libcuda.so.1).
const bool kLibcudaDefaulted = [] {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto emulator = (exe.parent_path() / "../../emu/libcuda.so.1").lexically_normal();
    setenv(thaw::cuda::kLibcudaEnv, emulator.c_str(), /*overwrite=*/0);
  }
  return true;
}();

// Sets an environment variable for one test and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::shared_ptr<Driver> load_or_die() {
  auto driver = Driver::load();
  if (!driver) {
    ADD_FAILURE() << driver.error().what();
    return nullptr;
  }
  return *driver;
}

// A driver that is initialized, with device 0's primary context current.
class CudaDriverTable : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = load_or_die();
    ASSERT_NE(cu_, nullptr);
    auto init = cu_->init();
    ASSERT_TRUE(init) << init.error().what();
    auto dev = cu_->device_get(0);
    ASSERT_TRUE(dev) << dev.error().what();
    dev_ = *dev;
    auto ctx = cu_->primary_ctx_retain(dev_);
    ASSERT_TRUE(ctx) << ctx.error().what();
    ctx_ = *ctx;
    ASSERT_TRUE(cu_->ctx_set_current(ctx_));
    get_device_stats_ =
        reinterpret_cast<decltype(&thawEmuGetDeviceStats)>(cu_->symbol("thawEmuGetDeviceStats"));
    get_process_stats_ =
        reinterpret_cast<decltype(&thawEmuGetProcessStats)>(cu_->symbol("thawEmuGetProcessStats"));
    ASSERT_NE(get_device_stats_, nullptr);
    ASSERT_NE(get_process_stats_, nullptr);
  }

  void TearDown() override {
    if (cu_ && ctx_) {
      EXPECT_TRUE(cu_->ctx_set_current(nullptr));
      EXPECT_TRUE(cu_->primary_ctx_release(dev_));
    }
  }

  ThawEmuDeviceStats device_stats() const {
    ThawEmuDeviceStats stats{};
    EXPECT_EQ(get_device_stats_(0, &stats), CUDA_SUCCESS);
    return stats;
  }
  ThawEmuProcessStats process_stats() const {
    ThawEmuProcessStats stats{};
    EXPECT_EQ(get_process_stats_(&stats), CUDA_SUCCESS);
    return stats;
  }

  std::shared_ptr<Driver> cu_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  decltype(&thawEmuGetDeviceStats) get_device_stats_ = nullptr;
  decltype(&thawEmuGetProcessStats) get_process_stats_ = nullptr;
};

std::vector<unsigned char> pattern(size_t bytes, unsigned seed) {
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 131 + seed);
  return v;
}

// ---- loading --------------------------------------------------------------------------

TEST(CudaDriverTableLoad, LoadsTheLibraryNamedByThawLibcuda) {
  const char* env = std::getenv(thaw::cuda::kLibcudaEnv);
  ASSERT_NE(env, nullptr);
  auto cu = Driver::load();
  ASSERT_TRUE(cu) << cu.error().what();
  EXPECT_EQ((*cu)->path(), env);
  // Only the emulator has the inspection entry points: this is the emulator.
  EXPECT_NE((*cu)->symbol("thawEmuGetDeviceStats"), nullptr);
}

TEST(CudaDriverTableLoad, AnExplicitPathWinsOverTheEnvironment) {
  std::string emulator = std::getenv(thaw::cuda::kLibcudaEnv);
  ScopedEnv env(thaw::cuda::kLibcudaEnv, "/nonexistent/env/libcuda.so.1");
  auto cu = Driver::load(emulator);
  ASSERT_TRUE(cu) << cu.error().what();
  EXPECT_EQ((*cu)->path(), emulator);
}

TEST(CudaDriverTableLoad, AMissingLibraryIsAnErrorNamingThePathAndThawLibcuda) {
  auto cu = Driver::load("/nonexistent/dir/libcuda.so.1");
  ASSERT_FALSE(cu);
  EXPECT_EQ(cu.error().call, "dlopen");
  EXPECT_THAT(cu.error().what(), HasSubstr("/nonexistent/dir/libcuda.so.1"));
  EXPECT_THAT(cu.error().what(), HasSubstr("THAW_LIBCUDA"));
}

TEST(CudaDriverTableLoad, ABadThawLibcudaIsAnErrorNamingThatPath) {
  ScopedEnv env(thaw::cuda::kLibcudaEnv, "/nonexistent/env/libcuda.so.1");
  auto cu = Driver::load();
  ASSERT_FALSE(cu);
  EXPECT_THAT(cu.error().what(), HasSubstr("/nonexistent/env/libcuda.so.1"));
}

TEST(CudaDriverTableLoad, ALibraryWithoutCuGetProcAddressIsNotADriver) {
  // libm loads fine but is not a CUDA driver.
  auto cu = Driver::load("libm.so.6");
  ASSERT_FALSE(cu);
  EXPECT_EQ(cu.error().code, CUDA_ERROR_NOT_FOUND);
  EXPECT_THAT(cu.error().what(), HasSubstr("cuGetProcAddress_v2"));
  EXPECT_THAT(cu.error().what(), HasSubstr("libm.so.6"));
}

TEST(CudaDriverTableLoad, RawResolvesBaseNamesAndAnswersNullForUnknownOnes) {
  auto cu = load_or_die();
  ASSERT_NE(cu, nullptr);
  EXPECT_NE(cu->raw("cuMemsetD32Async"), nullptr);
  // cuGetProcAddress: an unknown symbol is CUDA_SUCCESS with pfn = NULL.
  EXPECT_EQ(cu->raw("cuNoSuchFunction"), nullptr);
  // symbol() is plain dlsym on the driver's handle (RTLD_LOCAL hides it otherwise).
  EXPECT_EQ(cu->symbol("thawEmuNoSuchSymbol"), nullptr);
}

// ---- errors ---------------------------------------------------------------------------

TEST(CudaDriverTableError, WhatReadsCallNameAndMessage) {
  CudaError e{.code = CUDA_ERROR_INVALID_VALUE,
              .call = "cuMemMap",
              .name = "CUDA_ERROR_INVALID_VALUE",
              .message = "invalid argument"};
  EXPECT_EQ(e.what(), "cuMemMap: CUDA_ERROR_INVALID_VALUE (invalid argument)");
}

TEST_F(CudaDriverTable, ADriverErrorCarriesTheDriversNameAndString) {
  // cuda.h, cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE."
  auto ptr = cu_->mem_alloc(0);
  ASSERT_FALSE(ptr);
  EXPECT_EQ(ptr.error().code, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ptr.error().call, "cuMemAlloc");
  EXPECT_EQ(ptr.error().name, "CUDA_ERROR_INVALID_VALUE");
  EXPECT_EQ(ptr.error().message, "invalid argument");
  EXPECT_EQ(ptr.error().what(), "cuMemAlloc: CUDA_ERROR_INVALID_VALUE (invalid argument)");
}

TEST_F(CudaDriverTable, ACodeTheDriverCannotNameGetsAFallbackName) {
  // cuGetErrorName/String: "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE
  // will be returned and *pStr will be set to the NULL address." 1001 is no CUresult, yet
  // inside the enum's value range (CUDA_ERROR_UNKNOWN = 999 → 0..1023), so the cast is
  // defined behaviour.
  CudaError e = cu_->error(static_cast<CUresult>(1001), "cuSomething");
  EXPECT_EQ(e.name, "CUresult 1001");
  EXPECT_EQ(e.message, "unknown error code");
  EXPECT_EQ(e.what(), "cuSomething: CUresult 1001 (unknown error code)");
}

TEST(CudaDriverTableErrors, CallsBeforeInitReportNotInitialized) {
  // Needs a driver nobody has initialized: run in a fresh process.
  EXPECT_EXIT(
      {
        auto cu = Driver::load();
        if (!cu) {
          fprintf(stderr, "%s\n", cu.error().what().c_str());
          std::_Exit(2);
        }
        auto count = (*cu)->device_count();
        if (count) std::_Exit(3);
        fprintf(stderr, "%s\n", count.error().what().c_str());
        std::_Exit(count.error().code == CUDA_ERROR_NOT_INITIALIZED ? 0 : 4);
      },
      ::testing::ExitedWithCode(0),
      "cuDeviceGetCount: CUDA_ERROR_NOT_INITIALIZED \\(initialization error\\)");
}

// ---- devices and contexts ---------------------------------------------------------

TEST_F(CudaDriverTable, ReportsDevicesWithNameMemoryAndAttributes) {
  auto version = cu_->driver_version();
  ASSERT_TRUE(version);
  EXPECT_GE(*version, thaw::cuda::kCudaVersion);

  auto count = cu_->device_count();
  ASSERT_TRUE(count);
  ASSERT_GE(*count, 1);
  auto name = cu_->device_name(dev_);
  ASSERT_TRUE(name);
  EXPECT_FALSE(name->empty());
  auto total = cu_->device_total_mem(dev_);
  ASSERT_TRUE(total);
  EXPECT_GT(*total, 0u);
  auto major = cu_->device_attribute(dev_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  ASSERT_TRUE(major);
  EXPECT_GE(*major, 1);
  auto info = cu_->mem_get_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->total, *total);
  EXPECT_LE(info->free, info->total);

  // An ordinal past the last device: cuda.h lists CUDA_ERROR_INVALID_DEVICE for cuDeviceGet.
  auto bad = cu_->device_get(*count);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, CUDA_ERROR_INVALID_DEVICE);
}

TEST(CudaDriverTableDevices, PassesTheEmulatorsConfiguredDevicesThrough) {
  // The emulator reads its device set at cuInit, so configure a fresh process, with a
  // state directory of its own (the parent's ledger describes the default devices).
  EXPECT_EXIT(
      {
        char dir[] = "/tmp/thaw-driver-test-XXXXXX";
        if (mkdtemp(dir) == nullptr) std::_Exit(1);
        setenv("THAW_EMU_STATE_DIR", dir, 1);
        setenv("THAW_EMU_DEVICES", "2", 1);
        setenv("THAW_EMU_DEVICE_MEMORY", "512M,1G", 1);
        auto cu = Driver::load();
        if (!cu || !(*cu)->init()) std::_Exit(2);
        auto count = (*cu)->device_count();
        auto d0 = (*cu)->device_get(0);
        auto d1 = (*cu)->device_get(1);
        if (!count || !d0 || !d1) std::_Exit(3);
        auto m0 = (*cu)->device_total_mem(*d0);
        auto m1 = (*cu)->device_total_mem(*d1);
        auto u0 = (*cu)->device_uuid(*d0);
        auto u1 = (*cu)->device_uuid(*d1);
        if (!m0 || !m1 || !u0 || !u1) std::_Exit(4);
        fprintf(stderr, "count=%d mem0=%zu mem1=%zu\n", *count, *m0, *m1);
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        bool ok = *count == 2 && *m0 == 512 * kMiB && *m1 == 1024 * kMiB &&
                  thaw::cuda::format_uuid(*u0) != thaw::cuda::format_uuid(*u1);
        std::_Exit(ok ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CudaDriverTableUuid, PrintsTheNvidiaSmiForm) {
  CUuuid uuid;
  for (int i = 0; i < 16; ++i) uuid.bytes[i] = static_cast<char>(i * 17);
  EXPECT_EQ(thaw::cuda::format_uuid(uuid), "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

TEST_F(CudaDriverTable, TheCurrentContextIsTheOneSet) {
  auto current = cu_->ctx_get_current();
  ASSERT_TRUE(current);
  EXPECT_EQ(*current, ctx_);
  EXPECT_TRUE(cu_->ctx_synchronize());
  EXPECT_TRUE(cu_->ctx_synchronize(ctx_));
}

// ---- memory, copies, streams, events -------------------------------------------------

TEST_F(CudaDriverTable, AllocCopyFreeRoundTripsAndShowsInMemGetInfo) {
  constexpr size_t kBytes = 8 * kMiB;
  auto before = cu_->mem_get_info();
  ASSERT_TRUE(before);
  auto ptr = cu_->mem_alloc(kBytes);
  ASSERT_TRUE(ptr) << ptr.error().what();
  auto during = cu_->mem_get_info();
  ASSERT_TRUE(during);
  EXPECT_LE(during->free + kBytes, before->free);

  auto in = pattern(kBytes, 3);
  std::vector<unsigned char> out(kBytes);
  ASSERT_TRUE(cu_->memcpy_htod(*ptr, in.data(), kBytes));
  ASSERT_TRUE(cu_->memcpy_dtoh(out.data(), *ptr, kBytes));
  EXPECT_EQ(in, out);
  ASSERT_TRUE(cu_->memset_d8(*ptr + kMiB, 0xab, kMiB));
  ASSERT_TRUE(cu_->memcpy_dtoh(out.data(), *ptr, kBytes));
  EXPECT_EQ(out[kMiB - 1], in[kMiB - 1]);
  EXPECT_EQ(out[kMiB], 0xab);
  EXPECT_EQ(out[2 * kMiB - 1], 0xab);
  EXPECT_EQ(out[2 * kMiB], in[2 * kMiB]);

  ASSERT_TRUE(cu_->mem_free(*ptr));
  auto after = cu_->mem_get_info();
  ASSERT_TRUE(after);
  EXPECT_EQ(after->free, before->free);
  EXPECT_EQ(device_stats().process_bytes_in_use, 0u);
}

TEST_F(CudaDriverTable, AsyncCopiesOnAStreamWithEventsLeaveNothingBehind) {
  constexpr size_t kBytes = 4 * kMiB;
  auto host = cu_->mem_host_alloc(kBytes);
  ASSERT_TRUE(host) << host.error().what();
  auto dev = cu_->mem_alloc(kBytes);
  ASSERT_TRUE(dev);
  auto stream = cu_->stream_create(CU_STREAM_NON_BLOCKING);
  ASSERT_TRUE(stream) << stream.error().what();
  auto start = cu_->event_create();
  auto end = cu_->event_create();
  ASSERT_TRUE(start && end);

  auto in = pattern(kBytes, 11);
  std::memcpy(*host, in.data(), kBytes);
  ASSERT_TRUE(cu_->event_record(*start, *stream));
  ASSERT_TRUE(cu_->memcpy_htod_async(*dev, *host, kBytes, *stream));
  ASSERT_TRUE(cu_->event_record(*end, *stream));
  ASSERT_TRUE(cu_->event_synchronize(*end));
  auto ms = cu_->event_elapsed_ms(*start, *end);
  ASSERT_TRUE(ms) << ms.error().what();
  EXPECT_GE(*ms, 0.0f);

  std::memset(*host, 0, kBytes);
  ASSERT_TRUE(cu_->memcpy_dtoh_async(*host, *dev, kBytes, *stream));
  ASSERT_TRUE(cu_->stream_synchronize(*stream));
  EXPECT_EQ(std::memcmp(*host, in.data(), kBytes), 0);

  EXPECT_EQ(process_stats().streams, 1u);
  EXPECT_EQ(process_stats().events, 2u);
  ASSERT_TRUE(cu_->event_destroy(*start));
  ASSERT_TRUE(cu_->event_destroy(*end));
  ASSERT_TRUE(cu_->stream_destroy(*stream));
  ASSERT_TRUE(cu_->mem_free(*dev));
  ASSERT_TRUE(cu_->mem_free_host(*host));
  ThawEmuProcessStats ps = process_stats();
  EXPECT_EQ(ps.streams, 0u);
  EXPECT_EQ(ps.events, 0u);
  EXPECT_EQ(ps.pinned_host_ranges, 0u);
  EXPECT_EQ(device_stats().process_bytes_in_use, 0u);

  // A destroyed stream is a stale handle; the emulator reports it (stream handles are
  // opaque ids there) and the table passes the code through.
  auto stale = cu_->stream_synchronize(*stream);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, CUDA_ERROR_INVALID_HANDLE);
}

// ---- virtual memory management --------------------------------------------------------

TEST_F(CudaDriverTable, VmmRoundTripThroughTheTableLeavesNoBytesBehind) {
  CUmemAllocationProp prop = thaw::cuda::device_allocation_prop(dev_);
  auto gran = cu_->allocation_granularity(prop);
  ASSERT_TRUE(gran) << gran.error().what();
  ASSERT_GT(*gran, 0u);
  const size_t bytes = 2 * *gran;

  auto handle = cu_->mem_create(bytes, prop);
  ASSERT_TRUE(handle) << handle.error().what();
  auto va = cu_->address_reserve(bytes, *gran);
  ASSERT_TRUE(va) << va.error().what();
  ASSERT_TRUE(cu_->mem_map(*va, bytes, 0, *handle));
  ASSERT_TRUE(cu_->mem_set_access(*va, bytes, dev_));

  ThawEmuDeviceStats during = device_stats();
  EXPECT_EQ(during.process_bytes_in_use, bytes);
  EXPECT_EQ(during.vmm_mappings, 1u);
  EXPECT_EQ(during.vmm_handle_refs, 1u);

  auto in = pattern(bytes, 5);
  std::vector<unsigned char> out(bytes);
  ASSERT_TRUE(cu_->memcpy_htod(*va, in.data(), bytes));
  ASSERT_TRUE(cu_->memcpy_dtoh(out.data(), *va, bytes));
  EXPECT_EQ(in, out);

  // cuMemRetainAllocationHandle takes any address inside a mapping; each retain is a
  // reference that needs its own cuMemRelease.
  auto retained = cu_->retain_allocation_handle(reinterpret_cast<void*>(*va + *gran + 100));
  ASSERT_TRUE(retained) << retained.error().what();
  EXPECT_EQ(device_stats().vmm_handle_refs, 2u);
  auto props = cu_->allocation_properties(*retained);
  ASSERT_TRUE(props);
  EXPECT_EQ(props->location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(props->location.id, dev_);
  ASSERT_TRUE(cu_->mem_release(*retained));

  ASSERT_TRUE(cu_->mem_unmap(*va, bytes));
  ASSERT_TRUE(cu_->mem_release(*handle));
  ASSERT_TRUE(cu_->address_free(*va, bytes));

  ThawEmuDeviceStats after = device_stats();
  EXPECT_EQ(after.process_bytes_in_use, 0u);
  EXPECT_EQ(after.physical_allocations, 0u);
  EXPECT_EQ(after.vmm_handle_refs, 0u);
  EXPECT_EQ(after.vmm_mappings, 0u);
  EXPECT_EQ(process_stats().reservations, 0u);
}

TEST_F(CudaDriverTable, AnExportedFdImportsToAHandleOnTheSameMemory) {
  CUmemAllocationProp prop =
      thaw::cuda::device_allocation_prop(dev_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  auto gran = cu_->allocation_granularity(prop);
  ASSERT_TRUE(gran);
  const size_t bytes = *gran;

  auto original = cu_->mem_create(bytes, prop);
  ASSERT_TRUE(original) << original.error().what();
  auto fd = cu_->export_to_fd(*original);
  ASSERT_TRUE(fd) << fd.error().what();
  ASSERT_GE(*fd, 0);
  auto imported = cu_->import_from_fd(*fd);
  ASSERT_TRUE(imported) << imported.error().what();
  close(*fd);  // the import holds its own reference; the fd is ours to close

  auto props = cu_->allocation_properties(*imported);
  ASSERT_TRUE(props);
  EXPECT_EQ(props->location.id, dev_);
  EXPECT_TRUE(props->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

  // Map each handle into its own reservation: writes through the imported handle are
  // visible through the original one, because both name one physical allocation.
  auto va_original = cu_->address_reserve(bytes, *gran);
  auto va_imported = cu_->address_reserve(bytes, *gran);
  ASSERT_TRUE(va_original && va_imported);
  ASSERT_TRUE(cu_->mem_map(*va_original, bytes, 0, *original));
  ASSERT_TRUE(cu_->mem_map(*va_imported, bytes, 0, *imported));
  ASSERT_TRUE(cu_->mem_set_access(*va_original, bytes, dev_));
  ASSERT_TRUE(cu_->mem_set_access(*va_imported, bytes, dev_));
  EXPECT_EQ(device_stats().process_bytes_in_use, bytes);  // one allocation, two handles

  auto in = pattern(bytes, 42);
  std::vector<unsigned char> out(bytes);
  ASSERT_TRUE(cu_->memcpy_htod(*va_imported, in.data(), bytes));
  ASSERT_TRUE(cu_->memcpy_dtoh(out.data(), *va_original, bytes));
  EXPECT_EQ(in, out);

  ASSERT_TRUE(cu_->mem_unmap(*va_original, bytes));
  ASSERT_TRUE(cu_->mem_unmap(*va_imported, bytes));
  ASSERT_TRUE(cu_->mem_release(*original));
  ASSERT_TRUE(cu_->mem_release(*imported));
  ASSERT_TRUE(cu_->address_free(*va_original, bytes));
  ASSERT_TRUE(cu_->address_free(*va_imported, bytes));
  ThawEmuDeviceStats after = device_stats();
  EXPECT_EQ(after.process_bytes_in_use, 0u);
  EXPECT_EQ(after.vmm_handle_refs, 0u);
}

TEST_F(CudaDriverTable, ExportingAnAllocationWithoutShareableTypesFails) {
  // cuMemCreate without requested handle types (vLLM's CuMemAllocator does this): such
  // an allocation cannot be exported. cuda.h lists CUDA_ERROR_INVALID_VALUE and
  // CUDA_ERROR_NOT_SUPPORTED for cuMemExportToShareableHandle without saying which
  // applies here, so either is accepted.
  CUmemAllocationProp prop = thaw::cuda::device_allocation_prop(dev_, CU_MEM_HANDLE_TYPE_NONE);
  auto gran = cu_->allocation_granularity(prop);
  ASSERT_TRUE(gran);
  auto handle = cu_->mem_create(*gran, prop);
  ASSERT_TRUE(handle) << handle.error().what();
  auto fd = cu_->export_to_fd(*handle);
  ASSERT_FALSE(fd);
  EXPECT_THAT(fd.error().code,
              ::testing::AnyOf(CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED));
  EXPECT_EQ(fd.error().call, "cuMemExportToShareableHandle");
  ASSERT_TRUE(cu_->mem_release(*handle));
}

}  // namespace
