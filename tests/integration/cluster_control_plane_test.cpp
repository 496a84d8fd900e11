// The control plane end to end, every piece real: thaw-coordinator (ZeroMQ over loopback TCP,
// CURVE with a ZAP allow-list), several thawd processes as node agents (each its own private
// dbus-daemon, emulated GPU and host cache), a loopback nginx registry, and thawctl cluster
// as the frontend.
//
//   register, heartbeat, receive a cold-start plan, execute its stage fetches;
//   a SIGKILLed agent is declared dead and its stage re-planned and fetched elsewhere;
//   a restarted coordinator rebuilds nodes and plans from the agents' registrations;
//   an agent whose key is not on the allow-list is refused.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "fetch_test_support.hpp"
#include "nginx_server.hpp"
#include "temp_dir.hpp"
#include "thawd_test_support.hpp"

namespace thaw::testing {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// Short enough to see deaths in a test, long enough that a loaded CI machine (ctest -j2, an
// ASan build) does not starve an agent's thread into a false one.
constexpr double kHeartbeatSeconds = 0.25;
constexpr int kLiveness = 4;

// One thawd node agent: its own bus, emulated GPU, cache and key.
class Node {
 public:
  Node(const std::filesystem::path& dir, std::string id, const std::string& registry,
       const std::string& coordinator, const std::filesystem::path& coordinator_pub,
       const std::filesystem::path& key, const std::string& extra_config = "")
      : dir_(dir), id_(std::move(id)) {
    std::filesystem::create_directories(dir_);
    bus_ = std::make_unique<PrivateBus>(dir_);
    // [network] first: extra_config continues [coordinator]. No test shapes the machine's
    // real uplink (a root thawd on a node with a NIC and a default route would).
    std::ofstream(dir_ / "thawd.toml")
        << "[network]\nshaping = false\n[node]\nid = \"" << id_ << "\"\nstate_dir = \""
        << (dir_ / "state").string() << "\"\n[store]\ncache_dir = \"" << (dir_ / "cache").string()
        << "\"\ncache_budget = \"256MiB\"\nregistry = \"" << registry
        << "\"\nconnections = 2\n[gpu]\npool_share = 0.5\n[shim]\nsocket = \""
        << (dir_ / "thawd.sock").string() << "\"\n[dbus]\nbus = \"" << bus_->address()
        << "\"\n[coordinator]\nendpoint = \"" << coordinator << "\"\nserver_key = \""
        << coordinator_pub.string() << "\"\nkey = \""
        << key.string()
        // 1 MB/s as the node's link: Alg. 1 then needs a pipeline to meet a TTFT SLO
        // (the loopback fetch itself is as fast as it is).
        << "\"\nnetwork = \"1MB\"\npcie = \"16GB\"\n"
        << extra_config;
    start();
  }
  ~Node() {
    if (pid_ > 0) kill9();
  }

  void start() {
    std::filesystem::remove(dir_ / "notify");
    NotifySocket notify(dir_ / "notify");
    pid_ = spawn({THAWD_PATH, "--config", (dir_ / "thawd.toml").string()},
                 {"NOTIFY_SOCKET=" + (dir_ / "notify").string(), "THAW_LIBCUDA=" THAW_EMU_LIBCUDA,
                  "THAW_EMU_DEVICE_MEMORY=256M", "THAW_EMU_STATE_DIR=" + (dir_ / "emu").string(),
                  "no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1"},
                 dir_ / "thawd.log");
    ASSERT_FALSE(notify.until("READY=1").empty()) << "thawd " << id_ << ":\n" << log();
  }
  void kill9() {
    ::kill(pid_, SIGKILL);
    wait_exit(pid_);
    pid_ = -1;
  }
  // thawctl --json models on this node's bus.
  json models() const {
    auto r = run({THAWCTL_PATH, "--bus=" + bus_->address(), "--json", "models"});
    return r.exit_code == 0 ? json::parse(r.output, nullptr, false) : json();
  }
  std::string log() const { return slurp(dir_ / "thawd.log"); }
  const std::string& id() const { return id_; }
  const std::string& bus_address() const { return bus_->address(); }

