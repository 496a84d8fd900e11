#include "daemon/store/cache/host_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <system_error>

#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/cache/host_cache_state.hpp"

namespace thaw::store {
namespace fs = std::filesystem;
namespace layout = cache_layout;
using detail::FileEntry;
using detail::HostCacheState;
using detail::ModelEntry;

namespace detail {
namespace {

int64_t realtime_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

CacheFileOptions writer_options(const HostCacheState& state) {
  CacheFileOptions options = state.config.file_options;
  options.writer_lock = false;  // see CacheFileOptions::writer_lock
  return options;
}

// Bytes a file occupies on disk now (sparse files: only what was written).
uint64_t occupied_bytes(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Free space that sparse files of this cache will still take as their fetches fill them
// (each file's budgeted allocation less what it occupies), other than `key`/`path`'s.
// Locked. A stat per cached file: caches hold tens of files, not thousands.
uint64_t promised_space_locked(const HostCacheState& state, std::string_view key,
                               std::string_view path) {
  uint64_t promised = 0;
  const fs::path& root = state.config.root;
  for (const auto& [model_key, model] : state.models) {
    for (const auto& [relative, entry] : model.files) {
      if (model_key == key && relative == path) continue;
      const uint64_t occupied = occupied_bytes(layout::data_path(root, model_key, relative)) +
                                occupied_bytes(layout::readiness_path(root, model_key, relative));
      if (entry.allocated_bytes > occupied) promised += entry.allocated_bytes - occupied;
    }
  }
  return promised;
}

// The one live CacheFile of an indexed, fully created file: the existing object if
// anyone still holds it, else a fresh open.
CacheResult<std::shared_ptr<CacheFile>> live_or_open_locked(HostCacheState& state,
                                                            const std::string& key,
                                                            const std::string& relative_path,
                                                            FileEntry& entry) {
  if (auto live = entry.live.lock()) return live;
  const fs::path& root = state.config.root;
  auto file =
      CacheFile::open(layout::data_path(root, key, relative_path),
                      layout::readiness_path(root, key, relative_path), writer_options(state));
  if (!file) return std::unexpected(file.error());
  auto shared = std::make_shared<CacheFile>(std::move(*file));
  entry.live = shared;
  return shared;
}

// Forgets a file whose pair on disk is gone or corrupt, deleting what is left of it.
void drop_file_locked(HostCacheState& state, const std::string& key, ModelEntry& model,
                      const std::string& relative_path) {
  auto it = model.files.find(relative_path);
  if (it == model.files.end()) return;
  const fs::path& root = state.config.root;
  std::error_code ec;
  fs::remove(layout::data_path(root, key, relative_path), ec);
  fs::remove(layout::readiness_path(root, key, relative_path), ec);
  model.bytes -= it->second.allocated_bytes;
  state.used -= it->second.allocated_bytes;
  model.files.erase(it);
  detail::mark_dropped(state, key, model, relative_path);  // the model lacks it now
}

bool should_drop(const CacheError& error) {
  return error.code == CacheErrc::corrupt || error.code == CacheErrc::not_found;
}

// Forgets a model that holds nothing and is held by no one.
void forget_if_unused_locked(HostCacheState& state, const std::string& key) {
  auto it = state.models.find(key);
  if (it == state.models.end()) return;
  const ModelEntry& model = it->second;
  if (model.files.empty() && model.pins == 0 && model.creating == 0) {
    std::error_code ec;
    fs::remove_all(layout::model_dir(state.config.root, key), ec);
    state.models.erase(it);
  }
}

}  // namespace

void touch_locked(HostCacheState& state, const std::string& key, ModelEntry& model) {
  const int64_t now = state.config.clock();
  model.last_used_ns = now;
  const fs::path path = layout::last_used_path(state.config.root, key);
  // The model directory exists only once it has files; a model that is only pinned
  // keeps its time in memory until then.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return;
  const timespec times[2] = {{now / 1'000'000'000, now % 1'000'000'000},
                             {now / 1'000'000'000, now % 1'000'000'000}};
  ::futimens(fd.get(), times);
}

CacheResult<void> evict_locked(HostCacheState& state, const std::string& key) {
  auto it = state.models.find(key);
  if (it == state.models.end()) return {};
  std::error_code ec;
  fs::remove_all(layout::model_dir(state.config.root, key), ec);
  if (ec) {
    return cache_failure(
        CacheErrc::io_error,
        fmt::format("evicting model {}: removing {}: {}", key,
                    layout::model_dir(state.config.root, key).string(), ec.message()));
  }
  state.used -= it->second.bytes;
  state.models.erase(it);
  return {};
}

// The least recently used model that may be evicted (unpinned, nothing being created,
// not `keep`), or nullptr. Ties go to the smaller key, so the order is deterministic.
const std::string* pick_victim_locked(const HostCacheState& state, std::string_view keep) {
  const std::string* victim = nullptr;
  int64_t victim_time = 0;
  for (const auto& [key, model] : state.models) {
    if (model.pins != 0 || model.creating != 0 || key == keep || model.files.empty()) continue;
    if (victim == nullptr || model.last_used_ns < victim_time) {
      victim = &key;
      victim_time = model.last_used_ns;
    }
  }
  return victim;
}

bool evict_one_locked(HostCacheState& state, std::string_view keep) {
  const std::string* victim = pick_victim_locked(state, keep);
  if (victim == nullptr) return false;
  const std::string key = *victim;
  return evict_locked(state, key).has_value();
}

CacheResult<void> make_room_locked(HostCacheState& state, uint64_t needed, std::string_view keep,
                                   std::string_view for_what, std::vector<std::string>* evicted) {
  const uint64_t budget = state.config.budget_bytes;
  if (needed > budget) {
    return cache_failure(
        CacheErrc::over_budget,
        fmt::format("cache {}: {} needs {} bytes, more than the whole cache budget of {} bytes; "
                    "raise the budget",
                    state.config.root.string(), for_what, needed, budget));
  }
  while (state.used + needed > budget) {
    const std::string* victim = pick_victim_locked(state, keep);
    if (victim == nullptr) {
      uint64_t held = 0;
      std::string holders;
      for (const auto& [key, model] : state.models) {
        if (model.bytes == 0 || (model.pins == 0 && model.creating == 0 && key != keep)) continue;
        held += model.bytes;
        holders += fmt::format("{}{} ({} bytes, {} pins{})", holders.empty() ? "" : ", ", key,
                               model.bytes, model.pins,
                               model.creating != 0 ? ", being created"
                               : key == keep       ? ", being added to"
                                                   : "");
      }
      return cache_failure(
          CacheErrc::over_budget,
          fmt::format("cache {}: {} needs {} bytes but only {} of the {}-byte budget are free "
                      "and nothing else can be evicted: {} bytes are held by {}; unpin "
                      "models or raise the cache budget",
                      state.config.root.string(), for_what, needed,
                      budget > state.used ? budget - state.used : 0, budget, held,
                      holders.empty() ? "nothing" : holders));
    }
    const std::string key = *victim;
    if (auto ok = evict_locked(state, key); !ok) return ok;
    if (evicted != nullptr) evicted->push_back(key);
  }
  return {};
}

void release_pin(HostCacheState& state, const std::string& key) {
  std::lock_guard lock(state.mutex);
  auto it = state.models.find(key);
  if (it == state.models.end()) return;
  if (it->second.pins > 0) --it->second.pins;
  touch_locked(state, key, it->second);
  forget_if_unused_locked(state, key);
}

}  // namespace detail

namespace {

using detail::drop_file_locked;
using detail::forget_if_unused_locked;
using detail::live_or_open_locked;
using detail::should_drop;
using detail::writer_options;

CacheResult<UniqueFd> claim_root(const fs::path& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    return cache_failure(CacheErrc::not_a_cache, fmt::format("cache root {}: cannot create it: {}",
                                                             root.string(), ec.message()));
  }
  if (!fs::is_directory(root, ec)) {
    return cache_failure(CacheErrc::not_a_cache,
                         fmt::format("cache root {} is not a directory", root.string()));
  }
  const fs::path marker = layout::marker_path(root);
  if (!fs::exists(fs::symlink_status(marker, ec))) {
    if (!fs::is_empty(root, ec) || ec) {
      return cache_failure(
          CacheErrc::not_a_cache,
          fmt::format("refusing to use {} as the cache root: it is not empty and has no {} "
                      "marker, so thaw did not create it (the cache deletes what it does not "
                      "recognise); give an empty or new directory",
                      root.string(), layout::kMarker));
    }
  }
  UniqueFd fd(::open(marker.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) return std::unexpected(errno_error(errno, fmt::format("opening {}", marker.string())));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return cache_failure(CacheErrc::locked,
                           fmt::format("cache root {} is in use by another HostCache (another "
                                       "thawd or thaw-fetch); stop it or use another root",
                                       root.string()));
    }
    return std::unexpected(errno_error(errno, fmt::format("flock {}", marker.string())));
  }
  return fd;
}

// Gives the cache to `gid` (see HostCacheConfig::group): the root and what an older thawd
// left under it without the group, so an upgrade needs no manual chgrp.
CacheResult<void> share_with_group(const fs::path& root, gid_t gid) {
  const auto give = [gid](const fs::path& path, bool directory) -> CacheResult<void> {
    if (::lchown(path.c_str(), static_cast<uid_t>(-1), gid) != 0 ||
        ::chmod(path.c_str(), directory ? 02750 : 0640) != 0) {
      return std::unexpected(errno_error(
          errno, fmt::format("giving {} to group {} (the first of shim.allow_groups; engines "
                             "of that group read cached files)",
                             path.string(), gid)));
    }
    return {};
  };
  if (auto ok = give(root, true); !ok) return ok;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::file_status status = it->symlink_status(ec);
    if (ec || fs::is_symlink(status)) continue;
    if (fs::is_directory(status) || fs::is_regular_file(status)) {
      if (auto ok = give(it->path(), fs::is_directory(status)); !ok) return ok;
    }
  }
  if (ec) return std::unexpected(errno_error(ec.value(), "walking " + root.string()));
  return {};
}

}  // namespace

