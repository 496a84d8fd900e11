// Router: routing among a model's workers, route switches, the hold queue and its deadline,
// cold-start asks, load windows. No sockets: threads stand in for concurrent requests.
#include "gateway/router.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

namespace thaw::gateway {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

WorkerRoute serving(const std::string& url) {
  return WorkerRoute{url, WorkerState::serving, "p-1", 0, "n"};
}
WorkerRoute starting() {
  return WorkerRoute{"", WorkerState::cold_starting, "p-1", 0, "n"};
}

RouterOptions quick(std::size_t queue = 4, std::chrono::milliseconds deadline = 300ms) {
  RouterOptions o;
  o.hold_queue = queue;
  o.hold_deadline = deadline;
  o.cold_start_retry = 10s;
  return o;
}

TEST(Router, UnknownModelIsRefusedAtOnce) {
  Router router(quick(), nullptr);
  router.replace({{"a", {serving("http://h:1")}}});
  const auto t0 = Clock::now();
  auto lease = router.acquire("b");
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, RouteError::Kind::unknown_model);
  EXPECT_NE(lease.error().message.find("`b`"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 50ms);
}

TEST(Router, LeastOutstandingPrefersTheIdleWorkerAndTakesTurnsOnTies) {
  Router router(quick(), nullptr);
  router.replace({{"m", {serving("http://a:1"), serving("http://b:1")}}});
  auto first = router.acquire("m");
  ASSERT_TRUE(first);
  auto second = router.acquire("m");
  ASSERT_TRUE(second);
  EXPECT_NE((*first)->url(), (*second)->url());  // a tie: turns
  const std::string busy = (*first)->url();
  second->reset();  // the other one is idle now
  for (int i = 0; i < 3; ++i) {
    auto next = router.acquire("m");
    ASSERT_TRUE(next);
    EXPECT_NE((*next)->url(), busy) << "picked the worker that has a request outstanding";
  }
  EXPECT_EQ(router.outstanding(busy), 1u);
}

TEST(Router, RoundRobinIgnoresLoad) {
  RouterOptions o = quick();
  o.balance = Balance::round_robin;
  Router router(o, nullptr);
  router.replace({{"m", {serving("http://a:1"), serving("http://b:1")}}});
  std::vector<std::unique_ptr<Lease>> held;
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) {
    auto l = router.acquire("m");
    ASSERT_TRUE(l);
    order.push_back((*l)->url());
    held.push_back(std::move(*l));
  }
  EXPECT_EQ(order,
            (std::vector<std::string>{"http://a:1", "http://b:1", "http://a:1", "http://b:1"}));
}

TEST(Router, UnreachableWorkerIsPassedOverWhileOthersServe) {
  Router router(quick(), nullptr);
  router.replace({{"m", {serving("http://dead:1"), serving("http://live:1")}}});
  router.mark_unreachable("http://dead:1", 10s);
  std::vector<std::unique_ptr<Lease>> held;
  for (int i = 0; i < 4; ++i) {
    auto l = router.acquire("m");
    ASSERT_TRUE(l);
    EXPECT_EQ((*l)->url(), "http://live:1");  // even with the live one busy
    held.push_back(std::move(*l));
  }
  // When every worker refused lately, they are still tried (better than refusing outright).
  router.mark_unreachable("http://live:1", 10s);
  EXPECT_TRUE(router.acquire("m"));
  router.mark_unreachable("http://dead:1", 0ms);  // its pause is over
  auto busy = router.acquire("m");
  ASSERT_TRUE(busy);
  EXPECT_EQ((*busy)->url(), "http://dead:1");
}

TEST(Router, RouteSwitchSendsOnlyNewRequestsToTheNewWorker) {
  Router router(quick(), nullptr);
  router.replace({{"m", {serving("http://stage0:1")}}});
  auto in_flight = router.acquire("m");
  ASSERT_TRUE(in_flight);
  // Consolidation: the pipeline's entry drains, the full worker serves.
  router.replace({{"m",
                   {WorkerRoute{"http://stage0:1", WorkerState::draining, "p-1", 0, "n0"},
                    serving("http://full:1")}}});
  EXPECT_EQ((*in_flight)->url(), "http://stage0:1");
  EXPECT_EQ(router.outstanding("http://stage0:1"), 1u);  // its lease survived the switch
  for (int i = 0; i < 3; ++i) {
    auto next = router.acquire("m");
    ASSERT_TRUE(next);
    EXPECT_EQ((*next)->url(), "http://full:1");
  }
  in_flight->reset();
  EXPECT_EQ(router.outstanding("http://stage0:1"), 0u);
}

TEST(Router, HeldRequestIsAnsweredWhenAWorkerAppears) {
  Router router(quick(4, 5000ms), nullptr);
  router.replace({{"m", {starting()}}});
  auto waiter = std::async(std::launch::async, [&] { return router.acquire("m"); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(waiter.wait_for(0ms), std::future_status::timeout) << "not held";
  EXPECT_EQ(router.take_window(Clock::now())[0].queue_length, 1u);
  router.replace({{"m", {serving("http://ready:1")}}});
  ASSERT_EQ(waiter.wait_for(2s), std::future_status::ready);
  auto lease = waiter.get();
  ASSERT_TRUE(lease);
  EXPECT_EQ((*lease)->url(), "http://ready:1");
}

TEST(Router, DeadlinePassesWithAClearError) {
  Router router(quick(4, 200ms), nullptr);
  router.replace({{"m", {starting()}}});
  const auto t0 = Clock::now();
  auto lease = router.acquire("m");
  const auto waited = Clock::now() - t0;
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, RouteError::Kind::deadline);
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 1s);
}

