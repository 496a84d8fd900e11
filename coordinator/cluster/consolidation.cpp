// ClusterState's workers: ports and wiring of a plan's pipeline workers, their readiness, the
// routes gateways get, and HydraServe §6's consolidation as phases decided only from what the
// nodes report (so a restarted coordinator, rebuilt from registrations, carries on).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/proto/cluster/cluster_codec.hpp"
#include "coordinator/cluster/cluster_state.hpp"
#include "coordinator/policy/hydraserve_scaling.hpp"

namespace thaw::coordinator {
namespace {

std::string url_of(const std::string& host, std::uint32_t port) {
  return fmt::format("http://{}:{}", host, port);
}

v1::CoordinatorMessage as_message(v1::Task task) {
  v1::CoordinatorMessage m;
  *m.mutable_task() = std::move(task);
  return m;
}

const v1::PlannedStage* stage_of(const v1::Plan& plan, std::uint32_t k) {
  for (const v1::PlannedStage& s : plan.placement()) {
    if (s.stage() == k) return &s;
  }
  return nullptr;
}

v1::PlannedStage* stage_of(v1::Plan& plan, std::uint32_t k) {
  for (v1::PlannedStage& s : *plan.mutable_placement()) {
    if (s.stage() == k) return &s;
  }
  return nullptr;
}

// The port after the last ':' of "host:port" (0 when there is none).
std::uint32_t port_in(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return 0;
  std::uint32_t port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return 0;
    port = port * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return port <= 65535 ? port : 0;
}

}  // namespace

std::string ClusterState::worker_host(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  if (it != nodes_.end() && !it->second.report.worker_host().empty()) {
    return it->second.report.worker_host();
  }
  return node_id;  // thawd's node id defaults to the host name
}

std::uint32_t ClusterState::take_port(const std::string& node_id) {
  // Ports the plans hold on this node; one counter for all nodes, so nodes sharing a host
  // (a test, a cluster in a box) get different ports too.
  std::set<std::uint32_t> used;
  for (const auto& [id, p] : plans_) {
    for (const v1::PlannedStage& s : p.plan.placement()) {
      if (s.node_id() != node_id) continue;
      used.insert({s.pipeline_port(), s.http_port(), s.standalone_port()});
    }
  }
  for (std::uint32_t i = 0; i < config_.worker_port_count; ++i) {
    const std::uint32_t port = config_.worker_port_base + next_port_++ % config_.worker_port_count;
    if (!used.contains(port)) return port;
  }
  return 0;
}

void ClusterState::assign_ports(PlanRecord& plan) {
  for (v1::PlannedStage& s : *plan.plan.mutable_placement()) {
    if (plan.plan.stages() > 1 && s.pipeline_port() == 0) {
      s.set_pipeline_port(take_port(s.node_id()));
    }
    // Every stage serves HTTP: stage 0 is the route, the others answer /health (readiness)
    // and, with the reference engine, /kv (the gather of a KV migration).
    if (s.http_port() == 0) s.set_http_port(take_port(s.node_id()));
  }
}

v1::Task ClusterState::launch_task(const PlanRecord& plan, const v1::PlannedStage& stage,
                                   bool standalone) const {
  v1::Task t;
  const std::string suffix = plan.generation > 0 ? fmt::format("-g{}", plan.generation) : "";
  t.set_id(fmt::format("{}/{}/{}{}", plan.plan.id(), stage.stage(),
                       standalone ? "launch-standalone" : "launch-worker", suffix));
  t.set_generation(plan.generation);
  t.set_plan_id(plan.plan.id());
  t.set_kind(v1::TASK_LAUNCH_WORKER);
  *t.mutable_model() = plan.model;
  t.set_stage(stage.stage());
  t.set_stages(plan.plan.stages());
  t.set_gpu(stage.gpu());
  t.set_full_memory(stage.full_memory());
  t.set_standalone(standalone);
  const std::uint64_t layers = plan.model.layers();
  const std::uint64_t s = std::max<std::uint32_t>(plan.plan.stages(), 1);
  // vLLM's even split (the reference engine's too): stage k has [L·k/s, L·(k+1)/s).
  t.set_layer_begin(static_cast<std::uint32_t>(layers * stage.stage() / s));
  t.set_layer_end(static_cast<std::uint32_t>(layers * (stage.stage() + 1) / s));
  if (standalone) {
    t.set_http_port(stage.standalone_port());
  } else {
    t.set_http_port(stage.http_port());
    if (plan.plan.stages() > 1) {
      for (std::uint32_t k = 0; k < plan.plan.stages(); ++k) {
        const v1::PlannedStage* peer = stage_of(plan.plan, k);
        t.add_peers(peer == nullptr ? "unplaced:0"
                                    : fmt::format("{}:{}", worker_host(peer->node_id()),
                                                  peer->pipeline_port()));
      }
    }
  }
  return t;
}

v1::Task ClusterState::stop_task(const PlanRecord& plan, const v1::PlannedStage& stage,
                                 bool standalone, std::optional<std::uint32_t> generation) const {
  v1::Task t;
  const std::uint32_t g = generation.value_or(plan.generation);
  t.set_id(fmt::format("{}/{}/{}{}", plan.plan.id(), stage.stage(),
                       standalone ? "stop-standalone" : "stop-worker",
                       g > 0 ? fmt::format("-g{}", g) : ""));
  t.set_generation(g);
  t.set_plan_id(plan.plan.id());
  t.set_kind(v1::TASK_STOP_WORKER);
  *t.mutable_model() = plan.model;
  t.set_stage(stage.stage());
  t.set_stages(plan.plan.stages());
  t.set_gpu(stage.gpu());
  t.set_standalone(standalone);
  return t;
}

void ClusterState::apply_worker_progress(PlanRecord& plan, const std::string& node_id,
                                         const v1::TaskStatus& status) {
  const v1::Task& task = status.task();
  v1::PlannedStage* stage = stage_of(plan.plan, task.stage());
  if (stage == nullptr || stage->node_id() != node_id) return;  // a stage that moved since
  // An older launch's worker (stopped by a relaunch) says nothing about the pipeline now.
  if (!task.standalone() && task.generation() != plan.generation) return;
  if (task.kind() == v1::TASK_STOP_WORKER) {
    if (!task.standalone()) plan.stop_sent.insert(task.stage());
    return;
  }
  if (task.kind() != v1::TASK_LAUNCH_WORKER) return;
  const bool ready = status.state() == v1::TASK_RUNNING && status.worker_ready();
  if (task.standalone()) {
    stage->set_standalone_state(status.state());
    stage->set_standalone_ready(ready);
    if (stage->standalone_port() == 0) stage->set_standalone_port(task.http_port());
    stage->set_standalone_url(url_of(worker_host(node_id), stage->standalone_port()));
  } else {
    stage->set_worker_state(status.state());
    stage->set_worker_ready(ready);
    if (stage->http_port() == 0) stage->set_http_port(task.http_port());
    if (stage->pipeline_port() == 0 && task.peers_size() > static_cast<int>(task.stage())) {
      stage->set_pipeline_port(port_in(task.peers(static_cast<int>(task.stage()))));
    }
  }
}

void ClusterState::relaunch(PlanRecord& plan, const std::set<std::uint32_t>& moved,
                            std::vector<Outbound>& out) {
  const std::uint32_t old = plan.generation++;
  for (v1::PlannedStage& s : *plan.plan.mutable_placement()) {
    // The moved stage's old worker died with its node; the others' are told to stop (or, if
    // still waiting for their fetch, not to start).
    if (!moved.contains(s.stage())) {
      out.push_back({s.node_id(), as_message(stop_task(plan, s, false, old))});
    }
    s.set_pipeline_port(0);
    s.set_http_port(0);
    s.set_worker_state(v1::TASK_STATE_UNSPECIFIED);
    s.set_worker_ready(false);
  }
  assign_ports(plan);
  for (const v1::PlannedStage& s : plan.plan.placement()) {
    out.push_back({s.node_id(), as_message(launch_task(plan, s, false))});
  }
  plan.plan.set_phase(v1::PHASE_COLD_STARTING);
  set_routes(plan);
}

std::vector<std::uint32_t> ClusterState::standalone_stages(const PlanRecord& plan) const {
  // Scale down: the first full-memory stage (Alg. 1 puts them first, so stage 0); scale up:
  // as many full-memory stages as the model wants (§6.1). A low-memory stage cannot hold the
  // whole model, so it never becomes a standalone worker.
  std::vector<std::uint32_t> out;
  const std::uint32_t keep =
      policy::consolidate(plan.plan.stages(), plan.plan.scale_up() ? plan.wanted : 1).standalone;
  for (const v1::PlannedStage& s : plan.plan.placement()) {
    if (s.full_memory() && out.size() < keep) out.push_back(s.stage());
  }
  return out;
}

void ClusterState::fail_cold_start(PlanRecord& plan, const std::string& why, double now,
                                   std::vector<Outbound>& out) {
  const std::string reason =
      fmt::format("the cold start of {} failed (plan {}): {}, also after {} relaunch(es)",
                  plan.model.name(), plan.plan.id(), why, plan.exit_relaunches);
  for (const v1::PlannedStage& s : plan.plan.placement()) {
    if (s.worker_state() == v1::TASK_RUNNING) {
      out.push_back({s.node_id(), as_message(stop_task(plan, s, false))});
    }
  }
  plan.failed = true;
  plan.plan.set_phase_error(reason);
  // Gateways ask again as soon as the route is gone; a refusal with the reason answers their
  // held requests at once instead of another cold start that would fail the same way.
  failed_cold_starts_[plan.model.name()] = {reason, now + config_.failed_cold_start_backoff_s};
}

void ClusterState::erase_failed_plans() {
  std::erase_if(plans_, [](const auto& p) { return p.second.failed; });
}

void ClusterState::advance(PlanRecord& plan, double now, std::vector<Outbound>& out) {
  if (!config_.launch_workers || plan.failed) return;
  v1::Plan& p = plan.plan;
  const v1::PlannedStage* first = stage_of(p, 0);
  if (first == nullptr) return;
  for (int guard = 0; guard < 8; ++guard) {
    const v1::ConsolidationPhase before = p.phase();
    switch (p.phase()) {
      case v1::PHASE_UNSPECIFIED:
        p.set_phase(v1::PHASE_COLD_STARTING);
        break;
      case v1::PHASE_COLD_STARTING: {
        // A stage's engine that exits before the pipeline serves: every stage is launched
        // once more (its peers' links broke with it), then the cold start fails, so that
        // gateways stop holding its requests (a command that fails twice will fail again).
        std::set<std::uint32_t> exited;
        std::string which;
        for (const v1::PlannedStage& s : p.placement()) {
          if (s.worker_state() == v1::TASK_FAILED || s.worker_state() == v1::TASK_DONE) {
            exited.insert(s.stage());
            which = fmt::format(
                "the worker of stage {} on {} exited before the pipeline served "
                "(its log: the node's state_dir/workers)",
                s.stage(), s.node_id());
          }
        }
        if (!exited.empty()) {
          if (plan.exit_relaunches < config_.cold_start_relaunches) {
            ++plan.exit_relaunches;
            relaunch(plan, exited, out);
            p.set_phase_error(
                fmt::format("{}; launched again (generation {})", which, plan.generation));
          } else {
            fail_cold_start(plan, which, now, out);
          }
          break;
        }
        if (first->worker_ready()) {
          // One stage is already a worker with the whole model: nothing to consolidate.
          p.set_phase(p.stages() == 1 ? v1::PHASE_CONSOLIDATED : v1::PHASE_PIPELINED);
        }
        break;
      }
      case v1::PHASE_PIPELINED: {
        const std::vector<std::uint32_t> targets = standalone_stages(plan);
        if (targets.empty()) {
          p.set_phase_error(
              "no full-memory stage: the group stays pipelined (no worker can hold the whole "
              "model)");
          break;
        }
        bool all_there = true;
        for (std::uint32_t k : targets) {
          if (plan.whole_model_on.contains(k)) continue;
          all_there = false;
          // Scale-up: the other full-memory stages fetch the rest too (stage 0's fetch task
          // already does, with `consolidate`).
          if (k != 0 && !plan.rest_fetch_sent.contains(k)) {
            const v1::PlannedStage& s = *stage_of(p, k);
            v1::Task t;
            t.set_id(fmt::format("{}/{}/fetch-rest", p.id(), k));
            t.set_plan_id(p.id());
            t.set_kind(v1::TASK_FETCH);
            *t.mutable_model() = plan.model;
            t.set_stage(k);
            t.set_stages(p.stages());
            t.set_gpu(s.gpu());
            t.set_full_memory(true);
            t.set_consolidate(true);
            out.push_back({s.node_id(), as_message(std::move(t))});
            plan.rest_fetch_sent.insert(k);
          }
        }
        if (!all_there) break;
        for (std::uint32_t k : targets) {
          v1::PlannedStage& s = *stage_of(p, k);
          if (s.standalone_port() == 0) s.set_standalone_port(take_port(s.node_id()));
          s.set_standalone_url(url_of(worker_host(s.node_id()), s.standalone_port()));
          s.set_standalone_state(v1::TASK_RUNNING);
          out.push_back({s.node_id(), as_message(launch_task(plan, s, true))});
        }
        p.set_phase(v1::PHASE_LOADING);
        break;
      }
      case v1::PHASE_LOADING: {
        bool ready = true;
        for (std::uint32_t k : standalone_stages(plan)) {
          const v1::PlannedStage& s = *stage_of(p, k);
          if (s.standalone_state() == v1::TASK_FAILED || s.standalone_state() == v1::TASK_DONE) {
            // The pipeline keeps serving; the failure is shown, not retried in a loop.
            p.set_phase_error(
                fmt::format("standalone worker of stage {} on {} exited", k, s.node_id()));
          }
          ready = ready && s.standalone_ready();
        }
        if (!ready) break;
        p.set_phase(v1::PHASE_HANDOVER);
        plan.handover_since = now;
        p.set_handover(config_.handover == ClusterConfig::Handover::kv_transfer ? "kv-transfer"
                                                                                : "drain");
        order_handover(plan, now);
        break;
      }
      case v1::PHASE_HANDOVER: {
        // Resumed after a restart: the engine is asked (again) to drain, since only it knows
        // whether requests are left (gateways report load per model, not per worker).
        order_handover(plan, now);
        // Drained: a gateway's count made after the routes switched says no request is left
        // on the pipeline (before the switch new requests could still arrive).
        const bool drained = plan.in_flight_reported_at > plan.handover_since && p.in_flight() == 0;
        if (p.handover() != "drain" || !drained) break;
        p.set_phase(v1::PHASE_STOPPING);
        break;
      }
      case v1::PHASE_STOPPING: {
        const std::vector<std::uint32_t> keep = standalone_stages(plan);
        bool all_stopped = true;
        for (const v1::PlannedStage& s : p.placement()) {
          if (s.worker_state() == v1::TASK_RUNNING) {
            all_stopped = false;
            if (!plan.stop_sent.contains(s.stage())) {
              out.push_back({s.node_id(), as_message(stop_task(plan, s, false))});
              plan.stop_sent.insert(s.stage());
            }
          }
        }
        if (all_stopped) p.set_phase(v1::PHASE_CONSOLIDATED);
        break;
      }
      default:
        break;
    }
    if (p.phase() == before) break;
  }
  p.set_consolidated(p.phase() == v1::PHASE_CONSOLIDATED && p.stages() > 1);
  set_routes(plan);
}

void ClusterState::order_handover(PlanRecord& plan, double now) {
  v1::Plan& p = plan.plan;
  const v1::PlannedStage* first = stage_of(p, 0);
  const std::vector<std::uint32_t> targets = standalone_stages(plan);
  // Stage 0's port comes from its node's report: after a restart it may not have registered.
  if (plan.migration_started || first == nullptr || first->http_port() == 0 || targets.empty()) {
    return;
  }
  // A plan this coordinator rebuilt after a restart: gateways may still route to the pipeline
  // as the old coordinator last told them (they say hello again within a report interval). A
  // drain of an idle pipeline ends at once and its workers are stopped, so they would get
  // refused connections: first a gateway gets the switched routes (or none is heard).
  if (p.rebuilt() && routes_delivered_at_ <= plan.handover_since &&
      now - plan.handover_since < config_.handover_resume_grace_s) {
    return;
  }
  MigrationOrder order;
  order.plan_id = p.id();
  order.drain = p.handover() == "drain";
  order.from_url = url_of(worker_host(first->node_id()), first->http_port());
  order.to_url = stage_of(p, targets.front())->standalone_url();
  for (const v1::PlannedStage& s : p.placement()) {
    order.stage_urls.push_back(url_of(worker_host(s.node_id()), s.http_port()));
  }
  migrations_.push_back(std::move(order));
  plan.migration_started = true;
}

void ClusterState::set_routes(PlanRecord& plan) const {
  v1::Plan& p = plan.plan;
  for (v1::PlannedStage& s : *p.mutable_placement()) {
    // The pipeline: entered at stage 0 only.
    v1::WorkerState pipeline = v1::WORKER_STATE_UNSPECIFIED;
    if (s.stage() == 0 && s.worker_state() != v1::TASK_FAILED &&
        s.worker_state() != v1::TASK_DONE) {
      switch (p.phase()) {
        case v1::PHASE_COLD_STARTING:
          pipeline = v1::WORKER_COLD_STARTING;
          break;
        case v1::PHASE_PIPELINED:
        case v1::PHASE_LOADING:
          pipeline = v1::WORKER_SERVING;
          break;
        case v1::PHASE_HANDOVER:
          pipeline = v1::WORKER_DRAINING;
          break;
        case v1::PHASE_CONSOLIDATED:
          if (p.stages() == 1) pipeline = v1::WORKER_SERVING;  // the worker itself
          break;
        default:
          break;
      }
    }
    s.set_route_state(pipeline);
    s.set_worker_url(pipeline == v1::WORKER_STATE_UNSPECIFIED ||
                             pipeline == v1::WORKER_COLD_STARTING
                         ? ""
                         : url_of(worker_host(s.node_id()), s.http_port()));
    // The standalone worker takes requests from the hand-over on.
    const bool standalone_serves =
        s.standalone_ready() && s.standalone_state() == v1::TASK_RUNNING &&
        (p.phase() == v1::PHASE_HANDOVER || p.phase() == v1::PHASE_STOPPING ||
         p.phase() == v1::PHASE_CONSOLIDATED);
    s.set_standalone_route(standalone_serves ? v1::WORKER_SERVING : v1::WORKER_STATE_UNSPECIFIED);
  }
}

void ClusterState::on_worker_in_flight(const std::string& url, std::uint32_t in_flight, double now,
                                       std::vector<Outbound>& out) {
  for (auto& [id, plan] : plans_) {
    const v1::PlannedStage* first = stage_of(plan.plan, 0);
    if (first == nullptr || first->http_port() == 0 ||
        url_of(worker_host(first->node_id()), first->http_port()) != url) {
      continue;
    }
    plan.plan.set_in_flight(in_flight);
    plan.in_flight_reported_at = now;
    advance(plan, now, out);
  }
}

void ClusterState::on_routes_delivered(double now, std::vector<Outbound>& out) {
  last_now_ = std::max(last_now_, now);
  routes_delivered_at_ = now;
  for (auto& [id, plan] : plans_) {
    if (waits_for_routes(plan)) advance(plan, now, out);
  }
}

bool ClusterState::waits_for_routes(const PlanRecord& plan) {
  return plan.plan.rebuilt() && plan.plan.phase() == v1::PHASE_HANDOVER && !plan.migration_started;
}

std::vector<MigrationOrder> ClusterState::take_migrations() {
  std::vector<MigrationOrder> out;
  out.swap(migrations_);
  return out;
}

void ClusterState::on_migration_result(const std::string& plan_id, bool ok,
                                       const std::string& error, double now,
                                       std::vector<Outbound>& out) {
  auto it = plans_.find(plan_id);
  if (it == plans_.end() || it->second.plan.phase() != v1::PHASE_HANDOVER) return;
  PlanRecord& plan = it->second;
  if (plan.plan.handover() == "drain") {
    // The engine said its pipeline finished every request it had; else gateways' counts
    // decide.
    if (ok) {
      plan.plan.set_in_flight(0);
      plan.plan.set_phase(v1::PHASE_STOPPING);
    } else {
      plan.plan.set_phase_error("the engine's drain failed, waiting for gateways' counts: " +
                                error);
    }
  } else if (ok) {
    // Every request moved with its KV cache: nothing is left on the pipeline.
    plan.plan.set_in_flight(0);
    plan.plan.set_phase(v1::PHASE_STOPPING);
  } else {
    // The requests stay where they are and finish on the pipeline: the engine is asked to
    // drain (advance), the only one that can say when they have.
    plan.plan.set_phase_error("KV migration failed, draining instead: " + error);
    plan.plan.set_handover("drain");
    plan.migration_started = false;
  }
  advance(plan, now, out);
}

void ClusterState::rebuild_workers_from(const std::string& node_id, const v1::Register& report) {
  // The newest launch generation first: older launches' statuses are then ignored.
  for (const v1::TaskStatus& status : report.tasks()) {
    const v1::Task& task = status.task();
    auto it = plans_.find(task.plan_id());
    if (it == plans_.end() || task.standalone()) continue;
    if (task.kind() == v1::TASK_LAUNCH_WORKER || task.kind() == v1::TASK_STOP_WORKER) {
      it->second.generation = std::max(it->second.generation, task.generation());
    }
  }
  for (const v1::TaskStatus& status : report.tasks()) {
    const v1::Task& task = status.task();
    auto it = plans_.find(task.plan_id());
    if (it == plans_.end()) continue;
    PlanRecord& plan = it->second;
    if (task.kind() == v1::TASK_FETCH && task.consolidate() && status.state() == v1::TASK_DONE) {
      plan.whole_model_on.insert(task.stage());
      if (task.stage() != 0) plan.rest_fetch_sent.insert(task.stage());
    }
    if (task.kind() == v1::TASK_FETCH && task.consolidate() && task.stage() != 0) {
      plan.rest_fetch_sent.insert(task.stage());
      plan.plan.set_scale_up(true);
    }
    if (task.kind() == v1::TASK_LAUNCH_WORKER && task.standalone() && task.stage() != 0) {
      plan.plan.set_scale_up(true);
      plan.wanted = std::max(plan.wanted, task.stage() + 1);
    }
    apply_worker_progress(plan, node_id, status);
  }
  // The phase follows from what is known now; a phase already reached is not gone back on
  // (another node's registration may not have arrived yet).
  for (auto& [id, plan] : plans_) {
    if (!plan.plan.rebuilt()) continue;
    v1::Plan& p = plan.plan;
    v1::ConsolidationPhase phase = v1::PHASE_COLD_STARTING;
    bool standalone_any = false, standalone_all_ready = true;
    for (const v1::PlannedStage& s : p.placement()) {
      if (s.standalone_state() == v1::TASK_STATE_UNSPECIFIED) continue;
      standalone_any = true;
      standalone_all_ready = standalone_all_ready && s.standalone_ready();
    }
    const v1::PlannedStage* first = stage_of(p, 0);
    if (!plan.stop_sent.empty()) {
      phase = v1::PHASE_STOPPING;
    } else if (standalone_any) {
      phase = standalone_all_ready ? v1::PHASE_HANDOVER : v1::PHASE_LOADING;
    } else if (first != nullptr && first->worker_ready()) {
      phase = p.stages() == 1 ? v1::PHASE_CONSOLIDATED : v1::PHASE_PIPELINED;
    }
    if (phase > p.phase()) {
      p.set_phase(phase);
      // A hand-over resumed after a restart drains: a migration whose outcome was lost is not
      // repeated. The drain is asked of the engine (advance, once stage 0's node has
      // registered): nothing else reports the pipeline empty, since gateways report load per
      // model, not the per-worker counts on_worker_in_flight takes.
      if (phase == v1::PHASE_HANDOVER) {
        plan.handover_since = last_now_;
        p.set_handover("drain");
        plan.migration_started = false;
      }
    }
  }
}

void ClusterState::on_gateway_demand(const std::string& model, const GatewayDemand& demand,
                                     double now, std::vector<Outbound>& out) {
  last_now_ = std::max(last_now_, now);
  auto spec = models_.find(model);
  if (spec == models_.end()) return;
  const std::uint32_t batch = std::max<std::uint32_t>(config_.scaling_batch, 1);
  // Workers of this model: serving alone, pipelines serving, groups still starting.
  std::uint32_t standalone = 0, starting_capacity = 0;
  std::vector<PlanRecord*> pipelined;
  for (auto& [id, plan] : plans_) {
    if (plan.model.name() != model || plan.failed) continue;
    switch (plan.plan.phase()) {
      case v1::PHASE_UNSPECIFIED:
      case v1::PHASE_COLD_STARTING:
        starting_capacity += plan.plan.stages() * batch;
        pipelined.push_back(&plan);
        break;
      case v1::PHASE_PIPELINED:
        pipelined.push_back(&plan);
        break;
      default:
        for (const v1::PlannedStage& s : plan.plan.placement()) {
          standalone += s.standalone_state() == v1::TASK_RUNNING ? 1 : 0;
        }
        standalone += plan.plan.stages() == 1 ? 1 : 0;
        break;
    }
  }
  // §6.1: the queue plus the previous window's arrivals (the next window's predicted peak)
  // decide how many new workers to start; groups of at most 4 stages, several for a surge.
  const std::uint64_t previous = previous_arrivals_[model];
  previous_arrivals_[model] = demand.arrivals;
  const std::uint32_t needed = policy::new_workers_needed(
      {demand.queue_length, starting_capacity, static_cast<std::uint32_t>(previous), batch});
  for (std::uint32_t group : policy::pipeline_groups(needed)) {
    auto plan = plan_cold_start(spec->second, now, out);
    if (!plan) break;  // no room: the gateways keep holding, the next report tries again
    PlanRecord& record = plans_.at(plan->id());
    record.wanted = group;
    record.plan.set_scale_up(group > 1);
  }
  // Groups not yet consolidating: how many workers each should end as. The load beyond what
  // standalone workers carry is spread over them; more than one each is a scale-up. A gateway
  // counts a held request as in flight too (from its arrival: thaw-gateway's Router::InFlight),
  // so the queue is part of the concurrency, not added to it: 12 held requests are 2 workers'
  // load at 8 each, not 3 (the queue alone counts for a reporter that leaves held ones out).
  const double load =
      std::max(demand.concurrent_requests, static_cast<double>(demand.queue_length));
  const auto workers_for_load = static_cast<std::uint32_t>(std::ceil(load / batch));
  if (!pipelined.empty() && workers_for_load > standalone) {
    const std::uint32_t per_group =
        (workers_for_load - standalone + static_cast<std::uint32_t>(pipelined.size()) - 1) /
        static_cast<std::uint32_t>(pipelined.size());
    for (PlanRecord* plan : pipelined) {
      plan->wanted = std::max(plan->wanted, per_group);
      plan->plan.set_scale_up(plan->wanted > 1);
    }
  }
  // Keep-alive: a consolidated group idle for keep_alive_s is released.
  const bool idle =
      demand.queue_length == 0 && demand.concurrent_requests == 0 && demand.arrivals == 0;
  std::vector<std::string> released;
  for (auto& [id, plan] : plans_) {
    if (plan.model.name() != model || plan.plan.phase() != v1::PHASE_CONSOLIDATED) continue;
    if (!idle) {
      plan.idle_since = -1;
      continue;
    }
    if (plan.idle_since < 0) plan.idle_since = now;
    if (now - plan.idle_since < config_.keep_alive_s) continue;
    for (const v1::PlannedStage& s : plan.plan.placement()) {
      if (s.standalone_state() == v1::TASK_RUNNING) {
        out.push_back({s.node_id(), as_message(stop_task(plan, s, true))});
      }
      if (plan.plan.stages() == 1 && s.worker_state() == v1::TASK_RUNNING) {
        out.push_back({s.node_id(), as_message(stop_task(plan, s, false))});
      }
    }
    released.push_back(id);
  }
  for (const std::string& id : released) plans_.erase(id);
}

policy::ColdStartCosts ClusterState::startup_costs() const {
  policy::ColdStartCosts costs = config_.startup;
  if (!config_.measured_startup) return costs;
  double n = 0, process = 0, cuda = 0, engine = 0;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    const v1::StartupCosts& c = node.report.startup();
    const double k = c.phase_samples();
    n += k;
    process += k * c.process_start_s();
    cuda += k * c.cuda_init_s();
    engine += k * c.engine_init_s();
  }
  if (n < std::max<std::uint32_t>(config_.min_startup_samples, 1)) return costs;
  costs.container = process / n;
  costs.cuda_context = cuda / n;
  costs.library_load = engine / n;
  costs.runtime_init = costs.container + costs.cuda_context + costs.library_load;
  return costs;
}

}  // namespace thaw::coordinator
