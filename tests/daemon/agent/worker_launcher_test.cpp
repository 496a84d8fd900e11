// WorkerLauncher in supervised-child mode (no systemd): the environment a worker gets, its
// states, stop() ending its whole process group; and the helpers that name and build it.
#include "daemon/agent/worker_launcher.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent_test_support.hpp"

namespace thaw::daemon {
namespace {

using namespace std::chrono_literals;
using thaw::testing::TempDir;

using testing::read_all;

template <typename Check>
bool until(Check check, std::chrono::milliseconds timeout = 5s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (check()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return check();
}

// Gone, or a zombie waiting for whoever inherited it (the process is no longer running).
bool ended(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

pid_t pid_from_detail(const std::string& detail) {
  return detail.starts_with("pid ") ? static_cast<pid_t>(std::stol(detail.substr(4))) : -1;
}

WorkerSpec shell(const std::string& unit, const std::string& script, std::uint32_t gpu = 0) {
  return {unit, {"/bin/sh", "-c", script}, {}, gpu};
}

// Each child worker runs in a cgroup v2 of its own from its first instruction (what the
// traffic shaper classes its packets by), reported to the hooks, and removed once reaped.
TEST(WorkerLauncher, AChildWorkerRunsInItsOwnCgroupUntilItIsReaped) {
  auto parent = own_cgroup_v2_dir();
  if (!parent) GTEST_SKIP() << parent.error();
  if (::access(parent->c_str(), W_OK) != 0) GTEST_SKIP() << parent->string() << " not writable";
  TempDir dir;
  const auto out = dir.path() / "cgroup.txt";
  WorkerLauncher launcher(dir.path() / "workers", /*use_systemd=*/false);
  std::vector<std::pair<std::string, std::uint64_t>> started, gone;
  std::vector<std::vector<std::uint16_t>> ports;
  launcher.set_traffic_hooks({[&](const std::string& unit, const WorkerTraffic& t) {
                                started.emplace_back(unit, t.cgroup_id);
                                ports.push_back(t.ports);
                              },
                              [&](const std::string& unit, const WorkerTraffic& t) {
                                gone.emplace_back(unit, t.cgroup_id);
                                ports.push_back(t.ports);
                              }});
  const std::string unit = fmt::format("thaw-worker-cgtest-{}", getpid());
  // The worker reads its own cgroup as its first act, then waits to be told to end.
  WorkerSpec spec =
      shell(unit, fmt::format("cat /proc/self/cgroup > {}.tmp && mv {}.tmp {}; "
                              "while [ ! -e {}.end ]; do sleep 0.02; done",
                              out.string(), out.string(), out.string(), out.string()));
  spec.ports = {23001, 23002};  // where it would serve: told with the cgroup, both times
  ASSERT_TRUE(launcher.launch(spec).has_value());
  ASSERT_TRUE(until([&] { return std::filesystem::exists(out); }));
  const auto cgroup_dir = *parent / unit;
  auto id = cgroup_id_of(cgroup_dir);
  ASSERT_TRUE(id.has_value()) << id.error();
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0], std::make_pair(unit, *id));
  EXPECT_EQ(launcher.cgroup_id(unit), *id);
  const std::string line =
      "0::/" + std::filesystem::relative(cgroup_dir, *cgroup_v2_mount()).string() + "\n";
  EXPECT_NE(read_all(out).find(line), std::string::npos) << read_all(out);
  EXPECT_TRUE(gone.empty());
  std::ofstream(out.string() + ".end") << "";
  ASSERT_TRUE(until([&] { return launcher.status(unit).state != WorkerState::running; }));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], std::make_pair(unit, *id));
  EXPECT_EQ(ports, (std::vector<std::vector<std::uint16_t>>{{23001, 23002}, {23001, 23002}}));
  EXPECT_EQ(launcher.cgroup_id(unit), 0u);
  EXPECT_FALSE(std::filesystem::exists(cgroup_dir));
}

