// A plan's workers through HydraServe §6 in ClusterState, without sockets or clocks: wiring
// (peers, layers, ports), readiness, routes, scale-down with drain or KV migration, scale-up,
// the restart mid-consolidation, the §6.1 sliding window and measured start-up costs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "coordinator/cluster/cluster_state.hpp"

namespace thaw::coordinator {
namespace {

constexpr std::uint64_t GiB = 1ull << 30;

v1::NodeMessage registration(const std::string& node) {
  v1::NodeMessage m;
  v1::Register* r = m.mutable_register_();
  r->set_node_id(node);
  r->set_network_bytes_per_s(2e9);
  r->set_worker_host("10.0.0." + node.substr(1));
  v1::GpuInfo* g = r->add_gpus();
  g->set_index(0);
  g->set_memory_bytes(24 * GiB);
  g->set_free_bytes(20 * GiB);
  g->set_pcie_bytes_per_s(16e9);
  return m;
}

ClusterConfig config() {
  ClusterConfig c;
  c.startup.container = 0.5;
  c.startup.cuda_context = 0.5;
  c.startup.library_load = 1;
  c.plan_prefix = "t";
  c.launch_workers = true;
  c.worker_port_base = 30000;
  c.liveness = 1000;
  return c;
}

std::vector<v1::Task> tasks_of(const std::vector<Outbound>& out, v1::TaskKind kind,
                               std::vector<std::string>* nodes = nullptr) {
  std::vector<v1::Task> tasks;
  for (const Outbound& o : out) {
    if (o.message.body_case() == v1::CoordinatorMessage::kTask && o.message.task().kind() == kind) {
      tasks.push_back(o.message.task());
      if (nodes != nullptr) nodes->push_back(o.node_id);
    }
  }
  return tasks;
}

// Four nodes n0..n3 (worker hosts 10.0.0.0..3) and a model whose SLOs need a two-stage
// pipeline: TTFT 6 s; TPOT 50 ms gives (2, 1), 35 ms (2, 2) (t_d 30 ms, Eq. 2).
struct Harness {
  explicit Harness(ClusterConfig c = config(), double slo_tpot = 0.05) : state(c) {
    for (int i = 0; i < 4; ++i) {
      const std::string id = "n" + std::to_string(i);
      state.on_node_message(id, registration(id), 0);
    }
    v1::FrontendRequest d;
    v1::ModelSpec* m = d.mutable_deploy()->mutable_model();
    m->set_name("llama");
    m->set_size_bytes(13 * GiB);
    m->set_layers(32);
    m->set_slo_ttft_s(6);
    m->set_slo_tpot_s(slo_tpot);
    m->set_prefill_s(0.2);
    m->set_decode_s(0.03);
    std::vector<Outbound> out;
    state.on_frontend_request(d, 0, out);
  }

  v1::Plan cold_start() {
    v1::FrontendRequest r;
    r.mutable_cold_start()->set_model("llama");
    sent.clear();
    auto reply = state.on_frontend_request(r, 0, sent);
    EXPECT_TRUE(reply.error().empty()) << reply.error();
    plan_id = reply.plan().id();
    for (const Outbound& o : sent) {
      if (o.message.body_case() == v1::CoordinatorMessage::kTask) {
        held[o.node_id][o.message.task().id()].mutable_task()->CopyFrom(o.message.task());
        held[o.node_id][o.message.task().id()].set_state(v1::TASK_RUNNING);
      }
    }
    return reply.plan();
  }

  // A node reports a task's new state (and keeps it, for a later registration).
  std::vector<Outbound> report(const std::string& node, const v1::Task& task, v1::TaskState st,
                               bool ready = false, double now = 1) {
    v1::NodeMessage m;
    v1::TaskStatus* s = m.mutable_progress();
    *s->mutable_task() = task;
    s->set_state(st);
    s->set_worker_ready(ready);
    held[node][task.id()] = *s;
    auto out = state.on_node_message(node, m, now);
    for (const Outbound& o : out) {
      if (o.message.body_case() == v1::CoordinatorMessage::kTask) {
        held[o.node_id][o.message.task().id()].mutable_task()->CopyFrom(o.message.task());
        held[o.node_id][o.message.task().id()].set_state(v1::TASK_RUNNING);
      }
    }
    return out;
  }

  const v1::Plan& plan() const { return state.plans().at(plan_id).plan; }
  const v1::Task* task(const std::string& id, std::string* node = nullptr) const {
    for (const auto& [n, tasks] : held) {
      auto it = tasks.find(id);
      if (it == tasks.end()) continue;
      if (node != nullptr) *node = n;
      return &it->second.task();
    }
    return nullptr;
  }
  std::string node_of(std::uint32_t stage) const { return plan().placement(stage).node_id(); }