 private:
  std::filesystem::path dir_;
  std::string id_;
  std::unique_ptr<PrivateBus> bus_;
  pid_t pid_ = -1;
};

class ClusterControlPlane : public ::testing::Test {
 protected:
  ClusterControlPlane() {
    ::chmod(dir_.path().c_str(), 0755);
    registry_ = std::make_unique<store::testing::RegistryFixture>();
    for (const std::string& f : store::testing::model_files(registry_->model_dir())) {
      model_bytes_ += std::filesystem::file_size(registry_->model_dir() / f);
    }
    std::filesystem::create_directories(allow_dir());
    keygen(dir_.path() / "coordinator");
    node_endpoint_ = "tcp://127.0.0.1:" + std::to_string(store::testing::free_loopback_port());
    frontend_ = "ipc://" + (dir_.path() / "frontend.sock").string();
  }
  ~ClusterControlPlane() override {
    nodes_.clear();
    if (coordinator_ > 0) stop_coordinator(SIGKILL);
  }

  std::filesystem::path allow_dir() const { return dir_.path() / "nodes.d"; }

  static void keygen(const std::filesystem::path& prefix) {
    auto r = run({THAW_COORDINATOR_PATH, "keygen", prefix.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  void start_coordinator(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {THAW_COORDINATOR_PATH,
                                     "serve",
                                     "--nodes",
                                     node_endpoint_,
                                     "--frontend",
                                     frontend_,
                                     "--key",
                                     (dir_.path() / "coordinator.key").string(),
                                     "--allow",
                                     allow_dir().string(),
                                     "--heartbeat",
                                     "250ms",
                                     "--liveness",
                                     std::to_string(kLiveness)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    coordinator_ = spawn(argv, {}, dir_.path() / "coordinator.log");
    ASSERT_TRUE(eventually([&] { return state().contains("nodes"); }, 10s)) << coordinator_log();
  }
  void stop_coordinator(int sig = SIGTERM) {
    ::kill(coordinator_, sig);
    wait_exit(coordinator_);
    coordinator_ = -1;
  }
  std::string coordinator_log() const { return slurp(dir_.path() / "coordinator.log"); }

  // A node whose key is on the allow-list (unless `admitted` is false).
  Node& add_node(const std::string& id, bool admitted = true, const std::string& extra = "") {
    const auto prefix = dir_.path() / ("key-" + id);
    keygen(prefix);
    if (admitted) {
      std::filesystem::copy_file(prefix.string() + ".pub", allow_dir() / (id + ".pub"));
    }
    nodes_.push_back(std::make_unique<Node>(dir_.path() / id, id, registry_->server().base_url(),
                                            node_endpoint_, dir_.path() / "coordinator.pub",
                                            prefix.string() + ".key", extra));
    return *nodes_.back();
  }
  Node& node(const std::string& id) {
    for (auto& n : nodes_) {
      if (n->id() == id) return *n;
    }
    throw std::runtime_error("no node " + id);
  }

  ProgramResult cluster(std::vector<std::string> args) const {
    args.insert(args.begin(),
                {THAWCTL_PATH, "--json", "cluster", "--coordinator", frontend_, "--timeout", "3"});
    return run(args);
  }
  // thawctl --json cluster state (stdout only is JSON; stderr is empty on success).
  json state() const {
    auto r = cluster({"state"});
    if (r.exit_code != 0) return json::object();
    return json::parse(r.output, nullptr, false);
  }
  std::set<std::string> alive_nodes() const {
    std::set<std::string> alive;
    json s = state();
    for (const json& n : s.value("nodes", json::array())) {
      if (n.value("alive", false)) alive.insert(n.value("node_id", ""));
    }
    return alive;
  }
  json plan(const std::string& id) const {
    json s = state();
    for (const json& p : s.value("plans", json::array())) {
      if (p.value("id", "") == id) return p;
    }
    return json();
  }
  static bool all_fetched(const json& plan) {
    if (!plan.contains("placement")) return false;
    for (const json& s : plan["placement"]) {
      if (s.value("fetch_state", "") != "TASK_DONE") return false;
    }
    return true;
  }

  // Deploys gpt-syn with a TTFT SLO of 0.7 × M/b: one worker would take M/b over the nodes'
  // 1 MB/s links, two stages M/(2b) — so Alg. 1 plans a two-stage pipeline.
  json deploy_and_cold_start() {
    const double slo = 0.7 * static_cast<double>(model_bytes_) / 1e6;
    auto d = cluster({"deploy", store::testing::kModelName, "--size", std::to_string(model_bytes_),
                      "--layers", "8", "--ttft", std::to_string(slo)});
    EXPECT_EQ(d.exit_code, 0) << d.output;
    auto c = cluster({"cold-start", store::testing::kModelName});
    EXPECT_EQ(c.exit_code, 0) << c.output << coordinator_log();
    json reply = json::parse(c.output, nullptr, false);
    return reply.value("plan", json());
  }

  TempDir dir_;
  std::unique_ptr<store::testing::RegistryFixture> registry_;
  std::uint64_t model_bytes_ = 0;
  std::string node_endpoint_, frontend_;
  pid_t coordinator_ = -1;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(ClusterControlPlane, AgentsRegisterHeartbeatAndFetchTheirPlannedStages) {
  start_coordinator();
  for (const char* id : {"node-a", "node-b", "node-c"}) add_node(id);
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 3; }, 20s)) << coordinator_log();
  // Heartbeats keep them alive well past liveness × interval.
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(3 * kLiveness * kHeartbeatSeconds * 1000)));
  EXPECT_EQ(alive_nodes().size(), 3u) << coordinator_log();
  EXPECT_EQ(coordinator_log().find("declared dead"), std::string::npos) << coordinator_log();

