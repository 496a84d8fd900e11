// The gateway's small parsers (--route, durations, sizes, JSON nesting) and the gateway
// messages of the cluster codec (common/proto/cluster), as the gateway receives them.
#include <gtest/gtest.h>

#include "common/proto/cluster/cluster_codec.hpp"
#include "gateway/coordinator_link.hpp"
#include "gateway/gateway_server.hpp"
#include "gateway/route_flags.hpp"

namespace thaw::gateway {
namespace {

TEST(RouteFlags, ModelsWithSeveralWorkers) {
  auto routes = parse_route_flags(
      {"gpt2=http://127.0.0.1:8000", "gpt2=http://10.0.0.2:8001", "org/m=http://h:9"});
  ASSERT_TRUE(routes) << routes.error();
  ASSERT_EQ(routes->size(), 2u);
  ASSERT_EQ(routes->at("gpt2").size(), 2u);
  EXPECT_EQ(routes->at("gpt2")[1].url, "http://10.0.0.2:8001");
  EXPECT_EQ(routes->at("gpt2")[1].state, WorkerState::serving);
  EXPECT_EQ(routes->at("org/m")[0].url, "http://h:9");
}

TEST(RouteFlags, BadFlagsSayWhatIsExpected) {
  for (const char* bad :
       {"gpt2", "=http://h:1", "gpt2=", "gpt2=https://h:1", "gpt2=http://h", "gpt2=http://h:0",
        "gpt2=http://h:70000", "gpt2=http://h:1/v1", "g pt=http://h:1", "gpt2=http://:1"}) {
    auto routes = parse_route_flags({bad});
    ASSERT_FALSE(routes) << bad;
    EXPECT_TRUE(routes.error().starts_with("--route")) << routes.error();
  }
}

TEST(Durations, UnitsAndErrors) {
  EXPECT_EQ(parse_duration("250ms").value(), std::chrono::milliseconds(250));
  EXPECT_EQ(parse_duration("30s").value(), std::chrono::milliseconds(30'000));
  EXPECT_EQ(parse_duration("1.5").value(), std::chrono::milliseconds(1'500));
  EXPECT_EQ(parse_duration("2m").value(), std::chrono::milliseconds(120'000));
  EXPECT_FALSE(parse_duration("soon"));
  EXPECT_FALSE(parse_duration("5h"));
  EXPECT_FALSE(parse_duration("-1s"));
}

TEST(Sizes, UnitsAndErrors) {
  EXPECT_EQ(parse_bytes("1048576").value(), 1u << 20);
  EXPECT_EQ(parse_bytes("64KiB").value(), 64u << 10);
  EXPECT_EQ(parse_bytes("4MiB").value(), 4u << 20);
  EXPECT_FALSE(parse_bytes("4MB"));
  EXPECT_FALSE(parse_bytes("lots"));
  EXPECT_FALSE(parse_bytes("99999999GiB"));
}

TEST(Nesting, CountsBracketsOutsideStrings) {
  EXPECT_FALSE(nesting_exceeds(R"({"a": [[1], {"b": 2}]})", 3));
  EXPECT_TRUE(nesting_exceeds(R"({"a": [[1], {"b": 2}]})", 2));
  EXPECT_FALSE(nesting_exceeds(R"({"p": "[[[[[[[[\"[[[["})", 1));
  EXPECT_TRUE(nesting_exceeds(std::string(100'000, '['), 64));
}

TEST(GatewayMessages, RouteTableBecomesTheRoutersMap) {
  v1::RouteTable table;
  table.set_generation(3);
  auto* m = table.add_models();
  m->set_model("gpt2");
  auto* w = m->add_workers();
  w->set_url("http://10.0.0.1:8000");
  w->set_state(v1::WORKER_SERVING);
  w->set_plan_id("p-1");
  w = m->add_workers();
  w->set_state(v1::WORKER_COLD_STARTING);
  table.add_models()->set_model("idle");
  v1::FrontendReply reply;
  *reply.mutable_routes() = table;
  auto decoded = cluster::decode_frontend_reply(cluster::encode(reply));
  ASSERT_TRUE(decoded) << decoded.error();
  RouteMap map = route_map_from(decoded->routes());
  ASSERT_EQ(map.size(), 2u);
  ASSERT_EQ(map["gpt2"].size(), 2u);
  EXPECT_EQ(map["gpt2"][0].state, WorkerState::serving);
  EXPECT_EQ(map["gpt2"][0].plan_id, "p-1");
  EXPECT_EQ(map["gpt2"][1].state, WorkerState::cold_starting);
  EXPECT_TRUE(map["idle"].empty());
}

TEST(GatewayMessages, ModelsSurviveACoordinatorRestartForTheGracePeriod) {
  using namespace std::chrono_literals;
  auto table = [](std::uint64_t generation, std::vector<std::string> models) {
    v1::RouteTable t;
    t.set_generation(generation);
    for (const auto& m : models) t.add_models()->set_model(m);
    return t;
  };
  RouteTableTracker tracker(10s);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tracker.accept(table(1, {"a"}), t0).size(), 1u);
  EXPECT_EQ(tracker.accept(table(4, {"a", "b"}), t0).size(), 2u);
  // A model removed by a running coordinator is gone at once.
  EXPECT_EQ(tracker.accept(table(5, {"a"}), t0).size(), 1u);
  EXPECT_EQ(tracker.accept(table(6, {"a", "b"}), t0).size(), 2u);
  // Restart: generation 1 again, nothing deployed yet — a and b are kept, without workers.
  RouteMap after = tracker.accept(table(1, {}), t0 + 1s);
  EXPECT_EQ(tracker.restarts(), 1u);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(after["a"].empty());
  EXPECT_EQ(tracker.accept(table(2, {"c"}), t0 + 5s).size(), 3u);
  // After the grace period only what the coordinator lists.
  RouteMap later = tracker.accept(table(3, {"c"}), t0 + 12s);
  EXPECT_EQ(later.size(), 1u);
  EXPECT_TRUE(later.contains("c"));
}

TEST(GatewayMessages, CodecRefusesRoutesAGatewayCouldNotUse) {
  auto refused = [](auto edit) {
    v1::FrontendReply reply;
    auto* m = reply.mutable_routes()->add_models();
    m->set_model("gpt2");
    auto* w = m->add_workers();
    w->set_url("http://h:1");
    w->set_state(v1::WORKER_SERVING);
    edit(*m, *w);
    return !cluster::decode_frontend_reply(cluster::encode(reply)).has_value();
  };
  EXPECT_FALSE(refused([](auto&, auto&) {}));
  EXPECT_TRUE(refused([](auto&, auto& w) { w.set_url("file:///etc/passwd"); }));
  EXPECT_TRUE(refused([](auto&, auto& w) { w.set_url("http://h :1"); }));
  EXPECT_TRUE(refused([](auto&, auto& w) { w.set_url(""); }));  // serving needs a URL
  EXPECT_TRUE(refused([](auto&, auto& w) { w.set_state(v1::WORKER_STATE_UNSPECIFIED); }));
  EXPECT_TRUE(refused([](auto& m, auto&) { m.set_model(""); }));
  EXPECT_FALSE(refused([](auto&, auto& w) {
    w.set_url("");
    w.set_state(v1::WORKER_COLD_STARTING);
  }));
}

TEST(GatewayMessages, CodecChecksHelloAndLoadFields) {
  v1::FrontendRequest hello;
  hello.mutable_gateway_hello()->set_gateway_id("gw-1");
  hello.mutable_gateway_hello()->set_report_interval_s(1);
  EXPECT_TRUE(cluster::decode_frontend_request(cluster::encode(hello)));
  hello.mutable_gateway_hello()->set_gateway_id("gw 1");
  EXPECT_FALSE(cluster::decode_frontend_request(cluster::encode(hello)));
  hello.mutable_gateway_hello()->set_gateway_id("gw-1");
  hello.mutable_gateway_hello()->set_report_interval_s(3600);
  EXPECT_FALSE(cluster::decode_frontend_request(cluster::encode(hello)));

  v1::FrontendRequest load;
  load.mutable_load()->set_model("gpt2");
  load.mutable_load()->set_queue_length(3);
  load.mutable_load()->set_arrivals(10);
  load.mutable_load()->set_window_s(1);
  load.mutable_load()->set_gateway_id("gw-1");
  auto ok = cluster::decode_frontend_request(cluster::encode(load));
  ASSERT_TRUE(ok) << ok.error();
  EXPECT_EQ(ok->load().queue_length(), 3u);
  load.mutable_load()->set_window_s(-1);
  EXPECT_FALSE(cluster::decode_frontend_request(cluster::encode(load)));
}

}  // namespace
}  // namespace thaw::gateway