  // Drives the plan to the hand-over: stage 0 ready, the consolidating fetch done, the
  // standalone worker ready. Returns what the last step sent.
  std::vector<Outbound> to_handover() {
    report(node_of(0), *task(plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
    for (std::uint32_t k = 1; k < plan().stages(); ++k) {
      report(node_of(k), *task(plan_id + "/" + std::to_string(k) + "/launch-worker"),
             v1::TASK_RUNNING);
    }
    report(node_of(0), *task(plan_id + "/0/fetch"), v1::TASK_DONE);
    return report(node_of(0), *task(plan_id + "/0/launch-standalone"), v1::TASK_RUNNING, true, 2);
  }

  ClusterState state;
  std::vector<Outbound> sent;
  std::string plan_id;
  std::map<std::string, std::map<std::string, v1::TaskStatus>> held;  // node → id → status
};

TEST(Consolidation, EachStageIsLaunchedWiredToItsPeersWithItsLayers) {
  Harness h;
  const v1::Plan plan = h.cold_start();
  ASSERT_EQ(plan.stages(), 2u);
  std::vector<std::string> nodes;
  const auto launches = tasks_of(h.sent, v1::TASK_LAUNCH_WORKER, &nodes);
  ASSERT_EQ(launches.size(), 2u);
  std::set<std::string> peers;
  for (std::size_t i = 0; i < launches.size(); ++i) {
    const v1::Task& t = launches[i];
    SCOPED_TRACE(t.DebugString());
    EXPECT_EQ(nodes[i], plan.placement(static_cast<int>(t.stage())).node_id());
    ASSERT_EQ(t.peers_size(), 2);
    for (std::uint32_t k = 0; k < 2; ++k) {
      const v1::PlannedStage& s = plan.placement(static_cast<int>(k));
      EXPECT_EQ(t.peers(static_cast<int>(k)),
                "10.0.0." + s.node_id().substr(1) + ":" + std::to_string(s.pipeline_port()));
    }
    EXPECT_EQ(t.layer_begin(), t.stage() == 0 ? 0u : 16u);
    EXPECT_EQ(t.layer_end(), t.stage() == 0 ? 16u : 32u);
    EXPECT_NE(t.http_port(), 0u) << "every stage answers /health (and /kv)";
    EXPECT_FALSE(t.standalone());
    peers.insert(t.peers().begin(), t.peers().end());
  }
  EXPECT_EQ(peers.size(), 2u);
  std::set<std::uint32_t> ports = {plan.placement(0).pipeline_port(),
                                   plan.placement(1).pipeline_port(), plan.placement(0).http_port(),
                                   plan.placement(1).http_port()};
  EXPECT_EQ(ports.size(), 4u) << "every port the plan uses is its own";
  for (std::uint32_t p : ports) EXPECT_GE(p, 30000u);
  // Cold-starting: the gateway holds requests for it; no URL yet.
  EXPECT_EQ(plan.phase(), v1::PHASE_COLD_STARTING);
  EXPECT_EQ(plan.placement(0).route_state(), v1::WORKER_COLD_STARTING);
  EXPECT_EQ(plan.placement(0).worker_url(), "");
  // A second plan gets other ports.
  const v1::Plan second = h.cold_start();
  EXPECT_NE(second.placement(0).http_port(), plan.placement(0).http_port());
}

TEST(Consolidation, AStageWhoseEngineExitsDuringTheColdStartIsRelaunchedOnceThenThePlanFails) {
  ClusterConfig c = config();
  c.failed_cold_start_backoff_s = 10;
  Harness h(c);
  h.cold_start();
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING);
  auto out = h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_FAILED);
  // Once: every stage launched again wired to new ports (generation 1); the exited stage's
  // old worker is gone, the other's is told to stop.
  EXPECT_EQ(h.plan().phase(), v1::PHASE_COLD_STARTING);
  EXPECT_NE(h.plan().phase_error().find("stage 1 on " + h.node_of(1)), std::string::npos)
      << h.plan().phase_error();
  EXPECT_NE(h.plan().phase_error().find("launched again (generation 1)"), std::string::npos);
  const auto launched = tasks_of(out, v1::TASK_LAUNCH_WORKER);
  ASSERT_EQ(launched.size(), 2u);
  for (const v1::Task& t : launched) EXPECT_EQ(t.generation(), 1u);
  const auto stops = tasks_of(out, v1::TASK_STOP_WORKER);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stage(), 0u);
  EXPECT_EQ(stops[0].generation(), 0u);
  EXPECT_EQ(h.plan().placement(0).route_state(), v1::WORKER_COLD_STARTING) << "still held";
  // The old generation's exit, reported late, changes nothing.
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_DONE);
  EXPECT_FALSE(h.state.plans().at(h.plan_id).failed);

