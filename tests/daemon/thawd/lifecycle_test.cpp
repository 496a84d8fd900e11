// thawd's systemd life cycle and its D-Bus Manager, with the real binary on the emulator, a
// private dbus-daemon and the real busctl: a test-owned NOTIFY_SOCKET receives STATUS=,
// READY=1 (only once the bus name is owned), RELOADING=1 (SIGHUP), READY=1, STOPPING=1
// (SIGTERM) in that order, and thawd exits 0; busctl introspects the Manager, reads its
// properties and calls ListGpus. A bad configuration or an unreachable bus fails the start
// with a message that says which; --check-config validates without starting.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nginx_server.hpp"  // free_loopback_port
#include "temp_dir.hpp"
#include "thawd_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using thaw::testing::TempDir;

using thaw::testing::interface_block;
using thaw::testing::NotifySocket;
using thaw::testing::PrivateBus;
using thaw::testing::slurp;
using thaw::testing::spawn;
using thaw::testing::wait_exit;

// Runs busctl against `address`; returns its output (and its exit code in *rc).
std::string busctl(const std::string& address, const std::vector<std::string>& args, int* rc) {
  auto r = thaw::testing::busctl(address, args);
  *rc = r.exit_code;
  return r.output;
}

class ThawdLifecycle : public ::testing::Test {
 protected:
  void write_config(const std::string& extra = "", const std::string& bus = "") {
    std::ofstream(dir_.path() / "thawd.toml")
        << "[store]\ncache_dir = \"" << (dir_.path() / "cache").string()
        << "\"\ncache_budget = \"64MiB\"\n[gpu]\npool_share = 0.25\n[dbus]\nbus = \""
        << (bus.empty() ? bus_.address() : bus) << "\"\n[node]\nid = \"test-node\"\n"
        << extra;
    if (extra.find("[shim]") == std::string::npos) {
      std::ofstream(dir_.path() / "thawd.toml", std::ios::app)
          << "[shim]\nsocket = \"" << (dir_.path() / "thawd.sock").string() << "\"\n";
    }
    // Never the test machine's real uplink: a root thawd on a node with a NIC would shape it.
    if (extra.find("[network]") == std::string::npos) {
      std::ofstream(dir_.path() / "thawd.toml", std::ios::app) << "[network]\nshaping = false\n";
    }
  }
  std::vector<std::string> env() const {
    return {"NOTIFY_SOCKET=" + (dir_.path() / "notify").string(), "THAW_LIBCUDA=" THAW_EMU_LIBCUDA,
            "THAW_EMU_DEVICE_MEMORY=256M", "THAW_EMU_STATE_DIR=" + (dir_.path() / "emu").string()};
  }
  TempDir dir_;
  PrivateBus bus_{dir_.path()};
};

