// The control plane's codec (common/proto/cluster): every message kind survives a round trip,
// and every malformed, truncated, wrong-version, oversize or semantically invalid message is
// refused with one line that names the problem (the coordinator and thawd log it with the peer
// and drop the message, so nothing refused may reach them, and nothing valid may be refused).
#include "common/proto/cluster/cluster_codec.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "google/protobuf/util/message_differencer.h"

namespace {

namespace cluster = thaw::cluster;
namespace v1 = thaw::cluster::v1;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

bool same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

v1::ModelSpec model() {
  v1::ModelSpec m;
  m.set_name("org/model-7b");
  m.set_size_bytes(14'000'000'000);
  m.set_layers(32);
  m.set_slo_ttft_s(2.5);
  m.set_slo_tpot_s(0.1);
  m.set_prefill_s(0.4);
  m.set_decode_s(0.02);
  return m;
}

v1::Task task() {
  v1::Task t;
  t.set_id("plan-3/1/fetch");
  t.set_plan_id("plan-3");
  t.set_kind(v1::TASK_FETCH);
  *t.mutable_model() = model();
  t.set_stage(1);
  t.set_stages(2);
  t.set_gpu(3);
  t.set_layers(16);
  t.set_consolidate(true);
  return t;
}

v1::TaskStatus status() {
  v1::TaskStatus s;
  *s.mutable_task() = task();
  s.set_state(v1::TASK_RUNNING);
  s.set_bytes_done(100);
  s.set_bytes_total(1000);
  return s;
}

v1::NodeMessage registration() {
  v1::NodeMessage m;
  v1::Register* r = m.mutable_register_();
  r->set_node_id("node-a_1.rack2");
  r->set_thaw_version("0.1.0");
  r->set_network_bytes_per_s(12.5e9);
  for (std::uint32_t i = 0; i < 2; ++i) {
    v1::GpuInfo* g = r->add_gpus();
    g->set_index(i);
    g->set_memory_bytes(40ull << 30);
    g->set_free_bytes(30ull << 30);
    g->set_pcie_bytes_per_s(25e9);
    g->set_runs_worker(i == 1);
  }
  v1::CachedModel* c = r->add_cache();
  c->set_key("org/model-7b@main");
  c->set_state("partial");
  c->set_fetched_bytes(7);
  c->set_total_bytes(14);
  v1::SlotInfo* s = r->add_slots();
  s->set_id("slot-0");
  s->set_gpu(0);
  s->set_model("org/model-7b");
  s->set_state("prewarmed");
  s->set_resident_bytes(1 << 20);
  *r->add_tasks() = status();
  return m;
}

// Encodes `m` and expects the node message decoder to refuse it naming all of `parts`.
template <typename... Parts>
void expect_node_refused(v1::NodeMessage m, Parts... parts) {
  auto r = cluster::decode_node_message(cluster::encode(std::move(m)));
  ASSERT_FALSE(r) << "accepted: " << r->ShortDebugString();
  EXPECT_THAT(r.error(), AllOf(HasSubstr(parts)...));
  EXPECT_THAT(r.error(), Not(HasSubstr("\n")));
}

// ---- round trips ---------------------------------------------------------------------------

TEST(ClusterCodec, RoundTripsEveryNodeMessage) {
  v1::NodeMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_sequence(41);
  v1::NodeMessage progress;
  *progress.mutable_progress() = status();
  for (v1::NodeMessage m : {registration(), heartbeat, progress}) {
    auto back = cluster::decode_node_message(cluster::encode(m));
    ASSERT_TRUE(back) << back.error();
    EXPECT_EQ(back->version(), cluster::kProtocolVersion);
    m.set_version(cluster::kProtocolVersion);
    EXPECT_TRUE(same(*back, m)) << back->ShortDebugString();
  }
}

TEST(ClusterCodec, RoundTripsEveryCoordinatorMessage) {
  v1::CoordinatorMessage welcome, heartbeat, t, again;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(1000);
  welcome.mutable_welcome()->set_liveness(3);
  heartbeat.mutable_heartbeat()->set_sequence(7);
  *t.mutable_task() = task();
  again.mutable_re_register()->set_reason("the coordinator restarted");
  for (v1::CoordinatorMessage m : {welcome, heartbeat, t, again}) {
    auto back = cluster::decode_coordinator_message(cluster::encode(m));
    ASSERT_TRUE(back) << back.error();
    m.set_version(cluster::kProtocolVersion);
    EXPECT_TRUE(same(*back, m)) << back->ShortDebugString();
  }
}

TEST(ClusterCodec, RoundTripsEveryFrontendRequest) {
  v1::FrontendRequest deploy, cold, load, state;
  *deploy.mutable_deploy()->mutable_model() = model();
  cold.mutable_cold_start()->set_model("org/model-7b");
  load.mutable_load()->set_model("org/model-7b");
  load.mutable_load()->set_requests_per_s(3.5);
  state.mutable_state();
  for (v1::FrontendRequest m : {deploy, cold, load, state}) {
    auto back = cluster::decode_frontend_request(cluster::encode(m));
    ASSERT_TRUE(back) << back.error();
    m.set_version(cluster::kProtocolVersion);
    EXPECT_TRUE(same(*back, m)) << back->ShortDebugString();
  }
}

TEST(ClusterCodec, RoundTripsEveryFrontendReply) {
  v1::FrontendReply plan, state, deployed, error;
  v1::Plan* p = plan.mutable_plan();
  p->set_id("plan-3");
  p->set_model("org/model-7b");
  p->set_stages(2);
  p->set_predicted_ttft_s(1.9);
  p->set_meets_slo(true);
  v1::PlannedStage* s = p->add_placement();
  s->set_node_id("node-a");
  s->set_fetch_state(v1::TASK_RUNNING);
  v1::NodeState* n = state.mutable_state()->add_nodes();
  n->set_node_id("node-a");
  n->set_alive(true);
  *n->mutable_report() = registration().register_();
  *state.mutable_state()->add_models() = model();
  *deployed.mutable_deployed() = model();
  error.set_error("model org/x is not deployed");
  for (v1::FrontendReply m : {plan, state, deployed, error}) {
    auto back = cluster::decode_frontend_reply(cluster::encode(m));
    ASSERT_TRUE(back) << back.error();
    m.set_version(cluster::kProtocolVersion);
    EXPECT_TRUE(same(*back, m)) << back->ShortDebugString();
  }
}

// ---- framing: version, truncation, garbage, size, body -------------------------------------

TEST(ClusterCodec, RefusesAnotherVersionNamingBoth) {
  v1::NodeMessage m = registration();
  m.set_version(2);
  auto r = cluster::decode_node_message(m.SerializeAsString());
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), AllOf(HasSubstr("protocol version 2"), HasSubstr("speaks 1")));