HostCache::HostCache(std::shared_ptr<HostCacheState> state) : state_(std::move(state)) {}
HostCache::~HostCache() = default;

CacheResult<HostCache> HostCache::open(HostCacheConfig config) {
  if (config.root.empty()) {
    return cache_failure(CacheErrc::invalid_argument, "host cache: no root directory given");
  }
  if (config.budget_bytes == 0) {
    return cache_failure(
        CacheErrc::invalid_argument,
        fmt::format("host cache {}: the size budget must be > 0 bytes", config.root.string()));
  }
  if (!config.clock) config.clock = detail::realtime_ns;
  auto state = std::make_shared<HostCacheState>();
  state->config = std::move(config);
  auto lock = claim_root(state->config.root);
  if (!lock) return std::unexpected(lock.error());
  state->root_lock = std::move(*lock);
  if (state->config.group) {
    if (auto ok = share_with_group(state->config.root, *state->config.group); !ok) {
      return std::unexpected(ok.error());
    }
  }
  auto filesystem = probe_cache_filesystem(state->config.root);
  if (!filesystem) return std::unexpected(filesystem.error());
  state->filesystem = *filesystem;

  if (auto ok = detail::reindex(*state); !ok) return std::unexpected(ok.error());
  {
    std::lock_guard guard(state->mutex);
    if (auto ok =
            detail::make_room_locked(*state, 0, {}, "the re-indexed cache", &state->report.evicted);
        !ok) {
      return std::unexpected(ok.error());
    }
    state->report.models = state->models.size();
    state->report.bytes_used = state->used;
  }
  return HostCache(std::move(state));
}

