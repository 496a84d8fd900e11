// ClusterAgent against a stand-in coordinator: a CURVE ROUTER in the test (no ZAP handler,
// so any client key connects) that reads what the agent sends and answers by hand.
#include "daemon/agent/cluster_agent.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "agent_test_support.hpp"
#include "common/proto/cluster/cluster_codec.hpp"

namespace thaw::daemon {
namespace {

using namespace std::chrono_literals;

class ClusterAgentTest : public testing::NodeServiceFixture {
 protected:
  void SetUp() override {
    NodeServiceFixture::SetUp();
    tasks_ = std::make_unique<TaskRunner>(*service_, *workers_, WorkerSettings{});
    auto server_key = zmqx::generate_key_pair();
    ASSERT_TRUE(server_key) << server_key.error();
    server_key_ = *server_key;
    auto node_key = zmqx::generate_key_pair();
    ASSERT_TRUE(node_key) << node_key.error();
    node_key_ = *node_key;

    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::curve_server, true);
    router_.set(zmq::sockopt::curve_secretkey, server_key_.secret_z85);
    router_.set(zmq::sockopt::router_handover, true);
    router_.bind("tcp://127.0.0.1:*");
  }
  void TearDown() override {
    agent_.reset();
    tasks_.reset();
    NodeServiceFixture::TearDown();
  }

  AgentConfig config() {
    AgentConfig c;
    c.endpoint = router_.get(zmq::sockopt::last_endpoint);
    c.node_id = "node-1";
    c.node_key = node_key_;
    c.coordinator_public_z85 = server_key_.public_z85;
    c.network_bytes_per_s = 2'000'000'000;
    c.pcie_bytes_per_s = 25'000'000'000;
    c.heartbeat_interval_s = 0.1;
    c.liveness = 3;
    return c;
  }

  void start_agent() {
    auto agent = ClusterAgent::start(config(), *service_, *tasks_, *workers_);
    ASSERT_TRUE(agent) << agent.error();
    agent_ = std::move(*agent);
  }

  // The next message from the agent: its routing id and the decoded message.
  std::optional<std::pair<std::string, v1::NodeMessage>> receive(
      std::chrono::milliseconds timeout = 5s) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(router_, std::back_inserter(frames))) return std::nullopt;
    EXPECT_EQ(frames.size(), 2u);
    if (frames.size() != 2) return std::nullopt;
    auto m = cluster::decode_node_message(frames[1].to_string_view());
    EXPECT_TRUE(m) << m.error();
    if (!m) return std::nullopt;
    return std::make_pair(frames[0].to_string(), *m);
  }

  std::optional<v1::NodeMessage> receive_kind(v1::NodeMessage::BodyCase kind,
                                              std::chrono::milliseconds timeout = 5s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (auto now = std::chrono::steady_clock::now(); now < end;
         now = std::chrono::steady_clock::now()) {
      auto m = receive(std::chrono::duration_cast<std::chrono::milliseconds>(end - now));
      if (m && m->second.body_case() == kind) return m->second;
    }
    return std::nullopt;
  }

  // Reads and discards what the agent sent so far (until 30 ms pass without a message).
  void discard_pending() {
    while (receive(30ms)) {
    }
  }

  void send_raw(const std::string& payload) {
    std::array<zmq::const_buffer, 2> frames = {zmq::str_buffer("node-1"), zmq::buffer(payload)};
    ASSERT_TRUE(zmq::send_multipart(router_, frames, zmq::send_flags::dontwait));
  }
  void send(v1::CoordinatorMessage m) { send_raw(cluster::encode(std::move(m))); }

  void welcome(std::uint32_t interval_ms, std::uint32_t liveness) {
    v1::CoordinatorMessage m;
    m.mutable_welcome()->set_heartbeat_interval_ms(interval_ms);
    m.mutable_welcome()->set_liveness(liveness);
    send(std::move(m));
  }

  template <typename Check>
  static bool until(Check check, std::chrono::milliseconds timeout = 5s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (check()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return check();
  }

  std::unique_ptr<TaskRunner> tasks_;
  zmqx::CurveKeyPair server_key_, node_key_;
  zmq::context_t context_;
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::unique_ptr<ClusterAgent> agent_;
};

TEST_F(ClusterAgentTest, StartRefusesABadNodeIdOrCoordinatorKey) {
  AgentConfig bad_id = config();
  bad_id.node_id = "has space";
  auto a = ClusterAgent::start(bad_id, *service_, *tasks_, *workers_);
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().find("node.id"), std::string::npos) << a.error();

  AgentConfig bad_key = config();
  bad_key.coordinator_public_z85 = "short";
  auto b = ClusterAgent::start(bad_key, *service_, *tasks_, *workers_);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().find("coordinator's public key"), std::string::npos) << b.error();
}