  v1::CoordinatorMessage c;
  c.mutable_heartbeat();  // version 0: a peer that never set it
  auto rc = cluster::decode_coordinator_message(c.SerializeAsString());
  ASSERT_FALSE(rc);
  EXPECT_THAT(rc.error(), AllOf(HasSubstr("protocol version 0"), HasSubstr("speaks 1")));

  v1::FrontendReply reply;
  reply.set_version(7);
  reply.set_error("x");
  auto rr = cluster::decode_frontend_reply(reply.SerializeAsString());
  ASSERT_FALSE(rr);
  EXPECT_THAT(rr.error(), AllOf(HasSubstr("protocol version 7"), HasSubstr("speaks 1")));
}

TEST(ClusterCodec, NoPrefixOfARegisterDecodes) {
  const v1::NodeMessage original = registration();
  const std::string bytes = cluster::encode(original);
  ASSERT_GT(bytes.size(), 100u);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = cluster::decode_node_message(std::string_view(bytes).substr(0, n));
    // A prefix either fails to parse, lacks the version, or lacks the body: never a message
    // that differs from what was sent.
    ASSERT_FALSE(r) << "a prefix of " << n << " of " << bytes.size()
                    << " bytes decoded: " << r->ShortDebugString();
    EXPECT_FALSE(r.error().empty());
  }
  auto whole = cluster::decode_node_message(bytes);
  ASSERT_TRUE(whole) << whole.error();
  v1::NodeMessage expected = original;
  expected.set_version(cluster::kProtocolVersion);
  EXPECT_TRUE(same(*whole, expected));
}

