// ClusterState without sockets or clocks: registration, Paranoid-Pirate liveness, cold-start
// plans from Alg. 1, re-planning a dead node's stages, and the rebuild after a restart.
#include "coordinator/cluster/cluster_state.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <set>

namespace thaw::coordinator {
namespace {

constexpr std::uint64_t GiB = 1ull << 30;

v1::NodeMessage registration(const std::string& node, std::uint64_t free_bytes,
                             double network = 2e9) {
  v1::NodeMessage m;
  v1::Register* r = m.mutable_register_();
  r->set_node_id(node);
  r->set_network_bytes_per_s(network);
  v1::GpuInfo* g = r->add_gpus();
  g->set_index(0);
  g->set_memory_bytes(24 * GiB);
  g->set_free_bytes(free_bytes);
  g->set_pcie_bytes_per_s(16e9);
  return m;
}

v1::NodeMessage heartbeat() {
  v1::NodeMessage m;
  m.mutable_heartbeat()->set_sequence(1);
  return m;
}

v1::FrontendRequest deploy(const std::string& name, std::uint64_t size, double slo_ttft) {
  v1::FrontendRequest r;
  v1::ModelSpec* m = r.mutable_deploy()->mutable_model();
  m->set_name(name);
  m->set_size_bytes(size);
  m->set_layers(32);
  m->set_slo_ttft_s(slo_ttft);
  m->set_prefill_s(0.2);
  m->set_decode_s(0.03);
  return r;
}

v1::FrontendRequest cold_start(const std::string& name) {
  v1::FrontendRequest r;
  r.mutable_cold_start()->set_model(name);
  return r;
}

ClusterConfig config() {
  ClusterConfig c;
  c.heartbeat_interval_s = 1;
  c.liveness = 3;
  c.startup.container = 0.5;
  c.startup.cuda_context = 0.5;
  c.startup.library_load = 1;
  c.plan_prefix = "t";
  return c;
}

std::vector<Outbound> tasks_in(const std::vector<Outbound>& out) {
  std::vector<Outbound> tasks;
  for (const Outbound& o : out) {
    if (o.message.body_case() == v1::CoordinatorMessage::kTask) tasks.push_back(o);
  }
  return tasks;
}

// A cluster of `n` nodes "n0".. with one 24 GiB GPU each, all registered at t = 0.
ClusterState cluster_of(int n, double network = 2e9) {
  ClusterState state(config());
  for (int i = 0; i < n; ++i) {
    const std::string id = "n" + std::to_string(i);
    state.on_node_message(id, registration(id, 20 * GiB, network), 0);
  }
  return state;
}

TEST(ClusterState, RegistrationIsWelcomedWithTheHeartbeatSettings) {
  ClusterState state(config());
  auto out = state.on_node_message("a", registration("a", GiB), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].node_id, "a");
  ASSERT_TRUE(out[0].message.has_welcome());
  EXPECT_EQ(out[0].message.welcome().heartbeat_interval_ms(), 1000u);
  EXPECT_EQ(out[0].message.welcome().liveness(), 3u);
  EXPECT_TRUE(state.nodes().at("a").alive);
}

TEST(ClusterState, AnUnknownNodeIsAskedToRegister) {
  ClusterState state(config());
  auto out = state.on_node_message("stranger", heartbeat(), 5);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].message.has_re_register());
  EXPECT_NE(out[0].message.re_register().reason().find("does not know"), std::string::npos);
  EXPECT_TRUE(state.nodes().empty());
}

