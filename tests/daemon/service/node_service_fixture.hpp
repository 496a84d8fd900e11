// The NodeService suites' fixture: a local-directory registry with thaw-genmodel's GPT-2 and
// its manifest, a host cache in a temporary directory, one emulated GPU (gpu_config() says
// how its pool is made) and the service over them.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "daemon/service/node_service.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "fetch_test_support.hpp"
#include "temp_dir.hpp"

namespace thaw::daemon::testing {

class NodeServiceFixture : public ::testing::Test {
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
    driver_ = *driver;
    auto gpu = thaw::vmm::GpuMemory::create(*driver, gpu_config());
    ASSERT_TRUE(gpu) << gpu.error().message;
    gpu_ = std::move(*gpu);
    service_ = std::make_unique<NodeService>(*cache_, std::vector{gpu_.get()},
                                             NodeServiceConfig{registry_.path().string(), 4, 0});
  }
  void TearDown() override {
    service_.reset();
    gpu_.reset();
  }
  virtual thaw::vmm::GpuMemoryConfig gpu_config() const {
    thaw::vmm::GpuMemoryConfig gc;
    gc.pool_bytes = 64 << 20;
    return gc;
  }

  // Until `check` holds, reaping as thawd's timer would.
  template <typename Check>
  bool until(Check check, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      service_->reap();
      if (check()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  thaw::testing::TempDir registry_, cache_dir_;
  std::optional<thaw::store::HostCache> cache_;
  std::shared_ptr<thaw::cuda::Driver> driver_;
  std::unique_ptr<thaw::vmm::GpuMemory> gpu_;
  std::unique_ptr<NodeService> service_;
};

}  // namespace thaw::daemon::testing
