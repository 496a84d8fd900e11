// What the agent's suites share: a real NodeService over a host cache in a temporary
// directory (no registry, no GPU) with a WorkerLauncher for supervised children, and reading
// what a worker wrote.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/agent/worker_launcher.hpp"
#include "daemon/service/node_service.hpp"
#include "temp_dir.hpp"

namespace thaw::daemon::testing {

inline std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class NodeServiceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = store::HostCache::open({dir_.path() / "cache", 1ull << 30, {}, {}});
    ASSERT_TRUE(cache) << cache.error().message;
    cache_.emplace(std::move(*cache));
    service_ = std::make_unique<NodeService>(*cache_, std::vector<vmm::GpuMemory*>{},
                                             NodeServiceConfig{"", 4, 0});
    workers_ = std::make_unique<WorkerLauncher>(dir_.path() / "workers", false);
  }
  // Subclasses release what uses these first.
  void TearDown() override {
    workers_.reset();
    service_.reset();
  }

  thaw::testing::TempDir dir_;
  std::optional<store::HostCache> cache_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<WorkerLauncher> workers_;
};

}  // namespace thaw::daemon::testing