TEST(ClusterState, HeartbeatsGoOutEveryIntervalAndKeepANodeAlive) {
  ClusterState state = cluster_of(2);
  EXPECT_TRUE(state.tick(0.5).empty());  // welcomed at 0: next heartbeat due at 1
  auto out = state.tick(1.0);
  std::set<std::string> to;
  for (const Outbound& o : out) {
    EXPECT_TRUE(o.message.has_heartbeat());
    to.insert(o.node_id);
  }
  EXPECT_EQ(to, (std::set<std::string>{"n0", "n1"}));
  // Nodes heartbeat for 10 s: nobody dies.
  std::vector<std::string> died;
  for (double t = 1; t <= 10; t += 1) {
    state.on_node_message("n0", heartbeat(), t);
    state.on_node_message("n1", heartbeat(), t);
    state.tick(t, &died);
    EXPECT_TRUE(died.empty());
  }
}

TEST(ClusterState, ASilentNodeIsDeclaredDeadAfterLivenessTimesInterval) {
  ClusterState state = cluster_of(2);
  std::vector<std::string> died;
  for (double t = 0.5; t <= 3.0; t += 0.5) {
    state.on_node_message("n0", heartbeat(), t);
    state.tick(t, &died);
    EXPECT_TRUE(died.empty()) << "at " << t;
  }
  state.on_node_message("n0", heartbeat(), 3.1);
  state.tick(3.1, &died);  // n1 last heard at 0: 3.1 > 3 × 1 s
  EXPECT_EQ(died, std::vector<std::string>{"n1"});
  EXPECT_FALSE(state.nodes().at("n1").alive);
  EXPECT_TRUE(state.nodes().at("n0").alive);
  // Once dead, what it says is not taken until it registers again.
  auto out = state.on_node_message("n1", heartbeat(), 3.2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.has_re_register());
  EXPECT_FALSE(state.nodes().at("n1").alive);
  state.on_node_message("n1", registration("n1", 20 * GiB), 3.3);
  EXPECT_TRUE(state.nodes().at("n1").alive);
}

TEST(ClusterState, NextDeadlineIsTheNearestHeartbeatOrLivenessLimit) {
  ClusterState state = cluster_of(1);
  EXPECT_DOUBLE_EQ(state.next_deadline(0.25), 0.75);
  state.tick(1.0);
  EXPECT_DOUBLE_EQ(state.next_deadline(1.0), 1.0);
}

TEST(ClusterState, ColdStartOfAnUndeployedModelSaysToDeployIt) {
  ClusterState state = cluster_of(1);
  std::vector<Outbound> out;
  auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
  EXPECT_NE(reply.error().find("not deployed"), std::string::npos);
  EXPECT_NE(reply.error().find("thawctl cluster deploy"), std::string::npos);
  EXPECT_TRUE(out.empty());
}

TEST(ClusterState, ColdStartWithNoNodeThatFitsIsRefused) {
  ClusterState state(config());
  state.on_node_message("small", registration("small", GiB), 0);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("llama", 13 * GiB, 10), 0, out);
  auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
  EXPECT_NE(reply.error().find("no live node has a GPU"), std::string::npos);
  EXPECT_TRUE(tasks_in(out).empty());
  EXPECT_TRUE(state.plans().empty());
}

// A stringent TTFT SLO over a 16 Gbps network needs a pipeline: the plan's stages sit on
// distinct nodes and each gets a fetch task of its stage.
TEST(ClusterState, AStringentSloGetsAPipelineWithOneFetchTaskPerStage) {
  ClusterState state = cluster_of(4);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("llama", 13 * GiB, 6), 0, out);
  auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
  ASSERT_TRUE(reply.error().empty()) << reply.error();
  const v1::Plan& plan = reply.plan();
  EXPECT_GE(plan.stages(), 2u);  // 13 GiB alone over 2 GB/s takes ~7 s: more than the SLO
  EXPECT_TRUE(plan.meets_slo());
  EXPECT_LE(plan.predicted_ttft_s(), 6.0);
  ASSERT_EQ(plan.placement_size(), static_cast<int>(plan.stages()));
  auto tasks = tasks_in(out);
  ASSERT_EQ(tasks.size(), plan.stages());
  std::set<std::string> nodes;
  std::set<std::uint32_t> stages;
  for (const Outbound& t : tasks) {
    const v1::Task& task = t.message.task();
    EXPECT_EQ(task.kind(), v1::TASK_FETCH);
    EXPECT_EQ(task.plan_id(), plan.id());
    EXPECT_EQ(task.stages(), plan.stages());
    EXPECT_EQ(task.model().name(), "llama");
    EXPECT_EQ(t.node_id, plan.placement(static_cast<int>(task.stage())).node_id());
    nodes.insert(t.node_id);
    stages.insert(task.stage());
  }
  EXPECT_EQ(nodes.size(), plan.stages());
  EXPECT_EQ(stages.size(), plan.stages());
}

