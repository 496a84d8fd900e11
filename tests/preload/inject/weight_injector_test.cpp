// WeightInjector against the emulator, without thawd or the shim: a "slot" is made here the
// way thawd makes one (exportable pages filled with file bytes), handed over as fds, and
// the injector's copy mode, zero-copy mode (through a DeterministicLayout it backs) and
// page give-back are checked by reading device memory back.
#include "preload/inject/weight_injector.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <numeric>

#include "preload/layout/deterministic_layout.hpp"

namespace {

using namespace thaw::preload;
using thaw::layout::LayoutKind;

constexpr std::uint64_t kPage = 2 << 20;  // the emulator's granularity
constexpr CUdeviceptr kBase = 0x300000000000ull;

#define ASSERT_CU(x) ASSERT_EQ((x), CUDA_SUCCESS) << #x

InjectorDriver injector_driver() {
  InjectorDriver d;
  d.mem_import = &cuMemImportFromShareableHandle;
  d.mem_address_reserve = &cuMemAddressReserve;
  d.mem_address_free = &cuMemAddressFree;
  d.mem_map = &cuMemMap;
  d.mem_unmap = &cuMemUnmap;
  d.mem_release = &cuMemRelease;
  d.mem_set_access = &cuMemSetAccess;
  d.memcpy_dtod_async = &cuMemcpyDtoDAsync_v2;
  d.stream_synchronize = &cuStreamSynchronize;
  d.event_create = &cuEventCreate;
  d.event_record = &cuEventRecord;
  d.event_query = &cuEventQuery;
  d.event_synchronize = &cuEventSynchronize;
  d.event_destroy = &cuEventDestroy_v2;
  d.ctx_get_device = &cuCtxGetDevice;
  return d;
}

LayoutDriver layout_driver() {
  LayoutDriver d;
  d.ctx_get_device = &cuCtxGetDevice;
  d.device_total_mem = &cuDeviceTotalMem_v2;
  d.mem_get_allocation_granularity = &cuMemGetAllocationGranularity;
  d.mem_address_reserve = &cuMemAddressReserve;
  d.mem_address_free = &cuMemAddressFree;
  d.mem_create = &cuMemCreate;
  d.mem_release = &cuMemRelease;
  d.mem_map = &cuMemMap;
  d.mem_unmap = &cuMemUnmap;
  d.mem_set_access = &cuMemSetAccess;
  return d;
}

// "File" bytes: byte i of file f is (i * 7 + f) & 0xff.
std::vector<std::uint8_t> file_bytes(int file, std::uint64_t offset, std::uint64_t n) {
  std::vector<std::uint8_t> out(n);
  for (std::uint64_t i = 0; i < n; ++i)
    out[i] = static_cast<std::uint8_t>(((offset + i) * 7 + file) & 0xff);
  return out;
}

class WeightInjectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&device_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, device_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    for (auto& [va, size] : slot_maps_) (void)cuMemUnmap(va, size);
    for (auto h : slot_handles_) (void)cuMemRelease(h);
    if (slot_va_ != 0) (void)cuMemAddressFree(slot_va_, slot_bytes_);
    (void)cuStreamDestroy_v2(stream_);
    (void)cuDevicePrimaryCtxRelease_v2(device_);
  }

  // A slot of `pages` pages as thawd makes one; pieces: file 0 bytes [0, 3 MiB) at slot
  // offset 0 and file 1 bytes [0, 1 MiB) at slot offset 3 MiB + 256.
  SlotGrant make_slot(std::size_t pages, LayoutKind kind = LayoutKind::packed) {
    slot_bytes_ = pages * kPage;
    EXPECT_EQ(cuMemAddressReserve(&slot_va_, slot_bytes_, 0, 0, 0), CUDA_SUCCESS);
    SlotGrant g;
    g.slot = "g0s0";
    g.model = "m";
    g.layout_kind = kind;
    g.record_fingerprint = "f00d";
    g.page_bytes = kPage;
    g.pieces = {{0, "a.safetensors", 0, 3 << 20}, {(3 << 20) + 256, "b.safetensors", 0, 1 << 20}};
    g.resident_bytes = g.pieces.back().slot_end();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    for (std::size_t i = 0; i < pages; ++i) {
      CUmemGenericAllocationHandle h = 0;
      EXPECT_EQ(cuMemCreate(&h, kPage, &prop, 0), CUDA_SUCCESS);
      EXPECT_EQ(cuMemMap(slot_va_ + i * kPage, kPage, 0, h, 0), CUDA_SUCCESS);
      slot_maps_.emplace_back(slot_va_ + i * kPage, kPage);
      slot_handles_.push_back(h);
      int fd = -1;
      EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                CUDA_SUCCESS);
      g.pages[i * kPage] = thaw::UniqueFd(fd);
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(cuMemSetAccess(slot_va_, slot_bytes_, &access, 1), CUDA_SUCCESS);
    for (const SlotPiece& p : g.pieces) {
      const auto bytes = file_bytes(p.file == "a.safetensors" ? 0 : 1, p.file_offset, p.bytes);
      EXPECT_EQ(cuMemcpyHtoD_v2(slot_va_ + p.slot_offset, bytes.data(), bytes.size()),
                CUDA_SUCCESS);
    }
    return g;
  }

  std::vector<std::uint8_t> read(CUdeviceptr p, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    EXPECT_EQ(cuMemcpyDtoH_v2(out.data(), p, n), CUDA_SUCCESS);
    return out;
  }

  InjectorEnvironment env(std::optional<std::string> fingerprint = std::nullopt) {
    InjectorEnvironment e;
    e.record_fingerprint = [fingerprint] { return fingerprint; };
    e.free_pages = [this](const std::vector<std::uint64_t>& pages) {
      freed_.insert(freed_.end(), pages.begin(), pages.end());
    };
    e.notice = [this](const std::string& m) { notices_ += m + "\n"; };
    return e;
  }

  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUdeviceptr slot_va_ = 0;
  std::uint64_t slot_bytes_ = 0;
  std::vector<std::pair<CUdeviceptr, std::size_t>> slot_maps_;
  std::vector<CUmemGenericAllocationHandle> slot_handles_;
  std::vector<std::uint64_t> freed_;
  std::string notices_;
};

