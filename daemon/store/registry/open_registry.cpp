#include <fmt/format.h>

#include "daemon/store/registry/hf_registry.hpp"
#include "daemon/store/registry/http_directory_registry.hpp"
#include "daemon/store/registry/local_registry.hpp"
#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

const RemoteFile* ModelListing::find(std::string_view path) const {
  for (const auto& file : files) {
    if (file.path == path) return &file;
  }
  return nullptr;
}

std::expected<std::unique_ptr<Registry>, RegistryError> open_registry(std::string_view address,
                                                                      RegistryOptions options) {
  if (address.empty()) {
    return std::unexpected(RegistryError{RegistryErrc::bad_spec, "empty registry address"});
  }
  if (address.starts_with("hf+http://") || address.starts_with("hf+https://")) {
    return std::make_unique<HfHubRegistry>(std::string(address.substr(3)), std::move(options));
  }
  if (address.starts_with("http://") || address.starts_with("https://")) {
    return std::make_unique<HttpDirectoryRegistry>(std::string(address), std::move(options));
  }
  if (address.starts_with("file://")) {
    std::string_view path = address.substr(7);
    if (!path.starts_with('/')) {
      return std::unexpected(RegistryError{
          RegistryErrc::bad_spec,
          fmt::format("registry address '{}': file:// needs an absolute path", address)});
    }
    return std::make_unique<LocalRegistry>(std::string(path));
  }
  if (address.find("://") != std::string_view::npos) {
    return std::unexpected(RegistryError{
        RegistryErrc::bad_spec,
        fmt::format("registry address '{}': unknown scheme (http, https, hf+http, hf+https, "
                    "file or a path)",
                    address)});
  }
  return std::make_unique<LocalRegistry>(std::string(address));
}

}  // namespace thaw::store