TEST(ClusterState, ALooseSloGetsOneWorker) {
  ClusterState state = cluster_of(4);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("llama", 13 * GiB, 60), 0, out);
  auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
  ASSERT_TRUE(reply.error().empty()) << reply.error();
  EXPECT_EQ(reply.plan().stages(), 1u);
  EXPECT_TRUE(reply.plan().placement(0).full_memory());
  ASSERT_EQ(tasks_in(out).size(), 1u);
  EXPECT_EQ(tasks_in(out)[0].message.task().stages(), 1u);
}

TEST(ClusterState, LaunchWorkersAddsALaunchTaskPerStage) {
  ClusterConfig c = config();
  c.launch_workers = true;
  ClusterState state(c);
  state.on_node_message("n0", registration("n0", 20 * GiB), 0);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  auto reply = state.on_frontend_request(cold_start("m"), 0, out);
  ASSERT_TRUE(reply.error().empty());
  auto tasks = tasks_in(out);
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].message.task().kind(), v1::TASK_FETCH);
  EXPECT_EQ(tasks[1].message.task().kind(), v1::TASK_LAUNCH_WORKER);
}

TEST(ClusterState, ProgressUpdatesThePlansStage) {
  ClusterState state = cluster_of(1);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  auto reply = state.on_frontend_request(cold_start("m"), 0, out);
  ASSERT_TRUE(reply.error().empty());
  v1::NodeMessage progress;
  *progress.mutable_progress()->mutable_task() = tasks_in(out).at(0).message.task();
  progress.mutable_progress()->set_state(v1::TASK_DONE);
  progress.mutable_progress()->set_bytes_done(GiB);
  progress.mutable_progress()->set_bytes_total(GiB);
  state.on_node_message("n0", progress, 1);
  const v1::PlannedStage& stage = state.plans().at(reply.plan().id()).plan.placement(0);
  EXPECT_EQ(stage.fetch_state(), v1::TASK_DONE);
  EXPECT_EQ(stage.bytes_done(), GiB);
  // The node's report holds the task (what a state query shows).
  EXPECT_EQ(state.nodes().at("n0").report.tasks_size(), 1);
}

// A node running a stage dies: the stage moves to a live node not already in the plan, which
// gets the stage's fetch task; the plan counts the move.
TEST(ClusterState, ADeadNodesStageIsReplannedOnAnotherNode) {
  ClusterState state = cluster_of(5);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("llama", 13 * GiB, 6), 0, out);
  auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
  ASSERT_TRUE(reply.error().empty()) << reply.error();
  ASSERT_GE(reply.plan().stages(), 2u);
  const std::string victim = reply.plan().placement(1).node_id();
  std::set<std::string> in_plan;
  for (const auto& s : reply.plan().placement()) in_plan.insert(s.node_id());

  std::vector<std::string> died;
  std::vector<Outbound> sent;
  for (double t = 1; t <= 4; t += 1) {
    for (const auto& [id, node] : state.nodes()) {
      if (id != victim) state.on_node_message(id, heartbeat(), t);
    }
    auto o = state.tick(t, &died);
    sent.insert(sent.end(), o.begin(), o.end());
    if (!died.empty()) break;
  }
  ASSERT_EQ(died, std::vector<std::string>{victim});
  const v1::PlannedStage& moved = state.plans().at(reply.plan().id()).plan.placement(1);
  EXPECT_NE(moved.node_id(), victim);
  EXPECT_FALSE(in_plan.contains(moved.node_id())) << "moved onto a node already in the plan";
  EXPECT_EQ(moved.replans(), 1u);
  EXPECT_EQ(moved.fetch_state(), v1::TASK_RUNNING);
  auto tasks = tasks_in(sent);
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].node_id, moved.node_id());
  EXPECT_EQ(tasks[0].message.task().stage(), 1u);
  EXPECT_EQ(tasks[0].message.task().kind(), v1::TASK_FETCH);
}

