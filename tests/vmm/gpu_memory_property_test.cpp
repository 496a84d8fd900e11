// Randomized property test of GpuMemory: thousands of operations in random order, with
// driver faults injected into cuMemMap, cuMemUnmap and the prewarm copies. After every
// step each physical page has exactly one owner and is mapped where its owner says
// (check_invariants); at the end, with the manager gone, the emulator holds zero bytes,
// handles, mappings and reservations for this process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>

#include "common/safetensors/model.hpp"
#include "vmm/gpu_memory.hpp"
#include "vmm/reservation.hpp"
#include "vmm_test_support.hpp"

namespace thaw::vmm {
namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// Fault points: the n-th call of each listed entry point fails.
std::string fault_spec(std::mt19937& rng) {
  std::string spec;
  auto add = [&](const char* call, int count, int range, const char* error) {
    std::set<int> at;
    while (static_cast<int>(at.size()) < count) at.insert(1 + static_cast<int>(rng() % range));
    for (int n : at) {
      if (!spec.empty()) spec += ',';
      spec += std::string(call) + ":" + std::to_string(n) + "=" + error;
    }
  };
  // A run makes ~1000 of each page-table call and ~1400 copies (seen with THAW_EMU_TRACE).
  add("cuMemMap", 12, 1000, "CUDA_ERROR_OUT_OF_MEMORY");
  add("cuMemSetAccess", 4, 1000, "CUDA_ERROR_OUT_OF_MEMORY");
  add("cuMemUnmap", 4, 1000, "CUDA_ERROR_UNKNOWN");
  add("cuMemcpyHtoDAsync", 6, 1300, "CUDA_ERROR_INVALID_VALUE");
  return spec;
}

TEST(GpuMemoryProperty, EveryPageHasOneOwnerThroughRandomOperationsAndFaults) {
  const unsigned seed =
      std::getenv("THAW_VMM_SEED") ? std::atoi(std::getenv("THAW_VMM_SEED")) : 20261124;
  std::mt19937 rng(seed);
  const std::string faults = fault_spec(rng);
  ::setenv("THAW_EMU_FAULTS", faults.c_str(), 1);
  SCOPED_TRACE("seed " + std::to_string(seed) + ", faults " + faults);

  testing::TempDir dir;
  testing::generate_model(dir.path(), 2, 256);  // ~7 MB: 4 pages
  auto model = safetensors::Model::open(dir.path());
  ASSERT_TRUE(model);
  auto packed = WeightLayout::packed(*model);
  ASSERT_TRUE(packed);
  MappedFileSource source(dir.path());

  auto driver = testing::load_driver();
  {
    GpuMemoryConfig config;
    config.pool_bytes = 32 * kMiB;  // 16 pages: room for ~3 models plus some KV
    auto created = GpuMemory::create(driver, config);
    ASSERT_TRUE(created) << created.error().message;
    GpuMemory& gpu = **created;

    std::vector<SlotId> ids;
    std::vector<std::uint64_t> tokens;
    int failures = 0, driver_failures = 0;
    std::map<std::string, int> done;
    auto pick = [&]() -> std::optional<SlotId> {
      if (ids.empty()) return std::nullopt;
      return ids[rng() % ids.size()];
    };
    auto active = [&]() -> std::optional<SlotId> {
      for (const SlotInfo& s : gpu.slots()) {
        if (s.state == SlotState::active) return s.id;
      }
      return std::nullopt;
    };
    constexpr int kSteps = 3000;
    for (int step = 0; step < kSteps; ++step) {
      const int op = static_cast<int>(rng() % 11);
      std::string name;
      VmmResult<void> outcome{};
      auto record = [&](auto&& result) {
        if (!result) {
          ++failures;
          if (result.error().code == VmmErrc::driver) ++driver_failures;
          EXPECT_FALSE(result.error().message.empty());
        } else {
          ++done[name];
        }
      };
      switch (op) {
        case 0:
          name = "create";
          if (ids.size() < 4) {
            auto id = gpu.create_slot("m" + std::to_string(step));
            if (id) ids.push_back(*id);
            record(id);
          }
          break;
        case 1:
          name = "destroy";
          if (auto id = pick()) {
            auto r = gpu.destroy_slot(*id);
            if (r) ids.erase(std::find(ids.begin(), ids.end(), *id));
            record(r);
          }
          break;
        case 2:
        case 3: {
          name = "prewarm";
          if (auto id = pick()) {
            PrewarmOptions options;
            if (rng() % 3 == 0) options.layers = 1;
            record(gpu.prewarm(*id, *packed, source, options));
          }
          break;
        }
        case 4:
          name = "activate";
          if (auto id = pick()) {
            record(gpu.activate(*id, ActivationOptions{(rng() % 12) * kMiB}));
          }
          break;
        case 5:
          name = "ensure_kv";
          if (auto id = active()) {
            record(gpu.ensure_kv(*id, (1 + rng() % 6) * kMiB, std::chrono::milliseconds(200)));
          }
          break;
        case 6:
          name = "deactivate";
          if (auto id = active()) record(gpu.deactivate(*id));
          break;
        case 7:
          name = "evict";
          if (auto id = pick()) record(gpu.evict(*id));
          break;
        case 8:
          name = "lend";
          if (auto a = active(); a && !ids.empty()) {
            const SlotId b = *pick();
            const auto info = gpu.slot(*a);
            const std::uint64_t capacity = info ? info->kv_pages * 2 * kMiB : 0;
            const std::uint64_t keep = reservation_target(
                KvUsage{capacity, (rng() % 4) * kMiB, static_cast<std::uint32_t>(rng() % 4), 8});
            record(gpu.lend_kv(*a, b, keep));
          }
          break;
        case 9:
          name = "reclaim";
          if (auto a = active()) record(gpu.reclaim_kv(*a, (1 + rng() % 4) * 2 * kMiB));
          break;
        case 10:
          name = "export";
          if (auto id = pick(); id && (rng() % 2 == 0 || tokens.empty())) {
            auto exported = gpu.export_range(*id, 0, 2 * kMiB * (1 + rng() % 2));
            if (exported) {
              for (auto& p : exported->pages) ::close(p.fd);
              tokens.push_back(exported->token);
            }
            record(exported);
          } else if (!tokens.empty()) {
            record(gpu.confirm_import(tokens.back()));
            tokens.pop_back();
          }
          break;
      }
      gpu.wait_idle();
      auto ok = gpu.check_invariants();
      ASSERT_TRUE(ok) << "after step " << step << " (" << name << "): " << ok.error();
    }
    for (std::uint64_t t : tokens) ASSERT_TRUE(gpu.confirm_import(t));
    for (const auto& [what, n] : done) std::printf("  %s: %d succeeded\n", what.c_str(), n);
    std::printf("  refused or failed: %d (driver errors: %d)\n", failures, driver_failures);
    // The run must have exercised the interesting paths, faults included.
    EXPECT_GT(done["prewarm"], 50);
    EXPECT_GT(done["activate"], 20);
    EXPECT_GT(done["evict"], 20);
    EXPECT_GT(done["lend"], 5);
    EXPECT_GT(done["export"], 20);
    EXPECT_GT(driver_failures, 5) << "injected faults never surfaced";
    EXPECT_GT(failures, driver_failures);  // bad-state requests were refused too
  }
  ::unsetenv("THAW_EMU_FAULTS");
  const auto stats = testing::device_stats(*driver);
  EXPECT_EQ(stats.process_bytes_in_use, 0u);
  EXPECT_EQ(stats.vmm_handle_refs, 0u);
  EXPECT_EQ(stats.vmm_mappings, 0u);
  EXPECT_EQ(stats.physical_allocations, 0u);
  EXPECT_EQ(testing::process_stats(*driver).reservations, 0u);
}

}  // namespace
}  // namespace thaw::vmm
