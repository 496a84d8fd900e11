// HandoverRunner off the server's thread, the reference engine's executor against an engine
// that is not there, and the standalone worker's route in the gateways' table.
#include "coordinator/server/handover_runner.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "coordinator/server/gateway_hub.hpp"

namespace thaw::coordinator {
namespace {

using namespace std::chrono_literals;

std::vector<HandoverResult> wait_for(HandoverRunner& r, std::size_t n) {
  std::vector<HandoverResult> all;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (all.size() < n && std::chrono::steady_clock::now() < end) {
    for (HandoverResult& x : r.finished()) all.push_back(std::move(x));
    std::this_thread::sleep_for(5ms);
  }
  return all;
}

TEST(HandoverRunner, RunsOrdersInTheBackgroundAndHandsBackEachResultOnce) {
  std::atomic<int> calls{0};
  HandoverRunner runner([&](const MigrationOrder& o) {
    ++calls;
    std::this_thread::sleep_for(20ms);
    return HandoverResult{o.plan_id, o.drain, o.drain ? "" : "no KV interface"};
  });
  const auto t0 = std::chrono::steady_clock::now();
  runner.start({.plan_id = "p-1", .drain = true});
  runner.start({.plan_id = "p-2", .drain = false});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15ms) << "start() does not wait";
  auto results = wait_for(runner, 2);
  ASSERT_EQ(results.size(), 2u);
  std::sort(results.begin(), results.end(),
            [](const auto& a, const auto& b) { return a.plan_id < b.plan_id; });
  EXPECT_TRUE(results[0].ok);
  EXPECT_FALSE(results[1].ok);
  EXPECT_EQ(results[1].error, "no KV interface");
  EXPECT_TRUE(runner.finished().empty());
  EXPECT_EQ(calls.load(), 2);
}

TEST(HandoverRunner, TheReferenceEngineExecutorFailsClearlyWhenNoEngineAnswers) {
  // Port 1 on loopback: nothing listens; both modes fail at once with a reason.
  for (bool drain : {true, false}) {
    MigrationOrder o{.plan_id = "p-9",
                     .drain = drain,
                     .from_url = "http://127.0.0.1:1",
                     .to_url = "http://127.0.0.1:1",
                     .stage_urls = {"http://127.0.0.1:1", "http://127.0.0.1:1"}};
    const HandoverResult r = refengine_handover(o);
    EXPECT_EQ(r.plan_id, "p-9");
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.error.empty());
  }
}

TEST(GatewayRoutes, AStandaloneWorkerIsRoutedNextToItsDrainingPipeline) {
  std::map<std::string, PlanRecord> plans;
  PlanRecord& p = plans["p-1"];
  p.plan.set_id("p-1");
  p.plan.set_model("llama");
  v1::PlannedStage* s0 = p.plan.add_placement();
  s0->set_stage(0);
  s0->set_node_id("n0");
  s0->set_worker_url("http://10.0.0.1:20001");
  s0->set_route_state(v1::WORKER_DRAINING);
  s0->set_standalone_url("http://10.0.0.1:20005");
  s0->set_standalone_route(v1::WORKER_SERVING);
  v1::PlannedStage* s1 = p.plan.add_placement();
  s1->set_stage(1);
  s1->set_node_id("n1");
  const v1::RouteTable t = GatewayHub::routes(plans, {"llama"});
  ASSERT_EQ(t.models_size(), 1);
  ASSERT_EQ(t.models(0).workers_size(), 2);
  std::map<std::string, v1::WorkerState> by_url;
  for (const v1::WorkerRoute& w : t.models(0).workers()) by_url[w.url()] = w.state();
  EXPECT_EQ(by_url["http://10.0.0.1:20001"], v1::WORKER_DRAINING);
  EXPECT_EQ(by_url["http://10.0.0.1:20005"], v1::WORKER_SERVING);
}

// A failed cold start (fail_cold_start) gives no route, not even a cold-starting one: gateways
// would hold its requests for it; without a route they ask and get the refusal at once.
TEST(GatewayRoutes, AFailedColdStartHasNoRoute) {
  std::map<std::string, PlanRecord> plans;
  PlanRecord& p = plans["p-1"];
  p.plan.set_id("p-1");
  p.plan.set_model("llama");
  v1::PlannedStage* s0 = p.plan.add_placement();
  s0->set_stage(0);
  s0->set_node_id("n0");
  s0->set_route_state(v1::WORKER_COLD_STARTING);
  ASSERT_EQ(GatewayHub::routes(plans, {"llama"}).models(0).workers_size(), 1);
  p.failed = true;
  const v1::RouteTable t = GatewayHub::routes(plans, {"llama"});
  ASSERT_EQ(t.models_size(), 1);
  EXPECT_EQ(t.models(0).workers_size(), 0);
}

}  // namespace
}  // namespace thaw::coordinator
