// TaskRunner over a real NodeService (a host cache in a temporary directory, no registry, no
// GPU) and supervised workers: what each kind of task does, what it reports, and that a task
// the coordinator sends again is not carried out again.
#include "daemon/agent/task_runner.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent_test_support.hpp"

namespace thaw::daemon {
namespace {

using namespace std::chrono_literals;

using testing::read_all;

v1::Task make_task(const std::string& id, v1::TaskKind kind, std::uint32_t stage = 0,
                   std::uint32_t stages = 1, std::uint32_t gpu = 0) {
  v1::Task t;
  t.set_id(id);
  t.set_plan_id("p-1");
  t.set_kind(kind);
  t.mutable_model()->set_name("org/model");
  t.mutable_model()->set_size_bytes(1 << 20);
  t.set_stage(stage);
  t.set_stages(stages);
  t.set_gpu(gpu);
  return t;
}

class TaskRunnerTest : public testing::NodeServiceFixture {
 protected:
  void TearDown() override {
    runner_.reset();
    NodeServiceFixture::TearDown();
  }

  TaskRunner& runner(std::vector<std::string> command = {},
                     std::function<bool(std::uint16_t)> probe = {},
                     std::string preload = "/nonexistent/libthaw-preload.so") {
    runner_ = std::make_unique<TaskRunner>(
        *service_, *workers_,
        WorkerSettings{std::move(command), std::move(preload), "/run/test.sock",
                       dir_.path() / "timelines", std::move(probe)});
    return *runner_;
  }
  v1::TaskStatus held(const std::string& id) const {
    for (const v1::TaskStatus& s : runner_->held())
      if (s.task().id() == id) return s;
    ADD_FAILURE() << "no task " << id;
    return {};
  }

