// thawd's metrics in the OpenMetrics text format (what Prometheus-style scrapers of GPU
// clusters read): bytes fetched per class, fetches, prewarm hits and misses, activations,
// slots per state, fetch rate, cache use, shim connections and requests.
#pragma once

#include <string>

#include "daemon/network/network_config.hpp"
#include "daemon/service/node_service.hpp"
#include "daemon/shim_socket/shim_server.hpp"

namespace thaw::daemon {

// Safe from any thread (it reads the service and atomic counters only).
// `network`: traffic shaping's state and counters (the thaw_net_* families).
std::string render_openmetrics(const NodeService& service, const ShimSocketCounters& shim,
                               std::uint64_t cache_bytes_used, std::uint64_t cache_budget_bytes,
                               const NetStatus& network = {});

// The thaw_net_* families alone (no "# EOF"): shaping on/off, link rate, the coordinator's
// cold starts here, and per class (inference, critical_fetch, background_fetch, other) the
// rate and ceiling in force and bytes, packets and drops by direction (egress, ingress).
std::string render_network_openmetrics(const NetStatus& network);

}  // namespace thaw::daemon
