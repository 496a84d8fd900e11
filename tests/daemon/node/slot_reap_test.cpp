// Slots that hold nothing any more go away: one the GPU emptied itself to make room (an
// activated model's KV cache took its pages) is removed at the next reap, so it neither
// lingers as "empty" nor counts against gpu.max_slots; evicting a slot twice is not an
// error.
#include <gtest/gtest.h>

#include <thread>

#include "daemon/node/node_service.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "fetch_test_support.hpp"
#include "temp_dir.hpp"

namespace {

using namespace std::chrono_literals;
using namespace thaw::daemon;
using thaw::testing::TempDir;

class SlotReapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thaw::store::testing::generate_model(registry_.path() / "gpt-syn");
    thaw::store::PublishOptions publish;
    publish.chunk_size = 64 << 10;
    ASSERT_TRUE(thaw::store::publish_manifest(registry_.path() / "gpt-syn", publish));
    auto cache = thaw::store::HostCache::open({cache_dir_.path(), 1ull << 30, {}, {}});
    ASSERT_TRUE(cache) << cache.error().message;
    cache_.emplace(std::move(*cache));
    auto driver = thaw::cuda::Driver::load();
    ASSERT_TRUE(driver) << driver.error().what();
    thaw::vmm::GpuMemoryConfig gc;
    gc.pool_bytes = 64 << 20;
    gc.max_slots = 2;
    auto gpu = thaw::vmm::GpuMemory::create(*driver, gc);
    ASSERT_TRUE(gpu) << gpu.error().message;
    gpu_ = std::move(*gpu);
    service_ = std::make_unique<NodeService>(*cache_, std::vector{gpu_.get()},
                                             NodeServiceConfig{registry_.path().string(), 4, 0});
  }
  void TearDown() override {
    service_.reset();
    gpu_.reset();
  }

  template <typename Check>
  bool until(Check check, std::chrono::seconds timeout = 30s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      service_->reap();
      if (check()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  std::string prewarmed() {
    auto id = service_->prewarm("gpt-syn", 0);
    EXPECT_TRUE(id) << id.error().message;
    if (!id) return {};
    EXPECT_TRUE(until([&] { return service_->slot(*id).value().state == "prewarmed"; }));
    return *id;
  }

  TempDir registry_, cache_dir_;
  std::optional<thaw::store::HostCache> cache_;
  std::unique_ptr<thaw::vmm::GpuMemory> gpu_;
  std::unique_ptr<NodeService> service_;
};

TEST_F(SlotReapTest, ASlotTheGpuEmptiedForAnotherModelsKvCacheIsRemoved) {
  const std::string a = prewarmed();
  const std::string b = prewarmed();
  ASSERT_EQ(service_->slots().size(), 2u);
  // All of the pool that a does not hold, as KV cache: b's pages are taken.
  const std::uint64_t kv = (64u << 20) - service_->slot(a).value().total_bytes - (2u << 20);
  ASSERT_TRUE(service_->activate(a, kv)) << "activate";
  ASSERT_TRUE(until([&] { return !service_->slot(b).has_value(); }))
      << "slot " << b << " is still " << service_->slot(b).value().state;
  EXPECT_EQ(service_->slots().size(), 1u);
  EXPECT_EQ(service_->gpus()[0].slots, 1u) << "it no longer counts against max_slots";
  // And the room it left is usable: with max_slots 2, a new slot can be made.
  ASSERT_TRUE(service_->deactivate(a));
  const std::string c = prewarmed();
  EXPECT_FALSE(c.empty());
}

TEST_F(SlotReapTest, EvictingTwiceIsNotAnErrorAndTheSlotGoes) {
  const std::string a = prewarmed();
  ASSERT_TRUE(service_->evict(a));
  auto again = service_->evict(a);
  EXPECT_TRUE(again || again.error().name == error_name::kUnknownSlot) << again.error().message;
  ASSERT_TRUE(until([&] { return service_->slots().empty(); }));
  EXPECT_EQ(service_->gpus()[0].slots, 0u);
}

}  // namespace