  // Polls as the agent does until the task leaves the running state; its last status.
  v1::TaskStatus until_finished(const std::string& id) {
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      runner_->poll();
      for (const v1::TaskStatus& s : runner_->held()) {
        if (s.task().id() == id && s.state() != v1::TASK_RUNNING) return s;
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "task " << id << " still running";
    return {};
  }

  std::unique_ptr<TaskRunner> runner_;
};

// A registry that takes connections and never answers: a fetch from it stays in its listing
// until close(), when the kernel resets the connections it had queued and the fetch fails.
class SilentRegistry {
 public:
  SilentRegistry() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 16) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "no loopback listener: " << std::strerror(errno);
    }
    port_ = ntohs(a.sin_port);
  }
  ~SilentRegistry() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// HydraServe's overlap: under the shim, a stage's engine starts while its stage is fetched
// (the shim holds its lookups and reads until the bytes are in).
TEST_F(TaskRunnerTest, UnderTheShimAStagesWorkerStartsWhileItsFetchStillRuns) {
  SilentRegistry registry;
  service_->set_config(NodeServiceConfig{registry.url(), 1, 0});
  const auto out = dir_.path() / "launched";
  TaskRunner& r = runner({"/bin/sh", "-c", fmt::format("touch '{}'", out.string())});
  const v1::TaskStatus fetch = r.start(make_task("p-1/1/fetch", v1::TASK_FETCH, 1, 2));
  ASSERT_EQ(fetch.state(), v1::TASK_RUNNING) << fetch.error();
  const v1::TaskStatus launch =
      r.start(make_task("p-1/1/launch-worker", v1::TASK_LAUNCH_WORKER, 1, 2));
  EXPECT_NE(launch.state(), v1::TASK_FAILED) << launch.error();  // (done already, maybe)
  EXPECT_EQ(until_finished("p-1/1/launch-worker").state(), v1::TASK_DONE);
  EXPECT_TRUE(std::filesystem::exists(out)) << "the worker did not run";
  EXPECT_EQ(held("p-1/1/fetch").state(), v1::TASK_RUNNING)
      << "the fetch ended first: the test shows nothing about the launch's timing";
  registry.close();
  EXPECT_EQ(until_finished("p-1/1/fetch").state(), v1::TASK_FAILED);
}

// Without the shim (no preload configured) nothing would hold the engine's reads of bytes
// still arriving: the worker starts only once its stage's fetch has ended, and not at all
// when the fetch fails.
TEST_F(TaskRunnerTest, WithoutTheShimAStagesWorkerWaitsForItsFetch) {
  SilentRegistry registry;
  service_->set_config(NodeServiceConfig{registry.url(), 1, 0});
  const auto out = dir_.path() / "launched";
  TaskRunner& r = runner({"/bin/sh", "-c", fmt::format("touch '{}'", out.string())}, {}, "");
  ASSERT_EQ(r.start(make_task("p-1/1/fetch", v1::TASK_FETCH, 1, 2)).state(), v1::TASK_RUNNING);
  r.start(make_task("p-1/1/launch-worker", v1::TASK_LAUNCH_WORKER, 1, 2));
  for (int i = 0; i < 30; ++i) {
    r.poll();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(held("p-1/1/launch-worker").state(), v1::TASK_RUNNING);
  EXPECT_FALSE(std::filesystem::exists(out)) << "launched before its stage was in";
  registry.close();
  const v1::TaskStatus launch = until_finished("p-1/1/launch-worker");
  EXPECT_EQ(launch.state(), v1::TASK_FAILED);
  EXPECT_NE(launch.error().find("its stage's fetch failed"), std::string::npos) << launch.error();
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(TaskRunnerTest, AFetchWithoutARegistryFailsSayingWhatToSet) {
  const v1::TaskStatus s = runner().start(make_task("p-1/0/fetch", v1::TASK_FETCH, 0, 2));
  EXPECT_EQ(s.state(), v1::TASK_FAILED);
  EXPECT_NE(s.error().find("no registry is configured"), std::string::npos) << s.error();
  EXPECT_NE(s.error().find("store.registry"), std::string::npos) << s.error();
  EXPECT_EQ(s.task().id(), "p-1/0/fetch");
}

TEST_F(TaskRunnerTest, ALaunchWithoutAWorkerCommandFailsSayingToSetIt) {
  const v1::TaskStatus s = runner().start(make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER));
  EXPECT_EQ(s.state(), v1::TASK_FAILED);
  EXPECT_NE(s.error().find("set coordinator.worker_command"), std::string::npos) << s.error();
}

TEST_F(TaskRunnerTest, ALaunchRunsTheCommandWithPlaceholdersAndTheShimsEnvironment) {
  const auto out = dir_.path() / "worker.txt";
  TaskRunner& r =
      runner({"/bin/sh", "-c",
              fmt::format("echo \"$0 $1 $LD_PRELOAD $THAW_SOCKET $CUDA_VISIBLE_DEVICES $THAW_PLAN "
                          "$THAW_STAGE $THAW_STAGES\" > '{}'",
                          out.string()),
              "{key}", "{model}:{stage}/{stages}@{gpu}:{plan}"});
  const v1::TaskStatus first =
      r.start(make_task("p-1/1/launch-worker", v1::TASK_LAUNCH_WORKER, 1, 2, 3));
  EXPECT_NE(first.state(), v1::TASK_FAILED) << first.error();
  const v1::TaskStatus done = until_finished("p-1/1/launch-worker");
  EXPECT_EQ(done.state(), v1::TASK_DONE) << done.error();
  EXPECT_EQ(read_all(out),
            "org--model org/model:1/2@3:p-1 /nonexistent/libthaw-preload.so /run/test.sock 3 p-1 1 "
            "2\n");
  EXPECT_EQ(workers_->status("thaw-worker-p-1-1").state, WorkerState::exited);
}

TEST_F(TaskRunnerTest, AWorkerThatFailsFailsItsTaskWithTheExitStatus) {
  TaskRunner& r = runner({"/bin/sh", "-c", "exit 3"});
  r.start(make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER));
  const v1::TaskStatus s = until_finished("p-1/0/launch-worker");
  EXPECT_EQ(s.state(), v1::TASK_FAILED);
  EXPECT_EQ(s.error(), "worker thaw-worker-p-1-0: exit 3");

  const v1::TaskStatus missing =
      runner({"/nonexistent/engine"})
          .start(make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER));
  EXPECT_EQ(missing.state(), v1::TASK_FAILED);
  EXPECT_NE(missing.error().find("cannot start /nonexistent/engine"), std::string::npos)
      << missing.error();
}

