// NodeService without any front end: a local-directory registry (thaw-genmodel's GPT-2 with
// a manifest), a host cache in a temporary directory and one emulated GPU.
#include "daemon/service/node_service.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <mutex>
#include <random>
#include <thread>

#include "node_service_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace thaw::daemon;

class NodeServiceTest : public thaw::daemon::testing::NodeServiceFixture {
 protected:
  ModelState model_state_of(const std::string& name) { return service_->model(name).value().state; }
  ModelState model_state() { return model_state_of("gpt-syn"); }
  std::string slot_state(const std::string& id) { return service_->slot(id).value().state; }
};

TEST_F(NodeServiceTest, FetchTwiceWhileRunningJoinsAndAfterwardsResumesFromTheCache) {
  auto key = service_->fetch("gpt-syn");
  ASSERT_TRUE(key) << key.error().message;
  EXPECT_EQ(*key, "gpt-syn");
  EXPECT_EQ(service_->fetch("gpt-syn").value(), "gpt-syn");  // joins the running one
  // Waits without reaping, so the finished run's thread is still to be joined when the
  // next fetch replaces it.
  for (int i = 0; i < 3000 && model_state() != ModelState::complete; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(model_state(), ModelState::complete);
  std::this_thread::sleep_for(50ms);  // the fetch thread has returned
  const auto before = service_->counters().fetches_started.load();
  EXPECT_EQ(before, 1u);
  // Fetching again right away (before any reap) starts a new run that finds it all cached.
  ASSERT_TRUE(service_->fetch("gpt-syn"));
  ASSERT_TRUE(until([&] { return model_state() == ModelState::complete; }));
  EXPECT_EQ(service_->counters().fetches_started.load(), 2u);
  const ModelStatus m = service_->model("gpt-syn").value();
  EXPECT_EQ(m.fetched_bytes, m.total_bytes);
  EXPECT_GT(m.files, 2u);
}

// With shaping, each model gets its own id for its fetch sockets' marks (bpf/traffic_class.h),
// told to thawd's shaping (on_model_id) before its first fetch: one per cache key, kept for
// later fetches of the key, so the classifier's per-model counters stay one model's.
TEST_F(NodeServiceTest, EachModelGetsOneMarkIdToldBeforeItsFirstFetch) {
  std::vector<std::pair<std::uint16_t, std::string>> told;
  std::mutex mutex;
  NodeServiceConfig config{registry_.path().string(), 4, 0};
  config.mark_fetch_sockets = true;  // the local registry opens no socket to mark
  config.on_model_id = [&](std::uint16_t id, const std::string& key) {
    std::lock_guard lock(mutex);
    told.emplace_back(id, key);
  };
  service_->set_config(config);
  ASSERT_TRUE(service_->fetch("gpt-syn"));
  ASSERT_TRUE(until([&] { return model_state() == ModelState::complete; }));
  ASSERT_TRUE(service_->fetch("gpt-syn"));  // again: the same id, not told twice
  ASSERT_TRUE(until([&] { return model_state() == ModelState::complete; }));
  (void)service_->fetch("org/other-model");  // not in the registry: fails, but has its id
  ASSERT_TRUE(until([&] { return model_state_of("org/other-model") == ModelState::failed; }));
  std::lock_guard lock(mutex);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[0], (std::pair<std::uint16_t, std::string>{1, "gpt-syn"}));
  EXPECT_EQ(told[1].first, 2u);
  EXPECT_NE(told[1].second.find("other-model"), std::string::npos) << told[1].second;
}

TEST_F(NodeServiceTest, PrewarmOfAnUncachedModelFetchesItFirst) {
  auto slot = service_->prewarm("gpt-syn", std::nullopt);
  ASSERT_TRUE(slot) << slot.error().message;
  EXPECT_EQ(*slot, "g0s0");
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "prewarmed"; }))
      << service_->slot(*slot).value().error;
  const SlotStatus s = service_->slot(*slot).value();
  EXPECT_EQ(s.resident_bytes, s.total_bytes);
  EXPECT_EQ(model_state(), ModelState::complete);
}