// A restarted coordinator knows nothing; each node's registration carries its tasks, from
// which the model and the plan (stage → node) come back.
TEST(ClusterState, ARestartedCoordinatorRebuildsPlansFromRegistrations) {
  ClusterState before = cluster_of(4);
  std::vector<Outbound> out;
  before.on_frontend_request(deploy("llama", 13 * GiB, 6), 0, out);
  auto reply = before.on_frontend_request(cold_start("llama"), 0, out);
  ASSERT_TRUE(reply.error().empty());

  ClusterState after(config());
  // Each node heartbeats first (it has not noticed the restart), is asked to register, and
  // registers with its tasks.
  std::map<std::string, v1::NodeMessage> again;
  for (const auto& [id, node] : before.nodes()) again[id] = registration(id, 20 * GiB);
  for (const Outbound& t : tasks_in(out)) {
    v1::TaskStatus* held = again[t.node_id].mutable_register_()->add_tasks();
    *held->mutable_task() = t.message.task();
    held->set_state(v1::TASK_DONE);
  }
  for (auto& [id, message] : again) {
    auto r = after.on_node_message(id, heartbeat(), 10);
    ASSERT_TRUE(r.at(0).message.has_re_register());
    after.on_node_message(id, message, 10);
  }
  EXPECT_EQ(after.nodes().size(), 4u);
  ASSERT_EQ(after.plans().size(), 1u);
  const v1::Plan& rebuilt = after.plans().at(reply.plan().id()).plan;
  EXPECT_TRUE(rebuilt.rebuilt());
  EXPECT_EQ(rebuilt.model(), "llama");
  EXPECT_EQ(rebuilt.stages(), reply.plan().stages());
  ASSERT_EQ(rebuilt.placement_size(), reply.plan().placement_size());
  for (int i = 0; i < rebuilt.placement_size(); ++i) {
    EXPECT_EQ(rebuilt.placement(i).stage(), static_cast<std::uint32_t>(i));
    EXPECT_EQ(rebuilt.placement(i).node_id(), reply.plan().placement(i).node_id());
    EXPECT_EQ(rebuilt.placement(i).fetch_state(), v1::TASK_DONE);
  }
  // The model is deployed again: a new cold start works without a frontend re-deploying.
  std::vector<Outbound> more;
  EXPECT_TRUE(after.on_frontend_request(cold_start("llama"), 11, more).error().empty());
}

TEST(ClusterState, StateListsNodesModelsAndPlans) {
  ClusterState state = cluster_of(2);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  state.on_frontend_request(cold_start("m"), 0, out);
  v1::FrontendRequest query;
  query.mutable_state();
  auto reply = state.on_frontend_request(query, 2, out);
  ASSERT_TRUE(reply.has_state());
  EXPECT_EQ(reply.state().nodes_size(), 2);
  EXPECT_DOUBLE_EQ(reply.state().nodes(0).seconds_since_heard(), 2);
  EXPECT_EQ(reply.state().models_size(), 1);
  EXPECT_EQ(reply.state().plans_size(), 1);
}

