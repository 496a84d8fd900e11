// Publishing a model to a registry: writing its thaw-manifest.json (registry/manifest.hpp
// has the format) — every file with its size, sha256 (what Hugging Face calls the LFS
// oid) and a digest per chunk (the SHA-256 chaining state after it, or the chunk's own
// sha256), so a fetch can verify each chunk as it lands and a consumer never sees a byte
// that failed verification.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <string>

#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/registry/manifest.hpp"

namespace thaw::store {

struct PublishOptions {
  std::uint64_t chunk_size = kDefaultChunkBytes;  // > 0
  // Publish SHA-256 chaining states (chunk_chain_sha256) when the chunk size is a multiple
  // of 64, instead of one sha256 per chunk: a fetch then checks every chunk and the file's
  // sha256 in one pass, and the manifest holds one digest per chunk, not two. false (or a
  // chunk size that is not a multiple of 64): plain chunk_sha256.
  bool chain = true;
  // Told after each file is hashed (path relative to the directory, its size).
  std::function<void(const std::string& path, std::uint64_t size)> on_file;
};

struct PublishError {
  std::string message;  // names the directory or file and what to do
};

// The manifest of every regular file under `dir` (symlinks followed, as in a Hugging Face
// snapshot), sorted by path; hidden directories (.git, .cache) and the manifest itself
// are left out. Reads every byte once. Refuses, naming the file and the rule broken, a
// model the fetch side would refuse: any *.safetensors file the strict parser rejects
// (bad header, unknown dtype, overlapping or out-of-bounds offsets, ...), or weights that
// do not assemble (an index naming a missing shard or tensor).
std::expected<Manifest, PublishError> make_manifest(const std::filesystem::path& dir,
                                                    const PublishOptions& options = {});

// make_manifest, then writes it to dir/thaw-manifest.json atomically (a temporary file
// renamed over it). Returns the manifest written.
std::expected<Manifest, PublishError> publish_manifest(const std::filesystem::path& dir,
                                                       const PublishOptions& options = {});

}  // namespace thaw::store