TEST_F(NodeServiceTest, AttachIsExclusiveUntilTheOwnerIsReleased) {
  auto slot = service_->prewarm("gpt-syn", 0);
  ASSERT_TRUE(slot);
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "prewarmed"; }));
  auto a = service_->attach("gpt-syn", "pid 1");
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_GT(a->pages.pages.size(), 0u);
  for (const auto& p : a->pages.pages) ::close(p.fd);
  EXPECT_EQ(service_->attach("gpt-syn", "pid 2").error().name, error_name::kNotPrewarmed);
  EXPECT_EQ(service_->evict(*slot).error().name, error_name::kSlotBusy);
  EXPECT_EQ(service_->confirm_import("pid 1", *slot, a->token + 1).error().name,
            error_name::kInvalidArgument);
  // The token is the owner's: another engine cannot confirm (unpin) it, and does not use up
  // the owner's confirmation.
  EXPECT_EQ(service_->confirm_import("pid 2", *slot, a->token).error().name,
            error_name::kInvalidArgument);
  EXPECT_TRUE(service_->confirm_import("pid 1", *slot, a->token));
  EXPECT_FALSE(service_->confirm_import("pid 1", *slot, a->token)) << "confirmed twice";
  EXPECT_EQ(service_->release_owner("pid 2"), 0u);
  // A clean hand-back keeps the slot prewarmed for the next engine, once its bytes are
  // checked against the model.
  EXPECT_EQ(service_->release_owner("pid 1", "", /*handback=*/true), 1u);
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "prewarmed"; })) << slot_state(*slot);
  EXPECT_EQ(service_->counters().handbacks.load(), 1u);
  auto b = service_->attach("gpt-syn", "pid 3");
  ASSERT_TRUE(b) << b.error().message;
  for (const auto& p : b->pages.pages) ::close(p.fd);
  // Without one (the engine crashed, or could not vouch for the pages) it is evicted.
  EXPECT_EQ(service_->release_owner("pid 3"), 1u);
  EXPECT_EQ(service_->counters().discards.load(), 1u);
  EXPECT_EQ(service_->counters().prewarm_hits.load(), 2u);
  EXPECT_EQ(service_->counters().prewarm_misses.load(), 1u);
  EXPECT_TRUE(until([&] {
    service_->reap();
    return !service_->slot(*slot).has_value();
  }));
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
}

TEST_F(NodeServiceTest, AHandedBackSlotWhoseBytesChangedIsEvicted) {
  auto slot = service_->prewarm("gpt-syn", 0);
  ASSERT_TRUE(slot);
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "prewarmed"; }));
  auto a = service_->attach("gpt-syn", "pid 1");
  ASSERT_TRUE(a) << a.error().message;
  for (const auto& p : a->pages.pages) ::close(p.fd);
  // What an engine that rewrote a weight in place would leave behind.
  ASSERT_FALSE(a->layout.empty());
  const auto& piece = a->layout[a->layout.size() / 2];
  const std::uint32_t poison = 0xdeadbeef;
  auto context = driver_->primary_ctx_retain(0);
  ASSERT_TRUE(context);
  ASSERT_TRUE(driver_->ctx_set_current(*context));
  ASSERT_TRUE(
      driver_->memcpy_htod(gpu_->slot(0).value().base + piece.slot_offset, &poison, sizeof poison));
  (void)driver_->primary_ctx_release(0);
  EXPECT_EQ(service_->release_owner("pid 1", "", /*handback=*/true), 1u);
  EXPECT_TRUE(until([&] {
    service_->reap();
    return !service_->slot(*slot).has_value();
  })) << "not offered to the next engine";
  EXPECT_EQ(service_->counters().handbacks.load(), 0u);
  EXPECT_EQ(service_->counters().discards.load(), 1u);
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
}