// Eq. 3 on a node's link: a node whose running fetches would miss the TTFT SLO if it shared
// its link with one more worker is left out of the snapshot.
TEST(ClusterState, ANodeWhoseLinkIsFullIsLeftOut) {
  ClusterState state(config());
  state.on_node_message("busy", registration("busy", 20 * GiB, 1e9), 0);
  v1::NodeMessage progress;
  v1::Task* task = progress.mutable_progress()->mutable_task();
  task->set_id("x/0/fetch");
  task->set_plan_id("x");
  task->set_kind(v1::TASK_FETCH);
  task->mutable_model()->set_name("other");
  task->mutable_model()->set_size_bytes(9 * GiB);
  task->set_stages(1);
  progress.mutable_progress()->set_state(v1::TASK_RUNNING);
  progress.mutable_progress()->set_bytes_total(9 * GiB);
  state.on_node_message("busy", progress, 0);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 10), 0, out);
  // 9 GiB pending at 1 GB/s alone takes 9.7 s; shared with a second worker 19 s > 10 s.
  auto reply = state.on_frontend_request(cold_start("m"), 0, out);
  EXPECT_NE(reply.error().find("no live node"), std::string::npos) << reply.DebugString();
  state.on_node_message("free", registration("free", 20 * GiB, 1e9), 0);
  reply = state.on_frontend_request(cold_start("m"), 0, out);
  ASSERT_TRUE(reply.error().empty());
  EXPECT_EQ(reply.plan().placement(0).node_id(), "free");
}

