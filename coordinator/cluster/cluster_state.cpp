#include "coordinator/cluster/cluster_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "common/proto/cluster/cluster_codec.hpp"
#include "coordinator/policy/hydraserve_allocation.hpp"
#include "coordinator/policy/warmserve_placement.hpp"

namespace thaw::coordinator {
namespace {

constexpr double kNoSlo = 1e9;  // an SLO of 0 means none: every scheme meets it

v1::CoordinatorMessage heartbeat_message(std::uint64_t sequence) {
  v1::CoordinatorMessage m;
  m.mutable_heartbeat()->set_sequence(sequence);
  return m;
}

double stage_bytes(const v1::ModelSpec& model, std::uint32_t stages) {
  return static_cast<double>(model.size_bytes()) / std::max<std::uint32_t>(stages, 1);
}

// A node's PCIe bandwidth for Alg. 1's p_x: its slowest GPU's (they load in parallel).
double node_pcie(const v1::Register& r) {
  double p = 0;
  for (const v1::GpuInfo& g : r.gpus()) {
    if (g.pcie_bytes_per_s() > 0)
      p = p == 0 ? g.pcie_bytes_per_s() : std::min(p, g.pcie_bytes_per_s());
  }
  return p > 0 ? p : 16e9;  // no figure reported: PCIe 4.0 x16's
}

// The key a node caches a registry name under, and reports its slots with ("org/name" →
// "org--name", as NodeService::key_for).
std::string cache_key(const std::string& name) {
  std::string key = name;
  for (std::size_t at = key.find('/'); at != std::string::npos; at = key.find('/', at + 2)) {
    key.replace(at, 1, "--");
  }
  return key;
}

}  // namespace

ClusterState::ClusterState(ClusterConfig config) : config_(std::move(config)) {}

std::vector<Outbound> ClusterState::on_node_message(const std::string& node_id,
                                                    const v1::NodeMessage& message, double now) {
  std::vector<Outbound> out;
  last_now_ = std::max(last_now_, now);
  auto it = nodes_.find(node_id);
  if (message.body_case() == v1::NodeMessage::kRegister) {
    NodeRecord& node = nodes_[node_id];
    node.report = message.register_();
    node.last_heard = now;
    node.alive = true;
    rebuild_from(node_id, node.report);
    rebuild_workers_from(node_id, node.report);
    // A coordinator restarted mid-consolidation carries on from what the nodes hold.
    for (auto& [id, plan] : plans_) advance(plan, now, out);
    v1::CoordinatorMessage welcome;
    welcome.mutable_welcome()->set_heartbeat_interval_ms(
        static_cast<std::uint32_t>(std::lround(config_.heartbeat_interval_s * 1000)));
    welcome.mutable_welcome()->set_liveness(static_cast<std::uint32_t>(config_.liveness));
    out.push_back({node_id, std::move(welcome)});
    node.last_heartbeat_sent = now;
    return out;
  }
  if (it == nodes_.end() || !it->second.alive) {
    // Unknown (this coordinator restarted) or declared dead (its stages moved): the node's
    // full report is needed before anything it says can be placed.
    v1::CoordinatorMessage again;
    again.mutable_re_register()->set_reason(it == nodes_.end()
                                                ? "the coordinator does not know this node"
                                                : "this node was declared dead");
    out.push_back({node_id, std::move(again)});
    return out;
  }
  it->second.last_heard = now;
  if (message.body_case() == v1::NodeMessage::kProgress) {
    apply_progress(node_id, message.progress(), out);
  }
  if (message.body_case() == v1::NodeMessage::kHeartbeat &&
      message.heartbeat().resources_changed()) {
    *it->second.report.mutable_gpus() = message.heartbeat().gpus();
    *it->second.report.mutable_slots() = message.heartbeat().slots();
  }
  if (message.body_case() == v1::NodeMessage::kHeartbeat && message.heartbeat().has_startup()) {
    *it->second.report.mutable_startup() = message.heartbeat().startup();
  }
  return out;
}

void ClusterState::rebuild_from(const std::string& node_id, const v1::Register& report) {
  for (const v1::TaskStatus& status : report.tasks()) {
    const v1::Task& task = status.task();
    models_.try_emplace(task.model().name(), task.model());
    auto [it, created] = plans_.try_emplace(task.plan_id());
    PlanRecord& plan = it->second;
    if (created) {
      plan.model = task.model();
      plan.plan.set_id(task.plan_id());
      plan.plan.set_model(task.model().name());
      plan.plan.set_stages(task.stages());
      plan.plan.set_rebuilt(true);
    }
    if (task.kind() != v1::TASK_FETCH || task.stages() != plan.plan.stages()) continue;
    // The stage's placement: this node's, unless it moved to another live node meanwhile.
    v1::PlannedStage* stage = nullptr;
    for (v1::PlannedStage& s : *plan.plan.mutable_placement()) {
      if (s.stage() == task.stage()) stage = &s;
    }
    if (stage == nullptr) {
      stage = plan.plan.add_placement();
      stage->set_stage(task.stage());
    } else if (stage->node_id() != node_id) {
      auto other = nodes_.find(stage->node_id());
      if (other != nodes_.end() && other->second.alive) continue;
    }
    stage->set_node_id(node_id);
    stage->set_gpu(task.gpu());
    stage->set_full_memory(task.full_memory());
    if (task.consolidate() && status.state() == v1::TASK_DONE) plan.plan.set_consolidated(true);
    stage->set_fetch_state(status.state());
    stage->set_bytes_done(status.bytes_done());
    stage->set_bytes_total(status.bytes_total());
  }
  for (auto& [id, plan] : plans_) {
    auto& placement = *plan.plan.mutable_placement();
    std::sort(placement.begin(), placement.end(),
              [](const auto& a, const auto& b) { return a.stage() < b.stage(); });
  }
}

void ClusterState::apply_progress(const std::string& node_id, const v1::TaskStatus& status,
                                  std::vector<Outbound>& out) {
  NodeRecord& node = nodes_.at(node_id);
  bool replaced = false;
  for (v1::TaskStatus& held : *node.report.mutable_tasks()) {
    if (held.task().id() == status.task().id()) {
      held = status;
      replaced = true;
    }
  }
  if (!replaced) *node.report.add_tasks() = status;
  auto plan = plans_.find(status.task().plan_id());
  if (plan == plans_.end()) return;
  if (status.task().kind() != v1::TASK_FETCH) {
    apply_worker_progress(plan->second, node_id, status);
    advance(plan->second, last_now_, out);
    return;
  }
  for (v1::PlannedStage& s : *plan->second.plan.mutable_placement()) {
    if (s.stage() == status.task().stage() && s.node_id() == node_id) {
      s.set_fetch_state(status.state());
      s.set_bytes_done(status.bytes_done());
      s.set_bytes_total(status.bytes_total());
    }
  }
  if (status.task().consolidate() && status.state() == v1::TASK_DONE) {
    // The stage's node has the whole model. Without workers that is all there is to it; with
    // them it is where §6's consolidation starts (advance): stopping the other stages now
    // would kill the requests they carry.
    PlanRecord& record = plan->second;
    bool placed_here = false;
    for (const v1::PlannedStage& s : record.plan.placement()) {
      placed_here = placed_here || (s.stage() == status.task().stage() && s.node_id() == node_id);
    }
    if (placed_here) record.whole_model_on.insert(status.task().stage());
    if (!config_.launch_workers && status.task().stage() == 0) record.plan.set_consolidated(true);
    advance(record, last_now_, out);
  }
}

std::vector<Outbound> ClusterState::tick(double now, std::vector<std::string>* died) {
  std::vector<Outbound> out;
  last_now_ = std::max(last_now_, now);
  erase_failed_plans();
  const double deadline = config_.heartbeat_interval_s * config_.liveness;
  std::vector<std::string> dead;
  for (auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    if (now - node.last_heard > deadline) {
      node.alive = false;
      dead.push_back(id);
      continue;
    }
    if (now - node.last_heartbeat_sent >= config_.heartbeat_interval_s) {
      out.push_back({id, heartbeat_message(static_cast<std::uint64_t>(now * 1000))});
      node.last_heartbeat_sent = now;
    }
  }
  for (const std::string& id : dead) replan_stages_of(id, out);
  if (died != nullptr) *died = std::move(dead);
  // A rebuilt plan's hand-over that no gateway has heard of goes on after its grace.
  for (auto& [id, plan] : plans_) {
    if (waits_for_routes(plan)) advance(plan, now, out);
  }
  close_windows(now, out);
  return out;
}

void ClusterState::close_windows(double now, std::vector<Outbound>& out) {
  const auto current = static_cast<std::int64_t>(std::floor(now / config_.window_s));
  if (!window_) {
    window_ = current;
    return;
  }
  if (current <= *window_) return;
  // A window nobody reported in repeats the last one (a frontend that stopped reporting
  // has not lost its load); more than a day of silence is not filled in.
  const std::int64_t closing = std::min<std::int64_t>(
      current - *window_, static_cast<std::int64_t>(86400 / config_.window_s) + 1);
  for (auto& [name, load] : load_) {
    for (std::int64_t i = 0; i < closing; ++i) {
      if (load.samples > 0) {
        load.average.push_back(load.sum / load.samples);
        load.peak.push_back(load.max);
        load.sum = load.max = 0;
        load.samples = 0;
      } else {
        load.average.push_back(load.average.empty() ? 0 : load.average.back());
        load.peak.push_back(load.peak.empty() ? 0 : load.peak.back());
      }
    }
  }
  window_ = current;
  prewarm_round(current, out);
}

// WarmServe §5: which replicas of which models to keep prewarmed for the window now opening.
void ClusterState::prewarm_round(std::int64_t window, std::vector<Outbound>& out) {
  ++prewarm_rounds_;
  policy::CspConfig csp;
  csp.windows_per_day =
      std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(86400 / config_.window_s)));
  // The GPUs of live nodes, and the node and local index of each.
  std::vector<policy::ClusterGpu> gpus;
  std::vector<std::pair<std::string, std::uint32_t>> gpu_at;
  std::map<std::pair<std::string, std::uint32_t>, std::uint32_t> gpu_index;
  double link_sum = 0;
  std::uint32_t server = 0, links = 0;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    for (const v1::GpuInfo& g : node.report.gpus()) {
      gpu_index[{id, g.index()}] = static_cast<std::uint32_t>(gpus.size());
      gpus.push_back(
          {server, static_cast<double>(g.free_bytes()), !g.runs_worker(), !g.runs_worker()});
      gpu_at.emplace_back(id, g.index());
    }
    if (node.report.network_bytes_per_s() > 0) {
      link_sum += node.report.network_bytes_per_s();
      ++links;
    }
    ++server;
  }
  if (gpus.empty()) return;
  const double link = links > 0 ? link_sum / links : 16e9 / 8;

  // Models with load, by index; the cache key nodes report slots under.
  std::vector<const v1::ModelSpec*> model_at;
  std::map<std::string, std::uint32_t> model_by_key;
  std::vector<policy::ModelDemand> demands;
  for (auto& [name, load] : load_) {
    auto spec = models_.find(name);
    if (spec == models_.end() || load.average.empty()) continue;
    const std::size_t t = load.average.size();
    // CSP needs a day of history; until then the last window stands for the next.
    const double average = policy::predict_load(load.average, t, csp).value_or(load.average.back());
    const double peak =
        std::max(policy::predict_load(load.peak, t, csp).value_or(load.peak.back()), average);
    policy::ModelDemand d;
    d.model = static_cast<std::uint32_t>(model_at.size());
    d.size_bytes = static_cast<double>(spec->second.size_bytes());
    d.parallelism = 1;
    d.demand = {average, peak, load.active_instances, config_.batch_size, d.size_bytes / link};
    load.predicted_average = average;
    load.predicted_peak = peak;
    load.replicas_wanted = static_cast<std::uint32_t>(policy::prewarm_replicas(d.demand).size());
    demands.push_back(d);
    model_by_key[cache_key(name)] = d.model;
    model_at.push_back(&spec->second);
  }
  if (demands.empty()) return;

  // What is prewarmed (or being prewarmed) already: slots the nodes report, and prewarm
  // tasks still running whose slot the next report will show.
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;  // (model, gpu)
  std::vector<policy::PrewarmReplica> existing;
  auto add_existing = [&](std::uint32_t model, std::uint32_t gpu) {
    if (seen.insert({model, gpu}).second) existing.push_back({model, {gpu}, 0});
  };
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    for (const v1::SlotInfo& slot : node.report.slots()) {
      auto m = model_by_key.find(slot.model());
      auto g = gpu_index.find({id, slot.gpu()});
      if (m != model_by_key.end() && g != gpu_index.end() && slot.state() != "evicting") {
        add_existing(m->second, g->second);
      }
    }
    for (const v1::TaskStatus& t : node.report.tasks()) {
      if (t.task().kind() != v1::TASK_PREWARM || t.state() != v1::TASK_RUNNING) continue;
      auto m = model_by_key.find(cache_key(t.task().model().name()));
      auto g = gpu_index.find({id, t.task().gpu()});
      if (m != model_by_key.end() && g != gpu_index.end()) add_existing(m->second, g->second);
    }
  }

  for (const policy::PlacedReplica& placed :
       policy::place_prewarm_replicas(demands, gpus, existing)) {
    const v1::ModelSpec& model = *model_at.at(placed.replica.model);
    for (std::uint32_t g : placed.replica.gpus) {
      const auto& [node_id, local] = gpu_at.at(g);
      v1::CoordinatorMessage m;
      v1::Task* t = m.mutable_task();
      t->set_plan_id(fmt::format("warm-{}", window));
      t->set_id(fmt::format("warm-{}/{}/{}", window, model.name(), local));
      t->set_kind(v1::TASK_PREWARM);
      *t->mutable_model() = model;
      t->set_stages(1);
      t->set_gpu(local);
      out.push_back({node_id, std::move(m)});
    }
  }
}

