// Listings of model directories thawd is still filling.
//
// Engines that find their weights by listing the model directory — vLLM globs
// "*.safetensors" (Python's glob: os.scandir, that is opendir + readdir), transformers and
// others list it — would see only the files thawd's fetch has created so far, and load a
// model with shards missing or refuse it. thawd creates every file a fetch will ever create
// (each at its final size) by the end of the fetch's headers phase: the small files first,
// then every weight file at once, then each weight file's safetensors header. So a listing
// of a model directory (or a directory inside one) that starts while that fetch may still
// create files waits until it has created them all, and then lists what is on disk: every
// file exactly once, with its real inode and type, nothing made up and nothing to merge.
// The wait is the small files and the weight files' headers, which an engine that lists
// the directory reads next anyway.
//
// thawd is asked through the contract its open_file keeps (daemon/service/node_service.cpp):
// NotReady for a file not in the cache exactly while a fetch of the model may still create
// files; a name no model has (kListingProbe) thus asks "may the fetch still create files?".
// Without thawd, for a model no fetch is filling, or once the fetch has created its files,
// the listing goes ahead at once.
//
// Cost for every other directory: one hash of its parent (directories known to be outside
// every cache are remembered, pending_files.hpp), plus the working directory or
// /proc/self/fd link for a relative path or a descriptor.
#pragma once

#include <optional>

#include "preload/files/managed_files.hpp"

namespace thaw::preload {

// The file name thawd is asked about: never a model's file, so thawd's answer is about the
// fetch, not about a file.
inline constexpr const char* kListingProbe = ".thaw-listing-probe";

// The model directory (or directory inside one) that `path` (relative to `dirfd`) names, when
// a listing of it should first wait for thawd's fetch; nullopt for any other directory, with
// the shim disabled, or inside the shim.
std::optional<ModelFilePath> listing_candidate(int dirfd, const char* path);
// The same for the directory open on `fd` (fdopendir).
std::optional<ModelFilePath> listing_candidate(int fd);

// Waits while thawd's fetch of `where`'s model may still create files (at most
// THAW_PRELOAD_READ_TIMEOUT; then the listing goes ahead and the shim says it may lack
// files). errno is left as it was.
void wait_until_listable(const ModelFilePath& where);

}  // namespace thaw::preload