  json p = deploy_and_cold_start();
  ASSERT_TRUE(p.is_object()) << coordinator_log();
  ASSERT_EQ(p.value("stages", 0), 2) << p.dump(2);
  EXPECT_TRUE(p.value("meets_slo", false));
  ASSERT_TRUE(eventually([&] { return all_fetched(plan(p["id"])); }, 60s))
      << plan(p["id"]).dump(2) << coordinator_log();
  // Each stage's node holds the model in its cache (the stage's part of it), the others not.
  std::set<std::string> holders;
  for (const json& s : p["placement"]) holders.insert(s["node_id"]);
  EXPECT_EQ(holders.size(), 2u);
  for (const auto& n : nodes_) {
    const json models = n->models();
    bool cached = false;
    for (const json& m : models) cached |= m.dump().find("gpt-syn") != std::string::npos;
    EXPECT_EQ(cached, holders.contains(n->id())) << n->id() << ": " << models.dump();
    if (holders.contains(n->id())) {
      EXPECT_NE(n->log().find("stage"), std::string::npos) << n->log();
    }
  }
}

TEST_F(ClusterControlPlane, AKilledAgentIsDeclaredDeadAndItsStageReplanned) {
  start_coordinator();
  for (const char* id : {"node-a", "node-b", "node-c"}) add_node(id);
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 3; }, 20s)) << coordinator_log();
  json p = deploy_and_cold_start();
  ASSERT_EQ(p.value("stages", 0), 2) << p.dump(2);
  ASSERT_TRUE(eventually([&] { return all_fetched(plan(p["id"])); }, 60s));
  std::set<std::string> in_plan;
  for (const json& s : p["placement"]) in_plan.insert(s["node_id"]);
  const std::string victim = p["placement"][1]["node_id"];
  std::string spare;
  for (const char* id : {"node-a", "node-b", "node-c"}) {
    if (!in_plan.contains(id)) spare = id;
  }

  node(victim).kill9();
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return !alive_nodes().contains(victim); }, 10s))
      << coordinator_log();
  const double detected =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  RecordProperty("seconds_to_declare_dead", std::to_string(detected));
  std::printf("declared dead %.2f s after SIGKILL (liveness × interval = %.2f s)\n", detected,
              kLiveness * kHeartbeatSeconds);
  // Liveness × interval (1 s) plus the coordinator's 10 ms tick and this loop's polling
  // (thawctl runs take tens of ms each).
  EXPECT_LT(detected, kLiveness * kHeartbeatSeconds + 1.0) << coordinator_log();
  EXPECT_NE(coordinator_log().find("node " + victim + " missed 4 heartbeats"), std::string::npos);
  // The stage moved to the one node not already in the plan, which fetched it.
  ASSERT_TRUE(eventually(
      [&] {
        json now = plan(p["id"]);
        return now.contains("placement") && now["placement"][1]["node_id"] == spare &&
               all_fetched(now);
      },
      60s))
      << plan(p["id"]).dump(2) << coordinator_log();
  EXPECT_EQ(plan(p["id"])["placement"][1].value("replans", 0), 1);
  bool cached = false;
  for (const json& m : node(spare).models())
    cached |= m.dump().find("gpt-syn") != std::string::npos;
  EXPECT_TRUE(cached) << node(spare).log();
}