TEST_F(NodeServiceTest, PagesAnEngineCopiedOutAreFreedAndItsSlotIsNotHandedBack) {
  auto slot = service_->prewarm("gpt-syn", 0);
  ASSERT_TRUE(slot);
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "prewarmed"; }));
  const std::size_t free_before = gpu_->pool().free;
  auto a = service_->attach("gpt-syn", "pid 1");
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_GE(a->pages.pages.size(), 2u);
  // The engine's budget beyond the slot is every free page, their memory the driver's now.
  EXPECT_EQ(a->lent_bytes, free_before * gpu_->pool().page_bytes);
  EXPECT_EQ(a->budget_bytes, a->lent_bytes + a->pages.pages.size() * gpu_->pool().page_bytes);
  EXPECT_EQ(gpu_->pool().free, 0u);
  EXPECT_EQ(gpu_->pool().returned, free_before);
  for (const auto& p : a->pages.pages) ::close(p.fd);
  EXPECT_EQ(a->layout_kind, thaw::layout::LayoutKind::packed);
  EXPECT_EQ(a->resident_bytes, a->weight_bytes);
  EXPECT_EQ(service_->free_pages("pid 2", *slot, {0}).error().name, error_name::kUnknownSlot);
  EXPECT_EQ(service_->free_pages("pid 1", *slot, {1}).error().name, error_name::kGpu)
      << "not a page offset";
  auto freed = service_->free_pages("pid 1", *slot, {0, a->page_bytes});
  ASSERT_TRUE(freed) << freed.error().message;
  EXPECT_EQ(*freed, 2u);
  // Their memory went back to the driver: the engine needs the room for its own copy.
  EXPECT_EQ(gpu_->pool().free, 0u);
  EXPECT_EQ(gpu_->pool().returned, free_before + 2);
  EXPECT_EQ(service_->gpus()[0].pool_bytes,
            (gpu_->pool().pages - free_before - 2) * gpu_->pool().page_bytes);
  EXPECT_EQ(service_->slot(*slot).value().resident_bytes, 0u) << "its prefix is gone";
  service_->reap();
  EXPECT_EQ(gpu_->pool().returned, free_before + 2) << "not while the engine holds the slot";
  // Asking for a hand-back does not keep a slot that gave pages away; once the engine is
  // gone the pool takes its pages back from the driver.
  EXPECT_EQ(service_->release_owner("pid 1", "", /*handback=*/true), 1u);
  EXPECT_TRUE(until([&] {
    service_->reap();
    return !service_->slot(*slot).has_value() && gpu_->pool().returned == 0;
  }));
  EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
}

TEST_F(NodeServiceTest, AFailedPrewarmShowsWhyAndCanBeEvicted) {
  auto slot = service_->prewarm("no-such-model", 0);
  ASSERT_TRUE(slot) << slot.error().message;
  ASSERT_TRUE(until([&] { return slot_state(*slot) == "failed"; }));
  EXPECT_NE(service_->slot(*slot).value().error.find("fetching the model failed"),
            std::string::npos)
      << service_->slot(*slot).value().error;
  EXPECT_EQ(model_state_of("no-such-model"), ModelState::failed);
  ASSERT_TRUE(service_->evict(*slot));
  EXPECT_FALSE(service_->slot(*slot).has_value());
}

TEST_F(NodeServiceTest, RequestsNameWhatIsWrong) {
  EXPECT_EQ(service_->prewarm("gpt-syn", 3).error().name, error_name::kUnknownGpu);
  EXPECT_EQ(service_->activate("g0s9", 0).error().name, error_name::kUnknownSlot);
  EXPECT_EQ(service_->fetch("").error().name, error_name::kInvalidArgument);
  EXPECT_EQ(service_->open_file("gpt-syn", "../x").error().name, error_name::kInvalidArgument);
  EXPECT_EQ(service_->open_file("gpt-syn", "config.json").error().name, error_name::kUnknownModel);
  NodeService no_registry(*cache_, {}, NodeServiceConfig{});
  EXPECT_EQ(no_registry.fetch("gpt-syn").error().name, error_name::kNoRegistry);
  EXPECT_EQ(no_registry.prewarm("gpt-syn", std::nullopt).error().name, error_name::kNoGpu);
}

// At the shipped pool_share (0.9 of the emulated GPU: the driver alone has a tenth),
// random sequences of prewarms, attaches, engines allocating their whole budget, clean exits,
// kills and evictions. Each engine is this process allocating with cuMemAlloc what thawd's
// budget promised it beyond its slot; every such allocation must succeed (nothing promised
// twice, nothing promised that the driver does not have), every page keeps one owner, and
// when all engines are gone and all slots evicted the pool holds every page again.
class EngineBudgetProperty : public NodeServiceTest {
 protected:
  thaw::vmm::GpuMemoryConfig gpu_config() const override {
    thaw::vmm::GpuMemoryConfig gc;  // pool_bytes 0: pool_share of the device, 0.9
    return gc;
  }
  struct Engine {
    std::string owner, slot;
    std::uint64_t lent = 0;
    std::vector<CUdeviceptr> allocations;
  };
  void end(Engine& e, bool handback) {
    for (CUdeviceptr p : e.allocations) ASSERT_TRUE(driver_->mem_free(p));
    EXPECT_EQ(service_->release_owner(e.owner, "", handback), 1u);
  }
};