// Eq. 3 with the shaped share: a node that shapes guarantees its cold starts' fetches only
// the critical class's B_c = B less the reserves (inference 10 %, background 2 %, other 5 %:
// 83 % of B), so a plan that fits the whole link there but not B_c is refused, or goes to a
// node that does not shape.
TEST(ClusterState, OnAShapingNodeEq3CountsOnlyTheCriticalClassesShare) {
  // One node of 1 GB/s, fetching 4.2e9 bytes for another cold start. A newcomer (1 GiB, TTFT
  // SLO 10 s) would halve its share: 0.5 GB/s × 10 s = 5e9 ≥ 4.2e9 on the whole link, but
  // 0.415 GB/s × 10 s = 4.15e9 < 4.2e9 on the shaped share.
  auto busy_node = [](ClusterState& state, const std::string& id, bool shapes) {
    v1::NodeMessage r = registration(id, 20 * GiB, 1e9);
    r.mutable_register_()->set_shapes_traffic(shapes);
    state.on_node_message(id, r, 0);
    v1::NodeMessage progress;
    v1::Task* task = progress.mutable_progress()->mutable_task();
    task->set_id("x-" + id + "/0/fetch");
    task->set_plan_id("x-" + id);
    task->set_kind(v1::TASK_FETCH);
    task->mutable_model()->set_name("other");
    task->mutable_model()->set_size_bytes(4'200'000'000);
    task->set_stages(1);
    progress.mutable_progress()->set_state(v1::TASK_RUNNING);
    progress.mutable_progress()->set_bytes_total(4'200'000'000);
    state.on_node_message(id, progress, 0);
  };
  auto place = [](ClusterState& state) {
    std::vector<Outbound> out;
    state.on_frontend_request(deploy("m", GiB, 10), 0, out);
    return state.on_frontend_request(cold_start("m"), 0, out);
  };
  {
    ClusterState state(config());
    busy_node(state, "plain", false);
    auto reply = place(state);
    ASSERT_TRUE(reply.error().empty()) << reply.DebugString();
    EXPECT_EQ(reply.plan().placement(0).node_id(), "plain");
  }
  {
    ClusterState state(config());
    busy_node(state, "shaper", true);
    auto reply = place(state);
    EXPECT_NE(reply.error().find("no live node"), std::string::npos) << reply.DebugString();
  }
  {
    ClusterState state(config());
    busy_node(state, "a-shaper", true);  // first in Alg. 1's order of equals
    busy_node(state, "b-plain", false);
    auto reply = place(state);
    ASSERT_TRUE(reply.error().empty()) << reply.DebugString();
    for (const v1::PlannedStage& s : reply.plan().placement()) EXPECT_EQ(s.node_id(), "b-plain");
  }
  {
    // The reserves are the coordinator's (the ClassRates it sends): smaller ones leave the
    // cold starts enough (B_c = 0.9 GB/s: 0.45 GB/s × 10 s = 4.5e9 ≥ 4.2e9).
    ClusterConfig c = config();
    c.class_reserve = {0.05, 0.02, 0.03};
    ClusterState state(c);
    busy_node(state, "shaper", true);
    auto reply = place(state);
    ASSERT_TRUE(reply.error().empty()) << reply.DebugString();
    EXPECT_EQ(reply.plan().placement(0).node_id(), "shaper");
  }
}

// Scale-down (HydraServe §6): once stage 0's full-memory worker has fetched the rest of the
// model, the plan's node holds the whole model — and nothing is stopped for that alone: with
// workers launched the other stages may carry requests (consolidation_test.cpp walks the
// phases that end in stopping them).
TEST(ClusterState, TheConsolidatingFetchsEndStopsNoWorker) {
  for (bool launch : {false, true}) {
    SCOPED_TRACE(launch);
    ClusterConfig c = config();
    c.launch_workers = launch;
    ClusterState state(c);
    for (int i = 0; i < 4; ++i) {
      const std::string id = "n" + std::to_string(i);
      state.on_node_message(id, registration(id, 20 * GiB), 0);
    }
    std::vector<Outbound> out;
    // A 6 s TTFT SLO needs a pipeline; a TPOT SLO of 50 ms (t_d = 30 ms) needs a full-memory
    // worker in it: s = 2, w = 0 decodes at t_d·2 = 60 ms, w = 1 at t_d·1.5 = 45 ms (Eq. 2).
    v1::FrontendRequest request = deploy("llama", 13 * GiB, 6);
    request.mutable_deploy()->mutable_model()->set_slo_tpot_s(0.05);
    state.on_frontend_request(request, 0, out);
    auto reply = state.on_frontend_request(cold_start("llama"), 0, out);
    ASSERT_TRUE(reply.error().empty()) << reply.error();
    const v1::Plan& plan = reply.plan();
    ASSERT_GE(plan.stages(), 2u);
    std::optional<Outbound> consolidating;
    for (const Outbound& t : tasks_in(out)) {
      if (t.message.task().consolidate()) consolidating = t;
    }
    ASSERT_TRUE(plan.placement(0).full_memory()) << plan.DebugString();
    ASSERT_TRUE(consolidating.has_value());
    EXPECT_EQ(consolidating->message.task().stage(), 0u);
    v1::NodeMessage done;
    *done.mutable_progress()->mutable_task() = consolidating->message.task();
    done.mutable_progress()->set_state(v1::TASK_DONE);
    auto after = state.on_node_message(consolidating->node_id, done, 1);
    // Without workers the plan is consolidated (the node has the model); with them it waits
    // for its pipeline to serve and hand over.
    EXPECT_EQ(state.plans().at(plan.id()).plan.consolidated(), !launch);
    for (const Outbound& t : tasks_in(after)) {
      EXPECT_NE(t.message.task().kind(), v1::TASK_STOP_WORKER) << t.message.DebugString();
    }
  }
}

// ---- WarmServe: load windows and prewarm rounds -------------------------------------------

// Nodes "w0".."w<n-1>", each with two 24 GiB GPUs of which `free` is free.
ClusterState warm_cluster(int n, std::uint64_t free, double window_s = 10) {
  ClusterConfig c = config();
  c.window_s = window_s;
  c.batch_size = 32;
  c.liveness = 1000;  // these tests are about windows, not deaths
  ClusterState state(c);
  for (int i = 0; i < n; ++i) {
    const std::string id = "w" + std::to_string(i);
    v1::NodeMessage m = registration(id, free);
    v1::GpuInfo* g = m.mutable_register_()->add_gpus();
    g->set_index(1);
    g->set_memory_bytes(24 * GiB);
    g->set_free_bytes(free);
    state.on_node_message(id, m, 0);
  }
  return state;
}

v1::FrontendRequest load(const std::string& model, double concurrent, std::uint32_t instances) {
  v1::FrontendRequest r;
  r.mutable_load()->set_model(model);
  r.mutable_load()->set_concurrent_requests(concurrent);
  r.mutable_load()->set_active_instances(instances);
  return r;
}

std::vector<Outbound> prewarm_tasks(const std::vector<Outbound>& out) {
  std::vector<Outbound> tasks;
  for (const Outbound& t : tasks_in(out)) {
    if (t.message.task().kind() == v1::TASK_PREWARM) tasks.push_back(t);
  }
  return tasks;
}

TEST(ClusterStateWarmServe, LoadReportsAreAveragedAndPeakedPerWindow) {
  ClusterState state = warm_cluster(1, 20 * GiB);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  state.tick(0);
  for (double c : {10.0, 30.0, 20.0}) state.on_frontend_request(load("m", c, 1), 1, out);
  state.tick(10.5);  // window 0 closes
  const ModelLoad& l = state.loads().at("m");
  ASSERT_EQ(l.average.size(), 1u);
  EXPECT_DOUBLE_EQ(l.average[0], 20);
  EXPECT_DOUBLE_EQ(l.peak[0], 30);
  // A window without reports repeats the last one.
  state.tick(20.5);
  ASSERT_EQ(l.average.size(), 2u);
  EXPECT_DOUBLE_EQ(l.average[1], 20);
  EXPECT_EQ(state.prewarm_rounds(), 2u);
}

// 100 concurrent requests with one instance at batch 32: N_basic = ⌈100/32⌉ − 1 = 3 replicas,
// on three different GPUs (never two of one model on a GPU).
TEST(ClusterStateWarmServe, AWindowsEndPrewarmsTheReplicasTheLoadNeeds) {
  ClusterState state = warm_cluster(2, 20 * GiB);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("org/m", GiB, 0), 0, out);
  state.tick(0);
  state.on_frontend_request(load("org/m", 100, 1), 1, out);
  EXPECT_TRUE(prewarm_tasks(state.tick(5)).empty());  // the window is still open
  auto tasks = prewarm_tasks(state.tick(10.5));
  ASSERT_EQ(tasks.size(), 3u);
  std::set<std::pair<std::string, std::uint32_t>> gpus;
  for (const Outbound& t : tasks) {
    EXPECT_EQ(t.message.task().model().name(), "org/m");
    EXPECT_EQ(t.message.task().stages(), 1u);
    EXPECT_TRUE(t.message.task().plan_id().starts_with("warm-"));
    gpus.insert({t.node_id, t.message.task().gpu()});
  }
  EXPECT_EQ(gpus.size(), 3u);
  EXPECT_EQ(state.loads().at("org/m").replicas_wanted, 3u);
}

// Replicas already prewarmed (slots the nodes report, under the cache key) or being prewarmed
// (running tasks) are not placed again.
TEST(ClusterStateWarmServe, ExistingSlotsAndRunningPrewarmsCount) {
  ClusterState state = warm_cluster(2, 20 * GiB);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("org/m", GiB, 0), 0, out);
  state.tick(0);
  state.on_frontend_request(load("org/m", 100, 1), 1, out);
  auto first = prewarm_tasks(state.tick(10.5));
  ASSERT_EQ(first.size(), 3u);
  // The first is running on its node; the second's slot is reported by a heartbeat.
  v1::NodeMessage progress;
  *progress.mutable_progress()->mutable_task() = first[0].message.task();
  progress.mutable_progress()->set_state(v1::TASK_RUNNING);
  state.on_node_message(first[0].node_id, progress, 11);
  v1::NodeMessage beat = heartbeat();
  beat.mutable_heartbeat()->set_resources_changed(true);
  *beat.mutable_heartbeat()->mutable_gpus() = state.nodes().at(first[1].node_id).report.gpus();
  v1::SlotInfo* slot = beat.mutable_heartbeat()->add_slots();
  slot->set_id("g0s0");
  slot->set_gpu(first[1].message.task().gpu());
  slot->set_model("org--m");
  slot->set_state("prewarmed");
  state.on_node_message(first[1].node_id, beat, 11);
  EXPECT_EQ(state.nodes().at(first[1].node_id).report.slots_size(), 1);
  // Same load next window: only the third (never acknowledged) is placed again.
  state.on_frontend_request(load("org/m", 100, 1), 12, out);
  auto second = prewarm_tasks(state.tick(20.5));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_FALSE(second[0].node_id == first[0].node_id &&
               second[0].message.task().gpu() == first[0].message.task().gpu());
  EXPECT_FALSE(second[0].node_id == first[1].node_id &&
               second[0].message.task().gpu() == first[1].message.task().gpu());
}

