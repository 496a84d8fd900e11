// CoordinatorServer on real ZeroMQ sockets, in-process: the node endpoint (CURVE, ZAP
// allow-list) on loopback TCP with DEALERs playing node agents, the frontend on an ipc://
// path in a temporary directory with REQ clients. run() serves on its own thread until an
// eventfd is written.
#include "coordinator/server/coordinator_server.hpp"

#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <array>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq_addon.hpp>

#include "common/fd/unique_fd.hpp"
#include "common/proto/cluster/cluster_codec.hpp"
#include "temp_dir.hpp"

namespace thaw::coordinator {
namespace {

using namespace std::chrono_literals;
using thaw::testing::TempDir;

template <typename Check>
bool until(Check check, std::chrono::milliseconds timeout = 5s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (check()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return check();
}

v1::NodeMessage registration(const std::string& node_id) {
  v1::NodeMessage m;
  v1::Register* r = m.mutable_register_();
  r->set_node_id(node_id);
  r->set_thaw_version("test");
  r->set_network_bytes_per_s(2e9);
  v1::GpuInfo* gpu = r->add_gpus();
  gpu->set_index(0);
  gpu->set_memory_bytes(80ull << 30);
  gpu->set_free_bytes(60ull << 30);
  return m;
}

v1::NodeMessage heartbeat(std::uint64_t sequence) {
  v1::NodeMessage m;
  m.mutable_heartbeat()->set_sequence(sequence);
  return m;
}

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto key = zmqx::generate_key_pair();
    ASSERT_TRUE(key) << key.error();
    coordinator_key_ = *key;
    auto a = zmqx::generate_key_pair();
    ASSERT_TRUE(a) << a.error();
    key_a_ = *a;
    std::filesystem::create_directory(dir_.path() / "nodes.d");
    std::ofstream(dir_.path() / "nodes.d" / "a.pub") << key_a_.public_z85 << "\n";
  }

  // Each test picks its heartbeat interval and liveness (a node is dead after their product).
  void start(double interval_s = 0.2, int liveness = 5) {
    ServerOptions options;
    options.node_endpoint = "tcp://127.0.0.1:*";
    options.frontend_endpoint = "ipc://" + (dir_.path() / "frontend.sock").string();
    options.key = coordinator_key_;
    options.allowed_nodes = dir_.path() / "nodes.d";
    options.cluster.heartbeat_interval_s = interval_s;
    options.cluster.liveness = liveness;
    options.log = [this](int, const std::string& line) {
      std::lock_guard lock(log_mutex_);
      log_.push_back(line);
    };
    auto server = CoordinatorServer::start(std::move(options));
    ASSERT_TRUE(server) << server.error();
    server_ = std::move(*server);
    EXPECT_TRUE(server_->node_endpoint().starts_with("tcp://127.0.0.1:"))
        << server_->node_endpoint();
    EXPECT_NE(server_->node_endpoint(), "tcp://127.0.0.1:*");
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    ASSERT_TRUE(stop_);
    thread_ = std::thread([this] { server_->run(stop_.get()); });
  }