TEST_F(ThawdLifecycle, ReadyReloadingStoppingInOrderAndACleanExit) {
  write_config();
  NotifySocket notify(dir_.path() / "notify");
  const pid_t pid = spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(),
                          dir_.path() / "stderr");
  auto start = notify.until("READY=1");
  ASSERT_FALSE(start.empty()) << "no READY=1; stderr: " << slurp(dir_.path() / "stderr");
  ASSERT_GE(start.size(), 2u);  // progress before ready
  EXPECT_NE(start.front().find("STATUS=opening the host cache"), std::string::npos)
      << start.front();
  EXPECT_NE(start.back().find("STATUS=1 GPU(s), cache 0 B of 64.0 MiB"), std::string::npos)
      << start.back();
  bool took_name_first = false;
  for (const std::string& m : start) {
    if (m.find("taking the D-Bus name") != std::string::npos) took_name_first = true;
  }
  EXPECT_TRUE(took_name_first) << "READY=1 before the bus name was taken";
  EXPECT_TRUE(fs::exists(dir_.path() / "thawd.sock")) << "READY=1 before the shim socket listens";

  // The Manager, through the real busctl.
  int rc = 0;
  const std::string intro =
      busctl(bus_.address(), {"introspect", "org.thaw.Node1", "/org/thaw/Node1"}, &rc);
  EXPECT_EQ(rc, 0) << intro;
  for (const char* member : {"org.thaw.Node1.Manager", ".ListGpus", ".NodeId", ".GpuCount",
                             ".CacheBudgetBytes", ".State"}) {
    EXPECT_NE(intro.find(member), std::string::npos) << member << " missing:\n" << intro;
  }
  // The shipped interface XML is exactly what thawd exports.
  const std::string live = busctl(
      bus_.address(), {"introspect", "--xml-interface", "org.thaw.Node1", "/org/thaw/Node1"}, &rc);
  EXPECT_EQ(interface_block(live, "org.thaw.Node1.Manager"),
            interface_block(slurp(THAW_SOURCE_DIR "/packaging/org.thaw.Node1.Manager.xml"),
                            "org.thaw.Node1.Manager"))
      << "packaging/org.thaw.Node1.Manager.xml differs from what thawd exports";
  EXPECT_FALSE(interface_block(live, "org.thaw.Node1.Manager").empty()) << live;
  auto prop = [&](const char* name) {
    return busctl(
        bus_.address(),
        {"get-property", "org.thaw.Node1", "/org/thaw/Node1", "org.thaw.Node1.Manager", name}, &rc);
  };
  EXPECT_EQ(prop("NodeId"), "s \"test-node\"\n");
  EXPECT_EQ(prop("GpuCount"), "u 1\n");
  EXPECT_EQ(prop("CacheBudgetBytes"), "t 67108864\n");
  EXPECT_EQ(prop("State"), "s \"running\"\n");
  // 0.25 of the emulated 256 MiB GPU: 64 MiB, all free, no slots yet.
  EXPECT_EQ(
      busctl(bus_.address(),
             {"call", "org.thaw.Node1", "/org/thaw/Node1", "org.thaw.Node1.Manager", "ListGpus"},
             &rc),
      "a(uttu) 1 0 67108864 67108864 0\n");
  (void)prop("NoSuchProperty");
  EXPECT_NE(rc, 0);

  // thawctl reads the same, for people and for scripts.
  auto thawctl = [&](const std::string& args, int* code) {
    FILE* p = ::popen(
        (std::string(THAWCTL_PATH) + " --bus=" + bus_.address() + " " + args + " 2>&1").c_str(),
        "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    *code = WEXITSTATUS(::pclose(p));
    return out;
  };
  const std::string status_json = thawctl("--json status", &rc);
  EXPECT_EQ(rc, 0) << status_json;
  EXPECT_EQ(status_json,
            "{\"cache_budget_bytes\":67108864,\"cache_bytes_used\":0,\"engine_layout_hits\":0,"
            "\"gpus\":1,\"handbacks\":0,\"node_id\":\"test-node\",\"prewarm_hits\":0,"
            "\"prewarm_misses\":0,\"state\":\"running\",\"version\":\"" THAW_VERSION "\"}\n");
  EXPECT_EQ(thawctl("--json gpus", &rc),
            "[{\"free_bytes\":67108864,\"index\":0,\"pool_bytes\":67108864,\"slots\":0}]\n");
  const std::string human = thawctl("status", &rc);
  EXPECT_NE(human.find("cache    0 B of 64.0 MiB"), std::string::npos) << human;

  // SIGHUP: a changed live setting is applied, a changed restart-only one is reported.
  write_config("[shim]\nallow_groups = [\"ml\"]\nsocket = \"/tmp/elsewhere.sock\"\n");
  ASSERT_EQ(::kill(pid, SIGHUP), 0);
  auto reload = notify.until("READY=1");
  ASSERT_FALSE(reload.empty());
  EXPECT_NE(reload.front().find("RELOADING=1"), std::string::npos) << reload.front();

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  auto stop = notify.until("STOPPING=1");
  ASSERT_FALSE(stop.empty());
  EXPECT_EQ(wait_exit(pid), 0);
  const std::string log = slurp(dir_.path() / "stderr");
  EXPECT_NE(log.find("shim.socket changed; it takes effect at the next restart"), std::string::npos)
      << log;
  EXPECT_NE(log.find("GPU 0:"), std::string::npos) << log;
}

TEST_F(ThawdLifecycle, BadConfigFailsTheStartNamingTheLine) {
  write_config("[shim]\nsocket = \"relative.sock\"\n");
  NotifySocket notify(dir_.path() / "notify");
  const pid_t pid = spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(),
                          dir_.path() / "stderr");
  EXPECT_EQ(wait_exit(pid), 1);
  const std::string log = slurp(dir_.path() / "stderr");
  EXPECT_NE(log.find("thawd.toml:11:"), std::string::npos) << log;
  EXPECT_NE(log.find("shim.socket"), std::string::npos) << log;
  const std::string status = notify.next(2s);
  EXPECT_NE(status.find("STATUS=failed to start"), std::string::npos) << status;
  EXPECT_EQ(status.find("READY=1"), std::string::npos);
}

