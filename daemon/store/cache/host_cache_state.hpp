// HostCache's index, shared by host_cache.cpp and cache_reindex.cpp. Private to the
// cache: not installed, not included by users.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "daemon/store/cache/cache_file.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/cache/unique_fd.hpp"

namespace thaw::store::detail {

struct FileEntry {
  uint64_t size = 0;
  uint64_t chunk_size = 0;
  uint64_t allocated_bytes = 0;   // counted in ModelEntry::bytes and HostCacheState::used
  bool creating = false;          // CacheFile::create() in flight outside the lock
  std::weak_ptr<CacheFile> live;  // the one writer, while anyone holds it
};

struct ModelEntry {
  std::map<std::string, FileEntry, std::less<>> files;
  uint32_t pins = 0;
  uint32_t creating = 0;  // files of this model being created: not evictable meanwhile
  int64_t last_used_ns = 0;
  uint64_t bytes = 0;
  // Files deleted as damaged that no fetch has created again (marked on disk under
  // .thaw/dropped/): while any is here the model is incomplete, whatever `files` says.
  std::set<std::string, std::less<>> dropped;
};

struct HostCacheState {
  HostCacheConfig config;
  CacheFilesystem filesystem;
  UniqueFd root_lock;  // the flock()ed marker file
  ReindexReport report;

  mutable std::mutex mutex;
  std::condition_variable creation_done;                  // a FileEntry left the creating state
  std::map<std::string, ModelEntry, std::less<>> models;  // guarded by mutex
  uint64_t used = 0;                                      // guarded by mutex
};

// Marks `relative_path` of the model as dropped (in memory and on disk), or clears the mark
// once the file exists again. Best effort on disk: a failed write only loses the mark over a
// restart.
void mark_dropped(HostCacheState& state, const std::string& key, ModelEntry& model,
                  const std::string& relative_path);
void clear_dropped(HostCacheState& state, const std::string& key, ModelEntry& model,
                   const std::string& relative_path);

// Scans config.root into an empty state (no locking: nobody else sees it yet). Fails
// only when the root cannot be read at all; bad entries are dropped and reported.
CacheResult<void> reindex(HostCacheState& state);

// The model's LRU time = now; persisted as the mtime of its last-used file. Locked.
void touch_locked(HostCacheState& state, const std::string& key, ModelEntry& model);

// Deletes a model's directory and forgets it. Locked; the caller checked it is unpinned.
CacheResult<void> evict_locked(HostCacheState& state, const std::string& key);

// Evicts the least recently used evictable model other than `keep`; false if none.
bool evict_one_locked(HostCacheState& state, std::string_view keep);

// Evicts least recently used unpinned models (never `keep`) until `needed` more bytes
// fit the budget. Appends evicted keys to `evicted` if given. Locked.
CacheResult<void> make_room_locked(HostCacheState& state, uint64_t needed, std::string_view keep,
                                   std::string_view for_what,
                                   std::vector<std::string>* evicted = nullptr);

}  // namespace thaw::store::detail