const fs::path& HostCache::root() const {
  return state_->config.root;
}
uint64_t HostCache::budget_bytes() const {
  return state_->config.budget_bytes;
}

uint64_t HostCache::bytes_used() const {
  std::lock_guard lock(state_->mutex);
  return state_->used;
}

const ReindexReport& HostCache::reindex_report() const {
  return state_->report;
}

CacheResult<std::shared_ptr<CacheFile>> HostCache::open_file(std::string_view key_view,
                                                             std::string_view path_view,
                                                             CacheFileSpec spec) {
  if (auto ok = layout::check_model_key(key_view); !ok) return std::unexpected(ok.error());
  if (auto ok = layout::check_relative_path(path_view); !ok) return std::unexpected(ok.error());
  HostCacheState& state = *state_;
  auto allocation = cache_allocation_bytes(spec, state.filesystem);
  if (!allocation) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("{}/{}: {}", key_view, path_view, allocation.error().message));
  }
  const std::string key(key_view);
  const std::string relative_path(path_view);
  const std::string what = fmt::format("{}/{}", key, relative_path);

  std::unique_lock lock(state.mutex);
  for (;;) {
    auto model = state.models.find(key);
    if (model == state.models.end()) break;
    auto entry = model->second.files.find(relative_path);
    if (entry == model->second.files.end()) break;
    if (entry->second.creating) {
      state.creation_done.wait(lock);
      continue;
    }
    if (entry->second.size != spec.size || entry->second.chunk_size != spec.chunk_size) {
      return cache_failure(
          CacheErrc::conflict,
          fmt::format("{} is cached as {} bytes in chunks of {}, asked for {} bytes in chunks "
                      "of {}; use a model key that names the revision, or remove the model "
                      "first",
                      what, entry->second.size, entry->second.chunk_size, spec.size,
                      spec.chunk_size));
    }
    auto file = live_or_open_locked(state, key, relative_path, entry->second);
    if (file) {
      detail::touch_locked(state, key, model->second);
      return file;
    }
    if (!should_drop(file.error())) return std::unexpected(file.error());
    // Damaged on disk since it was indexed: start it afresh.
    drop_file_locked(state, key, model->second, relative_path);
    break;
  }

  if (auto ok = detail::make_room_locked(state, *allocation, key, what); !ok) {
    forget_if_unused_locked(state, key);
    return std::unexpected(ok.error());
  }
  {
    ModelEntry& model = state.models[key];
    model.files[relative_path] = FileEntry{spec.size, spec.chunk_size, *allocation, true, {}};
    ++model.creating;
    model.bytes += *allocation;
    state.used += *allocation;
  }

  const fs::path& root = state.config.root;
  CacheResult<CacheFile> created = cache_failure(CacheErrc::io_error, "not created");
  for (;;) {
    CacheFileOptions options = writer_options(state);
    options.promised_elsewhere = detail::promised_space_locked(state, key, relative_path);
    lock.unlock();
    created = CacheFile::create(layout::data_path(root, key, relative_path),
                                layout::readiness_path(root, key, relative_path), spec, options);
    lock.lock();
    if (created || created.error().code != CacheErrc::no_space) break;
    // The filesystem has less room than the budget promised (it is shared, or the
    // budget is larger than it): free the least recently used model and try again.
    if (!detail::evict_one_locked(state, key)) break;
  }

  ModelEntry& model = state.models[key];
  --model.creating;
  auto entry = model.files.find(relative_path);
  std::shared_ptr<CacheFile> result;
  if (created) {
    result = std::make_shared<CacheFile>(std::move(*created));
    entry->second.creating = false;
    entry->second.live = result;
    detail::clear_dropped(state, key, model, relative_path);
    detail::touch_locked(state, key, model);
  } else {
    model.bytes -= entry->second.allocated_bytes;
    state.used -= entry->second.allocated_bytes;
    model.files.erase(entry);
    forget_if_unused_locked(state, key);
  }
  state.creation_done.notify_all();
  if (!created) return std::unexpected(created.error());
  return result;
}

