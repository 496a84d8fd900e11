// Which faults are worth retrying, and how long to wait before the next attempt.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "daemon/store/registry/fetch_error.hpp"

namespace thaw::store {

struct Fault {
  bool permanent = false;
  FetchErrc code = FetchErrc::transport;  // used when permanent
  std::string cause;                      // "HTTP 503", "connection reset (…)", …
  long http_status = 0;
};

// 404/410 not_found, 401/403 forbidden, 416 range_not_satisfiable, other 4xx permanent
// http_status; 408, 425, 429 and every 5xx transient.
Fault classify_http_status(long status);

// A transfer that ended with `code` (not CURLE_OK, not CURLE_HTTP_RETURNED_ERROR).
// Malformed URLs, unsupported protocols, redirect loops and TLS certificate failures
// are permanent; connection failures, resets, timeouts and short bodies are transient.
Fault classify_transfer_failure(CURLcode code, const char* error_detail);

// Delay before retry number `failures` (1 for the first retry): initial·2^(failures-1),
// capped at `max`, scaled by `jitter` ∈ [0, 1] into [50 %, 100 %] of that.
std::chrono::milliseconds backoff_delay(std::uint32_t failures, std::chrono::milliseconds initial,
                                        std::chrono::milliseconds max, double jitter);

}  // namespace thaw::store