double ClusterState::next_deadline(double now) const {
  double next = config_.heartbeat_interval_s;
  const double liveness = config_.heartbeat_interval_s * config_.liveness;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    next = std::min(next, node.last_heartbeat_sent + config_.heartbeat_interval_s - now);
    next = std::min(next, node.last_heard + liveness - now);
  }
  if (window_) next = std::min(next, static_cast<double>(*window_ + 1) * config_.window_s - now);
  return std::max(next, 0.0);
}

void ClusterState::send_stage_tasks(PlanRecord& plan, const v1::PlannedStage& stage,
                                    std::vector<Outbound>& out, bool launch) const {
  auto task_for = [&](v1::TaskKind kind) {
    v1::CoordinatorMessage m;
    v1::Task* t = m.mutable_task();
    t->set_id(
        fmt::format("{}/{}/{}", plan.plan.id(), stage.stage(), cluster::task_kind_name(kind)));
    t->set_plan_id(plan.plan.id());
    t->set_kind(kind);
    *t->mutable_model() = plan.model;
    t->set_stage(stage.stage());
    t->set_stages(plan.plan.stages());
    t->set_gpu(stage.gpu());
    t->set_full_memory(stage.full_memory());
    // The full-memory worker of stage 0 will hold the whole model after scale-down (§6.1):
    // it fetches the rest at background class once its stage is in.
    t->set_consolidate(kind == v1::TASK_FETCH && stage.full_memory() && stage.stage() == 0 &&
                       plan.plan.stages() > 1);
    return m;
  };
  out.push_back({stage.node_id(), task_for(v1::TASK_FETCH)});
  if (config_.launch_workers && launch) {
    v1::CoordinatorMessage m;
    *m.mutable_task() = launch_task(plan, stage, false);
    out.push_back({stage.node_id(), std::move(m)});
  }
}

