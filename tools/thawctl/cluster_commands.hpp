// thawctl cluster …: a REQ client of thaw-coordinator's frontend endpoint.
//
//   deploy MODEL --size SIZE [--layers N] [--ttft S] [--tpot S] [--prefill S] [--decode S]
//   cold-start MODEL                 plan a cold start (HydraServe Alg. 1) and send its tasks
//   load MODEL --concurrent N [--instances K] [--rps R]   report a model's load
//   state                            nodes (alive, last heard, GPUs, tasks), models, plans
//
// The coordinator is $THAW_COORDINATOR or ipc:///run/thaw-coordinator/frontend.sock unless
// --coordinator says otherwise; no reply within --timeout seconds is exit 1.
#pragma once

#include <string>

#include "common/proto/cluster/cluster.pb.h"

namespace thawctl {

struct ClusterOptions {
  std::string endpoint;
  double timeout_s = 5;
  bool json = false;
};

// Each returns the exit code (bus_client.hpp's kExit*) or throws Failure.
int cluster_deploy(const thaw::cluster::v1::ModelSpec& model, const ClusterOptions& o);
int cluster_cold_start(const std::string& model, const ClusterOptions& o);
int cluster_load(const std::string& model, double concurrent_requests, unsigned active_instances,
                 double requests_per_s, const ClusterOptions& o);
int cluster_state(const ClusterOptions& o);

}  // namespace thawctl
