// Errors of the host cache and of readiness maps.
//
// Every failure is a value: a CacheErrc that callers branch on (no_space and
// over_budget ask for eviction or a bigger cache, corrupt means "drop and refetch",
// busy means "someone still uses it") and a one-line message that names the file or
// directory, the rule broken and, where there is one, what to do about it.
#pragma once

#include <expected>
#include <string>
#include <string_view>

namespace thaw::store {

enum class CacheErrc {
  invalid_argument,  // a bad key, path, range or geometry from the caller
  io_error,          // a system call failed for a reason not listed below
  no_space,          // the filesystem is full (ENOSPC / EDQUOT)
  over_budget,       // the configured cache size cannot be met (everything pinned)
  corrupt,           // a readiness map or cache entry failed validation
  not_found,         // no such model or file in the cache
  exists,            // creating something that already exists
  conflict,          // cached under the same name with a different size / chunk size
  busy,              // pinned or being created: cannot be removed now
  wrong_state,       // e.g. mark_complete() with chunks missing, failing a complete file
  not_a_cache,       // the root directory is not (and cannot become) a thaw cache
  locked,            // another process holds the cache root or the file's writer lock
  unsupported,       // the filesystem lacks something the cache needs (O_TMPFILE)
};

std::string_view to_string(CacheErrc code);

struct CacheError {
  CacheErrc code = CacheErrc::io_error;
  std::string message;
};

template <class T>
using CacheResult = std::expected<T, CacheError>;

inline std::unexpected<CacheError> cache_failure(CacheErrc code, std::string message) {
  return std::unexpected(CacheError{code, std::move(message)});
}

// "<what>: <strerror(err)>", coded no_space for ENOSPC/EDQUOT and io_error otherwise.
CacheError errno_error(int err, std::string_view what);

}  // namespace thaw::store
