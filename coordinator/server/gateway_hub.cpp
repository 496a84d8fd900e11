#include "coordinator/server/gateway_hub.hpp"

#include <algorithm>

namespace thaw::coordinator {
namespace {

// A gateway that sent no interval is taken to report every second; one silent for three of
// its intervals is gone (the Paranoid Pirate rule the nodes follow too).
constexpr double kDefaultIntervalS = 1.0;
constexpr int kMissedIntervals = 3;

}  // namespace

bool GatewayHub::hello(const std::string& routing_id, const v1::GatewayHello& hello, double now) {
  auto [it, inserted] = subscribers_.try_emplace(routing_id);
  it->second.gateway_id = hello.gateway_id();
  it->second.interval_s =
      hello.report_interval_s() > 0 ? hello.report_interval_s() : kDefaultIntervalS;
  it->second.last_heard = now;
  return inserted;
}

double GatewayHub::expiry(const std::string& gateway_id) const {
  double interval = kDefaultIntervalS;
  for (const auto& [id, s] : subscribers_) {
    if (s.gateway_id == gateway_id) interval = std::max(interval, s.interval_s);
  }
  return kMissedIntervals * interval;
}

void GatewayHub::load(const v1::LoadReport& report, double now) {
  Report& r = reports_[{report.gateway_id(), report.model()}];
  r.report = report;
  r.at = now;
}

std::vector<std::string> GatewayHub::subscribers(double now) {
  std::vector<std::string> live;
  std::erase_if(subscribers_, [&](const auto& s) {
    return now - s.second.last_heard > kMissedIntervals * s.second.interval_s;
  });
  for (const auto& [id, s] : subscribers_) live.push_back(id);
  std::erase_if(reports_, [&](const auto& r) { return now - r.second.at > expiry(r.first.first); });
  return live;
}

std::map<std::string, GatewayLoad> GatewayHub::loads(double now) const {
  std::map<std::string, GatewayLoad> out;
  for (const auto& [key, r] : reports_) {
    if (now - r.at > expiry(key.first)) continue;
    GatewayLoad& l = out[key.second];
    l.concurrent_requests += r.report.concurrent_requests();
    l.queue_length += r.report.queue_length();
    l.arrivals += r.report.arrivals();
    l.requests_per_s += r.report.requests_per_s();
    ++l.gateways;
  }
  return out;
}

v1::RouteTable GatewayHub::routes(const std::map<std::string, PlanRecord>& plans,
                                  const std::set<std::string>& deployed) {
  std::map<std::string, std::vector<v1::WorkerRoute>> by_model;
  for (const std::string& model : deployed) by_model[model];
  for (const auto& [id, record] : plans) {
    if (record.failed) continue;  // its requests are answered, not held (fail_cold_start)
    const v1::Plan& plan = record.plan;
    std::vector<v1::WorkerRoute>& workers = by_model[plan.model()];
    bool any = false;
    for (const v1::PlannedStage& stage : plan.placement()) {
      // The standalone worker consolidation started on this stage's node (cluster_state.hpp).
      if (stage.standalone_route() != v1::WORKER_STATE_UNSPECIFIED &&
          !stage.standalone_url().empty()) {
        v1::WorkerRoute w;
        w.set_url(stage.standalone_url());
        w.set_state(stage.standalone_route());
        w.set_plan_id(plan.id());
        w.set_stage(stage.stage());
        w.set_node_id(stage.node_id());
        workers.push_back(std::move(w));
        any = true;
      }
      if (stage.route_state() == v1::WORKER_STATE_UNSPECIFIED) continue;
      // A serving or draining worker without an address cannot be routed to; the codec
      // would refuse the whole table for it.
      if (stage.worker_url().empty() && stage.route_state() != v1::WORKER_COLD_STARTING) continue;
      v1::WorkerRoute w;
      w.set_url(stage.worker_url());
      w.set_state(stage.route_state());
      w.set_plan_id(plan.id());
      w.set_stage(stage.stage());
      w.set_node_id(stage.node_id());
      workers.push_back(std::move(w));
      any = true;
    }
    if (!any) {
      // A plan whose workers are not tracked yet is a cold start in flight: gateways hold
      // its requests instead of asking for another one.
      v1::WorkerRoute w;
      w.set_state(v1::WORKER_COLD_STARTING);
      w.set_plan_id(plan.id());
      workers.push_back(std::move(w));
    }
  }
  v1::RouteTable table;
  for (auto& [model, workers] : by_model) {
    v1::ModelRoute* m = table.add_models();
    m->set_model(model);
    for (auto& w : workers) *m->add_workers() = std::move(w);
  }
  return table;
}

std::optional<v1::RouteTable> GatewayHub::update(v1::RouteTable fresh) {
  fresh.set_generation(0);
  std::string bytes = fresh.SerializeAsString();  // maps are ordered: equal tables, equal bytes
  if (bytes == current_bytes_ && current_.generation() != 0) return std::nullopt;
  current_bytes_ = std::move(bytes);
  fresh.set_generation(current_.generation() + 1);
  current_ = std::move(fresh);
  return current_;
}

}  // namespace thaw::coordinator