std::expected<v1::Plan, std::string> ClusterState::plan_cold_start(const v1::ModelSpec& model,
                                                                   double now,
                                                                   std::vector<Outbound>& out) {
  if (auto f = failed_cold_starts_.find(model.name()); f != failed_cold_starts_.end()) {
    if (now < f->second.second) {
      return std::unexpected(fmt::format("{}; no new cold start of it for {:.0f} s",
                                         f->second.first, f->second.second - now));
    }
    failed_cold_starts_.erase(f);
  }
  // The snapshot Alg. 1 runs on: live nodes with GPUs; b_x is what a new worker would get
  // on the node's link shared with the fetches it is running (Eq. 3's B/(N+1)), and a node
  // whose running fetches would miss their deadlines at that share is left out (Eq. 3 with
  // the smallest stage a plan can have, M/4). Running fetches have no deadline here (SLOs
  // are on the whole cold start), so the check bites only on nodes with pending bytes that
  // the slower share would push past the TTFT SLO.
  std::vector<policy::ServerState> servers;
  std::vector<std::string> node_of;
  const double slo_ttft = model.slo_ttft_s() > 0 ? model.slo_ttft_s() : kNoSlo;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive || node.report.gpus_size() == 0) continue;
    // A shaping node guarantees its cold starts' fetches only the critical class's share of
    // the link (the rest is reserved for inference and the node's other traffic), so Eq. 3
    // and b_x use that share there, not the whole link.
    const double bandwidth = policy::cold_start_fetch_bytes_per_s(
        node.report.network_bytes_per_s() > 0 ? node.report.network_bytes_per_s() : 16e9 / 8,
        node.report.shapes_traffic(), config_.class_reserve);
    policy::ServerNetwork network(bandwidth, now);
    for (const v1::TaskStatus& t : node.report.tasks()) {
      if (t.task().kind() != v1::TASK_FETCH || t.state() != v1::TASK_RUNNING) continue;
      const double pending = t.bytes_total() > t.bytes_done()
                                 ? static_cast<double>(t.bytes_total() - t.bytes_done())
                                 : stage_bytes(t.task().model(), t.task().stages());
      network.add(now, {pending, now + slo_ttft});
    }
    if (!network.admits(now, {stage_bytes(model, 4), now + slo_ttft})) continue;
    policy::ServerState s;
    s.id = static_cast<std::uint32_t>(servers.size());
    s.network_bytes_per_s = network.share_for_next();
    s.pcie_bytes_per_s = node_pcie(node.report);
    for (const v1::GpuInfo& g : node.report.gpus()) {
      s.gpus.push_back({static_cast<double>(g.free_bytes()), g.runs_worker()});
    }
    servers.push_back(std::move(s));
    node_of.push_back(id);
  }
  policy::AllocationRequest request;
  request.model_bytes = static_cast<double>(model.size_bytes());
  request.costs = startup_costs();
  request.costs.prefill = model.prefill_s();
  request.costs.decode = model.decode_s();
  request.slo_ttft = slo_ttft;
  request.slo_tpot = model.slo_tpot_s() > 0 ? model.slo_tpot_s() : kNoSlo;
  request.overlapped = true;  // thaw streams weights while the engine starts (Eq. 5)
  auto allocation = policy::allocate_resources(request, servers);
  if (!allocation) {
    return std::unexpected(fmt::format(
        "no live node has a GPU with {} bytes free for {} ({} live node(s) with GPUs considered); "
        "free a slot (thawctl evict) or add a node",
        model.size_bytes(), model.name(), servers.size()));
  }
  PlanRecord record;
  record.model = model;
  v1::Plan& plan = record.plan;
  plan.set_id(fmt::format("{}-{}", config_.plan_prefix, next_plan_++));
  plan.set_model(model.name());
  plan.set_stages(static_cast<std::uint32_t>(allocation->stages));
  plan.set_predicted_ttft_s(allocation->ttft);
  plan.set_predicted_tpot_s(allocation->tpot);
  plan.set_meets_slo(allocation->meets_slo);
  for (std::size_t i = 0; i < allocation->workers.size(); ++i) {
    const policy::WorkerPlacement& w = allocation->workers[i];
    v1::PlannedStage* stage = plan.add_placement();
    stage->set_stage(static_cast<std::uint32_t>(i));
    stage->set_node_id(node_of.at(w.server));
    stage->set_gpu(w.gpu);
    stage->set_full_memory(w.full_memory || allocation->stages == 1);
    stage->set_fetch_state(v1::TASK_RUNNING);
  }
  if (config_.launch_workers) {
    assign_ports(record);
    plan.set_phase(v1::PHASE_COLD_STARTING);
  }
  for (const v1::PlannedStage& stage : plan.placement()) send_stage_tasks(record, stage, out);
  set_routes(record);
  const std::string id = plan.id();
  plans_[id] = std::move(record);
  return plans_[id].plan;
}