  void TearDown() override {
    if (thread_.joinable()) {
      const std::uint64_t one = 1;
      EXPECT_EQ(::write(stop_.get(), &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
      thread_.join();
    }
    server_.reset();
  }

  zmq::socket_t node_socket(const std::string& routing_id, const zmqx::CurveKeyPair& key) {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, routing_id);
    s.set(zmq::sockopt::curve_serverkey, coordinator_key_.public_z85);
    s.set(zmq::sockopt::curve_publickey, key.public_z85);
    s.set(zmq::sockopt::curve_secretkey, key.secret_z85);
    s.connect(server_->node_endpoint());
    return s;
  }

  static void send(zmq::socket_t& s, v1::NodeMessage m) {
    const std::string payload = cluster::encode(std::move(m));
    ASSERT_TRUE(s.send(zmq::buffer(payload), zmq::send_flags::dontwait));
  }

  // The next message from the coordinator within `timeout`, decoded and validated.
  static std::optional<v1::CoordinatorMessage> receive(zmq::socket_t& s,
                                                       std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    zmq::message_t frame;
    if (!s.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
    auto m = cluster::decode_coordinator_message(frame.to_string_view());
    EXPECT_TRUE(m) << m.error();
    if (!m) return std::nullopt;
    return *m;
  }

  // Messages until one of `kind` arrives (heartbeats may come first).
  static std::optional<v1::CoordinatorMessage> receive_kind(
      zmq::socket_t& s, v1::CoordinatorMessage::BodyCase kind,
      std::chrono::milliseconds timeout = 5s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (auto now = std::chrono::steady_clock::now(); now < end;
         now = std::chrono::steady_clock::now()) {
      auto m = receive(s, std::chrono::duration_cast<std::chrono::milliseconds>(end - now));
      if (m && m->body_case() == kind) return m;
    }
    return std::nullopt;
  }

  // A REQ client's round trip on the frontend; the raw reply bytes.
  std::optional<std::string> frontend_round_trip(const std::string& request) {
    zmq::socket_t req(context_, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 0);
    req.connect(server_->frontend_endpoint());
    if (!req.send(zmq::buffer(request))) return std::nullopt;
    zmq::pollitem_t item{req.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 5s) == 0) return std::nullopt;
    zmq::message_t reply;
    if (!req.recv(reply)) return std::nullopt;
    return reply.to_string();
  }

  v1::ClusterState cluster_state() {
    v1::FrontendRequest request;
    request.mutable_state();
    auto bytes = frontend_round_trip(cluster::encode(std::move(request)));
    EXPECT_TRUE(bytes) << "no reply to a state request";
    if (!bytes) return {};
    auto reply = cluster::decode_frontend_reply(*bytes);
    EXPECT_TRUE(reply) << reply.error();
    if (!reply) return {};
    EXPECT_EQ(reply->error(), "");
    EXPECT_EQ(reply->body_case(), v1::FrontendReply::kState);
    return reply->state();
  }

  std::optional<v1::NodeState> node_in_state(const std::string& id) {
    const v1::ClusterState state = cluster_state();
    for (const v1::NodeState& n : state.nodes()) {
      if (n.node_id() == id) return n;
    }
    return std::nullopt;
  }

  bool logged(const std::string& needle) {
    std::lock_guard lock(log_mutex_);
    return std::ranges::any_of(
        log_, [&](const std::string& line) { return line.find(needle) != std::string::npos; });
  }
  std::string log_text() {
    std::lock_guard lock(log_mutex_);
    std::string all;
    for (const std::string& line : log_) all += line + "\n";
    return all;
  }

  std::uint64_t dropped() const { return server_->counters().dropped.load(); }

  // Registers `id` with its own key and waits for the Welcome.
  zmq::socket_t registered_node_a() {
    zmq::socket_t s = node_socket("a", key_a_);
    send(s, registration("a"));
    auto welcome = receive_kind(s, v1::CoordinatorMessage::kWelcome);
    EXPECT_TRUE(welcome) << log_text();
    return s;
  }

  TempDir dir_;
  zmqx::CurveKeyPair coordinator_key_, key_a_;
  zmq::context_t context_;
  std::unique_ptr<CoordinatorServer> server_;
  UniqueFd stop_;
  std::thread thread_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
};

TEST_F(CoordinatorServerTest, AnAllowedNodeIsWelcomedThenHeartbeatedAndShownAlive) {
  start(0.2, 5);
  zmq::socket_t node = node_socket("a", key_a_);
  send(node, registration("a"));
  auto welcome = receive_kind(node, v1::CoordinatorMessage::kWelcome);
  ASSERT_TRUE(welcome) << log_text();
  EXPECT_EQ(welcome->welcome().heartbeat_interval_ms(), 200u);
  EXPECT_EQ(welcome->welcome().liveness(), 5u);
  // The coordinator's own heartbeats follow, one per interval.
  auto beat = receive_kind(node, v1::CoordinatorMessage::kHeartbeat, 2s);
  ASSERT_TRUE(beat);
  send(node, heartbeat(1));

  auto a = node_in_state("a");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->alive());
  EXPECT_EQ(a->report().gpus_size(), 1);
  EXPECT_EQ(a->report().gpus(0).free_bytes(), 60ull << 30);
  EXPECT_TRUE(logged("node a registered")) << log_text();
  EXPECT_EQ(dropped(), 0u);
}

TEST_F(CoordinatorServerTest, AKeyNotOnTheAllowListGetsNothing) {
  start();
  auto stranger = zmqx::generate_key_pair();
  ASSERT_TRUE(stranger) << stranger.error();
  // Even claiming an admitted node's id.
  zmq::socket_t node = node_socket("a", *stranger);
  send(node, registration("a"));
  EXPECT_FALSE(receive(node, 500ms));
  ASSERT_TRUE(until([&] { return logged("not on the allow-list"); })) << log_text();
  EXPECT_TRUE(logged(stranger->public_z85)) << log_text();
  EXPECT_TRUE(logged("refused a node connection")) << log_text();
  EXPECT_EQ(cluster_state().nodes_size(), 0);
  EXPECT_EQ(server_->counters().node_messages.load(), 0u);
}

TEST_F(CoordinatorServerTest, ANodesKeyUnderAnotherRoutingIdIsDropped) {
  start();
  zmq::socket_t impostor = node_socket("b", key_a_);
  send(impostor, registration("b"));
  ASSERT_TRUE(until([&] { return dropped() >= 1; })) << log_text();
  EXPECT_EQ(dropped(), 1u);
  EXPECT_FALSE(receive(impostor, 300ms));
  EXPECT_TRUE(logged("its key belongs to node \"a\"")) << log_text();
  EXPECT_EQ(cluster_state().nodes_size(), 0);
}

TEST_F(CoordinatorServerTest, ARegistrationNamingAnotherNodeIsDropped) {
  start();
  zmq::socket_t node = node_socket("a", key_a_);
  send(node, registration("c"));
  ASSERT_TRUE(until([&] { return dropped() >= 1; })) << log_text();
  EXPECT_FALSE(receive(node, 300ms));
  EXPECT_TRUE(logged("registers as \"c\"")) << log_text();
  EXPECT_EQ(cluster_state().nodes_size(), 0);
}

TEST_F(CoordinatorServerTest, AnUnknownNodesHeartbeatIsAnsweredWithReRegister) {
  start();
  zmq::socket_t node = node_socket("a", key_a_);
  send(node, heartbeat(7));
  auto again = receive_kind(node, v1::CoordinatorMessage::kReRegister);
  ASSERT_TRUE(again) << log_text();
  EXPECT_NE(again->re_register().reason().find("does not know"), std::string::npos);
}

TEST_F(CoordinatorServerTest, ASilentNodeIsDeclaredDeadAndAskedToRegisterAgain) {
  start(0.1, 3);
  zmq::socket_t node = registered_node_a();
  ASSERT_TRUE(until(
      [&] {
        auto a = node_in_state("a");
        return a && !a->alive();
      },
      3s));
  EXPECT_TRUE(logged("node a missed 3 heartbeats")) << log_text();
  send(node, heartbeat(1));
  auto again = receive_kind(node, v1::CoordinatorMessage::kReRegister);
  ASSERT_TRUE(again);
  EXPECT_NE(again->re_register().reason().find("declared dead"), std::string::npos);
  send(node, registration("a"));
  ASSERT_TRUE(receive_kind(node, v1::CoordinatorMessage::kWelcome));
  EXPECT_TRUE(node_in_state("a")->alive());
}

TEST_F(CoordinatorServerTest, AReconnectingAgentTakesOverItsId) {
  start();
  zmq::socket_t first = registered_node_a();
  zmq::socket_t second = node_socket("a", key_a_);
  send(second, registration("a"));
  ASSERT_TRUE(receive_kind(second, v1::CoordinatorMessage::kWelcome)) << log_text();
  EXPECT_TRUE(logged("node a registered again")) << log_text();
}

TEST_F(CoordinatorServerTest, GarbageOnBothEndpointsIsDroppedAndServingGoesOn) {
  start();
  zmq::socket_t node = registered_node_a();
  ASSERT_EQ(dropped(), 0u);

  // Node endpoint, from an admitted node: bytes that are no protobuf, a message of another
  // protocol version, one with no body, and one of two frames.
  ASSERT_TRUE(node.send(zmq::str_buffer("\xff\xff\xff garbage"), zmq::send_flags::dontwait));
  v1::NodeMessage future = heartbeat(1);
  future.set_version(cluster::kProtocolVersion + 1);
  ASSERT_TRUE(node.send(zmq::buffer(future.SerializeAsString()), zmq::send_flags::dontwait));
  v1::NodeMessage empty;
  empty.set_version(cluster::kProtocolVersion);
  ASSERT_TRUE(node.send(zmq::buffer(empty.SerializeAsString()), zmq::send_flags::dontwait));
  const std::string beat = cluster::encode(heartbeat(2));
  ASSERT_TRUE(node.send(zmq::buffer(beat), zmq::send_flags::sndmore));
  ASSERT_TRUE(node.send(zmq::buffer(beat), zmq::send_flags::dontwait));
  ASSERT_TRUE(until([&] { return dropped() >= 4; })) << log_text();
  EXPECT_TRUE(logged("does not parse")) << log_text();
  EXPECT_TRUE(logged("protocol version 2")) << log_text();
  EXPECT_TRUE(logged("no body")) << log_text();
  EXPECT_TRUE(logged("a message of 2 frames")) << log_text();

  // Frontend: a DEALER's frame without REQ's envelope is dropped unanswered...
  zmq::socket_t raw(context_, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(server_->frontend_endpoint());
  ASSERT_TRUE(raw.send(zmq::str_buffer("no delimiter"), zmq::send_flags::dontwait));
  ASSERT_TRUE(until([&] { return dropped() >= 5; })) << log_text();
  zmq::pollitem_t item{raw.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, 200ms), 0);
  // ...and a REQ's garbage or other version is answered with an error (REQ must get a reply).
  auto garbage = frontend_round_trip("\x08\x01\xff garbage");
  ASSERT_TRUE(garbage);
  auto garbage_reply = cluster::decode_frontend_reply(*garbage);
  ASSERT_TRUE(garbage_reply) << garbage_reply.error();
  EXPECT_NE(garbage_reply->error().find("frontend request"), std::string::npos)
      << garbage_reply->error();
  v1::FrontendRequest future_request;
  future_request.set_version(cluster::kProtocolVersion + 1);
  future_request.mutable_state();
  auto other = frontend_round_trip(future_request.SerializeAsString());
  ASSERT_TRUE(other);
  auto other_reply = cluster::decode_frontend_reply(*other);
  ASSERT_TRUE(other_reply) << other_reply.error();
  EXPECT_NE(other_reply->error().find("protocol version 2"), std::string::npos)
      << other_reply->error();
  EXPECT_EQ(dropped(), 7u);

  // Still serving both endpoints: the state shows node a alive, and a heartbeat from it is
  // accepted (it gets the coordinator's heartbeats, no ReRegister).
  auto a = node_in_state("a");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->alive());
  send(node, heartbeat(3));
  auto beat_back = receive_kind(node, v1::CoordinatorMessage::kHeartbeat, 2s);
  EXPECT_TRUE(beat_back);
  EXPECT_EQ(dropped(), 7u);
}

TEST_F(CoordinatorServerTest, StartFailsOnAMissingAllowDirectoryOrFrontendDirectory) {
  ServerOptions options;
  options.node_endpoint = "tcp://127.0.0.1:*";
  options.frontend_endpoint = "ipc://" + (dir_.path() / "frontend.sock").string();
  options.key = coordinator_key_;
  options.allowed_nodes = dir_.path() / "absent.d";
  auto no_allow = CoordinatorServer::start(options);
  ASSERT_FALSE(no_allow);
  EXPECT_NE(no_allow.error().find("absent.d"), std::string::npos) << no_allow.error();

  options.allowed_nodes = dir_.path() / "nodes.d";
  options.frontend_endpoint = "ipc://" + (dir_.path() / "no-such-dir" / "fe.sock").string();
  auto no_dir = CoordinatorServer::start(options);
  ASSERT_FALSE(no_dir);
  EXPECT_NE(no_dir.error().find("does its directory exist?"), std::string::npos) << no_dir.error();
}

}  // namespace
}  // namespace thaw::coordinator
