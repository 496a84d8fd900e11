// The agent's workers are inference by cgroup (issue 26), in a network namespace with the real
// classifier: WorkerLauncher starts a worker straight into a cgroup v2 of its own, its hooks
// register the id with the TrafficShaper (as thawd wires them to NodeShaping), and the
// classifier counts the worker's packets (unmarked, to a port nobody configured) as
// inference. The same worker launched without the registration is counted as other, so the
// cgroup id is what makes the difference; once the worker is reaped the id leaves the map.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon/agent/worker_launcher.hpp"
#include "daemon/network/traffic_shaper.hpp"
#include "netns_fixture.hpp"

namespace thaw::network {
namespace {

using namespace std::chrono_literals;
using namespace thaw::network::test;

constexpr int kDatagrams = 50;

class WorkerCgroupNetns : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces, qdiscs and BPF";
    if (sh("ip -V") != 0) GTEST_SKIP() << "needs ip(8) from iproute2";
    auto parent = daemon::own_cgroup_v2_dir();
    if (!parent) GTEST_SKIP() << parent.error();
    if (::access(parent->c_str(), W_OK) != 0)
      GTEST_SKIP() << parent->string() << " is not writable: workers get no cgroup of their own";
    state_dir_ = fmt::format("/tmp/thaw-worker-cgroup-test-{}", getpid());
    setenv("THAW_NETWORK_STATE_DIR", state_dir_.c_str(), 1);
    net_ = std::make_unique<NetnsPair>(0);
    ASSERT_TRUE(net_->ok) << "could not build the veth pair";
    // This thread is thawd: the shaper, and the workers it launches, live in the node's netns.
    enter_netns(net_->node);
    auto st = shaper_.start(default_shaping_settings("up0", 10'000'000));
    ASSERT_TRUE(st.has_value()) << st.error().message;
  }
  void TearDown() override {
    shaper_.stop();
    net_.reset();
    sh("rm -rf " + state_dir_);
  }

