#include "daemon/store/registry/http_directory_registry.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "daemon/store/registry/autoindex.hpp"
#include "daemon/store/registry/http_get.hpp"
#include "daemon/store/registry/relative_path.hpp"

namespace thaw::store {

namespace {

// A registry deeper than this is more likely a symlink loop than a model.
constexpr int kMaxDepth = 16;

}  // namespace

HttpDirectoryRegistry::HttpDirectoryRegistry(std::string base_url, RegistryOptions options)
    : base_url_(std::move(base_url)), options_(std::move(options)) {}

std::string HttpDirectoryRegistry::describe() const {
  return fmt::format("http directory {}", base_url_);
}

std::string HttpDirectoryRegistry::model_url(std::string_view model) const {
  return join_url(base_url_, url_escape_path(model)) + "/";
}

std::expected<FileSource, RegistryError> HttpDirectoryRegistry::source(
    std::string_view model, std::string_view file) const {
  if (auto ok = check_relative_path(model, "model name"); !ok) return std::unexpected(ok.error());
  if (auto ok = check_relative_path(file, "file name"); !ok) return std::unexpected(ok.error());
  return FileSource{FileSource::Kind::http, model_url(model) + url_escape_path(file)};
}

std::expected<ModelListing, RegistryError> HttpDirectoryRegistry::list(std::string_view model) {
  if (auto ok = check_relative_path(model, "model name"); !ok) return std::unexpected(ok.error());
  ModelListing listing;
  listing.model = std::string(model);

  const std::string manifest_url = model_url(model) + std::string(kManifestName);
  auto manifest_answer = http_request(manifest_url, options_, /*head_only=*/false);
  if (!manifest_answer) return std::unexpected(manifest_answer.error());
  if (manifest_answer->status == 200) {
    auto manifest = parse_manifest(manifest_answer->body, manifest_url);
    if (!manifest) return std::unexpected(manifest.error());
    for (const auto& file : manifest->files) {
      listing.files.push_back(RemoteFile{file.path, file.size, file.sha256});
    }
    listing.manifest = std::move(*manifest);
  } else if (manifest_answer->status == 404) {
    if (auto walked = walk(model, "", 0, listing.files); !walked) {
      return std::unexpected(walked.error());
    }
  } else {
    return std::unexpected(
        RegistryError{RegistryErrc::http_status,
                      fmt::format("GET {}: HTTP {}", manifest_url, manifest_answer->status)});
  }
  std::sort(listing.files.begin(), listing.files.end(),
            [](const RemoteFile& a, const RemoteFile& b) { return a.path < b.path; });
  return listing;
}

std::expected<void, RegistryError> HttpDirectoryRegistry::walk(std::string_view model,
                                                               const std::string& prefix, int depth,
                                                               std::vector<RemoteFile>& out) {
  const std::string url = model_url(model) + url_escape_path(prefix);
  if (depth > kMaxDepth) {
    return std::unexpected(RegistryError{
        RegistryErrc::bad_listing,
        fmt::format("listing {}: directories nested deeper than {}", url, kMaxDepth)});
  }
  auto answer = http_request(url, options_, /*head_only=*/false);
  if (!answer) return std::unexpected(answer.error());
  if (answer->status == 404) {
    return std::unexpected(
        RegistryError{RegistryErrc::not_found,
                      fmt::format("model '{}' not found: GET {} answered 404 (and it has no {})",
                                  model, url, kManifestName)});
  }
  if (answer->status != 200) {
    return std::unexpected(RegistryError{RegistryErrc::http_status,
                                         fmt::format("GET {}: HTTP {}", url, answer->status)});
  }
  auto entries = parse_autoindex(answer->body, url);
  if (!entries) return std::unexpected(entries.error());
  for (const auto& entry : *entries) {
    std::string path = prefix + entry.name;
    if (entry.directory) {
      if (auto ok = walk(model, path + "/", depth + 1, out); !ok) return ok;
      continue;
    }
    RemoteFile file{path, 0, std::nullopt};
    if (entry.size) {
      file.size = *entry.size;
    } else {
      const std::string file_url = model_url(model) + url_escape_path(path);
      auto head = http_request(file_url, options_, /*head_only=*/true);
      if (!head) return std::unexpected(head.error());
      if (head->status != 200 || !head->content_length) {
        return std::unexpected(RegistryError{
            RegistryErrc::http_status,
            fmt::format("HEAD {}: HTTP {} without a Content-Length; cannot size the file", file_url,
                        head->status)});
      }
      file.size = *head->content_length;
    }
    out.push_back(std::move(file));
  }
  return {};
}

}  // namespace thaw::store