// A transient unit's cgroup is systemd's: the launcher asks for its ControlGroup (relative to
// the cgroup v2 mount) and reports that directory's id, and its end once the unit is
// inactive. systemd-run and systemctl are stand-ins on PATH that answer as systemd would.
TEST(WorkerLauncher, ATransientUnitsCgroupIsTheOneSystemdReports) {
  auto mount = cgroup_v2_mount();
  if (!mount) GTEST_SKIP() << mount.error();
  if (::access(mount->c_str(), W_OK) != 0) GTEST_SKIP() << mount->string() << " not writable";
  TempDir dir;
  const std::string unit = fmt::format("thaw-worker-sdtest-{}", getpid());
  const std::string group = fmt::format("/thaw-sdtest-{}/{}.service", getpid(), unit);
  const auto cgroup_dir = *mount / std::filesystem::path(group).relative_path();
  std::filesystem::create_directories(cgroup_dir);  // what systemd makes for the unit
  const auto bin = dir.path() / "bin";
  std::filesystem::create_directories(bin);
  const auto active = dir.path() / "active";
  std::ofstream(bin / "systemd-run") << "#!/bin/sh\ntouch " << active.string() << "\n";
  std::ofstream(bin / "systemctl")
      << "#!/bin/sh\ncase \"$1\" in\n"
      << "  show) [ \"$4\" = " << unit << ".service ] && echo " << group << " ;;\n"
      << "  is-active) [ -e " << active.string() << " ] ;;\n"
      << "  *) true ;;\nesac\n";
  std::filesystem::permissions(bin / "systemd-run", std::filesystem::perms::owner_all);
  std::filesystem::permissions(bin / "systemctl", std::filesystem::perms::owner_all);
  const std::string path = ::getenv("PATH") ? ::getenv("PATH") : "/usr/bin:/bin";
  ::setenv("PATH", (bin.string() + ":" + path).c_str(), 1);
  std::vector<std::uint64_t> started, gone;
  {
    WorkerLauncher launcher(dir.path() / "workers", /*use_systemd=*/true);
    launcher.set_traffic_hooks(
        {[&](const std::string&, const WorkerTraffic& t) { started.push_back(t.cgroup_id); },
         [&](const std::string&, const WorkerTraffic& t) { gone.push_back(t.cgroup_id); }});
    ASSERT_TRUE(launcher.launch(shell(unit, "true")).has_value());
    auto id = cgroup_id_of(cgroup_dir);
    ASSERT_TRUE(id.has_value()) << id.error();
    EXPECT_EQ(started, std::vector<std::uint64_t>{*id});
    EXPECT_EQ(launcher.cgroup_id(unit), *id);
    EXPECT_EQ(launcher.status(unit).state, WorkerState::running);
    EXPECT_TRUE(gone.empty());
    std::filesystem::remove(active);  // the unit ends
    EXPECT_EQ(launcher.status(unit).state, WorkerState::exited);
    EXPECT_EQ(gone, std::vector<std::uint64_t>{*id});
  }
  ::setenv("PATH", path.c_str(), 1);
  ::rmdir(cgroup_dir.c_str());
  ::rmdir(cgroup_dir.parent_path().c_str());
}

// A thawd restart under systemd: the transient unit keeps running, and the next thawd's
// launcher adopts it from `systemctl list-units`, with the GPU and ports recorded at its launch.
// It is then a worker like its own: running, its GPU busy, its cgroup and ports told to the
// traffic hooks, stopped through systemctl, its end told to the hooks. Stand-ins on PATH
// answer as systemd would.
TEST(WorkerLauncher, AUnitStillRunningAfterARestartIsAdoptedWithItsGpuAndPorts) {
  auto mount = cgroup_v2_mount();
  if (!mount) GTEST_SKIP() << mount.error();
  if (::access(mount->c_str(), W_OK) != 0) GTEST_SKIP() << mount->string() << " not writable";
  TempDir dir;
  const std::string unit = fmt::format("thaw-worker-adopt-{}", getpid());
  const std::string group = fmt::format("/thaw-sdadopt-{}/{}.service", getpid(), unit);
  const auto cgroup_dir = *mount / std::filesystem::path(group).relative_path();
  std::filesystem::create_directories(cgroup_dir);
  const auto bin = dir.path() / "bin";
  std::filesystem::create_directories(bin);
  const auto active = dir.path() / "active";
  const auto stops = dir.path() / "stops";
  std::ofstream(bin / "systemd-run") << "#!/bin/sh\ntouch " << active.string() << "\n";
  std::ofstream(bin / "systemctl")
      << "#!/bin/sh\ncase \"$1\" in\n"
      << "  show) [ \"$4\" = " << unit << ".service ] && echo " << group << " ;;\n"
      << "  is-active) [ -e " << active.string() << " ] ;;\n"
      << "  list-units) [ -e " << active.string() << " ] && echo \"" << unit
      << ".service loaded active running /bin/sh -c sleep\"; "
      << "echo 'other.service loaded active running x' ;;\n"
      << "  stop) echo \"$3\" >>" << stops.string() << "; rm -f " << active.string() << " ;;\n"
      << "  *) true ;;\nesac\n";
  std::filesystem::permissions(bin / "systemd-run", std::filesystem::perms::owner_all);
  std::filesystem::permissions(bin / "systemctl", std::filesystem::perms::owner_all);
  const std::string path = ::getenv("PATH") ? ::getenv("PATH") : "/usr/bin:/bin";
  ::setenv("PATH", (bin.string() + ":" + path).c_str(), 1);
  {
    WorkerLauncher first(dir.path() / "workers", /*use_systemd=*/true);
    WorkerSpec spec = shell(unit, "sleep 600", /*gpu=*/3);
    spec.ports = {23101, 23102};
    ASSERT_TRUE(first.launch(spec).has_value());
  }  // thawd stops; the unit goes on
  std::vector<WorkerTraffic> started, gone;
  WorkerLauncher next(dir.path() / "workers", /*use_systemd=*/true);
  next.set_traffic_hooks({[&](const std::string&, const WorkerTraffic& t) { started.push_back(t); },
                          [&](const std::string&, const WorkerTraffic& t) { gone.push_back(t); }});
  EXPECT_EQ(next.status(unit).state, WorkerState::unknown) << "not adopted yet";
  EXPECT_EQ(next.adopt_running_units(), std::vector<std::string>{unit});
  EXPECT_TRUE(next.adopt_running_units().empty()) << "adopted once";
  auto id = cgroup_id_of(cgroup_dir);
  ASSERT_TRUE(id.has_value()) << id.error();
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].cgroup_id, *id);
  EXPECT_EQ(started[0].ports, (std::vector<std::uint16_t>{23101, 23102}));
  EXPECT_EQ(next.status(unit).state, WorkerState::running);
  EXPECT_EQ(next.busy_gpus(), std::vector<std::uint32_t>{3});
  // A repeated launch task is not a second engine (systemd-run would refuse the name).
  ASSERT_TRUE(next.launch(shell(unit, "sleep 600", 3)).has_value());
  ASSERT_TRUE(next.request_stop(unit).has_value());
  EXPECT_EQ(read_all(stops), unit + ".service\n");
  EXPECT_EQ(next.status(unit).state, WorkerState::exited);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].cgroup_id, *id);
  ::setenv("PATH", path.c_str(), 1);
  ::rmdir(cgroup_dir.c_str());
  ::rmdir(cgroup_dir.parent_path().c_str());
}

