#include "daemon/store/registry/fetch_error.hpp"
#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

std::string_view to_string(FetchErrc code) {
  switch (code) {
    case FetchErrc::not_found:
      return "not_found";
    case FetchErrc::forbidden:
      return "forbidden";
    case FetchErrc::range_not_satisfiable:
      return "range_not_satisfiable";
    case FetchErrc::http_status:
      return "http_status";
    case FetchErrc::retries_exhausted:
      return "retries_exhausted";
    case FetchErrc::bad_request:
      return "bad_request";
    case FetchErrc::transport:
      return "transport";
    case FetchErrc::socket_tag:
      return "socket_tag";
    case FetchErrc::local_io:
      return "local_io";
    case FetchErrc::file_changed:
      return "file_changed";
    case FetchErrc::sink:
      return "sink";
    case FetchErrc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string_view to_string(RegistryErrc code) {
  switch (code) {
    case RegistryErrc::bad_spec:
      return "bad_spec";
    case RegistryErrc::not_found:
      return "not_found";
    case RegistryErrc::http_status:
      return "http_status";
    case RegistryErrc::transport:
      return "transport";
    case RegistryErrc::bad_listing:
      return "bad_listing";
    case RegistryErrc::local_io:
      return "local_io";
  }
  return "unknown";
}

}  // namespace thaw::store