TEST(ClusterCodec, RefusesGarbage) {
  const std::string garbage[] = {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11),
                                 std::string("\x0a\x05hi", 4),  // length past the end
                                 std::string("\x0f", 1),        // wire type 7 does not exist
                                 "GET / HTTP/1.1\r\n\r\n"};
  for (const std::string& g : garbage) {
    auto n = cluster::decode_node_message(g);
    ASSERT_FALSE(n);
    EXPECT_THAT(n.error(), AnyOf(HasSubstr("does not parse"), HasSubstr("protocol version")));
    EXPECT_FALSE(cluster::decode_coordinator_message(g));
    EXPECT_FALSE(cluster::decode_frontend_request(g));
    EXPECT_FALSE(cluster::decode_frontend_reply(g));
  }
  auto r = cluster::decode_node_message(garbage[1]);
  EXPECT_THAT(r.error(), AllOf(HasSubstr("node message of 4 bytes"), HasSubstr("does not parse")));

  // A string field that is not UTF-8 (proto3 strings must be).
  v1::NodeMessage m = registration();
  std::string bytes = cluster::encode(m);
  const auto at = bytes.find("0.1.0");
  ASSERT_NE(at, std::string::npos);
  bytes[at] = '\xc0';
  auto u = cluster::decode_node_message(bytes);
  ASSERT_FALSE(u);
  EXPECT_THAT(u.error(), HasSubstr("does not parse"));
}

TEST(ClusterCodec, RefusesOversizeBeforeParsing) {
  // A valid message padded with an unknown field: it would parse, so only the size refuses it.
  std::string bytes = cluster::encode(registration());
  const std::size_t pad = cluster::kMaxInboundBytes;
  bytes += '\x7a';  // field 15, length-delimited
  std::size_t v = pad;
  for (; v >= 0x80; v >>= 7) bytes += static_cast<char>(0x80 | (v & 0x7f));
  bytes += static_cast<char>(v);
  bytes.append(pad, 'x');
  v1::NodeMessage parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));  // the padding itself is well-formed

  auto r = cluster::decode_node_message(bytes);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(),
              AllOf(HasSubstr(std::to_string(bytes.size()) + " bytes"), HasSubstr("limit")));
  EXPECT_THAT(cluster::decode_coordinator_message(bytes).error(), HasSubstr("limit"));
  EXPECT_THAT(cluster::decode_frontend_request(bytes).error(), HasSubstr("limit"));
  // Exactly at the limit is still parsed (and here refused for another reason).
  EXPECT_THAT(cluster::decode_node_message(std::string(cluster::kMaxInboundBytes, '\0')).error(),
              Not(HasSubstr("limit")));
  // Replies have their own, larger bound.
  EXPECT_THAT(
      cluster::decode_frontend_reply(std::string(cluster::kMaxReplyBytes + 1, '\0')).error(),
      HasSubstr("limit"));
}

TEST(ClusterCodec, RefusesAnEmptyBody) {
  auto n = cluster::decode_node_message(cluster::encode(v1::NodeMessage{}));
  ASSERT_FALSE(n);
  EXPECT_THAT(n.error(), HasSubstr("node message has no body"));
  auto c = cluster::decode_coordinator_message(cluster::encode(v1::CoordinatorMessage{}));
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error(), HasSubstr("coordinator message has no body"));
  auto f = cluster::decode_frontend_request(cluster::encode(v1::FrontendRequest{}));
  ASSERT_FALSE(f);
  EXPECT_THAT(f.error(), HasSubstr("frontend request has no body"));
  auto r = cluster::decode_frontend_reply(cluster::encode(v1::FrontendReply{}));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), HasSubstr("neither an error nor a body"));
}