TEST_F(ClusterControlPlane, ARestartedCoordinatorRebuildsItsStateFromTheNodes) {
  start_coordinator();
  for (const char* id : {"node-a", "node-b"}) add_node(id);
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 2; }, 20s)) << coordinator_log();
  json p = deploy_and_cold_start();
  ASSERT_EQ(p.value("stages", 0), 2) << p.dump(2);
  ASSERT_TRUE(eventually([&] { return all_fetched(plan(p["id"])); }, 60s));

  stop_coordinator(SIGKILL);  // loses everything it held in memory
  // Down for longer than the agents' liveness × interval: they give up on the connection
  // and reconnect with backoff.
  std::this_thread::sleep_for(
      std::chrono::milliseconds(static_cast<int>(2 * kLiveness * kHeartbeatSeconds * 1000)));
  start_coordinator();
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 2; }, 20s)) << coordinator_log();
  ASSERT_TRUE(eventually([&] { return all_fetched(plan(p["id"])); }, 10s))
      << state().dump(2) << coordinator_log();
  json rebuilt = plan(p["id"]);
  EXPECT_TRUE(rebuilt.value("rebuilt", false));
  EXPECT_EQ(rebuilt.value("model", ""), store::testing::kModelName);
  EXPECT_EQ(rebuilt.value("stages", 0), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rebuilt["placement"][i]["node_id"], p["placement"][i]["node_id"]) << i;
  }
  // The deployment came back with the nodes' tasks: a cold start needs no new deploy.
  auto c = cluster({"cold-start", store::testing::kModelName});
  EXPECT_EQ(c.exit_code, 0) << c.output;
  for (const auto& n : nodes_) {
    EXPECT_NE(n->log().find("silent for 4 heartbeats; reconnecting"), std::string::npos)
        << n->log();
    EXPECT_NE(n->log().find("registered with the coordinator"), std::string::npos) << n->log();
  }
}

// --launch-workers: each stage's node starts the configured worker command with the preload
// shim set and the stage in its environment; the task is done when the worker exits 0.
TEST_F(ClusterControlPlane, LaunchWorkerTasksStartTheConfiguredEngineWithTheShim) {
  start_coordinator({"--launch-workers"});
  const auto out = dir_.path() / "worker-{stage}.out";
  const std::string command =
      "worker_command = [\"/bin/sh\", \"-c\", \"echo \\\"$LD_PRELOAD $THAW_STAGE/$THAW_STAGES "
      "{model} $CUDA_VISIBLE_DEVICES\\\" > " +
      out.string() + "\"]\nworker_preload = \"/opt/thaw/libthaw-preload.so\"\n";
  for (const char* id : {"node-a", "node-b"}) add_node(id, true, command);
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 2; }, 20s)) << coordinator_log();
  json p = deploy_and_cold_start();
  ASSERT_EQ(p.value("stages", 0), 2) << p.dump(2);
  // Both stages' workers ran and exited 0: their launch tasks are done on their nodes.
  auto launch_done = [&](const std::string& node_id) {
    const json now = state();  // not state()["nodes"]: the range would outlive its json
    for (const json& n : now["nodes"]) {
      if (n["node_id"] != node_id) continue;
      for (const json& t : n["report"]["tasks"]) {
        if (t["task"]["kind"] == "TASK_LAUNCH_WORKER" && t["state"] == "TASK_DONE") return true;
      }
    }
    return false;
  };
  for (const json& s : p["placement"]) {
    const std::string node_id = s["node_id"];
    ASSERT_TRUE(eventually([&] { return launch_done(node_id); }, 20s))
        << state().dump(2) << node(node_id).log();
  }
  for (int stage = 0; stage < 2; ++stage) {
    const std::string text = slurp(dir_.path() / fmt::format("worker-{}.out", stage));
    EXPECT_EQ(text, fmt::format("/opt/thaw/libthaw-preload.so {}/2 gpt-syn 0\n", stage));
  }
}