TEST_F(EngineBudgetProperty, RandomPrewarmAttachExitKillSequencesNeverOvercommitNorLeak) {
  ASSERT_EQ(gpu_config().pool_share, 0.9);
  auto device = driver_->device_get(0);
  ASSERT_TRUE(device);
  auto context = driver_->primary_ctx_retain(*device);
  ASSERT_TRUE(context);
  ASSERT_TRUE(driver_->ctx_set_current(*context));
  const std::size_t page = gpu_->pool().page_bytes;
  std::size_t attaches = 0, kills = 0;
  for (unsigned seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    std::vector<Engine> engines;
    int next_pid = 1;
    for (int step = 0; step < 14; ++step) {
      const int action = std::uniform_int_distribution<int>(0, 4)(rng);
      if (action == 0 && service_->slots().size() < 3) {
        auto slot = service_->prewarm("gpt-syn", std::nullopt);
        ASSERT_TRUE(slot) << slot.error().message;
        // With engines holding the pool's free pages a prewarm may find no room: it fails,
        // it never takes an engine's pages.
        ASSERT_TRUE(until([&] {
          const std::string st = slot_state(*slot);
          return st == "prewarmed" || st == "failed";
        }));
        if (slot_state(*slot) == "failed") {
          ASSERT_TRUE(service_->evict(*slot));
        }
      } else if (action == 1) {
        const std::string owner = fmt::format("pid {}", next_pid++);
        auto a = service_->attach("gpt-syn", owner);
        if (!a) continue;  // no free prewarmed slot
        ++attaches;
        for (const auto& p : a->pages.pages) ::close(p.fd);
        Engine e{owner, a->slot, a->lent_bytes, {}};
        // The engine allocates all it was promised beyond its slot, as its KV cache would.
        if (e.lent != 0) {
          auto ptr = driver_->mem_alloc(e.lent);
          ASSERT_TRUE(ptr) << "an engine could not allocate the " << e.lent
                           << " bytes its budget promised: " << ptr.error().what();
          e.allocations.push_back(*ptr);
        }
        engines.push_back(std::move(e));
      } else if ((action == 2 || action == 3) && !engines.empty()) {
        const std::size_t i =
            std::uniform_int_distribution<std::size_t>(0, engines.size() - 1)(rng);
        kills += action == 3 ? 1 : 0;
        end(engines[i], /*handback=*/action == 2);
        engines.erase(engines.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (action == 4) {
        for (const SlotStatus& s : service_->slots()) {
          if (s.owner.empty() && s.state == "prewarmed") {
            ASSERT_TRUE(service_->evict(s.id));
            break;
          }
        }
      }
      service_->reap();
      gpu_->wait_idle();
      auto ok = gpu_->check_invariants();
      ASSERT_TRUE(ok) << ok.error();
      // Every live engine's pages are still out for it: none went to a prewarm.
      std::uint64_t promised = 0;
      for (const Engine& e : engines) promised += e.lent;
      EXPECT_GE(gpu_->pool().returned * page, promised);
    }
    for (Engine& e : engines) end(e, /*handback=*/false);
    engines.clear();
    ASSERT_TRUE(until([&] {
      for (const SlotStatus& s : service_->slots()) {
        if (s.state == "prewarmed" || s.state == "failed" || s.state == "empty") {
          (void)service_->evict(s.id);
        }
      }
      return service_->slots().empty() && gpu_->pool().returned == 0;
    })) << "pages left out of the pool: "
        << gpu_->pool().returned;
    EXPECT_EQ(gpu_->pool().free, gpu_->pool().pages);
  }
  EXPECT_GT(attaches, 4u) << "the sequences should attach engines";
  EXPECT_GT(kills, 0u);
  (void)driver_->primary_ctx_release(*device);
}

}  // namespace
