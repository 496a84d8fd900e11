// Prewarm from the host cache while the file is still being filled: the prewarm copies each
// range as its chunks are verified (and not before), and a failed fetch fails the prewarm
// with the store's reason and leaves the GPU's pages all free.
#include "daemon/prewarm/cache_weight_source.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "common/cuda/driver.hpp"
#include "vmm/gpu_memory.hpp"

namespace thaw::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr std::uint64_t kChunk = 1 << 20;
constexpr std::uint64_t kFileBytes = 12 * kChunk + 12345;
constexpr const char* kKey = "streamed";
constexpr const char* kFile = "model.safetensors";

class CacheWeightSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "thaw-prewarm-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    root_ = templ;
    auto cache =
        store::HostCache::open(store::HostCacheConfig{root_ / "cache", 1ull << 30, {}, {}});
    ASSERT_TRUE(cache) << cache.error().message;
    cache_.emplace(std::move(*cache));
    auto file = cache_->open_file(kKey, kFile, store::CacheFileSpec{kFileBytes, kChunk});
    ASSERT_TRUE(file) << file.error().message;
    file_ = *file;
    bytes_.resize(kFileBytes);
    std::mt19937 rng(5);
    for (auto& b : bytes_) b = static_cast<std::byte>(rng() & 0xff);

    auto driver = cuda::Driver::load();
    ASSERT_TRUE(driver) << driver.error().what();
    driver_ = *driver;
    vmm::GpuMemoryConfig config;
    config.pool_bytes = 64 << 20;
    auto gpu = vmm::GpuMemory::create(driver_, config);
    ASSERT_TRUE(gpu) << gpu.error().message;
    gpu_ = std::move(*gpu);
    // Two pieces in reverse file order, as an engine's copy map may have them.
    auto layout = vmm::WeightLayout::engine(
        {vmm::LayoutPiece{0, kFile, 6 * kChunk, kFileBytes - 6 * kChunk, 0},
         vmm::LayoutPiece{8 * kChunk, kFile, 0, 6 * kChunk, 1}});
    ASSERT_TRUE(layout);
    layout_.emplace(std::move(*layout));
  }
  void TearDown() override {
    gpu_.reset();
    file_.reset();
    cache_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Writes and verifies chunk c, as the store's fetch does.
  void land(std::uint64_t c) {
    const std::uint64_t begin = c * kChunk;
    const std::uint64_t n = std::min(kChunk, kFileBytes - begin);
    ASSERT_TRUE(file_->write_at(begin, std::span(bytes_).subspan(begin, n)));
    ASSERT_TRUE(file_->readiness().mark_verified(c));
  }

  fs::path root_;
  std::optional<store::HostCache> cache_;
  std::shared_ptr<store::CacheFile> file_;
  std::vector<std::byte> bytes_;
  std::shared_ptr<const cuda::Driver> driver_;
  std::unique_ptr<vmm::GpuMemory> gpu_;
  std::optional<vmm::WeightLayout> layout_;
};

TEST_F(CacheWeightSourceTest, PrewarmCopiesEachRangeAsItsChunksAreVerified) {
  CacheWeightSource source(*cache_, kKey);
  auto slot = gpu_->create_slot("streamed");
  ASSERT_TRUE(slot);
  std::atomic<std::uint64_t> progress{0};
  std::optional<vmm::VmmResult<vmm::PrewarmReport>> result;
  std::thread prewarm([&] {
    vmm::PrewarmOptions options;
    options.on_progress = [&](std::uint64_t done, std::uint64_t) { progress = done; };
    result.emplace(gpu_->prewarm(*slot, *layout_, source, options));
  });
  // The first piece needs chunks 6..12: with only chunks 0..5 landed nothing is copied.
  for (std::uint64_t c = 0; c < 6; ++c) land(c);
  std::this_thread::sleep_for(200ms);
  EXPECT_LT(progress.load(), kFileBytes - 6 * kChunk) << "copied bytes that were not verified";
  // Meanwhile the slot is loading: it can be neither activated nor evicted.
  EXPECT_EQ(gpu_->slot(*slot)->state, vmm::SlotState::loading);
  auto early = gpu_->activate(*slot);
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, vmm::VmmErrc::bad_state);
  EXPECT_NE(early.error().message.find("wait for its prewarm"), std::string::npos)
      << early.error().message;
  EXPECT_EQ(gpu_->evict(*slot).error().code, vmm::VmmErrc::bad_state);
  for (std::uint64_t c = 6; c < 13; ++c) land(c);
  prewarm.join();
  ASSERT_TRUE(*result) << result->error().message;
  EXPECT_EQ((*result)->bytes_copied, kFileBytes);
  const auto base = gpu_->slot(*slot)->base;
  for (const auto& p : layout_->pieces()) {
    std::vector<std::byte> device(p.bytes);
    ASSERT_TRUE(driver_->memcpy_dtoh(device.data(), base + p.slot_offset, p.bytes));
    EXPECT_TRUE(std::equal(device.begin(), device.end(), bytes_.begin() + p.file_offset));
  }
}

TEST_F(CacheWeightSourceTest, FailedFetchFailsThePrewarmWithTheStoresReason) {
  CacheWeightSource source(*cache_, kKey);
  auto slot = gpu_->create_slot("doomed");
  ASSERT_TRUE(slot);
  std::optional<vmm::VmmResult<vmm::PrewarmReport>> result;
  std::thread prewarm([&] { result.emplace(gpu_->prewarm(*slot, *layout_, source)); });
  for (std::uint64_t c = 6; c < 13; ++c) land(c);  // first piece done, second never comes
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(file_->readiness().mark_failed("chunk 3 failed its sha256 twice"));
  prewarm.join();
  ASSERT_FALSE(*result);
  EXPECT_EQ(result->error().code, vmm::VmmErrc::source);
  EXPECT_NE(result->error().message.find("failed its sha256"), std::string::npos)
      << result->error().message;
  gpu_->wait_idle();
  EXPECT_EQ(gpu_->slot(*slot)->state, vmm::SlotState::empty);
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
  auto ok = gpu_->check_invariants();
  EXPECT_TRUE(ok) << ok.error();
}

TEST_F(CacheWeightSourceTest, UncachedModelIsAClearError) {
  CacheWeightSource source(*cache_, "never-fetched", 1s);
  auto r = source.wait_bytes(kFile, 0, 10);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("fetch the model"), std::string::npos) << r.error().message;
  CacheWeightSource waiting(*cache_, kKey, 100ms);
  auto late = waiting.wait_bytes(kFile, 0, 10);
  ASSERT_FALSE(late);
  EXPECT_NE(late.error().message.find("not fetched within"), std::string::npos);
}

}  // namespace
}  // namespace thaw::daemon
