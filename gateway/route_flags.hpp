// --route MODEL=URL: the static route table of a gateway without a coordinator.
#pragma once

#include <expected>
#include <string>
#include <vector>

#include "gateway/router.hpp"

namespace thaw::gateway {

// Each flag names one serving worker of a model ("m=http://10.0.0.7:8000"); a model may be
// named several times. A URL is http://HOST:PORT with nothing after it.
std::expected<RouteMap, std::string> parse_route_flags(const std::vector<std::string>& flags);

// Parses "250ms", "30s", "2m" (a bare number is seconds).
std::expected<std::chrono::milliseconds, std::string> parse_duration(const std::string& text);
// Parses "1048576", "64KiB", "1MiB", "2GiB".
std::expected<std::size_t, std::string> parse_bytes(const std::string& text);

}  // namespace thaw::gateway
