// Model files thaw manages: files of a model directory in thawd's host cache
// (<root>/<model key>/<path>, the root marked by .thaw-cache), whose bytes may still be
// arriving. The shim finds them at open() (classify), opens their readiness map
// (common/readiness) and keeps it per descriptor (ManagedFileTable), so that reads and
// mappings never see a byte before it is fetched and verified.
//
// The readiness map comes from thawd (open_file) or else the cache itself
// (<root>/<key>/.thaw/ready/<path>, opened read-only). Complete files are tracked too —
// reads never wait on them — because the layout recorder wants to know which model the
// engine runs and which mappings hold its files' bytes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>

#include "common/fd/unique_fd.hpp"
#include "common/readiness/chunk_readiness.hpp"

namespace thaw::preload {

// Where a path lies in a thaw cache.
struct ModelFilePath {
  std::string full;      // absolute and normalised, for messages
  std::string root;      // the cache root (holds .thaw-cache)
  std::string model;     // key in the cache
  std::string relative;  // path in the model directory
};

// What `path` (absolute, or relative to `dirfd`) is: a file of a managed model, or nullopt
// (not in a thaw cache, the model directory itself, or the cache's own .thaw files). Only
// looks at the file system; decides and changes nothing.
std::optional<ModelFilePath> classify(int dirfd, const char* path);

struct ManagedFile {
  std::string path;  // as opened, for messages
  std::uint64_t size = 0;
  store::ChunkReadiness readiness;
  std::string model;      // key in the cache
  std::string relative;   // path in the model directory
  bool complete = false;  // every byte was in when it was opened
};

// The managed file at `where`, with its readiness map: `from_thawd` when thawd handed one
// over, else the cache's own. nullptr when there is no usable map (reads then pass through).
std::shared_ptr<ManagedFile> open_managed_file(const ModelFilePath& where,
                                               std::optional<UniqueFd> from_thawd);

// Blocks until [offset, offset + length) of the file is readable (clipped to its size).
// false (errno EIO) if its fetch failed or the wait timed out (THAW_PRELOAD_READ_TIMEOUT
// seconds, default 600); the reason is logged.
bool wait_readable(ManagedFile& file, std::uint64_t offset, std::uint64_t length);

// Descriptor → managed file. Every read and close asks: lock-free while it is empty, as it
// is in most processes.
class ManagedFileTable {
 public:
  void track(int fd, std::shared_ptr<ManagedFile> file);
  std::shared_ptr<ManagedFile> find(int fd) const;
  void untrack(int fd);

  // Held across fork() by the runtime's fork steps (shim_runtime_fork.cpp).
  std::shared_mutex& fork_mutex() { return mutex_; }

 private:
  mutable std::shared_mutex mutex_;
  std::map<int, std::shared_ptr<ManagedFile>> by_fd_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace thaw::preload