TEST_F(WeightInjectorTest, CopyModeCopiesFromTheSlotAndGivesBackPagesOnceCopied) {
  WeightInjector inj(injector_driver(), env(), make_slot(3));
  CUdeviceptr dst = 0;
  ASSERT_CU(cuMemAlloc_v2(&dst, 4 << 20));
  // The first 2 MiB of file a: page 0 entirely.
  auto r = inj.copy(dst, std::nullopt, false, "m", "a.safetensors", 0, 2 << 20, stream_, false);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, CUDA_SUCCESS);
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(read(dst, 2 << 20), file_bytes(0, 0, 2 << 20));
  inj.poll();
  EXPECT_EQ(freed_, std::vector<std::uint64_t>{0}) << "page 0 was copied out entirely";
  // The rest of file a and file b, synchronously: pages 1 and 2 follow.
  r = inj.copy(dst, std::nullopt, false, "m", "a.safetensors", 2 << 20, 1 << 20, nullptr, true);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(read(dst, 1 << 20), file_bytes(0, 2 << 20, 1 << 20));
  r = inj.copy(dst + 4096, std::nullopt, false, "m", "b.safetensors", 0, 1 << 20, stream_, false);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_TRUE(inj.finish() == false) << "pages were given back: no hand-back";
  EXPECT_EQ(read(dst + 4096, 1 << 20), file_bytes(1, 0, 1 << 20));
  std::sort(freed_.begin(), freed_.end());
  EXPECT_EQ(freed_, (std::vector<std::uint64_t>{0, kPage, 2 * kPage}));
  const InjectorStats s = inj.stats();
  EXPECT_EQ(s.bytes_injected, (4u << 20));
  EXPECT_EQ(s.pages_freed, 3u);
  EXPECT_FALSE(s.zero_copy);
  ASSERT_CU(cuMemFree_v2(dst));
}