// Without systemd a worker ends with the thawd that started it: nothing to adopt.
TEST(WorkerLauncher, WithoutSystemdThereIsNothingToAdopt) {
  TempDir dir;
  WorkerLauncher launcher(dir.path() / "workers", /*use_systemd=*/false);
  EXPECT_TRUE(launcher.adopt_running_units().empty());
}

TEST(WorkerLauncher, AWorkerGetsItsEnvironmentAndStopEndsItsProcessGroup) {
  TempDir dir;
  const auto out = dir.path() / "env.txt";
  const auto pidfile = dir.path() / "grandchild.pid";
  ::setenv("THAW_STAGE", "stale", 1);  // thawd's own value must be replaced, not kept
  WorkerLauncher launcher(dir.path() / "workers", /*use_systemd=*/false);
  WorkerSpec spec = shell(
      "thaw-worker-p-1-2",
      fmt::format("echo to-the-log; echo \"$LD_PRELOAD $THAW_STAGE\" > '{}'; sleep 30 & echo $! > "
                  "'{}'; sleep 30",
                  out.string(), pidfile.string()),
      3);
  spec.env = {"LD_PRELOAD=/nonexistent/libthaw-preload.so", "THAW_STAGE=2"};
  ASSERT_TRUE(launcher.launch(spec));
  ::unsetenv("THAW_STAGE");

  const WorkerStatus running = launcher.status(spec.unit);
  EXPECT_EQ(running.state, WorkerState::running);
  const pid_t pid = pid_from_detail(running.detail);
  ASSERT_GT(pid, 0) << running.detail;
  EXPECT_EQ(::getpgid(pid), pid);  // its own process group
  EXPECT_EQ(launcher.busy_gpus(), std::vector<std::uint32_t>{3});

  ASSERT_TRUE(until([&] { return read_all(pidfile).ends_with("\n"); }));
  EXPECT_EQ(read_all(out), "/nonexistent/libthaw-preload.so 2\n");
  const pid_t grandchild = static_cast<pid_t>(std::stol(read_all(pidfile)));
  EXPECT_EQ(::getpgid(grandchild), pid);
  EXPECT_NE(read_all(dir.path() / "workers" / "thaw-worker-p-1-2.log").find("to-the-log"),
            std::string::npos);

  // Launching the running unit again is not a second engine.
  ASSERT_TRUE(launcher.launch(spec));
  EXPECT_EQ(launcher.status(spec.unit).detail, running.detail);

  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(launcher.stop(spec.unit));
  EXPECT_LT(std::chrono::steady_clock::now() - before, 5s);  // SIGTERM was enough
  const WorkerStatus stopped = launcher.status(spec.unit);
  EXPECT_TRUE((stopped.state == WorkerState::failed && stopped.detail == "signal 15") ||
              stopped.state == WorkerState::exited)
      << stopped.detail;
  EXPECT_TRUE(ended(pid));
  // The backgrounded sleep got the group's SIGTERM too.
  EXPECT_TRUE(until([&] { return ended(grandchild); }, 2s));
  EXPECT_TRUE(launcher.busy_gpus().empty());
  EXPECT_TRUE(launcher.stop(spec.unit));  // stopping a stopped worker is fine
}

