// A local directory as registry: files at <root>/<model>/<file>, copied by the
// RangeFetcher with pread (or copy_file_range into a sink that offers a file descriptor).
// Listing: thaw-manifest.json when present (each listed file must exist with that size),
// else every regular file under the model directory; symlinked files (as in a Hugging
// Face cache snapshot) count, hidden directories (.git, .cache) are skipped.
#pragma once

#include <filesystem>

#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

class LocalRegistry final : public Registry {
 public:
  explicit LocalRegistry(std::filesystem::path root);

  std::expected<ModelListing, RegistryError> list(std::string_view model) override;
  std::expected<FileSource, RegistryError> source(std::string_view model,
                                                  std::string_view file) const override;
  std::string describe() const override;

 private:
  std::filesystem::path root_;  // absolute
};

}  // namespace thaw::store
