// MetricsServer's life cycle: destroying it at any moment after start() ends its thread.
// A stop that came before cpp-httplib's listening thread marked itself running was lost,
// and the destructor's join() hung (thawd under systemd: a SIGTERM right after READY=1 was
// a 60 s hang and a SIGKILL).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "daemon/metrics/metrics_server.hpp"

namespace {

using namespace std::chrono_literals;
using thaw::daemon::MetricsServer;

TEST(MetricsServer, StoppingRightAfterTheStartNeverHangs) {
  // Each round stops the server at once, when its thread has most likely not run yet: the
  // window the hang needed. 200 rounds take well under a second when nothing hangs.
  auto rounds = std::async(std::launch::async, [] {
    for (int i = 0; i < 200; ++i) {
      auto server = MetricsServer::start("127.0.0.1:0", [] { return std::string("# EOF\n"); });
      if (!server) return "round " + std::to_string(i) + ": " + server.error();
      server->reset();
    }
    return std::string();
  });
  if (rounds.wait_for(60s) != std::future_status::ready) {
    // The stuck round's join() never returns: leave now, saying why, rather than at ctest's
    // timeout with no message.
    std::fprintf(stderr, "MetricsServer: destroying a just-started server hung in join()\n");
    std::_Exit(1);
  }
  EXPECT_EQ(rounds.get(), "");
}

TEST(MetricsServer, AListenWithoutAPortIsRefusedSayingSo) {
  auto bad = MetricsServer::start("no-port-here", [] { return std::string(); });
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("expected HOST:PORT"), std::string::npos) << bad.error();
}

}  // namespace
