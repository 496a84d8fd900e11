// HostCache: the node's cache of model files, under one root directory (the daemon
// puts it on tmpfs or hugetlbfs; see cache_layout.hpp for what lies where).
//
// - open_file() creates a model's file at full size with a fresh readiness map, or
//   opens the one already cached (complete, or partial so a fetch can resume from its
//   verified chunks: missing_chunks()). One CacheFile object per cached file is live
//   at a time and shared by everyone who asks, so its readiness writer is one.
// - A size budget covers everything cached (data rounded to blocks plus readiness
//   maps). When a new file does not fit, whole models are evicted, least recently
//   used first, skipping pinned ones and the model being added to; if that is not
//   enough the error (over_budget) says how much is pinned by whom. A full
//   filesystem (budget larger than the space really free) also evicts, then fails
//   with no_space.
// - pin() returns a ModelPin (RAII) that protects a model from eviction and removal
//   while a consumer or fetch uses it. Hold one for as long as you fill or read a
//   model: evicting deletes the files (descriptors already open stay valid, but new
//   opens would find nothing).
// - LRU time is taken on pin, unpin, open_file and find_file, and persisted as the
//   mtime of the model's .thaw/last-used, so eviction order survives a restart.
// - open() re-indexes an existing root: keeps complete files, keeps partial ones
//   (state filling or failed) with their verified chunks, deletes data files whose
//   readiness map is missing or corrupt and maps without data, and reports it all.
//   A model that lost a file that way stays listed with that file as `dropped` (state
//   failed, so never complete) until a fetch creates it again; the mark survives restarts.
//   Entries of the root that are not model directories are left alone and reported.
//   A non-empty directory without the .thaw-cache marker is refused, so pointing the
//   cache at the wrong directory can never delete anyone's files.
//
// Thread safety: every HostCache and ModelPin operation may be called from any
// thread. Creating a file's space (fallocate, which can take a while for GBs) runs
// outside the cache's lock; others asking for that same file wait for it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/readiness/cache_error.hpp"
#include "common/readiness/chunk_readiness.hpp"
#include "daemon/store/cache/cache_file.hpp"

namespace thaw::store {

struct HostCacheConfig {
  std::filesystem::path root;
  uint64_t budget_bytes = 0;  // must be > 0
  CacheFileOptions file_options;
  // Wall-clock time for LRU, in ns since the Unix epoch (it must survive restarts, so
  // not a monotonic clock). Defaults to CLOCK_REALTIME; tests inject their own.
  std::function<int64_t()> clock;
  // Engines open cached files by path (the shim only passes readiness maps), so a group
  // whose members run engines (thawd: the first of shim.allow_groups) must be able to read
  // them. With a group, open() gives the root and everything under it to that group —
  // directories 02750 (setgid: what is created inside inherits the group), files 0640 —
  // and others nothing. Without one, files are 0640 of the owner's own group.
  std::optional<gid_t> group;
};

struct CachedFileInfo {
  std::string relative_path;
  uint64_t size = 0;
  uint64_t chunk_size = 0;
  uint64_t chunk_count = 0;
  uint64_t verified_chunks = 0;
  uint64_t allocated_bytes = 0;  // as counted against the budget
  FillState state = FillState::filling;
  bool being_created = false;  // space being reserved right now; state not readable yet
  // Deleted as damaged (re-index or a later check) and not created again yet: no bytes,
  // state failed, so the model never reads complete and a fetch creates it afresh.
  bool dropped = false;
};

struct CachedModelInfo {
  std::string key;
  uint64_t bytes = 0;
  uint32_t pins = 0;
  int64_t last_used_unix_ns = 0;
  std::vector<CachedFileInfo> files;  // by path
  // Its bytes were taken with nothing to check them against (set_unverified): complete
  // means "all there", not "as published".
  bool unverified = false;
};

struct DroppedEntry {
  std::filesystem::path path;
  std::string reason;
};

struct ReindexReport {
  size_t models = 0;                    // kept
  std::vector<std::string> incomplete;  // kept, but missing dropped files: fetches refetch them
  size_t complete_files = 0;
  size_t partial_files = 0;  // filling or failed: resumable from their verified chunks
  uint64_t bytes_used = 0;
  std::vector<DroppedEntry> dropped;           // deleted, with why
  std::vector<std::filesystem::path> ignored;  // root entries that are not models; kept
  std::vector<std::string> evicted;            // models evicted to fit the budget
};

namespace detail {
struct HostCacheState;
void release_pin(HostCacheState& state, const std::string& key);
}  // namespace detail

// Keeps one model from being evicted or removed while it lives. Movable.
class ModelPin {
 public:
  ModelPin() = default;
  ~ModelPin() { release(); }
  ModelPin(ModelPin&& other) noexcept = default;
  ModelPin& operator=(ModelPin&& other) noexcept {
    if (this != &other) {
      release();
      state_ = std::move(other.state_);
      key_ = std::move(other.key_);
    }
    return *this;
  }
  ModelPin(const ModelPin&) = delete;
  ModelPin& operator=(const ModelPin&) = delete;

