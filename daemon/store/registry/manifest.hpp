// thaw-manifest.json: the list of a model's files with sizes and digests, published next
// to the model on a registry. Shape (fields the store uses; others are kept verbatim so a
// newer publisher's additions survive a round trip):
//   {"files": [{"path": "model.safetensors", "size": 123, "sha256": "<64 hex>",
//               "chunk_size": 4194304, "chunk_sha256": ["<64 hex>", ...],
//               "chunk_chain_sha256": ["<64 hex>", ...]}, ...]}
// chunk_chain_sha256 (optional) holds the SHA-256 chaining state after each chunk but the
// last (see daemon/store/fetch/sha256_chain.hpp): with it a fetcher verifies every chunk
// and the whole file's sha256 in one pass over the bytes.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/store/registry/registry_error.hpp"

namespace thaw::store {

inline constexpr std::string_view kManifestName = "thaw-manifest.json";

struct ManifestFile {
  std::string path;  // relative to the model, checked (no "..")
  std::uint64_t size = 0;
  std::optional<std::string> sha256;      // whole file, lowercase hex
  std::uint64_t chunk_size = 0;           // 0: no chunk digests
  std::vector<std::string> chunk_sha256;  // ceil(size / chunk_size) entries, lowercase hex
  // Chained digests published (the key is present, even as [] for a one-chunk file):
  // ceil(size / chunk_size) - 1 chaining states; only with sha256 and a chunk_size that
  // is a multiple of 64.
  bool chained = false;
  std::vector<std::string> chunk_chain_sha256;
  nlohmann::json extra = nlohmann::json::object();  // fields not listed above
};

struct Manifest {
  std::vector<ManifestFile> files;
  nlohmann::json extra = nlohmann::json::object();  // top-level fields other than "files"

  const ManifestFile* find(std::string_view path) const;
};

// `origin` (URL or path) names the manifest in errors. Rejects: bad JSON, missing or
// mistyped fields, unsafe paths, duplicate paths, digests that are not 64 hex digits,
// chunk digests without chunk_size or with a count other than ceil(size / chunk_size),
// chaining states without sha256, with a chunk_size not a multiple of 64, or with a count
// other than ceil(size / chunk_size) - 1.
std::expected<Manifest, RegistryError> parse_manifest(std::string_view text,
                                                      std::string_view origin);

// The inverse of parse_manifest (unknown fields included).
nlohmann::json manifest_to_json(const Manifest& manifest);

// Lowercases a 64-digit hex digest; nullopt if `text` is not one.
std::optional<std::string> normalise_sha256(std::string_view text);

}  // namespace thaw::store
