// The coordinator's per-class rates reach a shaping node's kernel (issue 26), every piece
// real: thaw-coordinator, a thawd that shapes a veth (up0) in a network namespace with its BPF
// classifier and HTB, a throttled nginx registry, thawctl cluster as the frontend.
//
//   a cold start placed on the node makes the HTB classes of up0 (and of its IFB, where
//   downloads are shaped) carry the coordinator's ClassRates for N = 1 (HydraServe Eq. 3/4:
//   the critical-fetch class guaranteed the link less the reserves);
//   a second cold start makes N = 2: the node reports each cold start's equal share B_c / N
//   halved, while the critical class's guarantee B_c stays what the two share;
//   inference traffic on up0 makes thawd clamp fetch windows, and they are released once it
//   has stopped (the classifier's counter, sampled by thawd).
//
// Everything runs in the node's namespace (this test's thread enters it first, so each
// process it starts is born there): the coordinator and nginx on its loopback. The registry
// serves at 100 KB/s per connection, so both fetches still run when the rates are read back.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/policy/hydraserve_class_rates.hpp"
#include "fetch_test_support.hpp"
#include "netns_fixture.hpp"
#include "temp_dir.hpp"
#include "thawd_test_support.hpp"

namespace thaw::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using network::test::enter_netns;
using network::test::NetnsPair;
using network::test::sh;

constexpr std::uint64_t kLink = 10'000'000;  // up0's rate as thawd is told ([network])
constexpr std::uint16_t kEnginePort = 8000;  // [network] inference_ports

// The guaranteed rate tc reports for class `classid` (e.g. "7468:11") of `dev`, in bytes/s
// (tc prints bits with a unit and about four significant digits); nullopt if absent.
std::optional<double> htb_rate(const std::string& dev, const std::string& classid) {
  const std::string out = network::test::capture("tc class show dev " + dev + " 2>&1");
  const std::regex line("class htb " + classid + " .*? rate ([0-9.]+)([KMG]?)bit");
  std::smatch m;
  if (!std::regex_search(out, m, line)) return std::nullopt;
  double v = std::stod(m[1]);
  const std::string unit = m[2];
  v *= unit == "K" ? 1e3 : unit == "M" ? 1e6 : unit == "G" ? 1e9 : 1;
  return v / 8;
}