TEST_F(TaskRunnerTest, TheSameTaskIdIsNotStartedTwice) {
  const auto out = dir_.path() / "runs.txt";
  TaskRunner& r = runner({"/bin/sh", "-c", fmt::format("echo run >> '{}'", out.string())});
  const v1::Task task = make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER);
  r.start(task);
  ASSERT_EQ(until_finished(task.id()).state(), v1::TASK_DONE);
  ASSERT_TRUE(r.poll().empty());  // reported already

  // The coordinator resends it (a restart, a lost reply): its status again, no second run —
  // although the launcher would start the ended unit again if asked.
  const v1::TaskStatus again = r.start(task);
  EXPECT_EQ(again.state(), v1::TASK_DONE);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(read_all(out), "run\n");
  EXPECT_EQ(r.held().size(), 1u);
  // ...and it is reported again, once.
  const std::vector<v1::TaskStatus> reported = r.poll();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].task().id(), task.id());
  EXPECT_TRUE(r.poll().empty());

  // A failed task is not retried by a resend either.
  const v1::Task fetch = make_task("p-1/0/fetch", v1::TASK_FETCH);
  EXPECT_EQ(r.start(fetch).state(), v1::TASK_FAILED);
  EXPECT_EQ(r.start(fetch).state(), v1::TASK_FAILED);
  EXPECT_EQ(
      service_->counters().fetches_failed.load() + service_->counters().fetches_started.load(), 0u);
  EXPECT_EQ(r.held().size(), 2u);
}

TEST_F(TaskRunnerTest, EvictOfAModelWithNoSlotsIsDoneAndStoppingNoWorkerFails) {
  TaskRunner& r = runner();
  EXPECT_EQ(r.start(make_task("p-1/0/evict", v1::TASK_EVICT)).state(), v1::TASK_DONE);
  const v1::TaskStatus stop = r.start(make_task("p-1/0/stop-worker", v1::TASK_STOP_WORKER));
  EXPECT_EQ(stop.state(), v1::TASK_FAILED);
  EXPECT_NE(stop.error().find("no worker thaw-worker-p-1-0"), std::string::npos) << stop.error();
}

TEST_F(TaskRunnerTest, StopWorkerEndsTheStagesWorker) {
  TaskRunner& r = runner({"/bin/sleep", "30"});
  EXPECT_EQ(r.start(make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER)).state(),
            v1::TASK_RUNNING);
  EXPECT_EQ(workers_->status("thaw-worker-p-1-0").state, WorkerState::running);
  EXPECT_NE(r.start(make_task("p-1/0/stop-worker", v1::TASK_STOP_WORKER)).state(), v1::TASK_FAILED);
  EXPECT_EQ(until_finished("p-1/0/stop-worker").state(), v1::TASK_DONE);
  EXPECT_NE(workers_->status("thaw-worker-p-1-0").state, WorkerState::running);
  // The launch task learns that its worker ended.
  EXPECT_NE(until_finished("p-1/0/launch-worker").state(), v1::TASK_RUNNING);
}

