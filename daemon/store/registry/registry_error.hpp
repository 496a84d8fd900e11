// Why a registry could not list a model or locate a file.
#pragma once

#include <string>
#include <string_view>

namespace thaw::store {

enum class RegistryErrc {
  bad_spec,     // the registry address or a model/file name is malformed
  not_found,    // the model (or its listing) does not exist on the registry
  http_status,  // the registry answered a status that is not 200
  transport,    // the registry could not be reached (connect, TLS, timeout)
  bad_listing,  // a listing, an API answer or a manifest is malformed
  local_io,     // a local registry directory could not be read
};

std::string_view to_string(RegistryErrc code);

struct RegistryError {
  RegistryErrc code = RegistryErrc::transport;
  std::string message;  // one line, names the URL/path and the rule broken
};

}  // namespace thaw::store
