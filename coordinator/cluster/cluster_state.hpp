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
//
// Workers (launch_workers): each stage's engine is launched wired to its peers (ports from
// the coordinator's range, hosts as the nodes report them), and a plan walks the phases of
// HydraServe §6 (consolidation.cpp): cold-starting → pipelined (stage 0 answers health; it is
// the route) → loading (the consolidating fetch is done: a standalone worker starts on the
// full-memory stage's node, or on every full-memory stage's for scale-up) → hand-over (the
// standalone worker(s) are the routes; the pipeline drains, or its requests' KV migrates) →
// stopping (no request left on the pipeline: its workers are told to stop) → consolidated.
// Every step is decided from what nodes report, so a restarted coordinator resumes it (a plan
// rebuilt in the hand-over asks stage 0's engine to drain, once a gateway has its routes). A
// stage's worker that exits while cold-starting: the pipeline is relaunched once, then the
// cold start fails (no route; the model's cold starts refused with the reason for a while).
#pragma once

#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/proto/cluster/cluster.pb.h"
#include "coordinator/policy/hydraserve_class_rates.hpp"
#include "coordinator/policy/hydraserve_prediction.hpp"

namespace thaw::coordinator {

namespace v1 = thaw::cluster::v1;

struct ClusterConfig {
  double heartbeat_interval_s = 1.0;
  int liveness = 3;
  // Costs Alg. 1 adds to a model's own (runtime start-up, §4.1's t_c / t_cc, t_cu, t_l).
  policy::ColdStartCosts startup;
  bool launch_workers = false;  // plans also launch an engine per stage (agent's worker command)
  // Ports the coordinator hands out for workers' pipeline links and HTTP servers, on every
  // node: [worker_port_base, worker_port_base + worker_port_count).
  std::uint32_t worker_port_base = 20000;
  std::uint32_t worker_port_count = 10000;
  // How in-flight requests leave the pipeline at consolidation: drained (they finish on it;
  // works with any engine) or moved with their KV cache (the engine's KV-transfer endpoint).
  enum class Handover { drain, kv_transfer };
  Handover handover = Handover::drain;
  // Alg. 1's start-up costs: `startup` above until the nodes have measured `min_samples`
  // worker starts; then their measured averages (t_cc, t_cu, t_l; t_c = their sum).
  bool measured_startup = true;
  std::uint32_t min_startup_samples = 1;
  // HydraServe §6.1: a consolidated worker with no request for this long is released.
  double keep_alive_s = 60;
  std::uint32_t scaling_batch = 8;  // requests one new worker takes (the authors' value)
  // WarmServe: load reports are folded into windows of this length; at each window's end the
  // next window's average and peak load are predicted (CSP, Eq. 2–4), replica demand and
  // scores computed (Eq. 5–8) and the missing replicas placed (Alg. 1) as PREWARM tasks.
  double window_s = 300;
  std::uint32_t batch_size = 32;  // B: requests one instance serves (WarmServe §7.1)
  std::string plan_prefix = "p";  // plan ids are "<prefix>-<n>"; unique per coordinator run
  // A hand-over of a plan rebuilt after a restart stops the pipeline only once a gateway has
  // the routes that send requests to the standalone worker (a restarted coordinator has no
  // subscriber until a gateway's next hello, one report interval, 1 s by default); with no
  // gateway heard for this long it goes on without.
  double handover_resume_grace_s = 3;
  // A stage's worker that exits during the cold start: the pipeline is launched again this
  // many times, then the cold start fails and the model's next ones are refused (with the
  // reason) for failed_cold_start_backoff_s, so gateways answer their held requests at once.
  std::uint32_t cold_start_relaunches = 1;
  double failed_cold_start_backoff_s = 10;
  // Shares of a node's link guaranteed to inference, background and other traffic while cold
  // starts fetch there: the ClassRates sent to shaping nodes (ClassRateDispatch), and so
  // what placement's Eq. 3 leaves to the cold starts on a node that reports shapes_traffic.
  policy::ClassReserve class_reserve;
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
  std::uint32_t wanted = 1;                 // workers the model wants from this group (§6.1)
  double handover_since = -1;               // when routes switched (hand-over phase)
  double in_flight_reported_at = -1;        // when `plan.in_flight` was last reported
  bool migration_started = false;           // kv-transfer asked of the engines
  double idle_since = -1;                   // consolidated, no request (keep-alive)
  std::set<std::uint32_t> whole_model_on;   // stages whose node has fetched the whole model
  std::set<std::uint32_t> rest_fetch_sent;  // scale-up: stages asked to fetch the rest
  std::set<std::uint32_t> stop_sent;        // pipeline workers told to stop
  std::uint32_t generation = 0;             // of the pipeline's launches (relaunch())
  std::uint32_t exit_relaunches = 0;        // relaunches for a worker that exited cold-starting
  bool failed = false;                      // the cold start failed: erased at the next tick
};

// A model's load as the gateways see it (HydraServe §6.1's inputs).
struct GatewayDemand {
  std::uint32_t queue_length = 0;  // requests held for want of a serving worker
  double concurrent_requests = 0;  // in flight on workers
  std::uint64_t arrivals = 0;      // in the gateways' last window
};

// A KV migration the coordinator wants from the engines (§6.2): every request in flight on
// the pipeline whose first stage serves at `from_url` moves to the standalone worker at
// `to_url`; the caller (the server) drives the engines' KV-transfer endpoints and reports the
// outcome with on_migration_result.
struct MigrationOrder {
  std::string plan_id;
  bool drain = false;  // hand-over by drain: ask the pipeline to finish (where it can say so)
  std::string from_url;
  std::string to_url;
  std::vector<std::string> stage_urls;  // every stage's pipeline worker (HTTP), for the gather
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

