// ClassRateDispatch: which nodes get ClassRates when, and the message's round trip through
// the codec thawd's agent decodes it with (and what that codec refuses).
#include "coordinator/cluster/class_rate_dispatch.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "common/proto/cluster/cluster_codec.hpp"

namespace thaw::coordinator {
namespace {

v1::TaskStatus fetch(v1::TaskState state) {
  v1::TaskStatus s;
  s.mutable_task()->set_id("p-1/0/fetch");
  s.mutable_task()->set_kind(v1::TASK_FETCH);
  s.set_state(state);
  return s;
}

NodeRecord node(double link, int running_fetches, int done_fetches = 0) {
  NodeRecord n;
  n.report.set_node_id("n");
  n.report.set_network_bytes_per_s(link);
  for (int i = 0; i < running_fetches; ++i) *n.report.add_tasks() = fetch(v1::TASK_RUNNING);
  for (int i = 0; i < done_fetches; ++i) *n.report.add_tasks() = fetch(v1::TASK_DONE);
  v1::TaskStatus worker;
  worker.mutable_task()->set_kind(v1::TASK_LAUNCH_WORKER);
  worker.set_state(v1::TASK_RUNNING);
  *n.report.add_tasks() = worker;  // not a fetch: never counted
  return n;
}

TEST(ClassRateDispatch, CountsRunningFetchesOnly) {
  EXPECT_EQ(running_cold_starts(node(1e9, 2, 3).report), 2u);
  EXPECT_EQ(node_link_bytes_per_s(node(0, 0).report), 2e9);  // the placement's 16 Gbit/s
}

TEST(ClassRateDispatch, SendsOnChangeRepeatsWhileBusyAndRevertsOnce) {
  ClassRateDispatch dispatch({}, 30);
  std::map<std::string, NodeRecord> nodes = {{"a", node(1e9, 0)}, {"b", node(1e9, 2)}};
  auto out = dispatch.updates(nodes, 0);
  ASSERT_EQ(out.size(), 1u);  // a has no cold start and was never told otherwise
  EXPECT_EQ(out[0].node_id, "b");
  const v1::ClassRates& r = out[0].message.class_rates();
  EXPECT_EQ(r.cold_starts(), 2u);
  ASSERT_EQ(r.classes_size(), 4);
  EXPECT_DOUBLE_EQ(r.per_cold_start_bytes_per_s(), r.classes(1).rate_bytes_per_s() / 2);

  EXPECT_TRUE(dispatch.updates(nodes, 1).empty());  // nothing changed
  nodes["b"] = node(1e9, 3);
  out = dispatch.updates(nodes, 2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.class_rates().cold_starts(), 3u);
  EXPECT_TRUE(dispatch.updates(nodes, 20).empty());
  EXPECT_EQ(dispatch.updates(nodes, 33).size(), 1u) << "a busy node's rates are repeated";

  nodes["b"] = node(1e9, 0, 3);
  out = dispatch.updates(nodes, 40);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.class_rates().classes_size(), 0) << "back to its own rates";
  EXPECT_TRUE(dispatch.updates(nodes, 100).empty());

  // A node that died and came back busy is told again.
  nodes["b"] = node(1e9, 1);
  ASSERT_EQ(dispatch.updates(nodes, 101).size(), 1u);
  nodes["b"].alive = false;
  EXPECT_TRUE(dispatch.updates(nodes, 102).empty());
  nodes["b"].alive = true;
  EXPECT_EQ(dispatch.updates(nodes, 103).size(), 1u);
}

TEST(ClassRateDispatch, LooksAtMostEveryMinInterval) {
  ClassRateDispatch dispatch({}, 30, 0.25);
  std::map<std::string, NodeRecord> nodes = {{"a", node(1e9, 1)}};
  EXPECT_EQ(dispatch.updates(nodes, 10.0).size(), 1u);
  nodes["a"] = node(1e9, 2);
  EXPECT_TRUE(dispatch.updates(nodes, 10.1).empty()) << "within 0.25 s of the last walk";
  EXPECT_EQ(dispatch.updates(nodes, 10.3).size(), 1u) << "the change is sent at the next walk";
}

TEST(ClassRateDispatch, TheMessageRoundTripsThroughTheCodec) {
  v1::CoordinatorMessage m = class_rates_message(policy::node_class_rates(1.25e9, 3));
  auto decoded = cluster::decode_coordinator_message(cluster::encode(m));
  ASSERT_TRUE(decoded) << decoded.error();
  ASSERT_EQ(decoded->body_case(), v1::CoordinatorMessage::kClassRates);
  const v1::ClassRates& r = decoded->class_rates();
  EXPECT_EQ(r.cold_starts(), 3u);
  EXPECT_DOUBLE_EQ(r.link_bytes_per_s(), 1.25e9);
  ASSERT_EQ(r.classes_size(), 4);
  EXPECT_DOUBLE_EQ(r.classes(0).rate_bytes_per_s(), 0.125e9);
  EXPECT_DOUBLE_EQ(r.classes(1).ceil_bytes_per_s(), 1.25e9);

  auto revert = cluster::decode_coordinator_message(
      cluster::encode(class_rates_message(policy::node_class_rates(1.25e9, 0))));
  ASSERT_TRUE(revert) << revert.error();
  EXPECT_EQ(revert->class_rates().classes_size(), 0);
}

TEST(ClassRateDispatch, TheCodecRefusesRatesThatCannotBeApplied) {
  auto refused = [](auto&& edit) {
    v1::CoordinatorMessage m = class_rates_message(policy::node_class_rates(1000, 2));
    edit(*m.mutable_class_rates());
    auto d = cluster::decode_coordinator_message(cluster::encode(m));
    return d ? std::string() : d.error();
  };
  EXPECT_EQ(refused([](v1::ClassRates&) {}), "");
  EXPECT_NE(refused([](v1::ClassRates& r) {
              r.mutable_classes(1)->set_rate_bytes_per_s(2000);
            }).find("class 1: rate 2000 and ceiling 1000"),
            std::string::npos);
  EXPECT_NE(refused([](v1::ClassRates& r) {
              r.mutable_classes(0)->set_rate_bytes_per_s(900);
            }).find("guaranteed rates sum to"),
            std::string::npos);
  EXPECT_NE(refused([](v1::ClassRates& r) {
              r.mutable_classes()->RemoveLast();
            }).find("3 classes (0 or 4)"),
            std::string::npos);
  EXPECT_NE(refused([](v1::ClassRates& r) { r.set_link_bytes_per_s(0); }).find("class"),
            std::string::npos);
  EXPECT_NE(refused([](v1::ClassRates& r) {
              r.mutable_classes(2)->set_ceil_bytes_per_s(std::nan(""));
            }).find("class 2"),
            std::string::npos);
  EXPECT_NE(refused([](v1::ClassRates& r) { r.set_cold_starts(1u << 20); }).find("cold starts"),
            std::string::npos);
}

}  // namespace
}  // namespace thaw::coordinator