class ClusterShaping : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces, qdiscs and BPF";
    if (sh("ip -V") != 0) GTEST_SKIP() << "needs ip(8) from iproute2";
    net_ = std::make_unique<NetnsPair>(0);
    ASSERT_TRUE(net_->ok) << "could not build the veth pair";
    // Every process started from here on (nginx, the coordinator, thawd, thawctl) is born
    // in the node's namespace.
    enter_netns(net_->node);
    ::chmod(dir_.path().c_str(), 0755);
    registry_ = std::make_unique<store::testing::RegistryFixture>("100k");
    // A second model for the second cold start: the same files under another name.
    std::filesystem::copy(registry_->model_dir(), registry_->registry_root() / kSecond,
                          std::filesystem::copy_options::recursive);
    for (const std::string& f : store::testing::model_files(registry_->model_dir())) {
      model_bytes_ += std::filesystem::file_size(registry_->model_dir() / f);
    }
    std::filesystem::create_directories(dir_.path() / "nodes.d");
    keygen(dir_.path() / "coordinator");
    keygen(dir_.path() / "key-node");
    std::filesystem::copy_file(dir_.path() / "key-node.pub", dir_.path() / "nodes.d/node.pub");
    const std::string endpoint =
        "tcp://127.0.0.1:" + std::to_string(store::testing::free_loopback_port());
    frontend_ = "ipc://" + (dir_.path() / "frontend.sock").string();
    coordinator_ =
        spawn({THAW_COORDINATOR_PATH, "serve", "--nodes", endpoint, "--frontend", frontend_,
               "--key", (dir_.path() / "coordinator.key").string(), "--allow",
               (dir_.path() / "nodes.d").string(), "--heartbeat", "250ms", "--liveness", "4"},
              {}, dir_.path() / "coordinator.log");
    ASSERT_TRUE(eventually([&] { return state().contains("nodes"); }, 10s)) << coordinator_log();
    start_thawd(endpoint);
  }
  void TearDown() override {
    if (thawd_ > 0) {
      ::kill(thawd_, SIGTERM);  // a clean stop takes thawd's qdiscs and filter off up0
      wait_exit(thawd_);
    }
    if (coordinator_ > 0) {
      ::kill(coordinator_, SIGKILL);
      wait_exit(coordinator_);
    }
    registry_.reset();
    bus_.reset();
    net_.reset();
  }

  static constexpr const char* kSecond = "gpt-syn-b";

  static void keygen(const std::filesystem::path& prefix) {
    auto r = run({THAW_COORDINATOR_PATH, "keygen", prefix.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  void start_thawd(const std::string& endpoint) {
    const auto dir = dir_.path() / "node";
    std::filesystem::create_directories(dir);
    bus_ = std::make_unique<PrivateBus>(dir);
    // The node's link is up0 at kLink; nothing else says B, so the agent reports kLink and
    // the coordinator computes with it.
    std::ofstream(dir / "thawd.toml")
        << "[network]\nshaping = true\nuplink = \"up0\"\nlink_rate = \"" << kLink
        << "\"\ninference_ports = [" << kEnginePort << "]\n[node]\nid = \"node\"\nstate_dir = \""
        << (dir / "state").string() << "\"\n[store]\ncache_dir = \"" << (dir / "cache").string()
        << "\"\ncache_budget = \"256MiB\"\nregistry = \"" << registry_->server().base_url()
        << "/slow\"\nconnections = 2\n[gpu]\npool_share = 0.5\n[shim]\nsocket = \""
        << (dir / "thawd.sock").string() << "\"\n[dbus]\nbus = \"" << bus_->address()
        << "\"\n[coordinator]\nendpoint = \"" << endpoint << "\"\nserver_key = \""
        << (dir_.path() / "coordinator.pub").string() << "\"\nkey = \""
        << (dir_.path() / "key-node.key").string() << "\"\npcie = \"16GB\"\n";
    NotifySocket notify(dir / "notify");
    thawd_ = spawn({THAWD_PATH, "--config", (dir / "thawd.toml").string()},
                   {"NOTIFY_SOCKET=" + (dir / "notify").string(), "THAW_LIBCUDA=" THAW_EMU_LIBCUDA,
                    "THAW_EMU_DEVICE_MEMORY=256M", "THAW_EMU_STATE_DIR=" + (dir / "emu").string(),
                    "THAW_NETWORK_STATE_DIR=" + (dir / "bpf").string(), "no_proxy=127.0.0.1",
                    "NO_PROXY=127.0.0.1"},
                   dir / "thawd.log");
    ASSERT_FALSE(notify.until("READY=1").empty()) << thawd_log();
  }

  ProgramResult cluster(std::vector<std::string> args) const {
    args.insert(args.begin(),
                {THAWCTL_PATH, "--json", "cluster", "--coordinator", frontend_, "--timeout", "3"});
    return run(args);
  }
  json state() const {
    auto r = cluster({"state"});
    return r.exit_code == 0 ? json::parse(r.output, nullptr, false) : json::object();
  }
  // thawctl --json net on the node's bus: the rates in force and where they come from.
  json net() const {
    auto r = run({THAWCTL_PATH, "--bus=" + bus_->address(), "--json", "net"});
    return r.exit_code == 0 ? json::parse(r.output, nullptr, false) : json::object();
  }
  bool node_alive() const {
    for (const json& n : state().value("nodes", json::array())) {
      if (n.value("node_id", "") == "node" && n.value("alive", false)) return true;
    }
    return false;
  }
  json cold_start(const std::string& model) {
    auto d = cluster({"deploy", model, "--size", std::to_string(model_bytes_), "--layers", "8"});
    EXPECT_EQ(d.exit_code, 0) << d.output;
    auto c = cluster({"cold-start", model});
    EXPECT_EQ(c.exit_code, 0) << c.output << coordinator_log();
    return json::parse(c.output, nullptr, false).value("plan", json());
  }
  std::string coordinator_log() const { return slurp(dir_.path() / "coordinator.log"); }
  std::string thawd_log() const { return slurp(dir_.path() / "node/thawd.log"); }

  // Each class's guaranteed rate on up0 and on its IFB equals `want` (bytes/s) within tc's
  // printing precision; a message naming the first that does not, "" when all do.
  std::string htb_mismatch(const std::array<double, 4>& want) const {
    // thawd's IFB for up0's downloads (traffic_shaper.hpp); this thread is in the node's netns.
    const std::string ifb = fmt::format("thifb{}", if_nametoindex("up0"));
    for (const std::string& dev : {std::string("up0"), ifb}) {
      for (int c = 0; c < 4; ++c) {
        const std::string classid = fmt::format("7468:{:x}", 0x10 + c);
        auto rate = htb_rate(dev, classid);
        if (!rate) return fmt::format("{} has no class {}", dev, classid);
        if (std::abs(*rate - want[c]) > 0.002 * want[c] + 1) {
          return fmt::format("{} class {}: {} B/s, want {} B/s", dev, classid, *rate, want[c]);
        }
      }
    }
    return "";
  }

  std::unique_ptr<NetnsPair> net_;
  TempDir dir_;
  std::unique_ptr<store::testing::RegistryFixture> registry_;
  std::unique_ptr<PrivateBus> bus_;
  std::uint64_t model_bytes_ = 0;
  std::string frontend_;
  pid_t coordinator_ = -1, thawd_ = -1;
};

TEST_F(ClusterShaping, ColdStartsPlacedOnTheNodeSetItsHtbRatesToTheCoordinatorsClassRates) {
  ASSERT_TRUE(eventually([&] { return node_alive(); }, 20s)) << coordinator_log() << thawd_log();
  // The node told the coordinator it shapes: placement counts on B_c there (Eq. 3).
  json report;
  for (const json& n : state().value("nodes", json::array())) {
    if (n.value("node_id", "") == "node") report = n.value("report", json::object());
  }
  EXPECT_TRUE(report.value("shapes_traffic", false)) << report.dump(2);
  // Before any cold start: the node's own [network] rates (40 / 40 / 5 / 15 % of the link).
  const std::array<double, 4> configured = {0.40 * kLink, 0.40 * kLink, 0.05 * kLink, 0.15 * kLink};
  EXPECT_EQ(htb_mismatch(configured), "") << network::test::capture("tc class show dev up0");
  EXPECT_EQ(net().value("rates_from", ""), "config") << net().dump(2);

  // N = 1: the rates the coordinator computes for this node (its ClassRates, as the node
  // applies them: whole bytes per second).
  const auto one = coordinator::policy::node_class_rates(static_cast<double>(kLink), 1);
  std::array<double, 4> want{};
  for (int c = 0; c < 4; ++c) want[c] = std::floor(one.classes[c].rate);
  json p1 = cold_start(store::testing::kModelName);
  ASSERT_TRUE(p1.is_object()) << coordinator_log();
  ASSERT_EQ(p1["placement"][0].value("node_id", ""), "node") << p1.dump(2);
  ASSERT_TRUE(eventually([&] { return net().value("cold_starts", 0) == 1; }, 15s))
      << net().dump(2) << coordinator_log() << thawd_log();
  json n1 = net();
  EXPECT_EQ(n1.value("rates_from", ""), "coordinator");
  EXPECT_EQ(htb_mismatch(want), "") << network::test::capture("tc class show dev up0");
  const double share1 = n1.value("per_cold_start_bytes_per_s", 0.0);
  EXPECT_NEAR(share1, std::floor(one.per_cold_start), 1);
  fmt::print(
      "N = 1: critical class {} B/s on up0 (coordinator's B_c {} B/s), each cold start "
      "{} B/s\n",
      htb_rate("up0", "7468:11").value_or(-1), one.classes[1].rate, share1);

  // N = 2: a second model's cold start on the same node while the first still fetches.
  json p2 = cold_start(kSecond);
  ASSERT_TRUE(p2.is_object()) << coordinator_log();
  ASSERT_EQ(p2["placement"][0].value("node_id", ""), "node") << p2.dump(2);
  ASSERT_TRUE(eventually([&] { return net().value("cold_starts", 0) == 2; }, 15s))
      << net().dump(2) << coordinator_log() << thawd_log();
  const auto two = coordinator::policy::node_class_rates(static_cast<double>(kLink), 2);
  const double share2 = net().value("per_cold_start_bytes_per_s", 0.0);
  EXPECT_NEAR(share2, std::floor(two.per_cold_start), 1);
  EXPECT_NEAR(share2, share1 / 2, 1) << "Eq. 4: two cold starts share B_c equally";
  // B_c itself is what they share: the class's guarantee does not change with N.
  EXPECT_EQ(htb_mismatch(want), "") << network::test::capture("tc class show dev up0");
  fmt::print("N = 2: each cold start {} B/s (N = 1: {} B/s)\n", share2, share1);
  // Both fetches were still running: the rates above are those of N fetching cold starts.
  json s = state();
  int running = 0;
  for (const json& plan : s.value("plans", json::array())) {
    for (const json& st : plan.value("placement", json::array())) {
      running += st.value("fetch_state", "") == "TASK_RUNNING";
    }
  }
  EXPECT_EQ(running, 2) << s.dump(2);
}

// thawd clamps fetch windows only while something competes with a fetch (issue 26: a fetch
// alone keeps its goodput): requests to an engine port on up0 are inference in the classifier,
// thawd samples its counter and clamps; 2 s after the last request it releases the windows.
TEST_F(ClusterShaping, InferenceTrafficOnTheUplinkClampsFetchWindowsUntilItStops) {
  // An engine on the node (this thread is in its namespace) that reads whatever comes.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(kEnginePort);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  std::thread engine([listener] {
    const int c = ::accept(listener, nullptr, nullptr);
    char buf[256];
    while (c >= 0 && ::read(c, buf, sizeof buf) > 0) {
    }
    if (c >= 0) ::close(c);
  });
  EXPECT_EQ(thawd_log().find("fetch windows clamped"), std::string::npos)
      << "clamped with nothing competing:\n"
      << thawd_log();
  // Requests from the peer for 3 s, one every 100 ms.
  const int client = network::test::sh(fmt::format(
      "ip netns exec {} bash -c 'exec 3<>/dev/tcp/10.77.0.1/{}; for i in $(seq 30); do echo "
      "request >&3; sleep 0.1; done'",
      net_->peer, kEnginePort));
  EXPECT_EQ(client, 0);
  engine.join();
  ::close(listener);
  EXPECT_NE(thawd_log().find("fetch windows clamped"), std::string::npos)
      << "3 s of requests to an inference port did not clamp:\n"
      << thawd_log();
  EXPECT_TRUE(eventually(
      [&] { return thawd_log().find("fetch windows released") != std::string::npos; }, 6s))
      << thawd_log();
}

}  // namespace
}  // namespace thaw::testing
