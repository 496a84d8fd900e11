// The gateway ↔ coordinator messages against a real thaw-coordinator process: a gateway's
// hello gets the route table (deployed models), deployments and plans are pushed without being
// asked, a cold start the gateway asks for goes into the coordinator's planning path (a fake
// node agent receives the plan's task), held requests do not ask twice, and load reports reach
// the coordinator's load windows.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "child_process.hpp"
#include "common/proto/cluster/cluster_codec.hpp"
#include "common/zmq/curve_keys.hpp"
#include "gateway/coordinator_link.hpp"
#include "temp_dir.hpp"

namespace thaw::gateway {
namespace {

// A free loopback TCP port from the kernel's ephemeral range (bound to port 0, then released).
int ephemeral_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::until;

class GatewayCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directory(dir_.path() / "nodes.d");
    auto coordinator_key = zmqx::write_key_pair(dir_.path() / "coordinator");
    ASSERT_TRUE(coordinator_key) << coordinator_key.error();
    coordinator_public_ = coordinator_key->public_z85;
    auto node_key = zmqx::generate_key_pair();
    ASSERT_TRUE(node_key) << node_key.error();
    node_key_ = *node_key;
    std::ofstream(dir_.path() / "nodes.d" / "a.pub") << node_key_.public_z85 << "\n";
    // A loopback port for the nodes, chosen before the coordinator starts (it prints no bound
    // port): one the kernel hands out, in the ephemeral range — never in the ranges tests give
    // coordinators for their workers' ports (20000..32767), which a pid-derived port collided
    // with under ctest -j2 (a pipeline test's standalone worker then could not listen).
    node_port_ = ephemeral_loopback_port();
    frontend_ = "ipc://" + (dir_.path() / "frontend.sock").string();
    start_coordinator();
  }

  void start_coordinator() {
    coordinator_.reset();
    coordinator_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{THAW_COORDINATOR_BIN, "serve", "--nodes",
                                 "tcp://127.0.0.1:" + std::to_string(node_port_), "--frontend",
                                 frontend_, "--key", (dir_.path() / "coordinator.key").string(),
                                 "--allow", (dir_.path() / "nodes.d").string(), "--window", "1s",
                                 "--heartbeat", "200ms"},
        dir_.path() / "coordinator.log");
    ASSERT_TRUE(until([&] { return std::filesystem::exists(dir_.path() / "frontend.sock"); }, 10s))
        << coordinator_->log();
  }

  v1::FrontendReply ask(v1::FrontendRequest request) {
    zmq::socket_t req(context_, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 0);
    req.set(zmq::sockopt::rcvtimeo, 5000);
    req.connect(frontend_);
    const std::string bytes = cluster::encode(std::move(request));
    req.send(zmq::buffer(bytes));
    zmq::message_t answer;
    EXPECT_TRUE(req.recv(answer));
    auto reply = cluster::decode_frontend_reply(answer.to_string_view());
    EXPECT_TRUE(reply) << reply.error();
    return reply ? *reply : v1::FrontendReply{};
  }

  void deploy(const std::string& model) {
    v1::FrontendRequest r;
    v1::ModelSpec* m = r.mutable_deploy()->mutable_model();
    m->set_name(model);
    m->set_size_bytes(1ull << 30);
    m->set_layers(24);
    auto reply = ask(r);
    ASSERT_EQ(reply.error(), "");
  }

  // A node agent: a CURVE DEALER that registers as "a" with one GPU.
  zmq::socket_t connect_node() {
    zmq::socket_t node(context_, zmq::socket_type::dealer);
    node.set(zmq::sockopt::linger, 0);
    node.set(zmq::sockopt::routing_id, "a");
    node.set(zmq::sockopt::curve_serverkey, coordinator_public_);
    node.set(zmq::sockopt::curve_publickey, node_key_.public_z85);
    node.set(zmq::sockopt::curve_secretkey, node_key_.secret_z85);
    node.connect("tcp://127.0.0.1:" + std::to_string(node_port_));
    v1::NodeMessage m;
    v1::Register* r = m.mutable_register_();
    r->set_node_id("a");
    r->set_thaw_version("test");
    r->set_network_bytes_per_s(1.25e8);
    v1::GpuInfo* gpu = r->add_gpus();
    gpu->set_index(0);
    gpu->set_memory_bytes(80ull << 30);
    gpu->set_free_bytes(60ull << 30);
    node.send(zmq::buffer(cluster::encode(m)));
    return node;
  }

  thaw::testing::TempDir dir_{"thaw-gateway-coord"};
  std::string coordinator_public_;
  zmqx::CurveKeyPair node_key_;
  int node_port_ = 0;
  std::string frontend_;
  zmq::context_t context_;
  std::unique_ptr<ChildProcess> coordinator_;
};

