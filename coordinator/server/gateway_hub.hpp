// GatewayHub: the coordinator's side of thaw-gateway (cluster.proto's gateway section).
//
//   subscribers  gateways (DEALERs on the frontend endpoint, by routing id) heard from within
//                three of their report intervals; each gets the route table whenever it
//                changes;
//   loads        each gateway's latest LoadReport per model; a model's load is their sum over
//                live gateways (several gateways may run, each sees part of the traffic) —
//                the input of HydraServe §6.1's sliding window, read by the scaling logic;
//   routes       the table: every deployed model, and per plan the stages whose worker takes
//                client requests (PlannedStage.route_state, set by the worker tracking), or
//                one cold-starting entry while a plan has none yet.
//
// No sockets or clocks here (`now` is the server's monotonic seconds): unit-tested directly.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/proto/cluster/cluster.pb.h"
#include "coordinator/cluster/cluster_state.hpp"

namespace thaw::coordinator {

// A model's load summed over the gateways that reported it.
struct GatewayLoad {
  double concurrent_requests = 0;
  std::uint64_t queue_length = 0;
  std::uint64_t arrivals = 0;  // in the gateways' last windows
  double requests_per_s = 0;   // the sum of their arrival rates
  std::uint32_t gateways = 0;  // that reported this model
};

class GatewayHub {
 public:
  // Subscribes (or keeps subscribed) the gateway behind `routing_id`. True when it is new.
  bool hello(const std::string& routing_id, const v1::GatewayHello& hello, double now);
  // A load report from a gateway (its gateway_id; "" counts as one anonymous gateway).
  void load(const v1::LoadReport& report, double now);
  // The live subscribers' routing ids; forgets the silent ones (and their loads).
  std::vector<std::string> subscribers(double now);
  // Per model, over live gateways.
  std::map<std::string, GatewayLoad> loads(double now) const;

  // The route table of `plans` and `deployed` models (generation not set).
  static v1::RouteTable routes(const std::map<std::string, PlanRecord>& plans,
                               const std::set<std::string>& deployed);
  // Records `fresh` as the current table; returns it with a new generation when it differs
  // from the last one recorded (then it must be pushed), nothing otherwise.
  std::optional<v1::RouteTable> update(v1::RouteTable fresh);
  // The current table (with its generation), for a hello's reply.
  const v1::RouteTable& current() const { return current_; }

 private:
  struct Subscriber {
    std::string gateway_id;
    double interval_s = 1;
    double last_heard = 0;
  };
  struct Report {
    v1::LoadReport report;
    double at = 0;
  };
  double expiry(const std::string& gateway_id) const;

  std::map<std::string, Subscriber> subscribers_;                  // by routing id
  std::map<std::pair<std::string, std::string>, Report> reports_;  // (gateway id, model)
  v1::RouteTable current_;
  std::string current_bytes_;
};

}  // namespace thaw::coordinator
