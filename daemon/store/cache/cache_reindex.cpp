// Start-up re-index of a cache root (HostCache::open). See host_cache.hpp for the
// policy: keep what a readiness map vouches for, delete what nothing vouches for, and
// remember which files of a kept model were deleted, so it never reads complete.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <system_error>
#include <vector>

#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/cache/host_cache_state.hpp"

namespace thaw::store::detail {
namespace fs = std::filesystem;
namespace layout = cache_layout;
namespace {

struct FoundEntry {
  fs::path path;
  std::string relative;  // generic form, '/'-separated
  fs::file_type type;
};

// Everything below `dir` except directories, listed before anything is deleted (so
// deletions cannot disturb the walk). `skip` (a top-level name) is not descended into.
CacheResult<std::vector<FoundEntry>> list_tree(const fs::path& dir, std::string_view skip) {
  std::vector<FoundEntry> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  if (ec) {
    return cache_failure(CacheErrc::io_error,
                         fmt::format("re-index: listing {}: {}", dir.string(), ec.message()));
  }
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& path = it->path();
    if (it.depth() == 0 && !skip.empty() && path.filename() == skip) {
      it.disable_recursion_pending();
      continue;
    }
    const fs::file_type type = it->symlink_status(ec).type();
    if (ec) break;
    if (type == fs::file_type::directory) continue;
    found.push_back(FoundEntry{path, path.lexically_relative(dir).generic_string(), type});
  }
  if (ec) {
    return cache_failure(CacheErrc::io_error,
                         fmt::format("re-index: listing {}: {}", dir.string(), ec.message()));
  }
  return found;
}

int64_t mtime_ns(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

void drop(HostCacheState& state, const fs::path& path, std::string reason) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) reason += fmt::format(" (deleting it failed: {})", ec.message());
  state.report.dropped.push_back(DroppedEntry{path, std::move(reason)});
}

// Removes directories emptied by drops, deepest first; keeps `dir` itself.
void prune_empty_dirs(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) dirs.push_back(it->path());
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) {
    if (fs::is_empty(*d, ec)) fs::remove(*d, ec);
  }
}

// A data file of the model that was deleted: the model lacks it until a fetch re-creates it.
void drop_model_file(HostCacheState& state, const std::string& key, ModelEntry& model,
                     const FoundEntry& entry, std::string reason) {
  drop(state, entry.path, std::move(reason));
  if (layout::check_relative_path(entry.relative)) {
    mark_dropped(state, key, model, entry.relative);
  }
}

CacheResult<void> reindex_model(HostCacheState& state, const std::string& key) {
  const fs::path& root = state.config.root;
  const fs::path dir = layout::model_dir(root, key);
  CacheFileOptions options = state.config.file_options;
  options.writer_lock = false;
  ModelEntry model;

  auto data = list_tree(dir, layout::kMetaDir);
  if (!data) return std::unexpected(data.error());
  for (const FoundEntry& entry : *data) {
    if (entry.type != fs::file_type::regular) {
      drop_model_file(state, key, model, entry, "not a regular file");
      continue;
    }
    if (auto ok = layout::check_relative_path(entry.relative); !ok) {
      drop(state, entry.path, ok.error().message);
      continue;
    }
    const fs::path map = layout::readiness_path(root, key, entry.relative);
    auto file = CacheFile::open(entry.path, map, options);
    if (!file) {
      const bool no_map = file.error().code == CacheErrc::not_found;
      drop_model_file(
          state, key, model, entry,
          no_map ? "no readiness map (its creation never finished)" : file.error().message);
      if (!no_map) drop(state, map, "readiness map of a dropped file");
      continue;
    }
    auto allocation =
        cache_allocation_bytes(CacheFileSpec{file->size(), file->chunk_size()}, state.filesystem);
    if (!allocation) {  // cannot happen for a validated map; be safe
      drop_model_file(state, key, model, entry, allocation.error().message);
      drop(state, map, allocation.error().message);
      continue;
    }
    if (file->readiness().state() == FillState::complete) {
      ++state.report.complete_files;
    } else {
      ++state.report.partial_files;
    }
    model.files[entry.relative] =
        FileEntry{file->size(), file->chunk_size(), *allocation, false, {}};
    model.bytes += *allocation;
  }

  const fs::path ready = layout::readiness_dir(root, key);
  std::error_code ec;
  if (fs::exists(ready, ec)) {
    auto maps = list_tree(ready, {});
    if (!maps) return std::unexpected(maps.error());
    for (const FoundEntry& entry : *maps) {
      if (!model.files.contains(entry.relative)) {
        // Its data file is gone (or was just dropped): the model lacks that file.
        drop_model_file(state, key, model, entry, "readiness map without its data file");
      }
    }
  }

  // Marks left by earlier runs: still missing unless the file is back (a crash between
  // creating it and clearing the mark).
  const fs::path marks = layout::dropped_dir(root, key);
  if (fs::exists(marks, ec)) {
    auto found = list_tree(marks, {});
    if (!found) return std::unexpected(found.error());
    for (const FoundEntry& entry : *found) {
      if (model.files.contains(entry.relative) || !layout::check_relative_path(entry.relative)) {
        fs::remove(entry.path, ec);
      } else {
        model.dropped.insert(entry.relative);
      }
    }
  }

  if (model.files.empty()) {
    fs::remove_all(dir, ec);
    return {};
  }
  prune_empty_dirs(dir);
  model.last_used_ns = mtime_ns(layout::last_used_path(root, key));
  if (!model.dropped.empty()) state.report.incomplete.push_back(key);
  state.used += model.bytes;
  state.models.emplace(key, std::move(model));
  return {};
}

}  // namespace

void mark_dropped(HostCacheState& state, const std::string& key, ModelEntry& model,
                  const std::string& relative_path) {
  model.dropped.insert(relative_path);
  const fs::path mark = layout::dropped_path(state.config.root, key, relative_path);
  std::error_code ec;
  fs::create_directories(mark.parent_path(), ec);
  const int fd = ::open(mark.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0) ::close(fd);
}

void clear_dropped(HostCacheState& state, const std::string& key, ModelEntry& model,
                   const std::string& relative_path) {
  if (model.dropped.erase(relative_path) == 0) return;
  std::error_code ec;
  fs::remove(layout::dropped_path(state.config.root, key, relative_path), ec);
}

CacheResult<void> reindex(HostCacheState& state) {
  const fs::path& root = state.config.root;
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec) {
    return cache_failure(CacheErrc::io_error,
                         fmt::format("re-index: listing {}: {}", root.string(), ec.message()));
  }
  for (const fs::directory_entry& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name == layout::kMarker) continue;
    const bool is_dir = entry.symlink_status(ec).type() == fs::file_type::directory;
    if (!is_dir || !layout::check_model_key(name)) {
      state.report.ignored.push_back(entry.path());
      continue;
    }
    if (auto ok = reindex_model(state, name); !ok) return ok;
  }
  return {};
}

}  // namespace thaw::store::detail