  // Gateways' view of a model's load (§6.1): the sliding window decides how many workers it
  // needs (queue + the previous window's peak arrivals), starts pipeline groups for what is
  // missing (several for a surge), and records how many workers the model wants so each
  // group ends scaled down (one worker) or up (one per full-memory stage).
  void on_gateway_demand(const std::string& model, const GatewayDemand& demand, double now,
                         std::vector<Outbound>& out);
  // Requests in flight on the worker serving at `url`. A draining pipeline is stopped once
  // its count is 0 in a report made after the switch. (No gateway reports per-worker counts
  // yet, so the server never calls this: drains end by the engine's answer.)
  void on_worker_in_flight(const std::string& url, std::uint32_t in_flight, double now,
                           std::vector<Outbound>& out);
  // A route table made from the current plans reached a gateway (a hello's reply or a push):
  // hand-overs resumed after a restart may now drain the pipeline.
  void on_routes_delivered(double now, std::vector<Outbound>& out);
  // KV migrations (or engine drains) to carry out (each returned once).
  std::vector<MigrationOrder> take_migrations();
  // The outcome of one: done → the pipeline stops; failed → its requests drain instead
  // (gateways retry any that broke, from the prompt, on the standalone worker).
  void on_migration_result(const std::string& plan_id, bool ok, const std::string& error,
                           double now, std::vector<Outbound>& out);
  // The start-up costs Alg. 1 uses now (configured, or the nodes' measured averages).
  policy::ColdStartCosts startup_costs() const;
  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }
  const std::map<std::string, PlanRecord>& plans() const { return plans_; }
  const std::map<std::string, ModelLoad>& loads() const { return load_; }
  std::uint64_t prewarm_rounds() const { return prewarm_rounds_; }
  // Seconds until tick() has something to do (the next heartbeat or liveness deadline).
  double next_deadline(double now) const;

 private:
  std::expected<v1::Plan, std::string> plan_cold_start(const v1::ModelSpec& model, double now,
                                                       std::vector<Outbound>& out);
  // Its fetch, and (with workers, unless `launch` is false) its worker's launch.
  void send_stage_tasks(PlanRecord& plan, const v1::PlannedStage& stage, std::vector<Outbound>& out,
                        bool launch = true) const;
  // consolidation.cpp: ports, wiring, and the §6 phases.
  void assign_ports(PlanRecord& plan);
  std::uint32_t take_port(const std::string& node_id);
  std::vector<std::uint32_t> standalone_stages(const PlanRecord& plan) const;
  std::string worker_host(const std::string& node_id) const;
  v1::Task launch_task(const PlanRecord& plan, const v1::PlannedStage& stage,
                       bool standalone) const;
  v1::Task stop_task(const PlanRecord& plan, const v1::PlannedStage& stage, bool standalone,
                     std::optional<std::uint32_t> generation = std::nullopt) const;
  // A stage moved while the pipeline starts or serves: every stage is launched again wired
  // to the new peers (new ports), the older launches stopped.
  void relaunch(PlanRecord& plan, const std::set<std::uint32_t>& moved, std::vector<Outbound>& out);
  void apply_worker_progress(PlanRecord& plan, const std::string& node_id,
                             const v1::TaskStatus& status);
  void advance(PlanRecord& plan, double now, std::vector<Outbound>& out);
  // The hand-over's MigrationOrder (a KV migration or an engine drain), once per plan.
  void order_handover(PlanRecord& plan, double now);
  // A rebuilt plan's hand-over held back until a gateway has its routes (order_handover).
  static bool waits_for_routes(const PlanRecord& plan);
  // The plan's workers stopped, the plan marked failed (no route; erase_failed_plans drops
  // it) and the model's cold starts refused for a while.
  void fail_cold_start(PlanRecord& plan, const std::string& why, double now,
                       std::vector<Outbound>& out);
  void erase_failed_plans();
  void set_routes(PlanRecord& plan) const;
  void rebuild_workers_from(const std::string& node_id, const v1::Register& report);
  void replan_stages_of(const std::string& dead_node, std::vector<Outbound>& out);
  void rebuild_from(const std::string& node_id, const v1::Register& report);
  void apply_progress(const std::string& node_id, const v1::TaskStatus& status,
                      std::vector<Outbound>& out);
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
  std::uint32_t next_port_ = 0;  // offset into the port range
  std::vector<MigrationOrder> migrations_;
  std::map<std::string, std::uint64_t> previous_arrivals_;  // §6.1: last window's, per model
  double last_now_ = 0;
  double routes_delivered_at_ = -1;  // on_routes_delivered
  // model → why its last cold start failed, and until when its cold starts are refused
  std::map<std::string, std::pair<std::string, double>> failed_cold_starts_;
};

}  // namespace thaw::coordinator
