// GatewayHub (coordinator/server): the route table built from plans, change detection,
// subscriptions that expire, and gateway loads summed over live gateways.
#include "coordinator/server/gateway_hub.hpp"

#include <gtest/gtest.h>

namespace thaw::coordinator {
namespace {

PlanRecord plan(const std::string& id, const std::string& model, int stages) {
  PlanRecord r;
  r.plan.set_id(id);
  r.plan.set_model(model);
  r.plan.set_stages(stages);
  for (int s = 0; s < stages; ++s) {
    auto* st = r.plan.add_placement();
    st->set_stage(s);
    st->set_node_id("n" + std::to_string(s));
  }
  return r;
}

TEST(GatewayHub, DeployedModelsWithoutPlansHaveNoWorkers) {
  auto table = GatewayHub::routes({}, {"a", "b"});
  ASSERT_EQ(table.models_size(), 2);
  EXPECT_EQ(table.models(0).model(), "a");
  EXPECT_EQ(table.models(0).workers_size(), 0);
}

TEST(GatewayHub, UntrackedPlanIsACOldStartInFlight) {
  std::map<std::string, PlanRecord> plans{{"p-1", plan("p-1", "m", 2)}};
  auto table = GatewayHub::routes(plans, {"m"});
  ASSERT_EQ(table.models_size(), 1);
  ASSERT_EQ(table.models(0).workers_size(), 1);
  EXPECT_EQ(table.models(0).workers(0).state(), v1::WORKER_COLD_STARTING);
  EXPECT_EQ(table.models(0).workers(0).url(), "");
}

TEST(GatewayHub, OnlyEntryPointStagesAreRouted) {
  std::map<std::string, PlanRecord> plans{{"p-1", plan("p-1", "m", 2)}};
  auto* s0 = plans["p-1"].plan.mutable_placement(0);
  s0->set_worker_url("http://10.0.0.1:8000");
  s0->set_route_state(v1::WORKER_SERVING);
  // Stage 1 is internal to the pipeline: no route state.
  plans["p-1"].plan.mutable_placement(1)->set_worker_url("http://10.0.0.2:8000");
  auto table = GatewayHub::routes(plans, {});
  ASSERT_EQ(table.models(0).workers_size(), 1);
  EXPECT_EQ(table.models(0).workers(0).url(), "http://10.0.0.1:8000");
  EXPECT_EQ(table.models(0).workers(0).node_id(), "n0");
  // Scale-up: stage 1 serves too.
  plans["p-1"].plan.mutable_placement(1)->set_route_state(v1::WORKER_SERVING);
  EXPECT_EQ(GatewayHub::routes(plans, {}).models(0).workers_size(), 2);
  // A serving state without an address is not routed (the table would be refused).
  plans["p-1"].plan.mutable_placement(1)->clear_worker_url();
  EXPECT_EQ(GatewayHub::routes(plans, {}).models(0).workers_size(), 1);
}

TEST(GatewayHub, GenerationGrowsOnlyOnChange) {
  GatewayHub hub;
  auto first = hub.update(GatewayHub::routes({}, {"a"}));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->generation(), 1u);
  EXPECT_FALSE(hub.update(GatewayHub::routes({}, {"a"})));
  auto second = hub.update(GatewayHub::routes({}, {"a", "b"}));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->generation(), 2u);
  EXPECT_EQ(hub.current().generation(), 2u);
}

TEST(GatewayHub, SilentGatewaysExpireWithTheirLoads) {
  GatewayHub hub;
  v1::GatewayHello hello;
  hello.set_gateway_id("g1");
  hello.set_report_interval_s(1);
  EXPECT_TRUE(hub.hello("id1", hello, 0));
  EXPECT_FALSE(hub.hello("id1", hello, 0.5));
  hello.set_gateway_id("g2");
  EXPECT_TRUE(hub.hello("id2", hello, 0.5));
  v1::LoadReport r;
  r.set_model("m");
  r.set_concurrent_requests(3);
  r.set_queue_length(2);
  r.set_arrivals(5);
  r.set_requests_per_s(5);
  r.set_gateway_id("g1");
  hub.load(r, 0.5);
  r.set_gateway_id("g2");
  r.set_concurrent_requests(1);
  hub.load(r, 0.5);
  r.set_concurrent_requests(4);  // g2's newer report replaces its older one
  hub.load(r, 1.0);
  auto loads = hub.loads(1.0);
  EXPECT_DOUBLE_EQ(loads["m"].concurrent_requests, 7);
  EXPECT_EQ(loads["m"].queue_length, 4u);
  EXPECT_EQ(loads["m"].arrivals, 10u);
  EXPECT_EQ(loads["m"].gateways, 2u);
  hub.hello("id2", hello, 2.0);
  EXPECT_EQ(hub.subscribers(3.4).size(), 2u);  // g1 last heard at 0.5: 2.9 s
  EXPECT_EQ(hub.subscribers(3.6).size(), 1u);  // 3.1 s > 3 intervals
  hub.hello("id2", hello, 3.6);
  EXPECT_EQ(hub.subscribers(6.0).size(), 1u);
  EXPECT_EQ(hub.loads(6.0)["m"].gateways, 0u);  // g2's last report is 5 s old
}

}  // namespace
}  // namespace thaw::coordinator
