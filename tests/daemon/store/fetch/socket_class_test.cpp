// A stage fetch that consolidates, against nginx on loopback: every socket the store opens
// carries the SO_MARK of its class as thaw's classifier reads it (bpf/traffic_class.h) —
// the stage's bytes critical, the rest background — read back with getsockopt(SO_MARK).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "bpf/traffic_class.h"
#include "daemon/network/fetch_window.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/registry/socket_tagging.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

using testing::kModelName;
using testing::RegistryFixture;

bool can_set_mark() {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  unsigned int mark = 1;
  const bool ok = ::setsockopt(probe, SOL_SOCKET, SO_MARK, &mark, sizeof mark) == 0;
  ::close(probe);
  return ok;
}

struct Seen {
  FetchClass cls;
  std::uint32_t mark;
};

TEST(SocketClassTest, StageSocketsAreCriticalAndConsolidationSocketsBackground) {
  if (!can_set_mark()) GTEST_SKIP() << "SO_MARK needs CAP_NET_ADMIN; run as root";
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  std::mutex mutex;
  std::vector<Seen> seen;
  ModelFetchOptions options;
  options.model = kModelName;
  options.stage = StageSpec{1, 4};
  options.consolidate = true;
  constexpr std::uint32_t kModelId = 0x1234;
  options.fetcher.socket_tags = shaper_socket_tags(kModelId);
  options.fetcher.on_socket_tagged = [&](const SocketTagEvent& event) {
    std::uint32_t mark = 0;
    socklen_t len = sizeof mark;
    ASSERT_EQ(::getsockopt(event.fd, SOL_SOCKET, SO_MARK, &mark, &len), 0);
    std::lock_guard lock(mutex);
    seen.push_back({event.cls, mark});
  };
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;

  std::lock_guard lock(mutex);
  ASSERT_FALSE(seen.empty());
  int critical = 0, background = 0;
  for (const Seen& s : seen) {
    const int cls = thaw_mark_class(s.mark);
    EXPECT_EQ(thaw_mark_model(s.mark), kModelId);
    if (s.cls == FetchClass::critical) {
      ++critical;
      EXPECT_EQ(cls, THAW_CLASS_CRITICAL_FETCH) << std::hex << s.mark;
    } else {
      ++background;
      EXPECT_EQ(cls, THAW_CLASS_BACKGROUND_FETCH) << std::hex << s.mark;
    }
  }
  EXPECT_GT(critical, 0) << "the stage was not fetched at critical class";
  EXPECT_GT(background, 0) << "the consolidation was not fetched at background class";
  EXPECT_EQ(seen.front().cls, FetchClass::critical) << "the stage must come first";
}

// With thawd's FetchWindows set, every fetch socket is registered under its class and model
// while a transfer runs on it, its window clamped to the class's share, and unregistered when
// the transfer ends (a kept-alive idle connection is no fetch) or libcurl closes it.
TEST(SocketClassTest, FetchSocketsAreRegisteredWithTheirWindowsWhileTheyLive) {
  if (!can_set_mark()) GTEST_SKIP() << "SO_MARK needs CAP_NET_ADMIN; run as root";
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  // 1 MB/s at loopback round trips: every window is the floor of 3 segments (loopback's are
  // up to 64 KB), where an unregistered socket's would autotune to megabytes.
  auto windows = std::make_shared<network::FetchWindows>(
      network::FetchWindowRates{1'000'000, 1'000'000, 50'000});
  ModelFetchOptions options;
  options.model = kModelName;
  options.stage = StageSpec{1, 4};
  options.consolidate = true;
  constexpr std::uint32_t kModelId = 0x77;
  options.fetcher.socket_tags = shaper_socket_tags(kModelId);
  options.fetcher.fetch_windows = windows;
  std::atomic<bool> done{false};
  std::mutex mutex;
  std::set<int> classes;
  std::set<std::uint32_t> models;
  std::uint64_t smallest = ~0ull, largest = 0;
  std::size_t background_samples = 0;
  std::thread watcher([&] {
    while (!done) {
      const auto live = windows->live();
      std::size_t background = 0;
      for (const auto& l : live) background += l.traffic_class == THAW_CLASS_BACKGROUND_FETCH;
      if (background > 0) {
        std::lock_guard lock(mutex);
        ++background_samples;
      }
      for (const auto& l : live) {
        std::lock_guard lock(mutex);
        classes.insert(l.traffic_class);
        models.insert(l.model);
        smallest = std::min(smallest, l.window.bytes);
        largest = std::max(largest, l.window.bytes);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  {
    ModelFetch fetch(*registry, cache, options);
    auto result = fetch.run();
    done = true;
    watcher.join();
    ASSERT_TRUE(result) << result.error().message;
  }
  EXPECT_TRUE(windows->live().empty()) << "a closed socket stayed registered";
  EXPECT_EQ(windows->reclamp_errors(), 0u) << windows->last_error();
  std::lock_guard lock(mutex);
  EXPECT_TRUE(classes.count(THAW_CLASS_CRITICAL_FETCH)) << "no critical socket was registered";
  EXPECT_EQ(models, std::set<std::uint32_t>{kModelId});
  EXPECT_GE(smallest, network::kFetchWindowFloorBytes) << "a socket was left unclamped";
  EXPECT_LE(largest, 3u * (64u << 10)) << "a window was not clamped to the class's share";
  EXPECT_GT(background_samples, 0u) << "no background socket seen registered";
}

}  // namespace
}  // namespace thaw::store