TEST_F(ThawdLifecycle, UnreachableBusFailsTheStartSayingWhichBus) {
  write_config("", "unix:path=" + (dir_.path() / "no-such-bus").string());
  NotifySocket notify(dir_.path() / "notify");
  const pid_t pid = spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(),
                          dir_.path() / "stderr");
  EXPECT_EQ(wait_exit(pid), 1);
  const std::string log = slurp(dir_.path() / "stderr");
  EXPECT_NE(log.find("no-such-bus bus (dbus.bus in thawd.toml)"), std::string::npos) << log;
}

TEST(Thawctl, UnreachableThawdIsExitCodeOneWithAHint) {
  FILE* p = ::popen(THAWCTL_PATH " --bus=unix:path=/nonexistent/bus status 2>&1", "r");
  std::string out;
  char buf[1024];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  EXPECT_EQ(WEXITSTATUS(::pclose(p)), 1);
  EXPECT_NE(out.find("is thawd running?"), std::string::npos) << out;
  p = ::popen(THAWCTL_PATH " no-such-command 2>&1", "r");
  while (std::fread(buf, 1, sizeof(buf), p) > 0) {
  }
  EXPECT_EQ(WEXITSTATUS(::pclose(p)), 2);
}

TEST_F(ThawdLifecycle, CheckConfigValidatesWithoutStarting) {
  write_config();
  const auto good =
      spawn({THAWD_PATH, "--check-config", "--config", (dir_.path() / "thawd.toml").string()}, {},
            dir_.path() / "stderr");
  EXPECT_EQ(wait_exit(good), 0);
  write_config("", "sytem");
  const auto bad =
      spawn({THAWD_PATH, "--check-config", "--config", (dir_.path() / "thawd.toml").string()}, {},
            dir_.path() / "stderr");
  EXPECT_EQ(wait_exit(bad), 1);
  EXPECT_NE(slurp(dir_.path() / "stderr").find("dbus.bus"), std::string::npos);
}

// The exit code of `pid`, or -1 if it has not exited within `limit` (then it is killed): a
// hang must fail the test with a message, not run into ctest's timeout.
int exit_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(ThawdLifecycle, AConfigFileGivenWithDashCMustBeAReadableRegularFile) {
  const fs::path fifo = dir_.path() / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  struct Case {
    std::string path;
    std::string says;
  };
  // A missing file ran on the compiled-in system paths; /dev/zero was read without end; a FIFO
  // blocked the start forever.
  const std::vector<Case> cases = {{"/nonexistent/thawd.toml", "no such file"},
                                   {"/dev/zero", "is not a regular file"},
                                   {fifo.string(), "is not a regular file"},
                                   {dir_.path().string(), "is a directory"}};
  int n = 0;
  for (const Case& c : cases) {
    for (bool check : {true, false}) {
      const fs::path err = dir_.path() / ("stderr." + std::to_string(n++));
      std::vector<std::string> argv = {THAWD_PATH, "-c", c.path};
      if (check) argv.push_back("--check-config");
      const pid_t pid = spawn(argv, env(), err);
      EXPECT_EQ(exit_within(pid, 20s), 1) << c.path << (check ? " --check-config" : "");
      const std::string log = slurp(err);
      EXPECT_NE(log.find(c.path + ": " + c.says), std::string::npos) << log;
      EXPECT_EQ(log.find("valid"), std::string::npos) << log;
    }
  }
}

TEST_F(ThawdLifecycle, NonFinitePoolShareFailsTheCheckAndTheStart) {
  std::ofstream(dir_.path() / "nan.toml") << "[gpu]\npool_share = nan\n";
  for (bool check : {true, false}) {
    const fs::path err = dir_.path() / (check ? "stderr.check" : "stderr.start");
    std::vector<std::string> argv = {THAWD_PATH, "-c", (dir_.path() / "nan.toml").string()};
    if (check) argv.push_back("--check-config");
    const pid_t pid = spawn(argv, env(), err);
    EXPECT_EQ(exit_within(pid, 20s), 1);  // not an abort (134) while sizing the pool
    const std::string log = slurp(err);
    EXPECT_NE(log.find("nan.toml:2:14: gpu.pool_share: must be a finite number"), std::string::npos)
        << log;
  }
}

