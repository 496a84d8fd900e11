// ClusterState: what the coordinator knows of the cluster and decides from it — the logic of
// thaw-coordinator without sockets or clocks (both are the caller's: `now` is seconds on a
// monotonic clock), so every rule here is unit-tested directly.
//
//   nodes     each registered agent's latest report (GPUs, link, cache, slots, tasks),
//             when it was last heard, alive or dead (Paranoid Pirate: silent for
//             liveness × interval → dead);
//   models    what frontends deployed (name, size, layers, SLOs, costs) and their load;
//   plans     cold starts: s pipeline stages, each on a node's GPU, from HydraServe's Alg. 1
//             on a snapshot of the live nodes, with each stage's fetch progress.
//
// Restart: nothing is persisted. A coordinator that comes back knows no node; an agent that
// heartbeats to it is told to re-register, and its registration carries every task it holds
// (with the model spec and plan id), from which the models and plans are rebuilt.
// Death: a dead node's stages are placed again on live nodes (the same ranking, excluding
// nodes already in the plan where possible) and their tasks sent there.
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/proto/cluster/cluster.pb.h"
#include "coordinator/policy/hydraserve_prediction.hpp"

namespace thaw::coordinator {

namespace v1 = thaw::cluster::v1;

struct ClusterConfig {
  double heartbeat_interval_s = 1.0;
  int liveness = 3;
  // Costs Alg. 1 adds to a model's own (runtime start-up, §4.1's t_c / t_cc, t_cu, t_l).
  policy::ColdStartCosts startup;
  bool launch_workers = false;  // plans also launch an engine per stage (agent's worker command)
  // WarmServe: load reports are folded into windows of this length; at each window's end the
  // next window's average and peak load are predicted (CSP, Eq. 2–4), replica demand and
  // scores computed (Eq. 5–8) and the missing replicas placed (Alg. 1) as PREWARM tasks.
  double window_s = 300;
  std::uint32_t batch_size = 32;  // B: requests one instance serves (WarmServe §7.1)
  std::string plan_prefix = "p";  // plan ids are "<prefix>-<n>"; unique per coordinator run
};

struct Outbound {
  std::string node_id;
  v1::CoordinatorMessage message;
};

struct NodeRecord {
  v1::Register report;
  double last_heard = 0;
  double last_heartbeat_sent = -1e300;
  bool alive = true;
};

struct PlanRecord {
  v1::Plan plan;
  v1::ModelSpec model;
};

// A model's load history, one entry per closed window, and the window being collected.
struct ModelLoad {
  std::vector<double> average;  // mean of the concurrent requests reported in each window
  std::vector<double> peak;     // their maximum
  double sum = 0, max = 0;      // the open window
  std::uint32_t samples = 0;
  std::uint32_t active_instances = 0;  // K, as last reported
  double requests_per_s = 0;
  double predicted_average = 0, predicted_peak = 0;  // at the last prewarm round
  std::uint32_t replicas_wanted = 0;
};

class ClusterState {
 public:
  explicit ClusterState(ClusterConfig config);

  // A validated message from a node (its identity already checked against its key).
  std::vector<Outbound> on_node_message(const std::string& node_id, const v1::NodeMessage& message,
                                        double now);
  // Heartbeats due, nodes found dead (their ids in `died`) and their stages re-planned.
  std::vector<Outbound> tick(double now, std::vector<std::string>* died = nullptr);
  // A validated frontend request; tasks it causes go to `out`.
  v1::FrontendReply on_frontend_request(const v1::FrontendRequest& request, double now,
                                        std::vector<Outbound>& out);

  v1::ClusterState snapshot(double now) const;
  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }
  const std::map<std::string, PlanRecord>& plans() const { return plans_; }
  const std::map<std::string, ModelLoad>& loads() const { return load_; }
  std::uint64_t prewarm_rounds() const { return prewarm_rounds_; }
  // Seconds until tick() has something to do (the next heartbeat or liveness deadline).
  double next_deadline(double now) const;

 private:
  std::expected<v1::Plan, std::string> plan_cold_start(const v1::ModelSpec& model, double now,
                                                       std::vector<Outbound>& out);
  void send_stage_tasks(PlanRecord& plan, const v1::PlannedStage& stage,
                        std::vector<Outbound>& out) const;
  void replan_stages_of(const std::string& dead_node, std::vector<Outbound>& out);
  void rebuild_from(const std::string& node_id, const v1::Register& report);
  void apply_progress(const std::string& node_id, const v1::TaskStatus& status,
                      std::vector<Outbound>& out);
  // Scale-down once the consolidating stage holds the whole model (HydraServe §6).
  void consolidate(PlanRecord& plan, std::vector<Outbound>& out);
  std::optional<std::pair<std::string, std::uint32_t>> replacement_for(const PlanRecord& plan,
                                                                       double stage_bytes) const;
  // Closes the windows that ended before `now`; a prewarm round after each closing.
  void close_windows(double now, std::vector<Outbound>& out);
  void prewarm_round(std::int64_t window, std::vector<Outbound>& out);

  ClusterConfig config_;
  std::map<std::string, NodeRecord> nodes_;
  std::map<std::string, v1::ModelSpec> models_;
  std::map<std::string, ModelLoad> load_;
  std::optional<std::int64_t> window_;  // index of the open window (now / window_s)
  std::uint64_t prewarm_rounds_ = 0;
  std::map<std::string, PlanRecord> plans_;
  std::uint64_t next_plan_ = 1;
};

}  // namespace thaw::coordinator
