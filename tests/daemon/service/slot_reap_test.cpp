// Slots that hold nothing any more go away: one the GPU emptied itself to make room (an
// activated model's KV cache took its pages) is removed at the next reap, so it neither
// lingers as "empty" nor counts against gpu.max_slots; evicting a slot twice is not an
// error.
#include <gtest/gtest.h>

#include <thread>

#include "node_service_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace thaw::daemon;

class SlotReapTest : public thaw::daemon::testing::NodeServiceFixture {
 protected:
  thaw::vmm::GpuMemoryConfig gpu_config() const override {
    thaw::vmm::GpuMemoryConfig gc = NodeServiceFixture::gpu_config();
    gc.max_slots = 2;
    return gc;
  }
  std::string prewarmed() {
    auto id = service_->prewarm("gpt-syn", 0);
    EXPECT_TRUE(id) << id.error().message;
    if (!id) return {};
    EXPECT_TRUE(until([&] { return service_->slot(*id).value().state == "prewarmed"; }));
    return *id;
  }
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