  // Twice: the cold start fails. Stage 0's new worker is stopped, the plan gives no route and
  // is dropped at the next tick, and the model's next cold start is refused with the reason.
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker-g1"), v1::TASK_RUNNING);
  out =
      h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker-g1"), v1::TASK_FAILED, false, 2);
  ASSERT_TRUE(h.state.plans().contains(h.plan_id));
  EXPECT_TRUE(h.state.plans().at(h.plan_id).failed);
  EXPECT_NE(h.plan().phase_error().find("failed"), std::string::npos) << h.plan().phase_error();
  EXPECT_TRUE(tasks_of(out, v1::TASK_LAUNCH_WORKER).empty()) << "not a third time";
  const auto stopped = tasks_of(out, v1::TASK_STOP_WORKER);
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].stage(), 0u);
  EXPECT_EQ(stopped[0].generation(), 1u);
  const std::string exited_on = h.node_of(1);
  h.state.tick(3);
  EXPECT_FALSE(h.state.plans().contains(h.plan_id));
  v1::FrontendRequest again;
  again.mutable_cold_start()->set_model("llama");
  std::vector<Outbound> sent;
  auto reply = h.state.on_frontend_request(again, 4, sent);
  EXPECT_NE(reply.error().find("stage 1 on " + exited_on), std::string::npos) << reply.error();
  EXPECT_TRUE(sent.empty());
  EXPECT_TRUE(h.state.plans().empty());
  // After the back-off a cold start is tried again.
  reply = h.state.on_frontend_request(again, 12.5, sent);
  EXPECT_TRUE(reply.error().empty()) << reply.error();
  EXPECT_EQ(h.state.plans().size(), 1u);
}

TEST(Consolidation, StageZeroServesOnceItsHealthAnswers) {
  Harness h;
  h.cold_start();
  h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_RUNNING);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_COLD_STARTING) << "a later stage has no health endpoint";
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  const v1::Plan& p = h.plan();
  EXPECT_EQ(p.phase(), v1::PHASE_PIPELINED);
  EXPECT_EQ(p.placement(0).route_state(), v1::WORKER_SERVING);
  EXPECT_EQ(p.placement(0).worker_url(), "http://10.0.0." + h.node_of(0).substr(1) + ":" +
                                             std::to_string(p.placement(0).http_port()));
  EXPECT_EQ(p.placement(1).route_state(), v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_TRUE(p.placement(0).worker_ready());
}

TEST(Consolidation, ScaleDownLoadsAStandaloneWorkerDrainsThePipelineThenStopsIt) {
  Harness h;
  h.cold_start();
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_RUNNING);
  // The whole model is on stage 0's node: a standalone worker starts there, nothing stops.
  auto out = h.report(h.node_of(0), *h.task(h.plan_id + "/0/fetch"), v1::TASK_DONE);
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
  std::vector<std::string> nodes;
  const auto standalone = tasks_of(out, v1::TASK_LAUNCH_WORKER, &nodes);
  ASSERT_EQ(standalone.size(), 1u);
  EXPECT_TRUE(standalone[0].standalone());
  EXPECT_EQ(standalone[0].stage(), 0u);
  EXPECT_EQ(nodes[0], h.node_of(0));
  EXPECT_EQ(standalone[0].peers_size(), 0);
  EXPECT_NE(standalone[0].http_port(), h.plan().placement(0).http_port());
  EXPECT_EQ(h.plan().phase(), v1::PHASE_LOADING);
  EXPECT_EQ(h.plan().placement(0).route_state(), v1::WORKER_SERVING) << "the pipeline serves on";
  EXPECT_EQ(h.plan().placement(0).standalone_route(), v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_FALSE(h.plan().consolidated());

  // It is ready: new requests go to it, the pipeline drains.
  out = h.report(h.node_of(0), standalone[0], v1::TASK_RUNNING, true, 2);
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
  const v1::Plan& p = h.plan();
  EXPECT_EQ(p.phase(), v1::PHASE_HANDOVER);
  EXPECT_EQ(p.handover(), "drain");
  EXPECT_EQ(p.placement(0).route_state(), v1::WORKER_DRAINING);
  EXPECT_EQ(p.placement(0).standalone_route(), v1::WORKER_SERVING);
  EXPECT_EQ(p.placement(0).standalone_url(), "http://10.0.0." + h.node_of(0).substr(1) + ":" +
                                                 std::to_string(standalone[0].http_port()));
  const std::string pipeline_url = p.placement(0).worker_url();
  // The server asks the engine to drain too (where it can say when it is done).
  const auto orders = h.state.take_migrations();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_TRUE(orders[0].drain);
  EXPECT_EQ(orders[0].from_url, pipeline_url);

  // Requests still on the pipeline: nothing stops. A count from before the switch (t = 1.5)
  // does not count as drained.
  out.clear();
  h.state.on_worker_in_flight(pipeline_url, 0, 1.5, out);
  h.state.on_worker_in_flight(pipeline_url, 2, 3, out);
  h.state.on_worker_in_flight("http://10.0.0.9:1", 0, 3, out);  // another worker's
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
  EXPECT_EQ(h.plan().phase(), v1::PHASE_HANDOVER);
  EXPECT_EQ(h.plan().in_flight(), 2u);

  // Drained: every pipeline worker (stage 0's too) is told to stop; the standalone one is not.
  h.state.on_worker_in_flight(pipeline_url, 0, 4, out);
  std::vector<std::string> stopped_on;
  const auto stops = tasks_of(out, v1::TASK_STOP_WORKER, &stopped_on);
  ASSERT_EQ(stops.size(), 2u);
  std::set<std::uint32_t> stages;
  for (const v1::Task& t : stops) {
    EXPECT_FALSE(t.standalone());
    stages.insert(t.stage());
  }
  EXPECT_EQ(stages, (std::set<std::uint32_t>{0, 1}));
  EXPECT_EQ(h.plan().phase(), v1::PHASE_STOPPING);
  EXPECT_EQ(h.plan().placement(0).route_state(), v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_EQ(h.plan().placement(0).standalone_route(), v1::WORKER_SERVING);

  // Consolidated once both pipeline workers have exited.
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_DONE, false, 5);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_STOPPING);
  h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_DONE, false, 5);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_CONSOLIDATED);
  EXPECT_TRUE(h.plan().consolidated());
  EXPECT_EQ(h.plan().placement(0).standalone_route(), v1::WORKER_SERVING);
}