CacheResult<std::shared_ptr<CacheFile>> HostCache::find_file(std::string_view key_view,
                                                             std::string_view path_view) {
  if (auto ok = layout::check_model_key(key_view); !ok) return std::unexpected(ok.error());
  if (auto ok = layout::check_relative_path(path_view); !ok) return std::unexpected(ok.error());
  HostCacheState& state = *state_;
  const std::string key(key_view);
  const std::string relative_path(path_view);
  std::unique_lock lock(state.mutex);
  for (;;) {
    auto not_found = [&] {
      return cache_failure(CacheErrc::not_found,
                           fmt::format("{}/{} is not in the cache at {}", key, relative_path,
                                       state.config.root.string()));
    };
    auto model = state.models.find(key);
    if (model == state.models.end()) return not_found();
    auto entry = model->second.files.find(relative_path);
    if (entry == model->second.files.end()) return not_found();
    if (entry->second.creating) {
      state.creation_done.wait(lock);
      continue;
    }
    auto file = live_or_open_locked(state, key, relative_path, entry->second);
    if (!file) {
      if (should_drop(file.error())) {
        drop_file_locked(state, key, model->second, relative_path);
        forget_if_unused_locked(state, key);
      }
      return std::unexpected(file.error());
    }
    detail::touch_locked(state, key, model->second);
    return file;
  }
}

CacheResult<std::vector<ChunkRun>> HostCache::missing_chunks(std::string_view key,
                                                             std::string_view relative_path) {
  auto file = find_file(key, relative_path);
  if (!file) return std::unexpected(file.error());
  return (*file)->readiness().missing_chunks();
}