TEST_F(TaskRunnerTest, APipelineStageIsWiredToItsPeersAndLayers) {
  const auto out = dir_.path() / "stage.txt";
  TaskRunner& r = runner({"/bin/sh", "-c", fmt::format("echo \"$*\" > '{}'", out.string()), "sh",
                          "--pp-rank", "{pp_rank}", "--pp-size", "{pp_size}", "--pp-peers",
                          "{peers}", "--port", "{port}", "--layers", "{layer_begin}-{layer_end}"});
  v1::Task t = make_task("p-1/1/launch-worker", v1::TASK_LAUNCH_WORKER, 1, 2);
  t.mutable_model()->set_layers(12);
  t.add_peers("10.0.0.1:29500");
  t.add_peers("10.0.0.2:29501");
  t.set_layer_begin(6);
  t.set_layer_end(12);
  EXPECT_NE(r.start(t).state(), v1::TASK_FAILED);
  EXPECT_EQ(until_finished(t.id()).state(), v1::TASK_DONE);
  EXPECT_EQ(read_all(out),
            "--pp-rank 1 --pp-size 2 --pp-peers 10.0.0.1:29500,10.0.0.2:29501 --port 0 "
            "--layers 6-12\n");
}

// The shaper learns where a worker serves: its HTTP port and its own pipeline link's port
// (its entry in peers), so requests and activations arriving there are inference.
TEST_F(TaskRunnerTest, AWorkersServingPortsGoToTheTrafficHooks) {
  std::vector<std::vector<std::uint16_t>> ports;
  workers_->set_traffic_hooks(
      {[&](const std::string&, const WorkerTraffic& t) { ports.push_back(t.ports); }, {}});
  TaskRunner& r = runner({"/bin/true"});
  v1::Task t0 = make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER, 0, 2);
  t0.add_peers("10.0.0.1:29500");
  t0.add_peers("10.0.0.2:29501");
  t0.set_http_port(23456);
  v1::Task t1 = t0;
  t1.set_id("p-1/1/launch-worker");
  t1.set_stage(1);
  t1.set_http_port(0);
  EXPECT_NE(r.start(t0).state(), v1::TASK_FAILED);
  EXPECT_NE(r.start(t1).state(), v1::TASK_FAILED);
  EXPECT_EQ(ports, (std::vector<std::vector<std::uint16_t>>{{23456, 29500}, {29501}}));
}

TEST_F(TaskRunnerTest, AStandaloneWorkerIsAPipelineOfOneWithTheWholeModelInItsOwnUnit) {
  const auto out = dir_.path() / "alone.txt";
  TaskRunner& r =
      runner({"/bin/sh", "-c", fmt::format("echo \"$*\" > '{}'", out.string()), "sh",
              "{pp_rank}/{pp_size}", "[{peers}]", "{port}", "{layer_begin}-{layer_end}"});
  v1::Task t = make_task("p-1/0/launch-standalone", v1::TASK_LAUNCH_WORKER, 0, 2);
  t.mutable_model()->set_layers(12);
  t.add_peers("10.0.0.1:29500");
  t.add_peers("10.0.0.2:29501");
  t.set_layer_end(6);
  t.set_http_port(8123);
  t.set_standalone(true);
  EXPECT_NE(r.start(t).state(), v1::TASK_FAILED);
  EXPECT_EQ(until_finished(t.id()).state(), v1::TASK_DONE);
  EXPECT_EQ(read_all(out), "0/1 [] 8123 0-12\n");
  EXPECT_EQ(workers_->status("thaw-worker-p-1-0-full").state, WorkerState::exited);
  EXPECT_EQ(workers_->status("thaw-worker-p-1-0").state, WorkerState::unknown);
}

