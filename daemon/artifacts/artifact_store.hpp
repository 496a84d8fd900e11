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
// the new one, never half of either.
//
// Records are kept per configuration too: the same engine binary run as `generate` and as
// `serve` (another command line) allocates differently, so each keeps its own record rather
// than invalidating the other's at every switch. The shim server passes the engine's
// command line as `config`.
//
// Records belong to the user whose engine recorded them (the peer's uid on the shim socket):
// <state_dir>/artifacts/<kind>-<uid>-<32 hex>.json, written 0600 by thawd in a 0700
// directory. An engine gets and replaces only records of its own user — root's engines
// included, which read only root's: a record steers how an engine lays out its memory, so no
// user's record may steer another user's engine. Prewarm (newest_for_model) looks at every
// user's records, as the node decides what to prewarm; the layout only arranges the model's
// own verified bytes, and an engine maps a slot in place only when the slot was built from
// a record byte-identical to its own (the shim compares record fingerprints). Records of
// before this rule (<kind>-<32 hex>.json, no owner) are no engine's any more; prewarm may
// still read them.
//
// Nothing read from the state directory is trusted: a file is opened O_NONBLOCK|O_NOFOLLOW
// and used only if fstat says it is a regular file within the size cap (a FIFO, a symlink,
// a directory or a device is skipped, never blocked on), and a document of the wrong shape
// is an invalid artifact (logged once per file), never an exception.
//
// A good record is not replaced by a worse one. For documents with an "allocations"
// sequence (layout records), a put whose sequence only extends the stored one replaces it
// (the run went further); one that diverges from it is kept aside as a candidate, and
// replaces the record only when the next diverging run agrees with it — so one crashed or
// odd run never costs the runs after it their zero-copy, while an engine whose behaviour
// really changed gets a new record after two runs. Documents without a sequence replace.
//
// Operators see the records with list() (D-Bus ListArtifacts, thawctl artifacts): every
// user's, each with a summary read by its kind's codec (artifact_summary.hpp). A record that
// does not read — not JSON, refused by its codec, a FIFO or symlink planted in the directory —
// is listed as unreadable with the reason, never skipped silently and never an error.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd/unique_fd.hpp"
#include "daemon/artifacts/artifact_summary.hpp"
#include "daemon/service/service_error.hpp"

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

enum class ArtifactPut {
  stored,     // there was none for this key
  replaced,   // the new one extends the stored one (or neither has a sequence)
  kept,       // the new one is a prefix of the stored one: nothing new, the record stays
  candidate,  // it diverges: kept aside, the record stays
  promoted,   // it diverges the same way the candidate did: it is the record now
};
std::string_view to_string(ArtifactPut outcome);

struct ArtifactPutResult {
  std::string key;
  ArtifactPut outcome = ArtifactPut::stored;
};

struct StoredArtifact {
  std::string key;
  UniqueFd fd;  // read-only, positioned at 0
  std::uint64_t bytes = 0;
};

// One stored record as an operator sees it.
struct ListedArtifact {
  std::string key;             // its file's name without ".json"
  ArtifactIdentity identity;   // the kind from the file name; the rest "" when unreadable
  std::optional<uid_t> owner;  // nullopt: a record of before records had owners
  std::uint64_t bytes = 0;
  std::int64_t modified_usec = 0;  // last stored, or read back by an engine (get marks it)
  ArtifactSummary summary;
};

class ArtifactStore {
 public:
  static constexpr std::uint64_t kMaxArtifactBytes = 32ull << 20;

  // Nothing is created until the first put.
  explicit ArtifactStore(std::filesystem::path state_dir);

  // "<kind>-<owner uid>-<32 hex digits of the SHA-256 of the identity and config>".
  static std::string key(uid_t owner, const ArtifactIdentity& identity,
                         std::string_view config = {});

  // Stores the `bytes` bytes readable at offset 0 of `fd` (a memfd from the shim), as
  // `owner`'s record of `identity` run with `config`, or aside (see above).
  ServiceResult<ArtifactPutResult> put(uid_t owner, const ArtifactIdentity& identity, int fd,
                                       std::uint64_t bytes, std::string_view config = {});
  // `owner`'s record (never a candidate). Marks it the most recently used, for
  // newest_for_model.
  ServiceResult<StoredArtifact> get(uid_t owner, const ArtifactIdentity& identity,
                                    std::string_view config = {}) const;

  // The most recently stored or used record of `kind` for model `model` by any engine and
  // configuration (its document), or nullopt; prewarm builds a slot's engine layout from
  // it. Candidates, documents that do not parse and ones over the size cap are skipped.
  std::optional<std::string> newest_for_model(const std::string& kind,
                                              const std::string& model) const;

  // Every user's records (not candidates) whose identity names `model`, or all of them when
  // `model` is empty — unreadable ones too, with why (those whose model cannot be read only
  // when `model` is empty). Sorted by model, kind, engine, key. A record is read and
  // summarized once per version of its file (inode, size, modification time).
  std::vector<ListedArtifact> list(std::string_view model = {}) const;

  const std::filesystem::path& directory() const { return dir_; }

 private:
  struct ReadForListing {
    ino_t inode = 0;
    std::uint64_t bytes = 0;
    std::int64_t modified_nsec = 0;
    ArtifactIdentity identity;
    ArtifactSummary summary;
  };
  // What list() shows of the record at `path` (kind from its name), read now.
  static ReadForListing read_for_listing(const std::filesystem::path& path, std::string kind);

  // The most recently modified record whose name starts with `prefix` and whose identity
  // `wanted` accepts.
  std::optional<std::filesystem::path> newest_path(
      const std::string& prefix, const std::function<bool(const nlohmann::json&)>& wanted) const;
  // The document at `path`, or a discarded value when it is absent, not a regular file, too
  // big or not JSON (then logged, once per path).
  nlohmann::json read_record(const std::filesystem::path& path) const;
  void invalid(const std::filesystem::path& path, std::string_view why) const;

  std::filesystem::path dir_;
  mutable std::mutex logged_mutex_;
  mutable std::set<std::filesystem::path> logged_;  // invalid records already logged
  mutable std::mutex listed_mutex_;
  // list()'s reading of each record file, by path; pruned to the files present at each list().
  mutable std::map<std::filesystem::path, ReadForListing> listed_;
};

}  // namespace thaw::daemon
