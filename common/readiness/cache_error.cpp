#include "common/readiness/cache_error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace thaw::store {

std::string_view to_string(CacheErrc code) {
  switch (code) {
    case CacheErrc::invalid_argument:
      return "invalid_argument";
    case CacheErrc::io_error:
      return "io_error";
    case CacheErrc::no_space:
      return "no_space";
    case CacheErrc::over_budget:
      return "over_budget";
    case CacheErrc::corrupt:
      return "corrupt";
    case CacheErrc::not_found:
      return "not_found";
    case CacheErrc::exists:
      return "exists";
    case CacheErrc::conflict:
      return "conflict";
    case CacheErrc::busy:
      return "busy";
    case CacheErrc::wrong_state:
      return "wrong_state";
    case CacheErrc::not_a_cache:
      return "not_a_cache";
    case CacheErrc::locked:
      return "locked";
    case CacheErrc::unsupported:
      return "unsupported";
  }
  return "unknown";
}

CacheError errno_error(int err, std::string_view what) {
  const CacheErrc code =
      (err == ENOSPC || err == EDQUOT) ? CacheErrc::no_space : CacheErrc::io_error;
  return CacheError{code, fmt::format("{}: {}", what, std::strerror(err))};
}

}  // namespace thaw::store