// ---- semantics ------------------------------------------------------------------------------

TEST(ClusterCodec, RefusesInvalidNodeIds) {
  EXPECT_THAT(cluster::validate_node_id("").error(), HasSubstr("node id is empty"));
  EXPECT_THAT(cluster::validate_node_id("node a").error(),
              AllOf(HasSubstr("\"node a\""), HasSubstr("a space")));
  EXPECT_THAT(cluster::validate_node_id("rack/node").error(),
              AllOf(HasSubstr("\"rack/node\""), HasSubstr("'/'")));
  EXPECT_THAT(cluster::validate_node_id("node\n").error(),
              AllOf(HasSubstr("\"node\\x0a\""), HasSubstr("byte 0x0a")));
  EXPECT_THAT(cluster::validate_node_id(std::string(65, 'n')).error(),
              AllOf(HasSubstr("65 bytes"), HasSubstr("at most 64")));
  EXPECT_TRUE(cluster::validate_node_id(std::string(64, 'n')));
  EXPECT_TRUE(cluster::validate_node_id("Node-1_a.b"));

  // In a Register too.
  const std::string ids[] = {"", "a b", "a/b", std::string(65, 'x')};
  for (const std::string& id : ids) {
    v1::NodeMessage m = registration();
    m.mutable_register_()->set_node_id(id);
    expect_node_refused(m, "register: node id");
  }
}

TEST(ClusterCodec, RefusesTaskStagesOutOfRange) {
  v1::Task t = task();
  t.set_stage(2);
  t.set_stages(2);
  EXPECT_THAT(cluster::validate_task(t).error(),
              AllOf(HasSubstr("\"plan-3/1/fetch\""), HasSubstr("stage 2 of 2 stages")));
  t.set_stage(0);
  t.set_stages(0);
  EXPECT_THAT(cluster::validate_task(t).error(), HasSubstr("0 stages (1 to 64)"));
  t.set_stages(65);
  EXPECT_THAT(cluster::validate_task(t).error(), HasSubstr("65 stages (1 to 64)"));

  v1::CoordinatorMessage c;
  *c.mutable_task() = task();
  c.mutable_task()->set_stage(5);
  auto r = cluster::decode_coordinator_message(cluster::encode(c));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), AllOf(HasSubstr("task: "), HasSubstr("stage 5 of 2 stages")));
}

TEST(ClusterCodec, ChecksAPipelineWorkersWiring) {
  v1::Task t = task();
  t.set_kind(v1::TASK_LAUNCH_WORKER);
  t.add_peers("10.0.0.1:29500");
  t.add_peers("10.0.0.2:29501");
  t.set_http_port(8000);
  t.set_layer_begin(t.model().layers() / 2);
  t.set_layer_end(t.model().layers());
  EXPECT_TRUE(cluster::validate_task(t));
  v1::CoordinatorMessage c;
  *c.mutable_task() = t;
  auto back = cluster::decode_coordinator_message(cluster::encode(c));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->task().peers(1), "10.0.0.2:29501");

  v1::Task one_peer = t;
  one_peer.mutable_peers()->RemoveLast();
  EXPECT_THAT(cluster::validate_task(one_peer).error(), HasSubstr("1 peer addresses for 2"));
  v1::Task smuggled = t;
  smuggled.set_peers(0, "a:1,b:2");  // would add a stage on the engine's command line
  EXPECT_THAT(cluster::validate_task(smuggled).error(), HasSubstr("is not host:port"));
  v1::Task no_port = t;
  no_port.set_peers(0, "10.0.0.1");
  EXPECT_THAT(cluster::validate_task(no_port).error(), HasSubstr("is not host:port"));
  v1::Task layers = t;
  layers.set_layer_end(t.model().layers() + 1);
  EXPECT_THAT(cluster::validate_task(layers).error(), HasSubstr("layers ["));
  layers.set_layer_begin(3);
  layers.set_layer_end(2);
  EXPECT_THAT(cluster::validate_task(layers).error(), HasSubstr("layers [3, 2)"));
  v1::Task port = t;
  port.set_http_port(70000);
  EXPECT_THAT(cluster::validate_task(port).error(), HasSubstr("HTTP port 70000"));

  v1::NodeMessage hb;
  hb.set_version(cluster::kProtocolVersion);
  hb.mutable_heartbeat()->mutable_startup()->set_cuda_init_s(-1);
  auto r = cluster::decode_node_message(cluster::encode(hb));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), HasSubstr("start-up phase of -1 s"));
}

