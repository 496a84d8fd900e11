// GpuMemory on the emulator: every slot transition, the errors of bad requests, driver
// faults mid-operation, proactive prewarm (lend/reclaim), and an engine-layout prewarm whose
// pages a second process maps at the same addresses and finds the file bytes in.
#include "vmm/gpu_memory.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "common/safetensors/model.hpp"
#include "vmm/reservation.hpp"
#include "vmm_test_support.hpp"

namespace thaw::vmm {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

constexpr std::uint64_t kMiB = 1 << 20;

class GpuMemoryTest : public ::testing::Test {
 protected:
  // Faults must be set before the driver's first call, so a test that wants them calls
  // start() itself after setenv.
  void SetUp() override {}

  void start(std::uint64_t pool_bytes = 64 * kMiB) {
    driver_ = testing::load_driver();
    GpuMemoryConfig config;
    config.pool_bytes = pool_bytes;
    auto gpu = GpuMemory::create(driver_, config);
    ASSERT_TRUE(gpu) << gpu.error().message;
    gpu_ = std::move(*gpu);
  }

  void make_model(int layers = 4, int embd = 256) {
    testing::generate_model(dir_.path(), layers, embd);
    auto model = safetensors::Model::open(dir_.path());
    ASSERT_TRUE(model) << model.error().message;
    auto layout = WeightLayout::packed(*model);
    ASSERT_TRUE(layout) << layout.error().message;
    layout_ = std::move(*layout);
    source_ = std::make_unique<MappedFileSource>(dir_.path());
  }

  // Every piece of `layout` below `end` holds its file bytes at base + slot_offset.
  void expect_bytes(SlotId id, const WeightLayout& layout, std::uint64_t end = ~0ull) {
    auto info = gpu_->slot(id);
    ASSERT_TRUE(info);
    for (const LayoutPiece& p : layout.pieces()) {
      if (p.slot_end() > end) continue;
      std::vector<std::byte> actual(p.bytes);
      ASSERT_TRUE(driver_->memcpy_dtoh(actual.data(), info->base + p.slot_offset, p.bytes));
      ASSERT_TRUE(actual == testing::read_range(dir_.path() / p.file, p.file_offset, p.bytes))
          << p.file << " at slot offset " << p.slot_offset;
    }
  }

  void expect_consistent() {
    gpu_->wait_idle();
    auto ok = gpu_->check_invariants();
    EXPECT_TRUE(ok) << ok.error();
  }

  SlotId prewarmed_slot(const std::string& name) {
    auto id = gpu_->create_slot(name);
    EXPECT_TRUE(id);
    auto r = gpu_->prewarm(*id, *layout_, *source_);
    EXPECT_TRUE(r) << r.error().message;
    return *id;
  }

  TempDir dir_;
  std::shared_ptr<const cuda::Driver> driver_;
  std::unique_ptr<GpuMemory> gpu_;
  std::optional<WeightLayout> layout_;
  std::unique_ptr<MappedFileSource> source_;
};

TEST_F(GpuMemoryTest, PrewarmCopiesEveryTensorIntoPackedLayout) {
  start();
  make_model();
  auto id = gpu_->create_slot("gpt2-test");
  ASSERT_TRUE(id);
  EXPECT_EQ(gpu_->slot(*id)->state, SlotState::empty);
  std::uint64_t last_done = 0;
  PrewarmOptions options;
  options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_GE(done, last_done);
    EXPECT_LE(done, total);
    last_done = done;
  };
  auto report = gpu_->prewarm(*id, *layout_, *source_, options);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->bytes_copied, layout_->bytes());
  EXPECT_EQ(last_done, layout_->bytes());
  auto info = gpu_->slot(*id);
  EXPECT_EQ(info->state, SlotState::prewarmed);
  EXPECT_TRUE(info->complete());
  const std::size_t page = gpu_->pool().page_bytes;
  EXPECT_EQ(info->weight_pages, (layout_->extent() + page - 1) / page);
  EXPECT_EQ(gpu_->pool().weights, info->weight_pages);
  expect_bytes(*id, *layout_);
  for (std::size_t i = 1; i < layout_->pieces().size(); ++i) {
    EXPECT_EQ(layout_->pieces()[i].slot_offset % 256, 0u);  // packed pieces are aligned
  }
  expect_consistent();
}

