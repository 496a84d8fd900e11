// thawd's metrics in the OpenMetrics text format (what Prometheus-style scrapers of GPU
// clusters read): bytes fetched per class, fetches, prewarm hits and misses, activations,
// slots per state, fetch rate, cache use, shim connections and requests.
#pragma once

#include <string>

#include "daemon/service/node_service.hpp"
#include "daemon/shim_socket/shim_server.hpp"

namespace thaw::daemon {

// Safe from any thread (it reads the service and atomic counters only).
std::string render_openmetrics(const NodeService& service, const ShimSocketCounters& shim,
                               std::uint64_t cache_bytes_used, std::uint64_t cache_budget_bytes);

}  // namespace thaw::daemon