TEST_F(TaskRunnerTest, AWorkerIsReadyWhenItsHealthAnswersAndItsPhasesAreAveraged) {
  // The "engine" writes a timeline as the reference engine does (CLOCK_MONOTONIC t_ns), then
  // waits; the probe says healthy only once the timeline is complete.
  const auto timeline = dir_.path() / "timelines" / "thaw-worker-p-1-0.timeline";
  std::atomic<int> probes{0};
  std::atomic<std::uint16_t> probed_port{0};
  TaskRunner& r = runner({"/bin/sh", "-c", "exec sleep 30", "{timeline}"}, [&](std::uint16_t port) {
    probed_port = port;
    return ++probes >= 3;
  });
  v1::Task t = make_task("p-1/0/launch-worker", v1::TASK_LAUNCH_WORKER, 0, 2);
  t.set_http_port(8124);
  const std::uint64_t before = monotonic_ns();
  ASSERT_NE(r.start(t).state(), v1::TASK_FAILED);
  // Written from here with the same clock the agent uses: launch + 0.1 s process start, then
  // 0.2 s CUDA init, 0.3 s weights, 0.4 s engine init.
  {
    std::filesystem::create_directories(timeline.parent_path());
    std::ofstream f(timeline);
    const std::uint64_t t0 = before + 100'000'000;
    f << fmt::format("{{\"event\":\"process_start\",\"t_ns\":{}}}\n", t0)
      << "not json: the engine's other output\n"
      << fmt::format("{{\"event\":\"driver_init\",\"t_ns\":{}}}\n", t0 + 200'000'000)
      << fmt::format("{{\"event\":\"weights_loaded\",\"t_ns\":{}}}\n", t0 + 500'000'000)
      << fmt::format("{{\"event\":\"ready\",\"t_ns\":{}}}\n", t0 + 900'000'000);
  }
  EXPECT_EQ(r.startup_costs().samples(), 0u);
  const auto end = std::chrono::steady_clock::now() + 5s;
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < end) {
    for (const v1::TaskStatus& s : r.poll()) ready = ready || s.worker_ready();
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(ready) << "the health probe said yes on its third call";
  EXPECT_EQ(probed_port.load(), 8124);
  const int probes_when_ready = probes;
  r.poll();
  EXPECT_EQ(probes.load(), probes_when_ready) << "a ready worker is not probed again";
  const v1::StartupCosts c = r.startup_costs();
  EXPECT_EQ(c.samples(), 1u);
  EXPECT_EQ(c.phase_samples(), 1u);
  // process_start is measured from the agent's launch, a little after `before`.
  EXPECT_GT(c.process_start_s(), 0.05);
  EXPECT_LE(c.process_start_s(), 0.1);
  EXPECT_NEAR(c.cuda_init_s(), 0.2, 1e-9);
  EXPECT_NEAR(c.weights_s(), 0.3, 1e-9);
  EXPECT_NEAR(c.engine_init_s(), 0.4, 1e-9);
  EXPECT_GT(c.ready_s(), 0);
  EXPECT_EQ(workers_->status("thaw-worker-p-1-0").state, WorkerState::running);
}

TEST(StartupMeter, AveragesEveryStartAndThePhasesOfStartsThatReportedThem) {
  StartupMeter m;
  m.record({.ready_s = 2,
            .process_start_s = 0.1,
            .cuda_init_s = 0.5,
            .weights_s = 1,
            .engine_init_s = 0.4});
  m.record({.ready_s = 4});  // an engine without a timeline
  m.record({.ready_s = 6,
            .process_start_s = 0.3,
            .cuda_init_s = 0.7,
            .weights_s = 3,
            .engine_init_s = 0.6});
  const v1::StartupCosts c = m.averages();
  EXPECT_EQ(c.samples(), 3u);
  EXPECT_EQ(c.phase_samples(), 2u);
  EXPECT_NEAR(c.ready_s(), 4, 1e-12);
  EXPECT_NEAR(c.process_start_s(), 0.2, 1e-12);
  EXPECT_NEAR(c.cuda_init_s(), 0.6, 1e-12);
  EXPECT_NEAR(c.weights_s(), 2, 1e-12);
  EXPECT_NEAR(c.engine_init_s(), 0.5, 1e-12);
}

TEST(StartupMeter, ATimelineFromBeforeTheLaunchOrMissingGivesNoPhases) {
  thaw::testing::TempDir dir;
  EXPECT_FALSE(phases_from_timeline(dir.path() / "absent", 100, 1.5).process_start_s);
  std::ofstream(dir.path() / "old") << "{\"event\":\"process_start\",\"t_ns\":50}\n";
  const StartupPhases p = phases_from_timeline(dir.path() / "old", 100, 1.5);
  EXPECT_FALSE(p.process_start_s) << "a previous run's timeline";
  EXPECT_EQ(p.ready_s, 1.5);
}

}  // namespace
}  // namespace thaw::daemon
