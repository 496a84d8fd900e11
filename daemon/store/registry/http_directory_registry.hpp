// A plain HTTP(S) directory as registry (e.g. nginx): files at <base>/<model>/<file>.
// Files are listed from <model>/thaw-manifest.json when it exists, else from nginx's
// `autoindex_format json` listing, descending into subdirectories; a file the listing
// gives no size for is sized with a HEAD request.
#pragma once

#include <string>

#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

class HttpDirectoryRegistry final : public Registry {
 public:
  HttpDirectoryRegistry(std::string base_url, RegistryOptions options);

  std::expected<ModelListing, RegistryError> list(std::string_view model) override;
  std::expected<FileSource, RegistryError> source(std::string_view model,
                                                  std::string_view file) const override;
  std::string describe() const override;

 private:
  std::expected<void, RegistryError> walk(std::string_view model, const std::string& prefix,
                                          int depth, std::vector<RemoteFile>& out);
  std::string model_url(std::string_view model) const;

  std::string base_url_;
  RegistryOptions options_;
};

}  // namespace thaw::store
