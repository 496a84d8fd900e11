#include "daemon/store/registry/manifest.hpp"

#include <fmt/format.h>

#include <set>

#include "daemon/store/registry/relative_path.hpp"

namespace thaw::store {

const ManifestFile* Manifest::find(std::string_view path) const {
  for (const auto& file : files) {
    if (file.path == path) return &file;
  }
  return nullptr;
}

std::optional<std::string> normalise_sha256(std::string_view text) {
  if (text.size() != 64) return std::nullopt;
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (!hex) return std::nullopt;
  }
  return out;
}

namespace {

RegistryError bad(std::string_view origin, std::string_view rule) {
  return RegistryError{RegistryErrc::bad_listing, fmt::format("manifest {}: {}", origin, rule)};
}

std::expected<ManifestFile, RegistryError> parse_file(const nlohmann::json& entry,
                                                      std::size_t index, std::string_view origin) {
  if (!entry.is_object())
    return std::unexpected(bad(origin, fmt::format("files[{}] is not an object", index)));
  ManifestFile file;
  auto path = entry.find("path");
  if (path == entry.end() || !path->is_string()) {
    return std::unexpected(bad(origin, fmt::format("files[{}] has no string \"path\"", index)));
  }
  file.path = path->get<std::string>();
  if (auto ok = check_relative_path(file.path, fmt::format("manifest {} file", origin)); !ok) {
    return std::unexpected(RegistryError{RegistryErrc::bad_listing, ok.error().message});
  }
  auto where = [&](std::string_view rule) {
    return bad(origin, fmt::format("file '{}': {}", file.path, rule));
  };
  auto size = entry.find("size");
  if (size == entry.end() || !size->is_number_unsigned()) {
    return std::unexpected(where("\"size\" must be a non-negative integer"));
  }
  file.size = size->get<std::uint64_t>();
  if (auto sha = entry.find("sha256"); sha != entry.end() && !sha->is_null()) {
    auto digest = sha->is_string() ? normalise_sha256(sha->get<std::string>()) : std::nullopt;
    if (!digest) return std::unexpected(where("\"sha256\" is not 64 hex digits"));
    file.sha256 = *digest;
  }
  if (auto chunk = entry.find("chunk_size"); chunk != entry.end() && !chunk->is_null()) {
    if (!chunk->is_number_unsigned()) {
      return std::unexpected(where("\"chunk_size\" must be a non-negative integer"));
    }
    file.chunk_size = chunk->get<std::uint64_t>();
  }
  if (auto chunks = entry.find("chunk_sha256"); chunks != entry.end() && !chunks->is_null()) {
    if (!chunks->is_array()) return std::unexpected(where("\"chunk_sha256\" is not an array"));
    for (const auto& item : *chunks) {
      auto digest = item.is_string() ? normalise_sha256(item.get<std::string>()) : std::nullopt;
      if (!digest) {
        return std::unexpected(
            where(fmt::format("chunk_sha256[{}] is not 64 hex digits", file.chunk_sha256.size())));
      }
      file.chunk_sha256.push_back(*digest);
    }
  }
  if (auto chain = entry.find("chunk_chain_sha256"); chain != entry.end() && !chain->is_null()) {
    if (!chain->is_array()) {
      return std::unexpected(where("\"chunk_chain_sha256\" is not an array"));
    }
    file.chained = true;
    for (const auto& item : *chain) {
      auto state = item.is_string() ? normalise_sha256(item.get<std::string>()) : std::nullopt;
      if (!state) {
        return std::unexpected(where(fmt::format("chunk_chain_sha256[{}] is not 64 hex digits",
                                                 file.chunk_chain_sha256.size())));
      }
      file.chunk_chain_sha256.push_back(*state);
    }
    if (!file.sha256) return std::unexpected(where("chunk_chain_sha256 without a \"sha256\""));
    if (file.chunk_size == 0 || file.chunk_size % 64 != 0) {
      return std::unexpected(
          where("chunk_chain_sha256 needs a chunk_size that is a multiple of 64 bytes"));
    }
    const std::uint64_t chunks = file.size / file.chunk_size + (file.size % file.chunk_size != 0);
    const std::uint64_t expected = chunks == 0 ? 0 : chunks - 1;
    if (file.chunk_chain_sha256.size() != expected) {
      return std::unexpected(
          where(fmt::format("{} chaining states for {} chunks (need {}: one per chunk but the "
                            "last)",
                            file.chunk_chain_sha256.size(), chunks, expected)));
    }
  }
  // Chaining states alone are enough to verify chunks; plain chunk digests, when given,
  // must cover every chunk.
  if (!file.chunk_sha256.empty() || (file.chunk_size != 0 && !file.chained)) {
    if (file.chunk_size == 0) return std::unexpected(where("chunk_sha256 without a chunk_size"));
    std::uint64_t expected = file.size / file.chunk_size + (file.size % file.chunk_size != 0);
    if (file.chunk_sha256.size() != expected) {
      return std::unexpected(
          where(fmt::format("{} chunk digests for {} bytes in chunks of {} (need {})",
                            file.chunk_sha256.size(), file.size, file.chunk_size, expected)));
    }
  }
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    const auto& key = it.key();
    if (key != "path" && key != "size" && key != "sha256" && key != "chunk_size" &&
        key != "chunk_sha256" && key != "chunk_chain_sha256") {
      file.extra[key] = it.value();
    }
  }
  return file;
}

}  // namespace

std::expected<Manifest, RegistryError> parse_manifest(std::string_view text,
                                                      std::string_view origin) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::unexpected(bad(origin, "not valid JSON"));
  if (!doc.is_object()) return std::unexpected(bad(origin, "top level is not an object"));
  auto files = doc.find("files");
  if (files == doc.end() || !files->is_array()) {
    return std::unexpected(bad(origin, "no \"files\" array"));
  }
  Manifest manifest;
  std::set<std::string, std::less<>> seen;
  for (std::size_t i = 0; i < files->size(); ++i) {
    auto file = parse_file((*files)[i], i, origin);
    if (!file) return std::unexpected(file.error());
    if (!seen.insert(file->path).second) {
      return std::unexpected(bad(origin, fmt::format("file '{}' listed twice", file->path)));
    }
    manifest.files.push_back(std::move(*file));
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "files") manifest.extra[it.key()] = it.value();
  }
  return manifest;
}

nlohmann::json manifest_to_json(const Manifest& manifest) {
  nlohmann::json doc = manifest.extra;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& file : manifest.files) {
    nlohmann::json entry = file.extra;
    entry["path"] = file.path;
    entry["size"] = file.size;
    if (file.sha256) entry["sha256"] = *file.sha256;
    if (file.chunk_size != 0) {
      entry["chunk_size"] = file.chunk_size;
      entry["chunk_sha256"] = file.chunk_sha256;
    }
    if (file.chained) entry["chunk_chain_sha256"] = file.chunk_chain_sha256;
    files.push_back(std::move(entry));
  }
  doc["files"] = std::move(files);
  return doc;
}

}  // namespace thaw::store