TEST(Consolidation, KvTransferMigratesThenStopsAndAFailedMigrationDrainsInstead) {
  for (bool migration_ok : {true, false}) {
    SCOPED_TRACE(migration_ok);
    ClusterConfig c = config();
    c.handover = ClusterConfig::Handover::kv_transfer;
    Harness h(c);
    h.cold_start();
    h.to_handover();
    EXPECT_EQ(h.plan().phase(), v1::PHASE_HANDOVER);
    EXPECT_EQ(h.plan().handover(), "kv-transfer");
    auto orders = h.state.take_migrations();
    ASSERT_EQ(orders.size(), 1u);
    EXPECT_EQ(orders[0].plan_id, h.plan_id);
    EXPECT_EQ(orders[0].from_url, h.plan().placement(0).worker_url());
    EXPECT_EQ(orders[0].to_url, h.plan().placement(0).standalone_url());
    ASSERT_EQ(orders[0].stage_urls.size(), 2u);
    EXPECT_EQ(orders[0].stage_urls[0], orders[0].from_url);
    EXPECT_FALSE(orders[0].drain);
    EXPECT_TRUE(h.state.take_migrations().empty()) << "each order is handed out once";
    // Requests on the pipeline: the engines' answer ends the migration.
    std::vector<Outbound> out;
    h.state.on_worker_in_flight(orders[0].from_url, 1, 3, out);
    EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
    h.state.on_migration_result(h.plan_id, migration_ok, "stage 1 crashed", 4, out);
    if (migration_ok) {
      EXPECT_EQ(tasks_of(out, v1::TASK_STOP_WORKER).size(), 2u);
      EXPECT_EQ(h.plan().phase(), v1::PHASE_STOPPING);
    } else {
      EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
      EXPECT_EQ(h.plan().handover(), "drain");
      EXPECT_NE(h.plan().phase_error().find("stage 1 crashed"), std::string::npos);
      // The engine is asked to drain: nothing else says when the requests have finished.
      const auto drains = h.state.take_migrations();
      ASSERT_EQ(drains.size(), 1u);
      EXPECT_TRUE(drains[0].drain);
      EXPECT_EQ(drains[0].from_url, orders[0].from_url);
      h.state.on_worker_in_flight(orders[0].from_url, 0, 5, out);
      EXPECT_EQ(tasks_of(out, v1::TASK_STOP_WORKER).size(), 2u);
    }
  }
}

TEST(Consolidation, AnEngineThatSaysItDrainedEndsTheHandOver) {
  Harness h;
  h.cold_start();
  h.to_handover();
  ASSERT_EQ(h.state.take_migrations().size(), 1u);
  std::vector<Outbound> out;
  h.state.on_migration_result(h.plan_id, false, "404 /drain", 3, out);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_HANDOVER) << "no answer from the engine: counts decide";
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
  h.state.on_migration_result(h.plan_id, true, "", 4, out);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_STOPPING);
  EXPECT_EQ(tasks_of(out, v1::TASK_STOP_WORKER).size(), 2u);
}

TEST(Consolidation, AStandaloneWorkerThatDiesLeavesThePipelineServing) {
  Harness h;
  h.cold_start();
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/fetch"), v1::TASK_DONE);
  auto out =
      h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-standalone"), v1::TASK_FAILED, false);
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty());
  EXPECT_EQ(h.plan().phase(), v1::PHASE_LOADING);
  EXPECT_EQ(h.plan().placement(0).route_state(), v1::WORKER_SERVING);
  EXPECT_NE(h.plan().phase_error().find("exited"), std::string::npos);
}