TEST(Router, HoldQueueIsBounded) {
  Router router(quick(2, 2000ms), nullptr);
  router.replace({{"m", {starting()}}});
  auto a = std::async(std::launch::async, [&] { return router.acquire("m"); });
  auto b = std::async(std::launch::async, [&] { return router.acquire("m"); });
  std::this_thread::sleep_for(100ms);
  auto c = router.acquire("m");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().kind, RouteError::Kind::queue_full);
  router.replace({{"m", {serving("http://w:1")}}});
  EXPECT_TRUE(a.get());
  EXPECT_TRUE(b.get());
}

TEST(Router, ColdStartIsAskedOnceForManyHeldRequestsAndAgainAfterTheRetryTime) {
  std::atomic<int> asks{0};
  RouterOptions o = quick(16, 700ms);
  o.cold_start_retry = 400ms;
  Router router(o, [&](const std::string& model) {
    EXPECT_EQ(model, "m");
    ++asks;
  });
  router.replace({{"m", {}}});  // deployed, nothing running
  std::vector<std::future<std::expected<std::unique_ptr<Lease>, RouteError>>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::async(std::launch::async, [&] { return router.acquire("m"); }));
  }
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(asks.load(), 1);
  for (auto& h : held) EXPECT_FALSE(h.get());  // nobody started it: the deadline
  EXPECT_EQ(asks.load(), 2);                   // asked again after 400 ms
}

TEST(Router, NoColdStartIsAskedWhileOneIsUnderWay) {
  std::atomic<int> asks{0};
  Router router(quick(4, 200ms), [&](const std::string&) { ++asks; });
  router.replace({{"m", {starting()}}});
  EXPECT_FALSE(router.acquire("m"));
  EXPECT_EQ(asks.load(), 0);
}

TEST(Router, ColdStartAskThatAnswersAtOnceIsSeen) {
  // The control plane may replace the table from inside the ask (a fake, or a fast push).
  Router* self = nullptr;
  Router router(quick(4, 2000ms), [&](const std::string&) {
    self->replace({{"m", {serving("http://w:1")}}});
  });
  self = &router;
  router.replace({{"m", {}}});
  const auto t0 = Clock::now();
  auto lease = router.acquire("m");
  ASSERT_TRUE(lease);
  EXPECT_LT(Clock::now() - t0, 500ms);
}

TEST(Router, RefusedColdStartFailsHeldRequestsWithItsReason) {
  Router* self = nullptr;
  std::thread coordinator;  // answers the ask a little later, as a real one does
  Router router(quick(4, 10'000ms), [&](const std::string& m) {
    coordinator = std::thread([&, m] {
      std::this_thread::sleep_for(50ms);
      self->cold_start_refused(m, "no live node has room");
    });
  });
  self = &router;
  router.replace({{"m", {}}});
  const auto t0 = Clock::now();
  auto lease = router.acquire("m");
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, RouteError::Kind::cold_start_refused);
  EXPECT_NE(lease.error().message.find("no live node has room"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 2s);
  coordinator.join();
  // A refusal while a cold start is under way (another gateway's, say) changes nothing.
  router.replace({{"m", {starting()}}});
  router.cold_start_refused("m", "late");
  EXPECT_FALSE(router.acquire("m", Clock::now() + 100ms).has_value());
  EXPECT_EQ(router.acquire("m", Clock::now() + 100ms).error().kind, RouteError::Kind::deadline);
}

TEST(Router, StopFailsHeldRequests) {
  Router router(quick(4, 10'000ms), nullptr);
  router.replace({{"m", {starting()}}});
  auto waiter = std::async(std::launch::async, [&] { return router.acquire("m"); });
  std::this_thread::sleep_for(50ms);
  router.stop();
  ASSERT_EQ(waiter.wait_for(1s), std::future_status::ready);
  auto lease = waiter.get();
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, RouteError::Kind::stopping);
}

TEST(Router, LoadWindowCountsArrivalsConcurrencyAndQueue) {
  Router router(quick(), nullptr);
  router.replace({{"m", {serving("http://w:1"), starting()}}, {"idle", {}}});
  auto t0 = Clock::now();
  (void)router.take_window(t0);
  {
    Router::InFlight a(router, "m"), b(router, "m");
    Router::InFlight unknown(router, "nope");  // not counted anywhere
    auto samples = router.take_window(t0 + 2s);
    ASSERT_EQ(samples.size(), 2u);
    const ModelLoadSample& idle = samples[0];
    const ModelLoadSample& m = samples[1];
    EXPECT_EQ(idle.model, "idle");
    EXPECT_EQ(idle.arrivals, 0u);
    EXPECT_EQ(m.model, "m");
    EXPECT_EQ(m.arrivals, 2u);
    EXPECT_EQ(m.concurrent, 2u);
    EXPECT_EQ(m.active_instances, 2u);
    EXPECT_NEAR(m.window_s, 2.0, 0.01);
  }
  auto next = router.take_window(t0 + 3s);
  EXPECT_EQ(next[1].arrivals, 0u);  // a new window
  EXPECT_EQ(next[1].concurrent, 0u);
  EXPECT_EQ(router.models(), (std::vector<std::string>{"idle", "m"}));
}

TEST(Router, ModelRemovedWhileInFlightIsForgottenAfterwards) {
  Router router(quick(), nullptr);
  router.replace({{"m", {serving("http://w:1")}}});
  {
    Router::InFlight req(router, "m");
    auto lease = router.acquire("m");
    ASSERT_TRUE(lease);
    router.replace({});
    EXPECT_FALSE(router.knows("m"));
    EXPECT_EQ((*lease)->url(), "http://w:1");
  }
  EXPECT_TRUE(router.take_window(Clock::now()).empty());
  EXPECT_EQ(router.outstanding("http://w:1"), 0u);
}

}  // namespace
}  // namespace thaw::gateway