std::optional<std::pair<std::string, std::uint32_t>> ClusterState::replacement_for(
    const PlanRecord& plan, double bytes) const {
  std::set<std::string> in_plan;
  for (const v1::PlannedStage& s : plan.plan.placement()) in_plan.insert(s.node_id());
  // Alg. 1's ranking (1/b + 1/p, smaller first) among live nodes with a GPU that fits the
  // stage; a node not yet in the plan first, so two stages do not share a link.
  std::optional<std::tuple<bool, double, std::string, std::uint32_t>> best;
  for (const auto& [id, node] : nodes_) {
    if (!node.alive) continue;
    const double b =
        node.report.network_bytes_per_s() > 0 ? node.report.network_bytes_per_s() : 2e9;
    const double rank = 1 / b + 1 / node_pcie(node.report);
    for (const v1::GpuInfo& g : node.report.gpus()) {
      if (static_cast<double>(g.free_bytes()) < bytes) continue;
      auto candidate = std::make_tuple(in_plan.contains(id), rank, id, g.index());
      if (!best || candidate < *best) best = candidate;
    }
  }
  if (!best) return std::nullopt;
  return std::make_pair(std::get<2>(*best), std::get<3>(*best));
}

void ClusterState::replan_stages_of(const std::string& dead_node, std::vector<Outbound>& out) {
  for (auto& [id, plan] : plans_) {
    if (plan.failed) continue;
    // Workers wired to the dead node's stage cannot serve: with workers, every stage of a
    // pipeline still starting or serving is launched again (relaunch). Later phases keep
    // their standalone workers; the hand-over carries on without the dead stage.
    const bool rewire = config_.launch_workers && (plan.plan.phase() == v1::PHASE_COLD_STARTING ||
                                                   plan.plan.phase() == v1::PHASE_PIPELINED);
    std::set<std::uint32_t> moved;
    for (int i = 0; i < plan.plan.placement_size(); ++i) {
      v1::PlannedStage* stage = plan.plan.mutable_placement(i);
      if (stage->node_id() != dead_node) continue;
      const double bytes = stage->full_memory() ? static_cast<double>(plan.model.size_bytes())
                                                : stage_bytes(plan.model, plan.plan.stages());
      auto target = replacement_for(plan, bytes);
      if (!target) {
        // No live node fits it: shown as failed in the state; a new cold start re-plans.
        stage->set_fetch_state(v1::TASK_FAILED);
        continue;
      }
      stage->set_node_id(target->first);
      stage->set_gpu(target->second);
      // New ports on the new node (a relaunch below gives every stage new ones).
      stage->set_pipeline_port(0);
      stage->set_http_port(0);
      stage->set_worker_state(v1::TASK_STATE_UNSPECIFIED);
      stage->set_worker_ready(false);
      if (config_.launch_workers) assign_ports(plan);
      stage->set_fetch_state(v1::TASK_RUNNING);
      stage->set_bytes_done(0);
      stage->set_replans(stage->replans() + 1);
      send_stage_tasks(plan, *stage, out, /*launch=*/!rewire);
      if (rewire) moved.insert(stage->stage());
    }
    if (!moved.empty()) relaunch(plan, moved, out);
  }
}

