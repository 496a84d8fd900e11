// Why a range fetch failed for good.
//
// Transient faults (5xx, resets, truncated bodies, stalls) never surface here: the
// fetcher retries and resumes them. A FetchError is what is left once a fault is known to
// be permanent (404, 403, 416, a sink that cannot take bytes) or the retries ran out; its
// message names the URL or path, the byte range and the last cause, on one line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace thaw::store {

enum class FetchErrc {
  not_found,              // HTTP 404/410 or a local file that does not exist
  forbidden,              // HTTP 401/403 or EACCES on a local file
  range_not_satisfiable,  // HTTP 416: the range lies outside the file
  http_status,            // any other status that retrying cannot fix
  retries_exhausted,      // transient faults outlasted the retry budget
  bad_request,            // the request itself is malformed (empty URL, zero length)
  transport,              // a libcurl failure that retrying cannot fix (bad URL, TLS)
  socket_tag,             // the configured SO_MARK / SO_PRIORITY could not be set
  local_io,               // reading a local source failed or it is shorter than the range
  file_changed,           // the server reports a different total size than expected
  sink,                   // the sink refused the bytes (e.g. the cache disk is full)
  cancelled,              // cancel() or cancel_file() stopped the request
};

std::string_view to_string(FetchErrc code);

struct FetchError {
  FetchErrc code = FetchErrc::transport;
  std::string message;   // one line, names URL/path, range and cause
  long http_status = 0;  // last HTTP status seen, 0 if none
};

}  // namespace thaw::store
