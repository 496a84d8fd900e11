// A stage fetch that consolidates, against nginx on loopback: every socket the store opens
// carries the SO_MARK of its class as thaw's classifier reads it (bpf/traffic_class.h) —
// the stage's bytes critical, the rest background — read back with getsockopt(SO_MARK).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "bpf/traffic_class.h"
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

}  // namespace
}  // namespace thaw::store
