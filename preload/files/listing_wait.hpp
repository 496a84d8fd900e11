// The decisions behind complete listings of model directories (pending_listing.hpp), kept
// free of the shim's state, thawd and the clock so they can be tested on their own.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "preload/files/managed_files.hpp"

namespace thaw::preload {

// Where the directory `absolute` (an absolute path; normalised here) lies in a thaw cache:
// the model directory <root>/<key> (relative "") or a directory inside it (relative
// "sub/dir"). nullopt for any other directory: outside every cache, a cache root itself,
// or the cache's own metadata (a key starting with '.', such as the marker, or anything
// under <key>/.thaw). `has_marker(dir)` says whether `dir` holds a cache marker; it is asked
// for each ancestor, nearest first, until one does.
template <typename HasMarker>
std::optional<ModelFilePath> listed_model_directory(const std::filesystem::path& absolute,
                                                    HasMarker has_marker) {
  namespace fs = std::filesystem;
  if (!absolute.is_absolute()) return std::nullopt;
  fs::path dir = absolute.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "<key>/" names <key>
  const std::vector<fs::path> parts(dir.begin(), dir.end());
  // parts[0] is "/"; a root at parts[0..i) has the model key at parts[i].
  for (std::size_t i = parts.size(); i-- > 1;) {
    fs::path root;
    for (std::size_t j = 0; j < i; ++j) root /= parts[j];
    if (!has_marker(root)) continue;
    const std::string key = parts[i].string();
    if (key.empty() || key.front() == '.') return std::nullopt;
    fs::path relative;
    for (std::size_t j = i + 1; j < parts.size(); ++j) relative /= parts[j];
    if (!relative.empty() && relative.begin()->string() == ".thaw") return std::nullopt;
    return ModelFilePath{dir.string(), root.string(), key, relative.string()};
  }
  return std::nullopt;
}

// What waiting for a complete listing came to.
enum class ListingWait {
  complete,         // no fetch was creating files in it: listed at once
  complete_waited,  // a fetch was; it has created every file it will now
  timed_out,        // the fetch still was at the deadline: the listing may lack files
};

// Asks `fetch_creating_files()` (true while a fetch of the directory's model may still
// create files in it) until it says no or `timeout` has passed, sleeping `sleep(step)`
// between asks with steps of 5 ms doubling up to 50 ms. The clock is steady_clock unless a
// test passes its own `now`.
template <typename Probe, typename Sleep, typename Now>
ListingWait wait_for_complete_listing(Probe fetch_creating_files, Sleep sleep,
                                      std::chrono::nanoseconds timeout, Now now) {
  if (!fetch_creating_files()) return ListingWait::complete;
  const auto deadline = now() + timeout;
  std::chrono::milliseconds step(5);
  for (;;) {
    if (now() >= deadline) return ListingWait::timed_out;
    sleep(step);
    step = std::min(step * 2, std::chrono::milliseconds(50));
    if (!fetch_creating_files()) return ListingWait::complete_waited;
  }
}

}  // namespace thaw::preload