TEST(ClusterCodec, RefusesAnUnknownTaskKind) {
  v1::Task t = task();
  t.set_kind(v1::TASK_KIND_UNSPECIFIED);
  EXPECT_THAT(cluster::validate_task(t).error(), HasSubstr("unknown kind 0"));
  t.set_kind(static_cast<v1::TaskKind>(42));  // a newer peer's kind: proto3 enums are open
  EXPECT_THAT(cluster::validate_task(t).error(), HasSubstr("unknown kind 42"));
  v1::CoordinatorMessage c;
  *c.mutable_task() = t;
  auto r = cluster::decode_coordinator_message(cluster::encode(c));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), HasSubstr("unknown kind 42"));
}

TEST(ClusterCodec, RefusesABadModelSpec) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    void (v1::ModelSpec::*set)(double);
    double value;
    const char* named;
  };
  for (const Case& c : {Case{&v1::ModelSpec::set_slo_ttft_s, nan, "TTFT SLO nan"},
                        Case{&v1::ModelSpec::set_slo_ttft_s, -1, "TTFT SLO -1"},
                        Case{&v1::ModelSpec::set_slo_tpot_s, -0.5, "TPOT SLO -0.5"},
                        Case{&v1::ModelSpec::set_prefill_s, inf, "prefill time inf"},
                        Case{&v1::ModelSpec::set_decode_s, -inf, "decode time -inf"}}) {
    v1::ModelSpec m = model();
    (m.*c.set)(c.value);
    auto r = cluster::validate_model_spec(m);
    ASSERT_FALSE(r) << c.named;
    EXPECT_THAT(r.error(), AllOf(HasSubstr("\"org/model-7b\""), HasSubstr(c.named),
                                 HasSubstr("not a non-negative number")));
  }
  v1::ModelSpec m = model();
  m.set_layers(100'001);
  EXPECT_THAT(cluster::validate_model_spec(m).error(), HasSubstr("100001 layers"));
  m = model();
  m.set_name("");
  EXPECT_THAT(cluster::validate_model_spec(m).error(), HasSubstr("model name is empty"));
  m.set_name("org/my model");
  EXPECT_THAT(cluster::validate_model_spec(m).error(),
              AllOf(HasSubstr("model name \"org/my model\""), HasSubstr("a space")));
  m.set_name(std::string(257, 'm'));
  EXPECT_THAT(cluster::validate_model_spec(m).error(), HasSubstr("257 bytes long (at most 256)"));

  // Inside a task sent to a node, and a deploy from a frontend.
  v1::CoordinatorMessage c;
  *c.mutable_task() = task();
  c.mutable_task()->mutable_model()->set_slo_ttft_s(nan);
  EXPECT_THAT(cluster::decode_coordinator_message(cluster::encode(c)).error(),
              AllOf(HasSubstr("task: task \"plan-3/1/fetch\": model"), HasSubstr("TTFT SLO")));
  v1::FrontendRequest d;
  *d.mutable_deploy()->mutable_model() = model();
  d.mutable_deploy()->mutable_model()->set_decode_s(-2);
  EXPECT_THAT(cluster::decode_frontend_request(cluster::encode(d)).error(),
              AllOf(HasSubstr("deploy: model"), HasSubstr("decode time -2")));
}