CacheResult<ModelPin> HostCache::pin(std::string_view key_view) {
  if (auto ok = layout::check_model_key(key_view); !ok) return std::unexpected(ok.error());
  const std::string key(key_view);
  std::lock_guard lock(state_->mutex);
  ModelEntry& model = state_->models[key];
  ++model.pins;
  detail::touch_locked(*state_, key, model);
  return ModelPin(state_, key);
}

CacheResult<void> HostCache::remove_model(std::string_view key_view) {
  if (auto ok = layout::check_model_key(key_view); !ok) return std::unexpected(ok.error());
  const std::string key(key_view);
  std::lock_guard lock(state_->mutex);
  auto it = state_->models.find(key);
  if (it == state_->models.end() || it->second.files.empty()) {
    return cache_failure(CacheErrc::not_found, fmt::format("model {} is not in the cache at {}",
                                                           key, state_->config.root.string()));
  }
  if (it->second.pins != 0 || it->second.creating != 0) {
    return cache_failure(CacheErrc::busy,
                         fmt::format("model {} cannot be removed: {} pins, {} files being "
                                     "created; release the pins first",
                                     key, it->second.pins, it->second.creating));
  }
  return detail::evict_locked(*state_, key);
}

CacheResult<void> HostCache::set_unverified(std::string_view key_view, bool unverified) {
  if (auto ok = layout::check_model_key(key_view); !ok) return std::unexpected(ok.error());
  const fs::path marker = layout::unverified_path(state_->config.root, key_view);
  std::error_code ec;
  if (!unverified) {
    fs::remove(marker, ec);
    if (ec) return std::unexpected(errno_error(ec.value(), "removing " + marker.string()));
    return {};
  }
  fs::create_directories(marker.parent_path(), ec);
  if (ec)
    return std::unexpected(errno_error(ec.value(), "creating " + marker.parent_path().string()));
  UniqueFd fd(::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) return std::unexpected(errno_error(errno, "creating " + marker.string()));
  return {};
}

std::vector<CachedModelInfo> HostCache::models() const {
  const HostCacheState& state = *state_;
  std::vector<CachedModelInfo> result;
  std::lock_guard lock(state.mutex);
  for (const auto& [key, model] : state.models) {
    CachedModelInfo info{key, model.bytes, model.pins, model.last_used_ns, {}};
    struct stat marker {};
    info.unverified =
        ::lstat(layout::unverified_path(state.config.root, key).c_str(), &marker) == 0;
    for (const auto& [path, entry] : model.files) {
      CachedFileInfo file;
      file.relative_path = path;
      file.size = entry.size;
      file.chunk_size = entry.chunk_size;
      file.chunk_count =
          entry.chunk_size == 0 ? 0 : (entry.size + entry.chunk_size - 1) / entry.chunk_size;
      file.allocated_bytes = entry.allocated_bytes;
      file.being_created = entry.creating;
      auto fill = [&file](const ChunkReadiness& readiness) {
        file.state = readiness.state();
        file.verified_chunks = readiness.verified_chunks();
      };
      if (auto live = entry.live.lock()) {
        fill(live->readiness());
      } else if (!entry.creating) {
        // Nobody holds a writer: what is on disk is current. Read it without one.
        const fs::path map = layout::readiness_path(state.config.root, key, path);
        UniqueFd fd(::open(map.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        auto readiness = fd ? ChunkReadiness::open_reader(std::move(fd), map.string())
                            : CacheResult<ChunkReadiness>(cache_failure(CacheErrc::not_found, ""));
        if (readiness) {
          fill(*readiness);
        } else {
          file.state = FillState::failed;  // damaged; find_file/open_file will drop it
        }
      }
      info.files.push_back(std::move(file));
    }
    if (!model.files.empty()) {  // a model of dropped files only is forgotten, not listed
      for (const std::string& path : model.dropped) {
        CachedFileInfo file;
        file.relative_path = path;
        file.state = FillState::failed;
        file.dropped = true;
        info.files.push_back(std::move(file));
      }
      std::ranges::sort(info.files, {}, &CachedFileInfo::relative_path);
    }
    result.push_back(std::move(info));
  }
  std::stable_sort(result.begin(), result.end(), [](const auto& a, const auto& b) {
    return a.last_used_unix_ns < b.last_used_unix_ns;
  });
  return result;
}

}  // namespace thaw::store
