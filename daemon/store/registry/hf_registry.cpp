#include "daemon/store/registry/hf_registry.hpp"

#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "daemon/store/registry/http_get.hpp"
#include "daemon/store/registry/relative_path.hpp"

namespace thaw::store {

namespace {

// A revision such as "refs/pr/1" is one URL segment on the hub: its '/' is encoded.
std::string escape_segment(std::string_view text) {
  std::string escaped = url_escape_path(text);
  std::string out;
  for (char c : escaped) {
    if (c == '/') {
      out += "%2F";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::optional<std::uint64_t> unsigned_field(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<std::uint64_t>();
}

}  // namespace

std::expected<std::vector<HfSibling>, RegistryError> parse_hf_siblings(std::string_view text,
                                                                       std::string_view origin) {
  auto bad = [&](std::string_view rule) {
    return std::unexpected(
        RegistryError{RegistryErrc::bad_listing, fmt::format("model info {}: {}", origin, rule)});
  };
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object()) return bad("top level is not an object");
  auto siblings = doc.find("siblings");
  if (siblings == doc.end() || !siblings->is_array()) return bad("no \"siblings\" array");
  std::vector<HfSibling> out;
  for (std::size_t i = 0; i < siblings->size(); ++i) {
    const auto& item = (*siblings)[i];
    if (!item.is_object()) return bad(fmt::format("siblings[{}] is not an object", i));
    auto name = item.find("rfilename");
    if (name == item.end() || !name->is_string()) {
      return bad(fmt::format("siblings[{}] has no string \"rfilename\"", i));
    }
    HfSibling sibling;
    sibling.rfilename = name->get<std::string>();
    if (auto ok = check_relative_path(sibling.rfilename, fmt::format("model info {} file", origin));
        !ok) {
      return std::unexpected(RegistryError{RegistryErrc::bad_listing, ok.error().message});
    }
    sibling.size = unsigned_field(item, "size");
    if (auto lfs = item.find("lfs"); lfs != item.end() && lfs->is_object()) {
      if (!sibling.size) sibling.size = unsigned_field(*lfs, "size");
      if (auto sha = lfs->find("sha256"); sha != lfs->end() && sha->is_string()) {
        sibling.sha256 = normalise_sha256(sha->get<std::string>());
        if (!sibling.sha256) {
          return bad(fmt::format("'{}': lfs.sha256 is not 64 hex digits", sibling.rfilename));
        }
      }
    }
    out.push_back(std::move(sibling));
  }
  return out;
}

HfHubRegistry::HfHubRegistry(std::string base_url, RegistryOptions options)
    : base_url_(std::move(base_url)), options_(std::move(options)) {}

std::string HfHubRegistry::describe() const {
  return fmt::format("hugging face hub {} (revision {})", base_url_, options_.revision);
}

std::string HfHubRegistry::model_info_url(std::string_view repo) const {
  return join_url(base_url_, fmt::format("api/models/{}/revision/{}?blobs=true",
                                         url_escape_path(repo), escape_segment(options_.revision)));
}

std::string HfHubRegistry::resolve_url(std::string_view repo, std::string_view file) const {
  return join_url(base_url_, fmt::format("{}/resolve/{}/{}", url_escape_path(repo),
                                         escape_segment(options_.revision), url_escape_path(file)));
}

std::expected<FileSource, RegistryError> HfHubRegistry::source(std::string_view repo,
                                                               std::string_view file) const {
  if (auto ok = check_relative_path(repo, "repository name"); !ok)
    return std::unexpected(ok.error());
  if (auto ok = check_relative_path(file, "file name"); !ok) return std::unexpected(ok.error());
  return FileSource{FileSource::Kind::http, resolve_url(repo, file)};
}

std::expected<ModelListing, RegistryError> HfHubRegistry::list(std::string_view repo) {
  if (auto ok = check_relative_path(repo, "repository name"); !ok)
    return std::unexpected(ok.error());
  const std::string info_url = model_info_url(repo);
  auto answer = http_request(info_url, options_, /*head_only=*/false);
  if (!answer) return std::unexpected(answer.error());
  if (answer->status == 404) {
    return std::unexpected(
        RegistryError{RegistryErrc::not_found,
                      fmt::format("repository '{}' revision '{}' not found: GET {} answered 404",
                                  repo, options_.revision, info_url)});
  }
  if (answer->status != 200) {
    std::string hint = (answer->status == 401 || answer->status == 403)
                           ? " (a gated or private repository needs an Authorization header)"
                           : "";
    return std::unexpected(
        RegistryError{RegistryErrc::http_status,
                      fmt::format("GET {}: HTTP {}{}", info_url, answer->status, hint)});
  }
  auto siblings = parse_hf_siblings(answer->body, info_url);
  if (!siblings) return std::unexpected(siblings.error());

  ModelListing listing;
  listing.model = std::string(repo);
  bool has_manifest = std::any_of(siblings->begin(), siblings->end(),
                                  [](const HfSibling& s) { return s.rfilename == kManifestName; });
  if (has_manifest) {
    const std::string url = resolve_url(repo, kManifestName);
    auto manifest_answer = http_request(url, options_, /*head_only=*/false);
    if (!manifest_answer) return std::unexpected(manifest_answer.error());
    if (manifest_answer->status != 200) {
      return std::unexpected(RegistryError{
          RegistryErrc::http_status,
          fmt::format("GET {}: HTTP {} (the model info lists it)", url, manifest_answer->status)});
    }
    auto manifest = parse_manifest(manifest_answer->body, url);
    if (!manifest) return std::unexpected(manifest.error());
    for (const auto& file : manifest->files) {
      listing.files.push_back(RemoteFile{file.path, file.size, file.sha256});
    }
    listing.manifest = std::move(*manifest);
  } else {
    for (auto& sibling : *siblings) {
      RemoteFile file{sibling.rfilename, 0, sibling.sha256};
      if (sibling.size) {
        file.size = *sibling.size;
      } else {
        const std::string url = resolve_url(repo, sibling.rfilename);
        auto head = http_request(url, options_, /*head_only=*/true);
        if (!head) return std::unexpected(head.error());
        if (head->status != 200 || !head->content_length) {
          return std::unexpected(RegistryError{
              RegistryErrc::http_status,
              fmt::format("HEAD {}: HTTP {} without a Content-Length; cannot size the file", url,
                          head->status)});
        }
        file.size = *head->content_length;
      }
      listing.files.push_back(std::move(file));
    }
  }
  std::sort(listing.files.begin(), listing.files.end(),
            [](const RemoteFile& a, const RemoteFile& b) { return a.path < b.path; });
  return listing;
}

}  // namespace thaw::store
