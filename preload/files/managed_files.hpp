// Model files thaw manages: files of a model directory in thawd's host cache
// (<root>/<model key>/<path>, the root marked by .thaw-cache), whose bytes may still be
// arriving. The shim finds them at open() and keeps, per descriptor, the file's readiness
// map (common/readiness) so that reads and mappings never see a byte before it is fetched
// and verified.
//
// The readiness map comes from thawd (open_file) or else the cache itself
// (<root>/<key>/.thaw/ready/<path>, opened read-only). Complete files are tracked too —
// reads never wait on them — because the layout recorder wants to know which model the
// engine runs and which mappings hold its files' bytes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/readiness/chunk_readiness.hpp"

namespace thaw::preload {

struct ManagedFile {
  std::string path;  // as opened, for messages
  std::uint64_t size = 0;
  store::ChunkReadiness readiness;
  std::string model;      // key in the cache
  std::string relative;   // path in the model directory
  bool complete = false;  // every byte was in when it was opened
};

// The managed file behind `path` (absolute, or relative to `dirfd`), or nullptr when the
// path is not in a thaw cache.
std::shared_ptr<ManagedFile> classify(int dirfd, const char* path);

// Descriptor table.
void track(int fd, std::shared_ptr<ManagedFile> file);
std::shared_ptr<ManagedFile> tracked(int fd);
void untrack(int fd);

// Blocks until [offset, offset + length) of the file is readable (clipped to its size).
// false (errno EIO) if its fetch failed or the wait timed out (THAW_PRELOAD_READ_TIMEOUT
// seconds, default 600); the reason is logged.
bool wait_readable(ManagedFile& file, std::uint64_t offset, std::uint64_t length);

}  // namespace thaw::preload