TEST(ClusterStateWarmServe, EnoughInstancesMeanNoPrewarm) {
  ClusterState state = warm_cluster(2, 20 * GiB);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  state.tick(0);
  state.on_frontend_request(load("m", 60, 2), 1, out);  // ⌈60/32⌉ = 2 = K
  EXPECT_TRUE(prewarm_tasks(state.tick(10.5)).empty());
  EXPECT_EQ(state.loads().at("m").replicas_wanted, 0u);
}

TEST(ClusterStateWarmServe, AGpuWithoutRoomGetsNoReplica) {
  ClusterState state = warm_cluster(1, GiB / 2);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  state.tick(0);
  state.on_frontend_request(load("m", 100, 0), 1, out);
  EXPECT_TRUE(prewarm_tasks(state.tick(10.5)).empty());
}

TEST(ClusterStateWarmServe, StateShowsLoadsAndPredictions) {
  ClusterState state = warm_cluster(1, 20 * GiB);
  std::vector<Outbound> out;
  state.on_frontend_request(deploy("m", GiB, 0), 0, out);
  state.tick(0);
  state.on_frontend_request(load("m", 40, 1), 1, out);
  state.tick(10.5);
  const v1::ClusterState snapshot = state.snapshot(11);
  ASSERT_EQ(snapshot.loads_size(), 1);
  EXPECT_EQ(snapshot.loads(0).windows(), 1u);
  EXPECT_DOUBLE_EQ(snapshot.loads(0).last_average(), 40);
  EXPECT_DOUBLE_EQ(snapshot.loads(0).predicted_average(), 40);  // < a day: the last window
  EXPECT_EQ(snapshot.loads(0).replicas_wanted(), 1u);
  EXPECT_DOUBLE_EQ(snapshot.window_s(), 10);
}

TEST(ClusterState, HeartbeatResourcesReplaceTheReportedGpusAndSlots) {
  ClusterState state = cluster_of(1);
  v1::NodeMessage beat = heartbeat();
  beat.mutable_heartbeat()->set_resources_changed(true);
  v1::GpuInfo* g = beat.mutable_heartbeat()->add_gpus();
  g->set_index(0);
  g->set_memory_bytes(24 * GiB);
  g->set_free_bytes(GiB);
  state.on_node_message("n0", beat, 1);
  EXPECT_EQ(state.nodes().at("n0").report.gpus(0).free_bytes(), GiB);
  // A plain heartbeat changes nothing.
  state.on_node_message("n0", heartbeat(), 2);
  EXPECT_EQ(state.nodes().at("n0").report.gpus_size(), 1);
  EXPECT_EQ(state.nodes().at("n0").report.gpus(0).free_bytes(), GiB);
}

}  // namespace
}  // namespace thaw::coordinator
