// ArtifactStore: what engines' preload shims record on a first run and read back on later
// ones (the deterministic layout's allocation sequence, H2D copy map and cuMemGetInfo
// answers; later, materialized graphs), kept under thawd's state directory
// (<state_dir>/artifacts/<key>.json, node.state_dir in thawd.toml).
//
// An artifact is keyed by its kind and identity — engine fingerprint, model, GPU type and
// driver version — so a record is only ever compared with a run of the same engine on the
// same model, GPU and driver. The document is JSON and must carry that identity itself
// (`"identity": {...}`): a document that says something else is refused, not stored.
// Writes are atomic (temporary file, fsync, rename): a crash leaves the old artifact or
// the new one, never half of either. A later put of the same key replaces the earlier.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/fd/unique_fd.hpp"
#include "daemon/node/service_error.hpp"

namespace thaw::daemon {

struct ArtifactIdentity {
  std::string kind;  // "layout", ...
  std::string engine;
  std::string model;
  std::string gpu;
  std::string driver;

  nlohmann::json to_json() const;  // without the kind
  bool operator==(const ArtifactIdentity&) const = default;
};

// kind + identity {engine, model, gpu, driver} as a shim sends them; every field a
// non-empty string, kind made of [a-z0-9_-].
ServiceResult<ArtifactIdentity> parse_artifact_identity(const nlohmann::json& kind,
                                                        const nlohmann::json& identity);

struct StoredArtifact {
  std::string key;
  UniqueFd fd;  // read-only, positioned at 0
  std::uint64_t bytes = 0;
};

class ArtifactStore {
 public:
  static constexpr std::uint64_t kMaxArtifactBytes = 32ull << 20;

  // Nothing is created until the first put.
  explicit ArtifactStore(std::filesystem::path state_dir);

  // "<kind>-<32 hex digits of the identity's SHA-256>".
  static std::string key(const ArtifactIdentity& identity);

  // Stores the `bytes` bytes readable at offset 0 of `fd` (a memfd from the shim).
  ServiceResult<std::string> put(const ArtifactIdentity& identity, int fd, std::uint64_t bytes);
  ServiceResult<StoredArtifact> get(const ArtifactIdentity& identity) const;

  // The newest artifact of `kind` recorded for model `model` by any engine (its document),
  // or nullopt. Documents that do not parse, or are over the size cap, are skipped.
  std::optional<std::string> newest_for_model(const std::string& kind,
                                              const std::string& model) const;

  const std::filesystem::path& directory() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace thaw::daemon