TEST_F(GpuMemoryTest, WeightPagesAnEngineCopiedOutGoToTheDriverUntilTakenBack) {
  start();
  make_model();
  auto id = gpu_->create_slot("gpt2-test");
  ASSERT_TRUE(id);
  ASSERT_TRUE(gpu_->prewarm(*id, *layout_, *source_));
  const std::size_t page = gpu_->pool().page_bytes;
  const std::uint64_t held = testing::device_stats(*driver_).process_bytes_in_use;
  const std::uint64_t offsets[] = {0, page};
  EXPECT_FALSE(gpu_->free_weight_pages(*id, std::vector<std::uint64_t>{page + 1}))
      << "not a page offset";
  auto freed = gpu_->free_weight_pages(*id, offsets);
  ASSERT_TRUE(freed) << freed.error().message;
  EXPECT_EQ(*freed, 2u);
  EXPECT_EQ(gpu_->pool().returned, 2u);
  EXPECT_EQ(gpu_->slot(*id)->loaded_bytes, 0u) << "the resident prefix ends at page 0";
  // The memory really went back to the driver.
  EXPECT_EQ(testing::device_stats(*driver_).process_bytes_in_use, held - 2 * page);
  expect_consistent();
  EXPECT_EQ(gpu_->take_back_returned(), 2u);
  EXPECT_EQ(gpu_->pool().returned, 0u);
  EXPECT_EQ(gpu_->pool().free + gpu_->pool().weights, gpu_->pool().pages);
  EXPECT_EQ(testing::device_stats(*driver_).process_bytes_in_use, held);
  expect_consistent();
}

TEST_F(GpuMemoryTest, PrewarmOfTheFirstLayersThenTheRest) {
  start();
  make_model();
  auto id = gpu_->create_slot("partial");
  ASSERT_TRUE(id);
  PrewarmOptions first;
  first.layers = 1;
  ASSERT_TRUE(gpu_->prewarm(*id, *layout_, *source_, first));
  auto info = gpu_->slot(*id);
  EXPECT_EQ(info->state, SlotState::prewarmed);
  EXPECT_FALSE(info->complete());
  EXPECT_EQ(info->loaded_bytes, layout_->prefix_for_layers(1));
  EXPECT_LT(info->loaded_bytes, layout_->extent());
  EXPECT_EQ(info->layers_resident, 1);
  expect_bytes(*id, *layout_, info->loaded_bytes);
  expect_consistent();

  auto rest = gpu_->prewarm(*id, *layout_, *source_);
  ASSERT_TRUE(rest) << rest.error().message;
  EXPECT_EQ(
      rest->bytes_copied, layout_->bytes() - [&] {
        std::uint64_t b = 0;
        for (const auto& p : layout_->pieces()) {
          if (p.slot_end() <= info->loaded_bytes) b += p.bytes;
        }
        return b;
      }());
  EXPECT_TRUE(gpu_->slot(*id)->complete());
  expect_bytes(*id, *layout_);
  expect_consistent();
}

TEST_F(GpuMemoryTest, PartlyPrewarmedSlotServesAndLoadsTheRestWhileActive) {
  start();
  make_model();
  auto id = gpu_->create_slot("partial-active");
  ASSERT_TRUE(id);
  PrewarmOptions first;
  first.layers = 2;
  ASSERT_TRUE(gpu_->prewarm(*id, *layout_, *source_, first));
  // WarmServe §4.1: the first layers are enough to start; the rest streams in meanwhile.
  auto report = gpu_->activate(*id, ActivationOptions{4 * kMiB});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->kv_offset % gpu_->pool().page_bytes, 0u);
  EXPECT_GE(report->kv_offset, layout_->extent());  // KV after the whole layout, not the prefix
  ASSERT_TRUE(gpu_->ensure_kv(*id, 4 * kMiB));
  auto rest = gpu_->prewarm(*id, *layout_, *source_);
  ASSERT_TRUE(rest) << rest.error().message;
  auto info = gpu_->slot(*id);
  EXPECT_EQ(info->state, SlotState::active);
  EXPECT_TRUE(info->complete());
  expect_bytes(*id, *layout_);
  expect_consistent();
}