TEST_F(ThawdLifecycle, AShimSocketPathThatIsNotASocketIsNeverDeleted) {
  const fs::path file = dir_.path() / "precious.txt";
  std::ofstream(file) << "someone's notes";
  const fs::path empty_dir = dir_.path() / "empty-dir";
  fs::create_directory(empty_dir);
  for (const auto& [path, what] :
       {std::pair{file, "is a regular file"}, std::pair{empty_dir, "is a directory"}}) {
    write_config("[shim]\nsocket = \"" + path.string() + "\"\n");
    const fs::path err = dir_.path() / ("stderr." + path.filename().string());
    const pid_t pid =
        spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(), err);
    EXPECT_EQ(exit_within(pid, 30s), 1);
    const std::string log = slurp(err);
    EXPECT_NE(log.find("shim.socket " + path.string() + ": " + what + ", not a socket"),
              std::string::npos)
        << log;
  }
  EXPECT_EQ(slurp(file), "someone's notes");
  EXPECT_TRUE(fs::is_directory(empty_dir));
}

TEST_F(ThawdLifecycle, SigtermRightAfterReadyWithMetricsStopsEveryTime) {
  // The metrics listener's thread could start serving after the stop: join() then waited
  // forever (under systemd a 60 s hang, then SIGKILL). A few rounds make the window likely.
  for (int round = 0; round < 5; ++round) {
    fs::remove(dir_.path() / "notify");
    write_config("[metrics]\nlisten = \"127.0.0.1:" +
                 std::to_string(thaw::store::testing::free_loopback_port()) + "\"\n");
    NotifySocket notify(dir_.path() / "notify");
    const fs::path err = dir_.path() / ("stderr.round" + std::to_string(round));
    const pid_t pid =
        spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(), err);
    ASSERT_FALSE(notify.until("READY=1").empty()) << slurp(err);
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    ASSERT_EQ(exit_within(pid, 20s), 0) << "round " << round << ": no clean exit within 20 s\n"
                                        << slurp(err);
    // Every line of thawd's own log on stderr starts with the local time, to the millisecond;
    // the start-up re-index says what it kept.
    const std::string log = slurp(err);
    std::istringstream lines(log);
    const std::regex stamped(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4} thawd: .*)");
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("thaw-emu:")) continue;  // the emulator's own, not thawd's
      EXPECT_TRUE(std::regex_match(line, stamped)) << line;
    }
    EXPECT_NE(log.find("kept 0 model(s)"), std::string::npos) << log;
  }
}

// [network] shaping = "auto" on loopback, whose link rate no driver reports: thawd runs
// without shaping, says why exactly once, and GetNetwork tells the same; shaping = true on a
// device that does not exist stops the start with what to fix.
TEST_F(ThawdLifecycle, ShapingThatCannotRunIsOffSaidOnceOrFailsTheStartWhenRequired) {
  write_config("[network]\nuplink = \"lo\"\n");
  NotifySocket notify(dir_.path() / "notify");
  const pid_t pid = spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()}, env(),
                          dir_.path() / "stderr");
  ASSERT_FALSE(notify.until("READY=1").empty()) << slurp(dir_.path() / "stderr");
  int rc = 0;
  const std::string reply = busctl(
      bus_.address(),
      {"call", "org.thaw.Node1", "/org/thaw/Node1", "org.thaw.Node1.Manager", "GetNetwork"}, &rc);
  EXPECT_EQ(rc, 0) << reply;
  EXPECT_TRUE(
      reply.starts_with("bsstsuta(stttttttt)a(qst) false \"traffic shaping off: the link rate "
                        "of lo is unknown"))
      << reply;
  EXPECT_NE(reply.find("\"lo\" 0 \"config\" 0 0 4 \"inference\""), std::string::npos) << reply;
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(wait_exit(pid), 0);
  const std::string log = slurp(dir_.path() / "stderr");
  const auto first = log.find("traffic shaping off");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("traffic shaping off", first + 1), std::string::npos) << "said twice:\n"
                                                                           << log;
  EXPECT_NE(log.find("set network.link_rate"), std::string::npos) << log;

  write_config("[network]\nshaping = true\nuplink = \"thaw-nosuch0\"\n");
  const pid_t failing = spawn({THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()},
                              env(), dir_.path() / "stderr.required");
  EXPECT_EQ(wait_exit(failing), 1);
  const std::string why = slurp(dir_.path() / "stderr.required");
  EXPECT_NE(why.find("network.uplink: no device 'thaw-nosuch0' on this node; `ip -br link` lists"),
            std::string::npos)
      << why;
}

}  // namespace