TEST(Consolidation, ScaleUpTurnsEveryFullMemoryStageIntoAWorkerAndStopsNoneOfThem) {
  Harness h(config(), 0.035);  // (2, 2): both stages full-memory
  h.cold_start();
  ASSERT_EQ(h.plan().stages(), 2u);
  ASSERT_TRUE(h.plan().placement(0).full_memory() && h.plan().placement(1).full_memory());
  // A burst: 14 requests in flight, batch 8 → two workers wanted.
  std::vector<Outbound> out;
  h.state.on_gateway_demand("llama", {.queue_length = 0, .concurrent_requests = 14}, 0.5, out);
  EXPECT_TRUE(h.plan().scale_up());
  out = h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_RUNNING);
  EXPECT_TRUE(tasks_of(out, v1::TASK_FETCH).empty()) << "not before the pipeline serves";
  out = h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  // Stage 1's node fetches the rest of the model too.
  std::vector<std::string> nodes;
  const auto fetches = tasks_of(out, v1::TASK_FETCH, &nodes);
  ASSERT_EQ(fetches.size(), 1u);
  EXPECT_EQ(fetches[0].stage(), 1u);
  EXPECT_TRUE(fetches[0].consolidate());
  EXPECT_EQ(nodes[0], h.node_of(1));
  out = h.report(h.node_of(0), *h.task(h.plan_id + "/0/fetch"), v1::TASK_DONE);
  EXPECT_TRUE(tasks_of(out, v1::TASK_LAUNCH_WORKER).empty()) << "waits for both";
  out = h.report(h.node_of(1), fetches[0], v1::TASK_DONE);
  const auto launched = tasks_of(out, v1::TASK_LAUNCH_WORKER);
  ASSERT_EQ(launched.size(), 2u);
  for (const v1::Task& t : launched) EXPECT_TRUE(t.standalone());
  h.report(h.node_of(0), launched[0], v1::TASK_RUNNING, true, 2);
  h.report(h.node_of(1), launched[1], v1::TASK_RUNNING, true, 2);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_HANDOVER);
  EXPECT_EQ(h.plan().placement(0).standalone_route(), v1::WORKER_SERVING);
  EXPECT_EQ(h.plan().placement(1).standalone_route(), v1::WORKER_SERVING);
  h.state.on_worker_in_flight(h.plan().placement(0).worker_url(), 0, 3, out);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_STOPPING);
}

TEST(Consolidation, ARestartedCoordinatorResumesTheHandOverFromTheNodesReports) {
  Harness h;
  h.cold_start();
  h.to_handover();
  ASSERT_EQ(h.plan().phase(), v1::PHASE_HANDOVER);
  const v1::Plan before = h.plan();

  // A new coordinator: the nodes register with every task they hold.
  ClusterState restarted(config());
  std::vector<Outbound> out;
  for (const auto& [node, tasks] : h.held) {
    v1::NodeMessage m = registration(node);
    for (const auto& [id, status] : tasks) *m.mutable_register_()->add_tasks() = status;
    auto sent = restarted.on_node_message(node, m, 10);
    out.insert(out.end(), sent.begin(), sent.end());
  }
  for (int i = 0; i < 4; ++i) {
    const std::string id = "n" + std::to_string(i);
    if (!h.held.contains(id)) restarted.on_node_message(id, registration(id), 10);
  }
  const v1::Plan& p = restarted.plans().at(h.plan_id).plan;
  EXPECT_TRUE(p.rebuilt());
  EXPECT_EQ(p.phase(), v1::PHASE_HANDOVER);
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty()) << "in-flight unknown: no stop yet";
  EXPECT_TRUE(tasks_of(out, v1::TASK_LAUNCH_WORKER).empty()) << "nothing launched twice";
  EXPECT_EQ(p.placement(0).worker_url(), before.placement(0).worker_url());
  EXPECT_EQ(p.placement(0).standalone_url(), before.placement(0).standalone_url());
  EXPECT_EQ(p.placement(0).route_state(), v1::WORKER_DRAINING);
  EXPECT_EQ(p.placement(0).standalone_route(), v1::WORKER_SERVING);
  // The gateway's next count resumes it.
  restarted.on_worker_in_flight(p.placement(0).worker_url(), 0, 11, out);
  EXPECT_EQ(tasks_of(out, v1::TASK_STOP_WORKER).size(), 2u);
  EXPECT_EQ(restarted.plans().at(h.plan_id).plan.phase(), v1::PHASE_STOPPING);

  // A coordinator restarted while stopping: stops already sent are not sent again.
  h.state.on_worker_in_flight(before.placement(0).worker_url(), 0, 12, out);
  v1::Task stop0 = tasks_of(out, v1::TASK_STOP_WORKER)[0];
  h.report(h.node_of(stop0.stage()), stop0, v1::TASK_RUNNING, false, 12);
  ClusterState again(config());
  std::vector<Outbound> out2;
  for (const auto& [node, tasks] : h.held) {
    v1::NodeMessage m = registration(node);
    for (const auto& [id, status] : tasks) *m.mutable_register_()->add_tasks() = status;
    auto sent = again.on_node_message(node, m, 20);
    out2.insert(out2.end(), sent.begin(), sent.end());
  }
  EXPECT_EQ(again.plans().at(h.plan_id).plan.phase(), v1::PHASE_STOPPING);
  for (const v1::Task& t : tasks_of(out2, v1::TASK_STOP_WORKER)) {
    EXPECT_NE(t.stage(), stop0.stage()) << "already told to stop";
  }
}