TEST_F(GpuMemoryTest, ActivateMapsKvInTheBackgroundAndDeactivateReturnsIt) {
  start();
  make_model();
  const SlotId id = prewarmed_slot("a");
  auto report = gpu_->activate(id, ActivationOptions{16 * kMiB});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->kv_target_bytes, 16 * kMiB);
  EXPECT_GE(report->kv_offset, layout_->extent());
  EXPECT_EQ(gpu_->slot(id)->state, SlotState::active);
  auto mapped = gpu_->ensure_kv(id, 16 * kMiB);
  ASSERT_TRUE(mapped) << mapped.error().message;
  EXPECT_GE(*mapped, 16 * kMiB);
  // The KV region is usable device memory.
  std::vector<std::byte> kv(16 * kMiB, std::byte{0x5c});
  ASSERT_TRUE(driver_->memcpy_htod(report->base + report->kv_offset, kv.data(), kv.size()));
  expect_bytes(id, *layout_);  // weights untouched
  expect_consistent();
  EXPECT_EQ(gpu_->pool().kv, 8u);

  // More than the budget is refused once the budget is mapped.
  auto more = gpu_->ensure_kv(id, 32 * kMiB, 2s);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().code, VmmErrc::pool_exhausted);

  ASSERT_TRUE(gpu_->deactivate(id));
  expect_consistent();
  EXPECT_EQ(gpu_->slot(id)->state, SlotState::prewarmed);
  EXPECT_EQ(gpu_->pool().kv, 0u);
  expect_bytes(id, *layout_);
  // And it can be activated again.
  ASSERT_TRUE(gpu_->activate(id, ActivationOptions{4 * kMiB}));
  ASSERT_TRUE(gpu_->ensure_kv(id, 4 * kMiB));
  ASSERT_TRUE(gpu_->deactivate(id));
  expect_consistent();
}

// A KV size near 2^64 (D-Bus Activate takes any u64) is clamped to what the slot can map,
// never wrapped to none.
TEST_F(GpuMemoryTest, AnEnormousKvRequestIsClampedNotWrappedToNothing) {
  start();
  make_model();
  const SlotId id = prewarmed_slot("a");
  auto report = gpu_->activate(id, ActivationOptions{~std::uint64_t{0} - 1});
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_GT(report->kv_target_bytes, 0u);
  EXPECT_EQ(report->kv_target_bytes % gpu_->pool().page_bytes, 0u);
  ASSERT_TRUE(gpu_->deactivate(id));
  expect_consistent();
}

TEST_F(GpuMemoryTest, ActivationEvictsOtherSlotsOnlyWhenTheBudgetNeedsThem) {
  start();
  make_model();
  const SlotId a = prewarmed_slot("a");
  const SlotId b = prewarmed_slot("b");
  const SlotId c = prewarmed_slot("c");
  ASSERT_TRUE(gpu_->activate(a, ActivationOptions{4 * kMiB}));
  ASSERT_TRUE(gpu_->ensure_kv(a, 4 * kMiB));
  expect_consistent();
  EXPECT_EQ(gpu_->slot(b)->state, SlotState::prewarmed);  // room enough: kept
  EXPECT_EQ(gpu_->slot(c)->state, SlotState::prewarmed);
  ASSERT_TRUE(gpu_->deactivate(a));
  expect_consistent();

  // All the KV the pool can give: b (prewarmed before c) goes first, then c.
  auto report = gpu_->activate(c, ActivationOptions{});
  ASSERT_TRUE(report);
  gpu_->wait_idle();
  auto kv = gpu_->ensure_kv(c, 1);
  ASSERT_TRUE(kv);
  expect_consistent();
  EXPECT_EQ(gpu_->slot(a)->state, SlotState::empty);
  EXPECT_EQ(gpu_->slot(b)->state, SlotState::empty);
  EXPECT_EQ(gpu_->pool().free, 0u);
  expect_bytes(c, *layout_);
}