  // Launches a worker that sends kDatagrams one-byte UDP datagrams to the peer (a new socket
  // for each: bash's /dev/udp), waits for it to end; returns the egress packets counted as
  // inference and as other meanwhile, and the cgroup id it ran in.
  struct Run {
    std::uint64_t inference = 0, other = 0, cgroup = 0;
    bool in_map_while_running = false;
  };
  Run run_worker(daemon::WorkerLauncher& launcher, const std::string& unit) {
    Run r;
    auto before = shaper_.counters();
    EXPECT_TRUE(before.has_value());
    const std::string script =
        fmt::format("for i in $(seq {}); do printf x > /dev/udp/10.77.0.2/9998; done", kDatagrams);
    auto launched = launcher.launch({unit, {"/bin/bash", "-c", script}, {}, 0});
    EXPECT_TRUE(launched.has_value()) << launched.error();
    r.cgroup = launcher.cgroup_id(unit);
    // Not reaped until status() is asked: the id is still registered here.
    auto ids = shaper_.inference_cgroups();
    EXPECT_TRUE(ids.has_value());
    r.in_map_while_running = ids && std::ranges::find(*ids, r.cgroup) != ids->end();
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (launcher.status(unit).state == daemon::WorkerState::running &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(20ms);
    EXPECT_EQ(launcher.status(unit).state, daemon::WorkerState::exited)
        << launcher.status(unit).detail;
    auto after = shaper_.counters();
    EXPECT_TRUE(after.has_value());
    if (before && after) {
      auto delta = [&](int c) {
        return after->classes[THAW_DIR_EGRESS][c].packets -
               before->classes[THAW_DIR_EGRESS][c].packets;
      };
      r.inference = delta(THAW_CLASS_INFERENCE);
      r.other = delta(THAW_CLASS_OTHER);
    }
    return r;
  }

  std::unique_ptr<NetnsPair> net_;
  TrafficShaper shaper_;
  std::string state_dir_;
};

TEST_F(WorkerCgroupNetns, AnAgentLaunchedWorkersPacketsAreInferenceByItsCgroup) {
  daemon::WorkerLauncher launcher(state_dir_ + "/workers", /*use_systemd=*/false);
  std::vector<std::uint64_t> registered, removed;
  launcher.set_traffic_hooks({[&](const std::string&, const daemon::WorkerTraffic& t) {
                                registered.push_back(t.cgroup_id);
                                ASSERT_TRUE(shaper_.add_inference_cgroup(t.cgroup_id).has_value());
                              },
                              [&](const std::string&, const daemon::WorkerTraffic& t) {
                                removed.push_back(t.cgroup_id);
                                ASSERT_TRUE(
                                    shaper_.remove_inference_cgroup(t.cgroup_id).has_value());
                              }});
  const Run engine = run_worker(launcher, fmt::format("thaw-worker-nettest-{}-0", getpid()));
  fmt::print("registered worker (cgroup {}): {} of {} datagrams inference, {} other\n",
             engine.cgroup, engine.inference, kDatagrams, engine.other);
  ASSERT_NE(engine.cgroup, 0u) << "the worker got no cgroup of its own";
  EXPECT_TRUE(engine.in_map_while_running);
  EXPECT_EQ(registered, std::vector<std::uint64_t>{engine.cgroup});
  EXPECT_EQ(removed, std::vector<std::uint64_t>{engine.cgroup});
  EXPECT_EQ(engine.inference, static_cast<std::uint64_t>(kDatagrams));
  auto ids = shaper_.inference_cgroups();
  ASSERT_TRUE(ids.has_value());
  EXPECT_TRUE(ids->empty()) << "the reaped worker's cgroup is still in the classifier's map";

  // The control: the same worker, its cgroup not registered, is just other traffic.
  launcher.set_traffic_hooks({});
  const Run plain = run_worker(launcher, fmt::format("thaw-worker-nettest-{}-1", getpid()));
  fmt::print("unregistered worker (cgroup {}): {} inference, {} of {} datagrams other\n",
             plain.cgroup, plain.inference, plain.other, kDatagrams);
  EXPECT_NE(plain.cgroup, 0u);
  EXPECT_NE(plain.cgroup, engine.cgroup);
  EXPECT_EQ(plain.inference, 0u);
  EXPECT_GE(plain.other, static_cast<std::uint64_t>(kDatagrams));
}

// Ingress has no cgroup to go by (tc programs may not ask a socket's cgroup there): packets
// arriving for a worker are inference by the ports it serves on, told with its cgroup and
// taken back when it ends.
TEST_F(WorkerCgroupNetns, PacketsToAWorkersPortsAreInferenceWhileItRuns) {
  constexpr std::uint16_t kPort = 23999;
  daemon::WorkerLauncher launcher(state_dir_ + "/workers", /*use_systemd=*/false);
  launcher.set_traffic_hooks({[&](const std::string&, const daemon::WorkerTraffic& t) {
                                for (auto p : t.ports)
                                  ASSERT_TRUE(shaper_.set_port_class(p, TrafficClass::inference));
                              },
                              [&](const std::string&, const daemon::WorkerTraffic& t) {
                                for (auto p : t.ports) ASSERT_TRUE(shaper_.clear_port_class(p));
                              }});
  // 20 datagrams from the peer to the node's kPort; the ingress packets counted as inference.
  auto inference_in = [&] {
    auto before = shaper_.counters();
    std::thread peer = in_netns(net_->peer, [] {
      const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(kPort);
      inet_pton(AF_INET, "10.77.0.1", &to.sin_addr);
      char byte = 'x';
      for (int i = 0; i < 20; ++i)
        sendto(fd, &byte, 1, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
      ::close(fd);
    });
    peer.join();
    std::this_thread::sleep_for(100ms);
    auto after = shaper_.counters();
    EXPECT_TRUE(before && after);
    return before && after ? after->classes[THAW_DIR_INGRESS][THAW_CLASS_INFERENCE].packets -
                                 before->classes[THAW_DIR_INGRESS][THAW_CLASS_INFERENCE].packets
                           : 0;
  };
  const std::string unit = fmt::format("thaw-worker-nettest-{}-port", getpid());
  const std::string end = state_dir_ + "/end";
  auto launched = launcher.launch(
      {unit,
       {"/bin/sh", "-c", fmt::format("while [ ! -e {} ]; do sleep 0.02; done", end)},
       {},
       0,
       {kPort}});
  ASSERT_TRUE(launched.has_value()) << launched.error();
  const std::uint64_t running = inference_in();
  std::filesystem::create_directories(state_dir_);
  std::ofstream(end) << "";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (launcher.status(unit).state == daemon::WorkerState::running &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  ASSERT_NE(launcher.status(unit).state, daemon::WorkerState::running);
  const std::uint64_t ended = inference_in();
  fmt::print("to the worker's port {}: {} of 20 inference while it runs, {} after it ended\n",
             kPort, running, ended);
  EXPECT_EQ(running, 20u);
  EXPECT_EQ(ended, 0u);
}

}  // namespace
}  // namespace thaw::network