// The cluster box's case (cluster.coordinator_restart): the coordinator dies while the plan
// loads and the standalone worker is ready by the time the nodes re-register, so the new
// coordinator starts in the hand-over. Nothing in the server reports per-worker in-flight
// counts (gateways report load per model), so it must ask stage 0's engine to drain, once
// stage 0's node has said where that engine serves and a gateway has the switched routes
// (else the drained pipeline is stopped while gateways still send to it).
TEST(Consolidation, AHandOverResumedAfterARestartAsksStageZerosEngineToDrain) {
  ClusterConfig c = config();
  c.handover = ClusterConfig::Handover::kv_transfer;  // a lost migration is not repeated
  Harness h(c);
  h.cold_start();
  h.to_handover();
  ASSERT_EQ(h.plan().phase(), v1::PHASE_HANDOVER);
  const v1::Plan before = h.plan();
  ASSERT_NE(h.node_of(0), h.node_of(1));

  ClusterState restarted(c);
  auto reregister = [&](const std::string& node, double now) {
    v1::NodeMessage m = registration(node);
    for (const auto& [id, status] : h.held.at(node)) *m.mutable_register_()->add_tasks() = status;
    return restarted.on_node_message(node, m, now);
  };
  // Stage 1's node first: stage 0's engine is not known yet, so there is nothing to ask.
  reregister(h.node_of(1), 10);
  EXPECT_TRUE(restarted.take_migrations().empty());
  reregister(h.node_of(0), 10);
  const v1::Plan& p = restarted.plans().at(h.plan_id).plan;
  ASSERT_EQ(p.phase(), v1::PHASE_HANDOVER);
  EXPECT_EQ(p.handover(), "drain");
  EXPECT_EQ(p.placement(0).standalone_route(), v1::WORKER_SERVING);
  EXPECT_TRUE(restarted.take_migrations().empty()) << "no gateway has the new routes yet";
  std::vector<Outbound> out;
  restarted.tick(11);
  EXPECT_TRUE(restarted.take_migrations().empty()) << "within the grace";
  restarted.on_routes_delivered(11.5, out);
  auto orders = restarted.take_migrations();
  ASSERT_EQ(orders.size(), 1u) << "the resumed hand-over asks the engine to drain";
  EXPECT_TRUE(orders[0].drain);
  EXPECT_EQ(orders[0].plan_id, h.plan_id);
  EXPECT_EQ(orders[0].from_url, before.placement(0).worker_url());
  EXPECT_EQ(orders[0].to_url, before.placement(0).standalone_url());
  // Heartbeats and progress after that do not ask again.
  v1::NodeMessage beat;
  beat.mutable_heartbeat();
  restarted.on_node_message(h.node_of(0), beat, 12);
  restarted.on_routes_delivered(12, out);
  restarted.tick(20);
  EXPECT_TRUE(restarted.take_migrations().empty()) << "asked once";
  // The engine says its pipeline finished: the pipeline's workers are stopped.
  restarted.on_migration_result(h.plan_id, true, "", 12, out);
  EXPECT_EQ(restarted.plans().at(h.plan_id).plan.phase(), v1::PHASE_STOPPING);
  EXPECT_EQ(tasks_of(out, v1::TASK_STOP_WORKER).size(), 2u);
}

// With no gateway heard after the restart, the resumed hand-over goes on after its grace.
TEST(Consolidation, AResumedHandOverNoGatewayHearsOfDrainsAfterItsGrace) {
  ClusterConfig c = config();
  c.handover_resume_grace_s = 3;
  Harness h(c);
  h.cold_start();
  h.to_handover();
  ClusterState restarted(c);
  for (const auto& [node, tasks] : h.held) {
    v1::NodeMessage m = registration(node);
    for (const auto& [id, status] : tasks) *m.mutable_register_()->add_tasks() = status;
    restarted.on_node_message(node, m, 10);
  }
  ASSERT_EQ(restarted.plans().at(h.plan_id).plan.phase(), v1::PHASE_HANDOVER);
  restarted.tick(12.9);
  EXPECT_TRUE(restarted.take_migrations().empty());
  restarted.tick(13);
  auto orders = restarted.take_migrations();
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_TRUE(orders[0].drain);
}