TEST_F(GpuMemoryTest, EvictReturnsEveryPageAndDestroyNeedsAnEmptySlot) {
  start();
  make_model();
  const SlotId id = prewarmed_slot("a");
  auto refused = gpu_->destroy_slot(id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, VmmErrc::bad_state);
  ASSERT_TRUE(gpu_->evict(id));
  expect_consistent();
  EXPECT_EQ(gpu_->slot(id)->state, SlotState::empty);
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
  ASSERT_TRUE(gpu_->destroy_slot(id));
  EXPECT_FALSE(gpu_->slot(id));
}

TEST_F(GpuMemoryTest, BadRequestsAreClearErrors) {
  start(8 * kMiB);  // 4 pages: smaller than the model (~14 MiB)
  make_model();
  auto unknown = gpu_->activate(42);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, VmmErrc::unknown_slot);
  EXPECT_NE(unknown.error().message.find("42"), std::string::npos);

  auto id = gpu_->create_slot("too-big");
  ASSERT_TRUE(id);
  auto empty = gpu_->activate(*id);
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, VmmErrc::bad_state);
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);

  // A layout larger than the pool.
  auto big = WeightLayout::engine({LayoutPiece{0, "model.safetensors", 0, 64 * kMiB, -1}});
  ASSERT_TRUE(big);
  auto refused = gpu_->prewarm(*id, *big, *source_);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, VmmErrc::invalid_argument);

  // Overlapping engine pieces.
  auto overlap =
      WeightLayout::engine({LayoutPiece{0, "a", 0, 100, -1}, LayoutPiece{50, "a", 100, 100, -1}});
  ASSERT_FALSE(overlap);
  EXPECT_NE(overlap.error().message.find("overlap"), std::string::npos);

  // More pages than free: the pool says how many it has; nothing is held afterwards.
  auto second = gpu_->create_slot("second");
  ASSERT_TRUE(second);
  auto exhausted = gpu_->prewarm(*second, *layout_, *source_);
  ASSERT_FALSE(exhausted);
  EXPECT_EQ(exhausted.error().code, VmmErrc::invalid_argument);  // does not fit at all
  std::vector<LayoutPiece> head;  // the packed layout's first ~5 MiB: 3 of the 4 pages
  for (const auto& p : layout_->pieces()) {
    if (p.slot_end() <= 5 * kMiB) head.push_back(p);
  }
  auto fits = WeightLayout::engine(head);
  ASSERT_TRUE(fits);
  ASSERT_GT(fits->extent(), 4 * kMiB);
  ASSERT_TRUE(gpu_->prewarm(*id, *fits, *source_));
  auto no_room = gpu_->prewarm(*second, *fits, *source_);
  ASSERT_FALSE(no_room);
  EXPECT_EQ(no_room.error().code, VmmErrc::pool_exhausted);
  EXPECT_NE(no_room.error().message.find("free"), std::string::npos) << no_room.error().message;
  EXPECT_EQ(gpu_->slot(*second)->state, SlotState::empty);
  expect_consistent();

  // A second active slot, evicting an active one.
  auto other = gpu_->create_slot("third");
  ASSERT_TRUE(gpu_->activate(*id, ActivationOptions{2 * kMiB}));
  auto second_active = gpu_->activate(*id);
  ASSERT_FALSE(second_active);
  EXPECT_EQ(second_active.error().code, VmmErrc::bad_state);
  auto evict_active = gpu_->evict(*id);
  ASSERT_FALSE(evict_active);
  EXPECT_NE(evict_active.error().message.find("deactivate"), std::string::npos);
  (void)other;
  expect_consistent();
}

