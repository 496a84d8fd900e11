#include "daemon/store/fetch/model_fetch_error.hpp"

namespace thaw::store {

std::string_view to_string(ModelFetchErrc code) {
  switch (code) {
    case ModelFetchErrc::invalid_argument:
      return "invalid_argument";
    case ModelFetchErrc::registry:
      return "registry";
    case ModelFetchErrc::model:
      return "model";
    case ModelFetchErrc::cache:
      return "cache";
    case ModelFetchErrc::cache_full:
      return "cache_full";
    case ModelFetchErrc::fetch:
      return "fetch";
    case ModelFetchErrc::integrity:
      return "integrity";
    case ModelFetchErrc::unverified:
      return "unverified";
    case ModelFetchErrc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

}  // namespace thaw::store