TEST_F(GatewayCoordinatorTest, RoutesColdStartAndLoadThroughARealCoordinator) {
  deploy("m");
  RouterOptions ro;
  ro.hold_deadline = 3s;
  ro.cold_start_retry = 30s;
  ControlPlane* control = nullptr;
  Router router(ro, [&](const std::string& model) { control->request_cold_start(model); });
  std::vector<std::string> log;
  std::mutex log_mutex;
  auto link = CoordinatorLink::start({frontend_, "gw-test", 200ms,
                                      [&](int, const std::string& line) {
                                        std::lock_guard lock(log_mutex);
                                        log.push_back(line);
                                      }},
                                     router);
  ASSERT_TRUE(link) << link.error();
  control = link->get();
  // What GatewayServer's report loop does: the window's load (and a hello) every interval.
  std::atomic<bool> done{false};
  std::thread reporter([&] {
    while (!done) {
      std::this_thread::sleep_for(200ms);
      control->report_load(router.take_window(std::chrono::steady_clock::now()));
    }
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done = true;
      t.join();
    }
  } join{done, reporter};
  // The hello's reply: the deployed model, nothing running.
  ASSERT_TRUE(until([&] { return router.knows("m"); }, 5s)) << coordinator_->log();
  EXPECT_TRUE(router.routes().at("m").empty());
  // A deployment after the hello is pushed.
  deploy("late");
  ASSERT_TRUE(until([&] { return router.knows("late"); }, 5s));

  zmq::socket_t node = connect_node();
  ASSERT_TRUE(until(
      [&] {
        v1::FrontendRequest q;
        q.mutable_state();
        auto s = ask(q);
        return s.state().nodes_size() == 1;
      },
      5s))
      << coordinator_->log();

  // Two requests arrive for "m": held, one cold start asked, planned onto node a.
  auto first = std::async(std::launch::async, [&] {
    Router::InFlight f(router, "m");
    return router.acquire("m").has_value();
  });
  auto second = std::async(std::launch::async, [&] {
    Router::InFlight f(router, "m");
    return router.acquire("m").has_value();
  });
  // The node receives the plan's task: the ask reached Alg. 1's planning.
  node.set(zmq::sockopt::rcvtimeo, 5000);
  bool got_task = false;
  for (int i = 0; i < 20 && !got_task; ++i) {
    zmq::message_t frame;
    if (!node.recv(frame)) break;
    auto m = cluster::decode_coordinator_message(frame.to_string_view());
    ASSERT_TRUE(m) << m.error();
    if (m->body_case() == v1::CoordinatorMessage::kTask) {
      EXPECT_EQ(m->task().model().name(), "m");
      got_task = true;
    }
  }
  EXPECT_TRUE(got_task) << coordinator_->log();
  // The plan is pushed as a cold start in flight (no worker tracked yet).
  ASSERT_TRUE(until(
      [&] {
        auto r = router.routes();
        return !r["m"].empty() && r["m"][0].state == WorkerState::cold_starting;
      },
      5s));
  // Load reports: both requests held over a whole 1 s window.
  bool seen = until(
      [&] {
        v1::FrontendRequest q;
        q.mutable_state();
        auto s = ask(q);
        for (const auto& l : s.state().loads()) {
          if (l.model() == "m" && l.windows() >= 1 && l.last_peak() >= 2) return true;
        }
        return false;
      },
      3s);
  // No worker comes (the fake node never launches one): both time out.
  EXPECT_FALSE(first.get());
  EXPECT_FALSE(second.get());
  EXPECT_TRUE(seen) << "the coordinator's load windows did not see the held requests";
  EXPECT_GE(link->get()->tables_received(), 3u);
  const std::string clog = coordinator_->log();
  EXPECT_NE(clog.find("gateway gw-test"), std::string::npos) << clog;
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& l) {
                            return l.starts_with("asking the coordinator for a cold start");
                          }),
            1)
      << "one ask for two held requests";
}