// Restarted while the pipeline serves (before the consolidating fetch ended): the plan walks on
// to the hand-over as usual, but its drain too waits for a gateway to have the routes.
TEST(Consolidation, ARebuiltPlansHandOverWaitsForAGatewayToHaveItsRoutes) {
  Harness h;
  h.cold_start();
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_RUNNING);
  ASSERT_EQ(h.plan().phase(), v1::PHASE_PIPELINED);
  ClusterState restarted(config());
  for (const auto& [node, tasks] : h.held) {
    v1::NodeMessage m = registration(node);
    for (const auto& [id, status] : tasks) *m.mutable_register_()->add_tasks() = status;
    restarted.on_node_message(node, m, 10);
  }
  ASSERT_EQ(restarted.plans().at(h.plan_id).plan.phase(), v1::PHASE_PIPELINED);
  auto progress = [&](const std::string& node, v1::Task task, bool ready, double now) {
    v1::NodeMessage m;
    *m.mutable_progress()->mutable_task() = std::move(task);
    m.mutable_progress()->set_state(
        m.progress().task().kind() == v1::TASK_FETCH ? v1::TASK_DONE : v1::TASK_RUNNING);
    m.mutable_progress()->set_worker_ready(ready);
    return restarted.on_node_message(node, m, now);
  };
  const auto sent = progress(h.node_of(0), *h.task(h.plan_id + "/0/fetch"), false, 11);
  const auto launched = tasks_of(sent, v1::TASK_LAUNCH_WORKER);
  ASSERT_EQ(launched.size(), 1u);
  ASSERT_TRUE(launched[0].standalone());
  progress(h.node_of(0), launched[0], true, 12);
  ASSERT_EQ(restarted.plans().at(h.plan_id).plan.phase(), v1::PHASE_HANDOVER);
  EXPECT_TRUE(restarted.take_migrations().empty()) << "no gateway has the new routes yet";
  std::vector<Outbound> out;
  restarted.on_routes_delivered(12.5, out);
  ASSERT_EQ(restarted.take_migrations().size(), 1u);
}

TEST(Consolidation, TheSlidingWindowStartsGroupsForTheQueueAndThePreviousWindow) {
  Harness h;
  std::vector<Outbound> out;
  // Window 1: 10 requests queued, nothing starting, no history: ceil(10/8) = 2 workers, one
  // group of 2 (Alg. 1 decides its pipeline size; the group ends as 2 workers).
  h.state.on_gateway_demand("llama", {.queue_length = 10, .arrivals = 40}, 1, out);
  ASSERT_EQ(h.state.plans().size(), 1u);
  const PlanRecord& first = h.state.plans().begin()->second;
  EXPECT_EQ(first.wanted, 2u);
  EXPECT_TRUE(first.plan.scale_up());
  // Window 2: the group is still starting (capacity 2 stages × 8): 10 queued fit, nothing new.
  h.state.on_gateway_demand("llama", {.queue_length = 10, .arrivals = 5}, 2, out);
  EXPECT_EQ(h.state.plans().size(), 1u);
  // Window 3: a surge beyond it: 40 queued − 16 + the previous window's 5 arrivals → 29 / 8 →
  // 4 workers, one more group.
  h.state.on_gateway_demand("llama", {.queue_length = 40, .arrivals = 90}, 3, out);
  EXPECT_EQ(h.state.plans().size(), 2u);
  // An unknown model changes nothing.
  h.state.on_gateway_demand("nope", {.queue_length = 40}, 4, out);
  EXPECT_EQ(h.state.plans().size(), 2u);
}

// thaw-gateway reports a held request both in its queue and as in flight: 12 held requests
// (queue 12, concurrent 12) are 12 requests' load — two workers at 8 each, not three.
TEST(Consolidation, HeldRequestsAreCountedOnceInAGroupsWorkers) {
  Harness h(config(), 0.035);  // (2, 2)
  h.cold_start();
  std::vector<Outbound> out;
  h.state.on_gateway_demand("llama", {.queue_length = 12, .concurrent_requests = 12}, 0.5, out);
  EXPECT_EQ(h.state.plans().at(h.plan_id).wanted, 2u);
  // Once they are on the pipeline, 20 in flight: three.
  h.state.on_gateway_demand("llama", {.queue_length = 0, .concurrent_requests = 20}, 0.6, out);
  EXPECT_EQ(h.state.plans().at(h.plan_id).wanted, 3u);
  EXPECT_EQ(h.state.plans().size(), 1u);
}

TEST(Consolidation, AnIdleConsolidatedGroupIsReleasedAfterTheKeepAlive) {
  ClusterConfig c = config();
  c.keep_alive_s = 30;
  Harness h(c);
  h.cold_start();
  h.to_handover();
  std::vector<Outbound> out;
  h.state.on_worker_in_flight(h.plan().placement(0).worker_url(), 0, 3, out);
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_DONE, false, 4);
  h.report(h.node_of(1), *h.task(h.plan_id + "/1/launch-worker"), v1::TASK_DONE, false, 4);
  ASSERT_EQ(h.plan().phase(), v1::PHASE_CONSOLIDATED);
  out.clear();
  h.state.on_gateway_demand("llama", {}, 10, out);
  h.state.on_gateway_demand("llama", {.concurrent_requests = 1}, 20, out);  // busy again
  h.state.on_gateway_demand("llama", {}, 30, out);
  h.state.on_gateway_demand("llama", {}, 59, out);
  EXPECT_TRUE(tasks_of(out, v1::TASK_STOP_WORKER).empty()) << "idle only since t = 30";
  h.state.on_gateway_demand("llama", {}, 60, out);
  const auto stops = tasks_of(out, v1::TASK_STOP_WORKER);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_TRUE(stops[0].standalone());
  EXPECT_FALSE(h.state.plans().contains(h.plan_id));
}

