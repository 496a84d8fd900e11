#include "daemon/store/registry/retry_policy.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::store {

Fault classify_http_status(long status) {
  Fault fault;
  fault.http_status = status;
  fault.cause = fmt::format("HTTP {}", status);
  if (status >= 500 || status == 408 || status == 425 || status == 429) {
    fault.permanent = false;
    return fault;
  }
  fault.permanent = true;
  switch (status) {
    case 404:
    case 410:
      fault.code = FetchErrc::not_found;
      break;
    case 401:
    case 403:
      fault.code = FetchErrc::forbidden;
      break;
    case 416:
      fault.code = FetchErrc::range_not_satisfiable;
      break;
    default:
      fault.code = FetchErrc::http_status;
      break;
  }
  return fault;
}

Fault classify_transfer_failure(CURLcode code, const char* error_detail) {
  Fault fault;
  std::string detail = (error_detail != nullptr && error_detail[0] != '\0')
                           ? std::string(error_detail)
                           : std::string(curl_easy_strerror(code));
  switch (code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_TOO_MANY_REDIRECTS:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
    case CURLE_LOGIN_DENIED:
    case CURLE_REMOTE_ACCESS_DENIED:
    case CURLE_NOT_BUILT_IN:
    case CURLE_BAD_FUNCTION_ARGUMENT:
      fault.permanent = true;
      fault.code = FetchErrc::transport;
      fault.cause = detail;
      return fault;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
      fault.cause = fmt::format("connection reset or broken ({})", detail);
      return fault;
    case CURLE_PARTIAL_FILE:
      fault.cause = fmt::format("truncated body ({})", detail);
      return fault;
    case CURLE_OPERATION_TIMEDOUT:
      fault.cause = fmt::format("timeout ({})", detail);
      return fault;
    case CURLE_COULDNT_CONNECT:
      fault.cause = fmt::format("cannot connect ({})", detail);
      return fault;
    default:
      fault.cause = detail;
      return fault;
  }
}

std::chrono::milliseconds backoff_delay(std::uint32_t failures, std::chrono::milliseconds initial,
                                        std::chrono::milliseconds max, double jitter) {
  failures = std::max<std::uint32_t>(failures, 1);
  double delay = static_cast<double>(initial.count());
  for (std::uint32_t i = 1; i < failures && delay < static_cast<double>(max.count()); ++i) {
    delay *= 2;
  }
  delay = std::min(delay, static_cast<double>(max.count()));
  delay *= 0.5 + 0.5 * std::clamp(jitter, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<std::int64_t>(delay));
}

}  // namespace thaw::store