// WarmServe's loop: load reports fold into 1 s windows; at a window's end the coordinator
// predicts the next, wants ⌈100/32⌉ − 1 = 3 replicas and places what fits (one per GPU: two
// nodes, one GPU each); each node prewarms the model (fetching it first) and its heartbeats
// report the slot.
TEST_F(ClusterControlPlane, LoadReportsLeadToPrewarmedSlotsOnIdleGpus) {
  start_coordinator({"--window", "1s"});
  for (const char* id : {"node-a", "node-b"}) add_node(id);
  ASSERT_TRUE(eventually([&] { return alive_nodes().size() == 2; }, 20s)) << coordinator_log();
  auto d = cluster({"deploy", store::testing::kModelName, "--size", std::to_string(model_bytes_),
                    "--layers", "8"});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  auto l = cluster({"load", store::testing::kModelName, "--concurrent", "100", "--instances", "1"});
  ASSERT_EQ(l.exit_code, 0) << l.output;
  auto prewarmed_on = [&](const json& s, const std::string& node_id) {
    for (const json& n : s["nodes"]) {
      if (n["node_id"] != node_id) continue;
      for (const json& slot : n["report"]["slots"]) {
        if (slot["model"] == store::testing::kModelName && slot["state"] == "prewarmed") {
          return true;
        }
      }
    }
    return false;
  };
  ASSERT_TRUE(eventually(
      [&] {
        const json s = state();
        return prewarmed_on(s, "node-a") && prewarmed_on(s, "node-b");
      },
      60s))
      << state().dump(2) << coordinator_log() << node("node-a").log();
  const json s = state();
  ASSERT_EQ(s["loads"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["loads"][0].value("replicas_wanted", 0), 3);
  EXPECT_DOUBLE_EQ(s["loads"][0].value("last_average", 0.0), 100.0);
  // The nodes say so themselves, over their own D-Bus.
  for (const char* id : {"node-a", "node-b"}) {
    auto slots = run({THAWCTL_PATH, "--bus=" + node(id).bus_address(), "--json", "slots"});
    EXPECT_NE(slots.output.find("prewarmed"), std::string::npos) << slots.output;
  }
  // Later windows with the same load place nothing more: the slots count.
  std::this_thread::sleep_for(2500ms);
  std::size_t prewarm_tasks = 0;
  const json later = state();
  for (const json& n : later["nodes"]) {
    for (const json& t : n["report"]["tasks"]) prewarm_tasks += t["task"]["kind"] == "TASK_PREWARM";
  }
  EXPECT_EQ(prewarm_tasks, 2u);
}

TEST_F(ClusterControlPlane, AnAgentWithAKeyNotOnTheAllowListIsRefused) {
  start_coordinator();
  add_node("node-a");
  add_node("intruder", /*admitted=*/false);
  ASSERT_TRUE(eventually([&] { return alive_nodes().contains("node-a"); }, 20s));
  ASSERT_TRUE(eventually(
      [&] { return coordinator_log().find("refused a node connection") != std::string::npos; },
      10s))
      << coordinator_log();
  std::this_thread::sleep_for(1s);
  const json s = state();
  for (const json& n : s["nodes"]) EXPECT_NE(n.value("node_id", ""), "intruder");
  EXPECT_NE(coordinator_log().find("is not on the allow-list"), std::string::npos);
  // The refused node's own log says what to check.
  EXPECT_TRUE(eventually(
      [&] {
        return node("intruder").log().find("its allow directory as intruder.pub") !=
               std::string::npos;
      },
      10s))
      << node("intruder").log();
}

}  // namespace
}  // namespace thaw::testing