TEST(Consolidation, MeasuredStartUpCostsReplaceTheConfiguredOnes) {
  Harness h;
  EXPECT_EQ(h.state.startup_costs().container, 0.5) << "no measurement yet: the configured";
  const double configured_ttft = h.cold_start().predicted_ttft_s();
  v1::NodeMessage beat;
  beat.mutable_heartbeat()->set_sequence(2);
  v1::StartupCosts* c = beat.mutable_heartbeat()->mutable_startup();
  c->set_samples(2);
  c->set_phase_samples(2);
  c->set_process_start_s(2);
  c->set_cuda_init_s(3);
  c->set_engine_init_s(4);
  h.state.on_node_message("n1", beat, 1);
  const policy::ColdStartCosts costs = h.state.startup_costs();
  EXPECT_EQ(costs.container, 2);
  EXPECT_EQ(costs.cuda_context, 3);
  EXPECT_EQ(costs.library_load, 4);
  EXPECT_EQ(costs.runtime_init, 9);
  // Eq. 5 with t_cc + t_cu = 5 s more than configured (1 s): the prediction grows.
  const double measured_ttft = h.cold_start().predicted_ttft_s();
  EXPECT_GT(measured_ttft, configured_ttft + 3);
  ClusterConfig off = config();
  off.measured_startup = false;
  Harness fixed(off);
  fixed.state.on_node_message("n1", beat, 1);
  EXPECT_EQ(fixed.state.startup_costs().container, 0.5);
}

}  // namespace
}  // namespace thaw::coordinator

namespace thaw::coordinator {
namespace {

TEST(Consolidation, AStageWhoseNodeDiesIsMovedAndEveryStageRelaunchedWithTheNewPeers) {
  ClusterConfig c = config();
  c.heartbeat_interval_s = 1;
  c.liveness = 3;
  Harness h(c);
  h.cold_start();
  h.report(h.node_of(0), *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_RUNNING, true);
  ASSERT_EQ(h.plan().phase(), v1::PHASE_PIPELINED);
  const std::string dead = h.node_of(1);
  const std::string survivor = h.node_of(0);
  const std::uint32_t old_port = h.plan().placement(0).http_port();
  // Every node but the dead one keeps talking.
  for (int i = 0; i < 4; ++i) {
    const std::string id = "n" + std::to_string(i);
    if (id == dead) continue;
    v1::NodeMessage beat;
    beat.mutable_heartbeat()->set_sequence(9);
    h.state.on_node_message(id, beat, 3.5);
  }
  std::vector<std::string> died;
  const auto out = h.state.tick(4, &died);
  ASSERT_EQ(died, std::vector<std::string>{dead});
  const v1::Plan& p = h.plan();
  EXPECT_NE(p.placement(1).node_id(), dead);
  EXPECT_EQ(p.phase(), v1::PHASE_COLD_STARTING) << "nothing serves until the new pipeline does";
  EXPECT_EQ(p.placement(0).route_state(), v1::WORKER_COLD_STARTING);
  // The survivor's worker (wired to the dead node) is stopped; the moved stage fetches; both
  // stages launch again, generation 1, wired to the new peer, on new ports.
  std::vector<std::string> stop_nodes, launch_nodes, fetch_nodes;
  const auto stops = tasks_of(out, v1::TASK_STOP_WORKER, &stop_nodes);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stop_nodes[0], survivor);
  EXPECT_EQ(stops[0].generation(), 0u);
  EXPECT_EQ(stops[0].stage(), 0u);
  const auto fetches = tasks_of(out, v1::TASK_FETCH, &fetch_nodes);
  ASSERT_EQ(fetches.size(), 1u);
  EXPECT_EQ(fetch_nodes[0], p.placement(1).node_id());
  const auto launches = tasks_of(out, v1::TASK_LAUNCH_WORKER, &launch_nodes);
  ASSERT_EQ(launches.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const v1::Task& t = launches[i];
    EXPECT_EQ(t.generation(), 1u);
    EXPECT_EQ(t.id(), fmt::format("{}/{}/launch-worker-g1", h.plan_id, t.stage()));
    EXPECT_EQ(launch_nodes[i], p.placement(static_cast<int>(t.stage())).node_id());
    ASSERT_EQ(t.peers_size(), 2);
    EXPECT_EQ(t.peers(1), "10.0.0." + p.placement(1).node_id().substr(1) + ":" +
                              std::to_string(p.placement(1).pipeline_port()));
  }
  EXPECT_NE(p.placement(0).http_port(), old_port);
  // The old launch's exit is not the new pipeline's; the new one's readiness is.
  h.report(survivor, *h.task(h.plan_id + "/0/launch-worker"), v1::TASK_DONE, false, 5);
  EXPECT_EQ(h.plan().placement(0).worker_state(), v1::TASK_STATE_UNSPECIFIED);
  const v1::Task& relaunched = launches[0].stage() == 0 ? launches[0] : launches[1];
  h.report(survivor, relaunched, v1::TASK_RUNNING, true, 5);
  EXPECT_EQ(h.plan().phase(), v1::PHASE_PIPELINED);
  EXPECT_EQ(h.plan().placement(0).route_state(), v1::WORKER_SERVING);
}

}  // namespace
}  // namespace thaw::coordinator