  const std::string& key() const { return key_; }
  bool held() const { return state_ != nullptr; }
  // Unpins now (also refreshes the model's LRU time). Idempotent.
  void release() {
    if (auto state = std::move(state_)) detail::release_pin(*state, key_);
  }

 private:
  friend class HostCache;
  ModelPin(std::shared_ptr<detail::HostCacheState> state, std::string key)
      : state_(std::move(state)), key_(std::move(key)) {}

  // Shared with the HostCache so a pin outliving it stays safe (and keeps the root
  // locked until released).
  std::shared_ptr<detail::HostCacheState> state_;
  std::string key_;
};

class HostCache {
 public:
  // Opens (creating if absent) the cache at config.root, takes its lock (a second
  // HostCache on the same root fails with `locked`), re-indexes it and evicts down to
  // the budget if the cache holds more than it.
  static CacheResult<HostCache> open(HostCacheConfig config);

  HostCache(HostCache&&) noexcept = default;
  HostCache& operator=(HostCache&&) noexcept = default;
  ~HostCache();

  const std::filesystem::path& root() const;
  uint64_t budget_bytes() const;
  uint64_t bytes_used() const;
  // What open() found and did.
  const ReindexReport& reindex_report() const;

  // Creates `relative_path` of model `key` with this size and chunk size, or opens the
  // cached one. A cached file with another size or chunk size is a `conflict` (the key
  // should name the revision; remove_model() to replace it). A cached file found
  // corrupt is deleted and created afresh.
  CacheResult<std::shared_ptr<CacheFile>> open_file(std::string_view key,
                                                    std::string_view relative_path,
                                                    CacheFileSpec spec);
  // The cached file, if there is one (not_found otherwise). Never creates.
  CacheResult<std::shared_ptr<CacheFile>> find_file(std::string_view key,
                                                    std::string_view relative_path);
  // The chunks a resumed fetch of that file must still get.
  CacheResult<std::vector<ChunkRun>> missing_chunks(std::string_view key,
                                                    std::string_view relative_path);

  // Pins `key` (which need not be cached yet: a fetch pins before creating files).
  CacheResult<ModelPin> pin(std::string_view key);
  // Deletes a model's files now. busy while it is pinned or a file is being created.
  CacheResult<void> remove_model(std::string_view key);

  // Records (on disk, under the model's .thaw/, so it survives restarts and goes with the
  // model) that the model's files were fetched without digests to check them, or clears
  // that once a fetch has checked every file. Only a fetch holding a pin calls it.
  CacheResult<void> set_unverified(std::string_view key, bool unverified);

  // Every cached or pinned model, least recently used first.
  std::vector<CachedModelInfo> models() const;

 private:
  explicit HostCache(std::shared_ptr<detail::HostCacheState> state);
  std::shared_ptr<detail::HostCacheState> state_;
};

}  // namespace thaw::store
