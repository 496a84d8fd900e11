// Model files thawd is fetching but has not created in its cache yet.
//
// thawd starts a stage's fetch before the engine exists, and the agent launches the engine at
// once (HydraServe's overlap). The fetch lists the model first, then creates each file in the
// cache at its final size (the registry's manifest) before its bytes arrive. An engine that
// starts within that window stats, access()es or opens a file that is not there yet; without
// help it would see ENOENT and give up ("names a shard which does not exist"). So when such a
// call fails with ENOENT for a path in a thaw cache, the hooks ask thawd: while a fetch of
// that model runs and has not created the file, they wait for it, then call again — the
// engine sees the whole file at its final size at once, and reads block only on bytes not yet
// arrived (file_hooks.cpp). The model's directory itself (<root>/<key>, which the cache
// creates with the first file) is waited for the same way. A path thawd does not fetch gets
// its ENOENT unchanged. Listings of the model directory wait the same way, for every file the
// fetch will create (pending_listing.hpp).
//
// Cost for everything else: nothing on success; on ENOENT, a look for the cache marker in the
// directory and above it, once per directory (a directory found to have none is remembered,
// so later misses there cost a hash).
#pragma once

#include <filesystem>
#include <optional>

#include "preload/files/managed_files.hpp"

namespace thaw::preload {

// For a call on `path` (relative to `dirfd`) that just failed with `err`: the model file it
// names when the call should wait for thawd to create it and be made again. nullopt (nothing
// to wait for) when err is not ENOENT, the shim is disabled, the path is not in a thaw cache,
// or this thread is inside the shim.
std::optional<ModelFilePath> pending_candidate(int dirfd, const char* path, int err);

// Waits until thawd has created `where` in its cache. true: the file is there now (call again);
// false: no fetch will create it (thawd absent, model not being fetched, the fetch ended
// without it) or it did not come within THAW_PRELOAD_READ_TIMEOUT — the caller then reports
// its original ENOENT. Logs once per file that it waited.
bool wait_until_created(const ModelFilePath& where);

// `path` made absolute the way the kernel reads it for an *at() call: relative to the working
// directory (AT_FDCWD) or to the directory `dirfd` holds (its /proc/self/fd link). nullopt when
// that base cannot be read. Not normalised.
std::optional<std::filesystem::path> absolute_at(int dirfd, const char* path);

// Whether `dir` (absolute, normalised) is known to hold no cache marker, in itself or any
// directory above it: found so now (one stat per level) or remembered from an earlier call
// (a hash). The cheap check every hook on a path runs before anything else.
bool outside_every_cache(const std::string& dir);

}  // namespace thaw::preload