v1::FrontendReply ClusterState::on_frontend_request(const v1::FrontendRequest& request, double now,
                                                    std::vector<Outbound>& out) {
  v1::FrontendReply reply;
  switch (request.body_case()) {
    case v1::FrontendRequest::kDeploy: {
      const v1::ModelSpec& model = request.deploy().model();
      models_[model.name()] = model;
      *reply.mutable_deployed() = model;
      break;
    }
    case v1::FrontendRequest::kColdStart: {
      auto model = models_.find(request.cold_start().model());
      if (model == models_.end()) {
        reply.set_error(
            fmt::format("model {} is not deployed: deploy it first (thawctl cluster "
                        "deploy {} --size BYTES ...)",
                        request.cold_start().model(), request.cold_start().model()));
        break;
      }
      auto plan = plan_cold_start(model->second, now, out);
      if (!plan) {
        reply.set_error(plan.error());
      } else {
        *reply.mutable_plan() = std::move(*plan);
      }
      break;
    }
    case v1::FrontendRequest::kLoad: {
      if (!models_.contains(request.load().model())) {
        reply.set_error(fmt::format("model {} is not deployed", request.load().model()));
        break;
      }
      ModelLoad& load = load_[request.load().model()];
      const double concurrent = request.load().concurrent_requests();
      load.sum += concurrent;
      load.max = std::max(load.max, concurrent);
      ++load.samples;
      load.active_instances = request.load().active_instances();
      load.requests_per_s = request.load().requests_per_s();
      if (!window_) window_ = static_cast<std::int64_t>(std::floor(now / config_.window_s));
      *reply.mutable_deployed() = models_[request.load().model()];
      break;
    }
    case v1::FrontendRequest::kState:
      *reply.mutable_state() = snapshot(now);
      break;
    default:
      reply.set_error("empty request");
  }
  return reply;
}

v1::ClusterState ClusterState::snapshot(double now) const {
  v1::ClusterState state;
  for (const auto& [id, node] : nodes_) {
    v1::NodeState* n = state.add_nodes();
    n->set_node_id(id);
    n->set_alive(node.alive);
    n->set_seconds_since_heard(now - node.last_heard);
    *n->mutable_report() = node.report;
  }
  for (const auto& [name, model] : models_) *state.add_models() = model;
  for (const auto& [id, plan] : plans_) *state.add_plans() = plan.plan;
  for (const auto& [name, load] : load_) {
    v1::ModelLoadState* l = state.add_loads();
    l->set_model(name);
    l->set_windows(static_cast<std::uint32_t>(load.average.size()));
    if (!load.average.empty()) {
      l->set_last_average(load.average.back());
      l->set_last_peak(load.peak.back());
    }
    l->set_predicted_average(load.predicted_average);
    l->set_predicted_peak(load.predicted_peak);
    l->set_active_instances(load.active_instances);
    l->set_replicas_wanted(load.replicas_wanted);
  }
  state.set_window_s(config_.window_s);
  state.set_prewarm_rounds(prewarm_rounds_);
  return state;
}

}  // namespace thaw::coordinator