TEST_F(WeightInjectorTest, BytesTheSlotDoesNotHoldAreLeftToTheDriver) {
  SlotGrant g = make_slot(3);
  g.resident_bytes = 2 << 20;  // only file a's first 2 MiB are in (the rest was given back)
  WeightInjector inj(injector_driver(), env(), std::move(g));
  CUdeviceptr dst = 0;
  ASSERT_CU(cuMemAlloc_v2(&dst, 4 << 20));
  EXPECT_FALSE(inj.copy(dst, std::nullopt, false, "m", "b.safetensors", 0, 4096, stream_, false))
      << "not resident";
  EXPECT_FALSE(
      inj.copy(dst, std::nullopt, false, "m", "a.safetensors", 3 << 20, 4096, stream_, false))
      << "past the file's piece";
  EXPECT_FALSE(
      inj.copy(dst, std::nullopt, false, "other", "a.safetensors", 0, 4096, stream_, false))
      << "another model";
  EXPECT_FALSE(inj.copy(dst, std::nullopt, false, "m", "c.safetensors", 0, 4096, stream_, false))
      << "a file the slot does not hold";
  // Straddling the resident end: not all of it is there.
  EXPECT_FALSE(inj.copy(dst, std::nullopt, false, "m", "a.safetensors", (2 << 20) - 4096, 8192,
                        stream_, false));
  auto r = inj.copy(dst, std::nullopt, false, "m", "a.safetensors", 4096, 8192, stream_, true);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(read(dst, 8192), file_bytes(0, 4096, 8192));
  EXPECT_EQ(inj.stats().bytes_copied, 4u * 4096 + 8192);
  EXPECT_TRUE(inj.finish()) << "nothing given back, nothing written: the slot can be kept";
  ASSERT_CU(cuMemFree_v2(dst));
}

TEST_F(WeightInjectorTest, ZeroCopyMapsTheSlotAtTheLayoutsAllocationsAndSkipsProvenCopies) {
  WeightInjector inj(injector_driver(), env("f00d"), make_slot(3, LayoutKind::engine));
  DeterministicLayout layout(layout_driver(), kBase);
  layout.set_backing(&inj);
  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(layout.allocate(&a, 3 << 20), CUDA_SUCCESS);  // slot offsets [0, 4 MiB)
  ASSERT_EQ(layout.allocate(&b, 3 << 20), CUDA_SUCCESS);  // [4, 8): page 2 is the slot's
  EXPECT_EQ(a, kBase);
  EXPECT_TRUE(layout.find(a)->backed);
  EXPECT_TRUE(layout.find(b)->backed);
  EXPECT_EQ(inj.stats().pages_mapped, 3u) << "pages 0, 1 and 2 (file b's last 256 bytes)";
  // The engine's memory is the slot's: its bytes are there before any copy.
  EXPECT_EQ(read(a, 3 << 20), file_bytes(0, 0, 3 << 20));
  // A copy the layout proves: nothing moves.
  auto r = inj.copy(a, 0, true, "m", "a.safetensors", 0, 3 << 20, stream_, false);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(inj.stats().bytes_skipped, (3u << 20));
  // The same bytes somewhere else: copied for real (device-to-device).
  r = inj.copy(b, 4 << 20, true, "m", "a.safetensors", 0, 4096, stream_, true);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(read(b, 4096), file_bytes(0, 0, 4096));
  EXPECT_EQ(inj.stats().bytes_injected, 4096u);
  // A real write into the slot's pages: no hand-back, and no more skipping.
  inj.note_write(1 << 20, 16);
  r = inj.copy(a, 0, true, "m", "a.safetensors", 0, 4096, stream_, true);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(inj.stats().bytes_skipped, (3u << 20)) << "dirty: copied, not skipped";
  EXPECT_TRUE(inj.stats().dirty);
  EXPECT_FALSE(inj.finish());
  EXPECT_TRUE(freed_.empty()) << "pages the engine maps are never given back under it";
  ASSERT_EQ(layout.free(a), CUDA_SUCCESS);
  ASSERT_EQ(layout.free(b), CUDA_SUCCESS);
}

TEST_F(WeightInjectorTest, ZeroCopyNeedsTheRecordTheSlotWasBuiltFrom) {
  WeightInjector inj(injector_driver(), env("beef"), make_slot(3, LayoutKind::engine));
  DeterministicLayout layout(layout_driver(), kBase + (1ull << 40));  // past the first region
  ASSERT_TRUE(layout.active());
  layout.set_backing(&inj);
  CUdeviceptr a = 0;
  ASSERT_EQ(layout.allocate(&a, 3 << 20), CUDA_SUCCESS) << layout.stop_reason().value_or("");
  EXPECT_FALSE(layout.find(a)->backed) << "fresh memory: the slot is from another record";
  EXPECT_NE(notices_.find("another layout record"), std::string::npos) << notices_;
  EXPECT_FALSE(inj.stats().zero_copy);
  // Copy mode still serves the weights.
  auto r = inj.copy(a, 0, false, "m", "a.safetensors", 0, 4096, stream_, true);
  ASSERT_TRUE(r && *r == CUDA_SUCCESS);
  EXPECT_EQ(read(a, 4096), file_bytes(0, 0, 4096));
  ASSERT_EQ(layout.free(a), CUDA_SUCCESS);
}

}  // namespace