TEST_F(GatewayCoordinatorTest, ARefusedColdStartFailsHeldRequestsAtOnceWithTheReason) {
  deploy("m");  // and no node at all: Alg. 1 has nowhere to put it
  RouterOptions ro;
  ro.hold_deadline = 20s;
  ControlPlane* control = nullptr;
  Router router(ro, [&](const std::string& model) { control->request_cold_start(model); });
  auto link = CoordinatorLink::start({frontend_, "gw-refused", 200ms, {}}, router);
  ASSERT_TRUE(link) << link.error();
  control = link->get();
  ASSERT_TRUE(until([&] { return router.knows("m"); }, 5s));
  const auto t0 = std::chrono::steady_clock::now();
  auto lease = router.acquire("m");
  ASSERT_FALSE(lease);
  EXPECT_EQ(lease.error().kind, RouteError::Kind::cold_start_refused) << lease.error().message;
  EXPECT_NE(lease.error().message.find("no live node"), std::string::npos) << lease.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_F(GatewayCoordinatorTest, ARestartedCoordinatorResubscribesTheGateway) {
  deploy("m");
  Router router(RouterOptions{}, nullptr);
  auto link = CoordinatorLink::start({frontend_, "gw-restart", 100ms, {}, 20s}, router);
  ASSERT_TRUE(link) << link.error();
  std::atomic<bool> done{false};
  std::thread reporter([&] {
    while (!done) {
      std::this_thread::sleep_for(100ms);
      (*link)->report_load(router.take_window(std::chrono::steady_clock::now()));
    }
  });
  struct Join {
    std::atomic<bool>& done;
    std::thread& t;
    ~Join() {
      done = true;
      t.join();
    }
  } join{done, reporter};
  ASSERT_TRUE(until([&] { return router.knows("m"); }, 5s));
  deploy("n");
  ASSERT_TRUE(until([&] { return router.knows("n"); }, 5s));
  // The coordinator goes away and comes back knowing nothing deployed. The count is read once
  // the old one is dead: read before, a reply it sent while being stopped counted as the new
  // one's table, and the re-subscription below was checked before it had happened (CI, ASan).
  coordinator_.reset();
  const std::uint64_t before = (*link)->tables_received();
  start_coordinator();
  // The gateway reconnects on its own (ZeroMQ's reconnect interval) and says hello again.
  ASSERT_TRUE(until(
      [&] { return coordinator_->log().find("gateway gw-restart") != std::string::npos; }, 10s))
      << coordinator_->log();
  ASSERT_TRUE(until([&] { return (*link)->tables_received() > before; }, 10s))
      << "no table from the restarted coordinator";
  // Its first table lists nothing; the models stay known (held → 503, not 404) for the grace.
  EXPECT_TRUE(router.knows("m"));
  EXPECT_TRUE(router.knows("n"));
  deploy("m");  // a frontend deploys again: pushed to the re-subscribed gateway
  ASSERT_TRUE(until(
      [&] {
        v1::FrontendRequest q;
        q.mutable_state();
        return ask(q).state().models_size() == 1;
      },
      5s));
  EXPECT_TRUE(until([&] { return router.knows("m"); }, 5s));
}

}  // namespace
}  // namespace thaw::gateway