TEST_F(ClusterAgentTest, RegistersHeartbeatsCarriesOutTasksAndReRegistersWithThem) {
  start_agent();
  auto first = receive();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->first, "node-1");  // routing id = node id
  ASSERT_EQ(first->second.body_case(), v1::NodeMessage::kRegister);
  const v1::Register& r = first->second.register_();
  EXPECT_EQ(r.node_id(), "node-1");
  EXPECT_DOUBLE_EQ(r.network_bytes_per_s(), 2e9);
  EXPECT_EQ(r.tasks_size(), 0);
  EXPECT_FALSE(agent_->status().connected);

  welcome(100, 20);  // 2 s of silence allowed: this test answers by hand
  ASSERT_TRUE(until([&] { return agent_->status().connected; }));
  auto b1 = receive_kind(v1::NodeMessage::kHeartbeat, 1s);
  auto b2 = receive_kind(v1::NodeMessage::kHeartbeat, 1s);
  ASSERT_TRUE(b1 && b2);
  EXPECT_GT(b2->heartbeat().sequence(), b1->heartbeat().sequence());

  // A task: carried out at once (no worker command here, so it fails) and reported.
  v1::CoordinatorMessage task;
  v1::Task* t = task.mutable_task();
  t->set_id("p-1/0/launch-worker");
  t->set_plan_id("p-1");
  t->set_kind(v1::TASK_LAUNCH_WORKER);
  t->mutable_model()->set_name("org/model");
  t->set_stages(1);
  send(std::move(task));
  auto progress = receive_kind(v1::NodeMessage::kProgress);
  ASSERT_TRUE(progress);
  EXPECT_EQ(progress->progress().task().id(), "p-1/0/launch-worker");
  EXPECT_EQ(progress->progress().state(), v1::TASK_FAILED);
  EXPECT_NE(progress->progress().error().find("coordinator.worker_command"), std::string::npos);

  // A coordinator that lost its state asks again: the registration lists the held task.
  // (Registrations the agent repeated before its Welcome may still be queued here: skipped.)
  const std::uint64_t registrations = agent_->status().registrations;
  v1::CoordinatorMessage again;
  again.mutable_re_register()->set_reason("the coordinator does not know this node");
  send(std::move(again));
  std::optional<v1::NodeMessage> second;
  for (int i = 0; i < 10 && !(second && second->register_().tasks_size() == 1); ++i) {
    second = receive_kind(v1::NodeMessage::kRegister);
  }
  ASSERT_TRUE(second);
  ASSERT_EQ(second->register_().tasks_size(), 1);
  EXPECT_EQ(second->register_().tasks(0).task().id(), "p-1/0/launch-worker");
  // (counted just after the send, so it may lag the message by a moment)
  EXPECT_TRUE(until([&] { return agent_->status().registrations == registrations + 1; }));

  // Invalid messages are counted and dropped; the link stays up.
  send_raw("\xff not protobuf");
  v1::CoordinatorMessage bad_welcome;
  bad_welcome.mutable_welcome()->set_heartbeat_interval_ms(1);  // < 10 ms
  bad_welcome.mutable_welcome()->set_liveness(3);
  send(std::move(bad_welcome));
  ASSERT_TRUE(until([&] { return agent_->status().dropped == 2; }));
  EXPECT_TRUE(agent_->status().connected);
  EXPECT_EQ(agent_->status().reconnects, 0u);
}

TEST_F(ClusterAgentTest, ASilentCoordinatorMakesItReconnectAndRegisterAfresh) {
  start_agent();
  ASSERT_TRUE(receive_kind(v1::NodeMessage::kRegister));
  welcome(100, 2);  // silent for 0.2 s → reconnect after a 1 s backoff
  ASSERT_TRUE(until([&] { return agent_->status().connected; }));
  ASSERT_TRUE(until([&] { return agent_->status().reconnects == 1; }, 2s));
  EXPECT_FALSE(agent_->status().connected);
  const std::uint64_t registrations = agent_->status().registrations;
  discard_pending();  // the old connection's messages
  auto fresh = receive_kind(v1::NodeMessage::kRegister, 3s);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->register_().node_id(), "node-1");
  EXPECT_TRUE(until([&] { return agent_->status().registrations > registrations; }));
  welcome(100, 20);
  ASSERT_TRUE(until([&] { return agent_->status().connected; }));
}

// The coordinator's per-class rates reach thawd's callback as sent; rates no shaper could
// apply are dropped by the codec and never reach it.
TEST_F(ClusterAgentTest, ClassRatesReachTheCallbackAndBadOnesAreDropped) {
  std::mutex mutex;
  std::vector<v1::ClassRates> delivered;
  AgentConfig c = config();
  c.on_class_rates = [&](const v1::ClassRates& r) {
    std::lock_guard lock(mutex);
    delivered.push_back(r);
  };
  auto agent = ClusterAgent::start(c, *service_, *tasks_, *workers_);
  ASSERT_TRUE(agent) << agent.error();
  agent_ = std::move(*agent);
  ASSERT_TRUE(receive_kind(v1::NodeMessage::kRegister));
  welcome(100, 20);
  ASSERT_TRUE(until([&] { return agent_->status().connected; }));

  v1::CoordinatorMessage rates;
  v1::ClassRates* r = rates.mutable_class_rates();
  r->set_link_bytes_per_s(1000);
  r->set_cold_starts(2);
  r->set_per_cold_start_bytes_per_s(415);
  for (double g : {100.0, 830.0, 20.0, 50.0}) {
    v1::ClassRate* cr = r->add_classes();
    cr->set_rate_bytes_per_s(g);
    cr->set_ceil_bytes_per_s(1000);
  }
  v1::CoordinatorMessage too_much = rates;
  too_much.mutable_class_rates()->mutable_classes(0)->set_rate_bytes_per_s(500);  // sum 1400
  send(std::move(too_much));
  send(std::move(rates));
  ASSERT_TRUE(until([&] {
    std::lock_guard lock(mutex);
    return !delivered.empty();
  }));
  EXPECT_TRUE(until([&] { return agent_->status().dropped == 1; }));
  std::lock_guard lock(mutex);
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_EQ(delivered[0].cold_starts(), 2u);
  ASSERT_EQ(delivered[0].classes_size(), 4);
  EXPECT_DOUBLE_EQ(delivered[0].classes(1).rate_bytes_per_s(), 830);
}

}  // namespace
}  // namespace thaw::daemon