TEST_F(GpuMemoryTest, DriverFaultMidPrewarmLeavesEveryPageAccountedFor) {
  // The 3rd cuMemMap of the process fails: the prewarm's third page.
  ::setenv("THAW_EMU_FAULTS", "cuMemMap:3=CUDA_ERROR_OUT_OF_MEMORY", 1);
  start();
  ::unsetenv("THAW_EMU_FAULTS");
  make_model();
  auto id = gpu_->create_slot("faulty");
  ASSERT_TRUE(id);
  auto r = gpu_->prewarm(*id, *layout_, *source_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, VmmErrc::driver);
  EXPECT_EQ(r.error().cuda_name, "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_NE(r.error().message.find("cuMemMap"), std::string::npos) << r.error().message;
  EXPECT_EQ(gpu_->slot(*id)->state, SlotState::empty);
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
  expect_consistent();
  // Only that call failed: the same prewarm now succeeds.
  ASSERT_TRUE(gpu_->prewarm(*id, *layout_, *source_));
  expect_bytes(*id, *layout_);
  expect_consistent();
}

TEST_F(GpuMemoryTest, PoolCreationFaultLeaksNothing) {
  ::setenv("THAW_EMU_FAULTS", "cuMemCreate:5=CUDA_ERROR_OUT_OF_MEMORY", 1);
  driver_ = testing::load_driver();
  GpuMemoryConfig config;
  config.pool_bytes = 64 * kMiB;
  auto gpu = GpuMemory::create(driver_, config);
  ::unsetenv("THAW_EMU_FAULTS");
  ASSERT_FALSE(gpu);
  EXPECT_EQ(gpu.error().cuda_name, "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_NE(gpu.error().message.find("page 5 of 32"), std::string::npos) << gpu.error().message;
  const auto stats = testing::device_stats(*driver_);
  EXPECT_EQ(stats.process_bytes_in_use, 0u);
  EXPECT_EQ(stats.vmm_handle_refs, 0u);
  EXPECT_EQ(stats.physical_allocations, 0u);
}

TEST_F(GpuMemoryTest, LendKvToAnotherSlotAndReclaimIt) {
  start();
  make_model(2, 256);  // ~7 MiB: 4 pages
  const SlotId a = prewarmed_slot("serving");
  ASSERT_TRUE(gpu_->activate(a, ActivationOptions{}));
  gpu_->wait_idle();
  const std::size_t kv_before = gpu_->slot(a)->kv_pages;
  ASSERT_GT(kv_before, 10u);
  // Grace period: keep Eq. 1's target, lend the rest to the next model.
  const std::uint64_t keep =
      reservation_target(KvUsage{kv_before * 2 * kMiB, 6 * kMiB, /*running=*/2, /*max_batch=*/16});
  auto b = gpu_->create_slot("next");
  ASSERT_TRUE(b);
  auto lent = gpu_->lend_kv(a, *b, keep);
  ASSERT_TRUE(lent) << lent.error().message;
  EXPECT_EQ(*lent, kv_before - (keep + 2 * kMiB - 1) / (2 * kMiB));
  EXPECT_EQ(gpu_->pool().lent, *lent);
  expect_consistent();
  // The borrower's prewarm uses the lent pages (the pool has no other free pages).
  EXPECT_EQ(gpu_->pool().free, 0u);
  ASSERT_TRUE(gpu_->prewarm(*b, *layout_, *source_));
  expect_bytes(*b, *layout_);
  expect_consistent();
  // The serving engine needs two pages back: first the unused lent ones.
  const std::size_t unused = *lent - gpu_->slot(*b)->weight_pages;
  auto got = gpu_->reclaim_kv(a, (unused + 1) * 2 * kMiB);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(*got, unused + 1);
  EXPECT_LT(gpu_->slot(*b)->loaded_bytes, layout_->extent());  // lost its top page
  expect_consistent();
  // The serving instance ends: what the borrower holds becomes its own.
  ASSERT_TRUE(gpu_->deactivate(a));
  expect_consistent();
  EXPECT_EQ(gpu_->pool().lent, 0u);
  EXPECT_EQ(gpu_->slot(*b)->state, SlotState::prewarmed);
  ASSERT_TRUE(gpu_->prewarm(*b, *layout_, *source_));  // tops it up again
  expect_bytes(*b, *layout_);
  expect_consistent();
}

TEST(ReservationTarget, FollowsEquationOne) {
  // M = 1000, C = 10: M/C = 100.
  EXPECT_EQ(reservation_target({1000, 0, 0, 10}), 100u);      // idle: one request's headroom
  EXPECT_EQ(reservation_target({1000, 50, 5, 10}), 500u);     // R/C dominates
  EXPECT_EQ(reservation_target({1000, 700, 5, 10}), 800u);    // K + M/C dominates
  EXPECT_EQ(reservation_target({1000, 990, 10, 10}), 1000u);  // capped at M
  EXPECT_EQ(reservation_target({1000, 0, 3, 0}), 1000u);      // C = 0 read as 1
}

TEST_F(GpuMemoryTest, EngineLayoutPagesMappedBySecondProcessHoldTheFileBytes) {
  start();
  make_model();
  // An engine's recorded copy map: tensors in reverse order, at its allocator's offsets
  // (512-byte granules with gaps), as a caching allocator would place them.
  std::vector<LayoutPiece> recorded;
  std::uint64_t at = 0;
  const auto& packed = layout_->pieces();
  for (auto it = packed.rbegin(); it != packed.rend(); ++it) {
    recorded.push_back(LayoutPiece{at, it->file, it->file_offset, it->bytes, it->layer});
    at = (at + it->bytes + 1024 + 511) / 512 * 512;
  }
  auto layout = WeightLayout::engine(recorded);
  ASSERT_TRUE(layout);
  auto id = gpu_->create_slot("engine-layout");
  ASSERT_TRUE(id);
  ASSERT_TRUE(gpu_->prewarm(*id, *layout, *source_));
  expect_bytes(*id, *layout);

  auto exported = gpu_->export_range(*id, 0, layout->extent());
  ASSERT_TRUE(exported) << exported.error().message;
  const std::string layout_file = (dir_.path() / "layout.txt").string();
  {
    std::ofstream out(layout_file);
    for (const auto& p : layout->pieces()) {
      out << p.slot_offset << ' ' << p.file << ' ' << p.file_offset << ' ' << p.bytes << '\n';
    }
  }
  std::vector<std::string> argv = {THAW_VMM_IMPORT_PEER, dir_.path().string(), layout_file,
                                   std::to_string(gpu_->slot(*id)->base),
                                   std::to_string(gpu_->pool().page_bytes)};
  for (const auto& page : exported->pages) {
    ::fcntl(page.fd, F_SETFD, 0);  // inherited by the peer
    argv.push_back(std::to_string(page.fd) + ":" + std::to_string(page.slot_offset));
  }
  // Until the importer confirms, the pages are pinned.
  auto early = gpu_->evict(*id);
  ASSERT_FALSE(early);
  EXPECT_NE(early.error().message.find("confirm"), std::string::npos);

  EXPECT_EQ(testing::run_program(argv), 0);
  for (const auto& page : exported->pages) ::close(page.fd);
  ASSERT_TRUE(gpu_->confirm_import(exported->token));
  EXPECT_EQ(gpu_->confirm_import(exported->token).error().code, VmmErrc::unknown_export);
  ASSERT_TRUE(gpu_->evict(*id));
  expect_consistent();
}

TEST_F(GpuMemoryTest, NothingLeaksOnceTheManagerIsGone) {
  start();
  make_model();
  const SlotId a = prewarmed_slot("a");
  (void)prewarmed_slot("b");
  ASSERT_TRUE(gpu_->activate(a, ActivationOptions{8 * kMiB}));
  ASSERT_TRUE(gpu_->ensure_kv(a, 8 * kMiB));
  gpu_.reset();  // active slot, prewarmed slot, KV: all torn down
  const auto stats = testing::device_stats(*driver_);
  EXPECT_EQ(stats.process_bytes_in_use, 0u);
  EXPECT_EQ(stats.vmm_handle_refs, 0u);
  EXPECT_EQ(stats.vmm_mappings, 0u);
  EXPECT_EQ(stats.physical_allocations, 0u);
  const auto process = testing::process_stats(*driver_);
  EXPECT_EQ(process.reservations, 0u);
  EXPECT_EQ(process.streams, 0u);
}

}  // namespace
}  // namespace thaw::vmm