TEST(WorkerLauncher, ExitStatusDecidesExitedOrFailed) {
  TempDir dir;
  WorkerLauncher launcher(dir.path() / "workers", false);
  ASSERT_TRUE(launcher.launch(shell("ok", "exit 0")));
  ASSERT_TRUE(launcher.launch(shell("bad", "exit 3")));
  ASSERT_TRUE(until([&] {
    return launcher.status("ok").state != WorkerState::running &&
           launcher.status("bad").state != WorkerState::running;
  }));
  EXPECT_EQ(launcher.status("ok").state, WorkerState::exited);
  EXPECT_EQ(launcher.status("ok").detail, "exit 0");
  EXPECT_EQ(launcher.status("bad").state, WorkerState::failed);
  EXPECT_EQ(launcher.status("bad").detail, "exit 3");
  EXPECT_EQ(launcher.status("never").state, WorkerState::unknown);

  // A unit that ended may be launched again.
  ASSERT_TRUE(launcher.launch(shell("ok", "sleep 30")));
  EXPECT_EQ(launcher.status("ok").state, WorkerState::running);
}

TEST(WorkerLauncher, LaunchAndStopRefuseWhatCannotBeDone) {
  TempDir dir;
  WorkerLauncher launcher(dir.path() / "workers", false);
  auto empty = launcher.launch({"thaw-worker-x-0", {}, {}, 0});
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().find("no worker command"), std::string::npos) << empty.error();

  auto missing = launcher.launch({"thaw-worker-x-0", {"/nonexistent/engine", "serve"}, {}, 0});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("cannot start /nonexistent/engine"), std::string::npos)
      << missing.error();

  auto unknown = launcher.stop("thaw-worker-nope-0");
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().find("no worker thaw-worker-nope-0"), std::string::npos)
      << unknown.error();
}

TEST(WorkerLauncher, DestroyingTheLauncherStopsItsWorkers) {
  TempDir dir;
  pid_t pid = -1;
  {
    WorkerLauncher launcher(dir.path() / "workers", false);
    ASSERT_TRUE(launcher.launch({"w", {"/bin/sleep", "30"}, {}, 0}));
    pid = pid_from_detail(launcher.status("w").detail);
    ASSERT_GT(pid, 0);
  }
  // Stopped and reaped: the pid no longer exists at all.
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(WorkerCommand, PlaceholdersAreReplacedInEveryArgument) {
  const std::map<std::string, std::string> values = {{"model", "org/model"}, {"key", "org--model"},
                                                     {"stage", "1"},         {"stages", "4"},
                                                     {"gpu", "7"},           {"plan", "p1-3"}};
  EXPECT_EQ(expand_worker_command({"/usr/bin/vllm", "serve", "{model}", "--gpu={gpu}",
                                   "/cache/{key}/{stage}-of-{stages}", "{plan}{plan}", "{unknown}",
                                   "{model", "plain"},
                                  values),
            (std::vector<std::string>{"/usr/bin/vllm", "serve", "org/model", "--gpu=7",
                                      "/cache/org--model/1-of-4", "p1-3p1-3", "{unknown}", "{model",
                                      "plain"}));
  // A value holding its own placeholder is inserted once, not expanded forever.
  EXPECT_EQ(expand_worker_command({"{model}:{model}"}, {{"model", "x{model}y"}}),
            std::vector<std::string>{"x{model}y:x{model}y"});
  EXPECT_TRUE(expand_worker_command({}, values).empty());
}

TEST(WorkerCommand, UnitNamesKeepOnlyLettersDigitsDashAndUnderscore) {
  EXPECT_EQ(WorkerLauncher::unit_name("p19a2b-3", 1), "thaw-worker-p19a2b-3-1");
  EXPECT_EQ(WorkerLauncher::unit_name("plan/with.dots and space", 0),
            "thaw-worker-plan_with_dots_and_space-0");
  EXPECT_EQ(WorkerLauncher::unit_name("a;rm -rf $(x)", 12), "thaw-worker-a_rm_-rf___x_-12");
  EXPECT_EQ(WorkerLauncher::unit_name("\xc3\xbc", 2), "thaw-worker-__-2");  // UTF-8 bytes too
}

}  // namespace
}  // namespace thaw::daemon
