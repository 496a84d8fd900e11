// Where the host cache keeps things under its root directory:
//
//   <root>/.thaw-cache                          marker that this is a thaw cache; flock()ed
//                                               by the HostCache that owns the root
//   <root>/<model key>/<relative path>          a cached model file, as the registry names it
//   <root>/<model key>/.thaw/ready/<rel path>   its readiness map (chunk_readiness.hpp)
//   <root>/<model key>/.thaw/last-used          its mtime is the model's LRU time
//   <root>/<model key>/.thaw/unverified         present while the model's bytes were taken
//                                               with no digest to check them against (it was
//                                               published without thaw-manifest.json)
//   <root>/<model key>/.thaw/dropped/<rel path> empty: that file was deleted as damaged and
//                                               no fetch has created it again yet, so the
//                                               model is incomplete (survives a restart)
//
// The per-model metadata lives under ".thaw/", a name reserved (a model file path may
// not start with it), so a model's own files — including hidden ones such as
// .gitattributes — can never collide with a readiness map, and the map tree mirrors
// the model's tree one to one. Model keys are single path components that cannot
// start with '.', so they never collide with the marker either.
#pragma once

#include <filesystem>
#include <string_view>

#include "common/readiness/cache_error.hpp"

namespace thaw::store::cache_layout {

inline constexpr std::string_view kMarker = ".thaw-cache";
inline constexpr std::string_view kMetaDir = ".thaw";
inline constexpr std::string_view kReadyDir = "ready";
inline constexpr std::string_view kLastUsed = "last-used";
inline constexpr std::string_view kUnverified = "unverified";
inline constexpr std::string_view kDroppedDir = "dropped";
inline constexpr size_t kMaxKeyBytes = 200;
inline constexpr size_t kMaxPathBytes = 1024;

// A model key: 1–200 characters of [A-Za-z0-9._@=-], starting with a letter or digit
// (e.g. "gpt2@main", "meta-llama--Llama-2-7b-hf@01c7f73"; map '/' of a hub repo id to
// "--"). Fails with invalid_argument naming the rule.
CacheResult<void> check_model_key(std::string_view key);
// A relative file path inside a model: '/'-separated components, none empty, "." or
// "..", at most 255 bytes each and 1024 in all, no NUL, not absolute, and not under
// the reserved ".thaw/".
CacheResult<void> check_relative_path(std::string_view path);

std::filesystem::path marker_path(const std::filesystem::path& root);
std::filesystem::path model_dir(const std::filesystem::path& root, std::string_view key);
std::filesystem::path data_path(const std::filesystem::path& root, std::string_view key,
                                std::string_view relative_path);
std::filesystem::path readiness_dir(const std::filesystem::path& root, std::string_view key);
std::filesystem::path readiness_path(const std::filesystem::path& root, std::string_view key,
                                     std::string_view relative_path);
std::filesystem::path last_used_path(const std::filesystem::path& root, std::string_view key);
std::filesystem::path unverified_path(const std::filesystem::path& root, std::string_view key);
std::filesystem::path dropped_dir(const std::filesystem::path& root, std::string_view key);
std::filesystem::path dropped_path(const std::filesystem::path& root, std::string_view key,
                                   std::string_view relative_path);

}  // namespace thaw::store::cache_layout