TEST(ClusterCodec, RefusesMoreFreeBytesThanMemory) {
  v1::NodeMessage m = registration();
  v1::GpuInfo* g = m.mutable_register_()->mutable_gpus(1);
  g->set_memory_bytes(100);
  g->set_free_bytes(101);
  expect_node_refused(m, "register: GPU 1 has more free bytes (101) than memory (100)");
}

TEST(ClusterCodec, RefusesBadGpuListsAndBandwidths) {
  v1::NodeMessage m = registration();
  m.mutable_register_()->mutable_gpus(1)->set_index(0);
  expect_node_refused(m, "GPU 0 is listed twice");
  m = registration();
  m.mutable_register_()->mutable_gpus(1)->set_index(64);
  expect_node_refused(m, "GPU index 64 (at most 63)");
  m = registration();
  m.mutable_register_()->mutable_gpus(0)->set_pcie_bytes_per_s(-1);
  expect_node_refused(m, "GPU 0 PCIe bandwidth -1");
  m = registration();
  m.mutable_register_()->set_network_bytes_per_s(std::nan(""));
  expect_node_refused(m, "network bandwidth nan");
}

TEST(ClusterCodec, RefusesProgressWithoutAState) {
  v1::NodeMessage m;
  *m.mutable_progress() = status();
  m.mutable_progress()->set_state(v1::TASK_STATE_UNSPECIFIED);
  expect_node_refused(m, "progress: task \"plan-3/1/fetch\": state not set");
  m.mutable_progress()->set_state(static_cast<v1::TaskState>(9));
  expect_node_refused(m, "state not set (got 9)");
  m.mutable_progress()->set_state(v1::TASK_DONE);
  m.mutable_progress()->set_bytes_done(1001);
  expect_node_refused(m, "1001 bytes done of 1000 in total");
  // The tasks a Register carries are held to the same rules.
  v1::NodeMessage r = registration();
  r.mutable_register_()->mutable_tasks(0)->set_state(v1::TASK_STATE_UNSPECIFIED);
  expect_node_refused(r, "register: task \"plan-3/1/fetch\": state not set");
}

TEST(ClusterCodec, RefusesADeployOfSizeZero) {
  v1::FrontendRequest d;
  *d.mutable_deploy()->mutable_model() = model();
  d.mutable_deploy()->mutable_model()->set_size_bytes(0);
  auto r = cluster::decode_frontend_request(cluster::encode(d));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), AllOf(HasSubstr("deploy: model \"org/model-7b\""), HasSubstr("size 0")));
}

TEST(ClusterCodec, RefusesBadLoadReportsAndWelcomes) {
  v1::FrontendRequest l;
  l.mutable_load()->set_model("org/model-7b");
  l.mutable_load()->set_requests_per_s(-3);
  EXPECT_THAT(cluster::decode_frontend_request(cluster::encode(l)).error(),
              HasSubstr("load: -3 requests per second"));
  v1::CoordinatorMessage w;
  w.mutable_welcome()->set_heartbeat_interval_ms(5);
  w.mutable_welcome()->set_liveness(3);
  EXPECT_THAT(cluster::decode_coordinator_message(cluster::encode(w)).error(),
              HasSubstr("heartbeat interval 5 ms"));
  w.mutable_welcome()->set_heartbeat_interval_ms(1000);
  w.mutable_welcome()->set_liveness(0);
  EXPECT_THAT(cluster::decode_coordinator_message(cluster::encode(w)).error(),
              HasSubstr("liveness 0 (1 to 100)"));
}

TEST(ClusterCodec, QuotesWhatAPeerSentSoItCannotForgeALogLine) {
  v1::NodeMessage m;
  *m.mutable_progress() = status();
  const std::string id = "x\nthawd[1]: forged " + std::string(300, 'y');
  m.mutable_progress()->mutable_task()->set_id(id);
  auto r = cluster::decode_node_message(cluster::encode(m));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error(), AllOf(HasSubstr("task id \"x\\x0athawd[1]: forged"),
                               HasSubstr("bytes long (at most 256)"), Not(HasSubstr("\n"))));
  EXPECT_LT(r.error().size(), 200u);
}

}  // namespace
