// The Hugging Face hub's HTTP API shape as registry, so the hub or any mirror of it
// serves models:
//   GET <base>/api/models/<repo>/revision/<rev>?blobs=true
//       → {"siblings": [{"rfilename": "config.json", "size": 665,
//                        "lfs": {"sha256": "…", "size": …}}, …], …}
//   GET <base>/<repo>/resolve/<rev>/<file>   (usually a 302 to a CDN; redirects followed)
// Sizes come from the siblings' "size" (or "lfs.size"); a sibling without one is sized
// with a HEAD of its resolve URL. A thaw-manifest.json among the siblings takes precedence.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

struct HfSibling {
  std::string rfilename;  // checked relative path
  std::optional<std::uint64_t> size;
  std::optional<std::string> sha256;  // the LFS object id (sha256 of the content)
};

// The "siblings" of a model-info answer; `origin` names the URL in errors.
std::expected<std::vector<HfSibling>, RegistryError> parse_hf_siblings(std::string_view text,
                                                                       std::string_view origin);

class HfHubRegistry final : public Registry {
 public:
  HfHubRegistry(std::string base_url, RegistryOptions options);

  std::expected<ModelListing, RegistryError> list(std::string_view repo) override;
  std::expected<FileSource, RegistryError> source(std::string_view repo,
                                                  std::string_view file) const override;
  std::string describe() const override;

  // <base>/api/models/<repo>/revision/<rev>?blobs=true
  std::string model_info_url(std::string_view repo) const;

 private:
  std::string resolve_url(std::string_view repo, std::string_view file) const;

  std::string base_url_;
  RegistryOptions options_;
};

}  // namespace thaw::store
