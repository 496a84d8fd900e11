// CacheFile: one cached model file and its readiness map.
//
// The data file is created at its full size up front, so a full cache filesystem is
// reported when the file is created, not halfway through a fetch. On tmpfs the size is
// set sparse (ftruncate) after checking that the filesystem's free space, less what is
// promised to other files not yet written, holds the file and its map: fallocate would
// make the kernel zero every page before the fetch overwrites it (about 0.2 CPU-s per
// GB here, a tenth of a loopback fetch's CPU) and would occupy a whole model's memory
// for a pipeline stage that fetches a quarter of it. hugetlbfs files are fallocated
// (huge pages must be reserved, or a write through the mapping would SIGBUS); so are
// files created with SpaceReservation::preallocate. A write that still finds the disk
// full (something outside the cache filled it) fails with no_space and its chunk is
// never marked ready. Bytes are written as they arrive
// (write_at, from any number of fetch threads at distinct offsets); the fetcher then
// checks the chunk's digest and marks it in readiness().
//
// Creation is atomic as seen on disk: both files are built as unnamed O_TMPFILE inodes
// and linked into place only when fully initialised — the readiness map first, then
// the data. A crash or error at any point leaves either nothing, or a data file with a
// map in state filling (a partial file, resumable), or an orphan map without data
// (dropped by HostCache's re-index). Nothing incomplete ever looks complete: only
// mark_complete() on a fully verified map does.
//
// On hugetlbfs, which has no write(2), bytes are written through a shared mapping of
// the data file, and the file's size is rounded up to the huge page size (the real
// size is readiness().file_size()).
//
// Thread safety: write_at and the reader-fd calls from any thread; readiness() is
// itself thread-safe (see chunk_readiness.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

#include "common/readiness/cache_error.hpp"
#include "common/readiness/chunk_readiness.hpp"
#include "common/readiness/mapped_region.hpp"
#include "daemon/store/cache/unique_fd.hpp"

namespace thaw::store {

struct CacheFileSpec {
  uint64_t size = 0;        // bytes of the model file
  uint64_t chunk_size = 0;  // readiness granule (and digest granule) in bytes
};

enum class DataWriteMode {
  automatic,  // pwrite, or a mapping where the filesystem has no write(2) (hugetlbfs)
  pwrite,
  mapping,
};

enum class SpaceReservation {
  checked,      // free space checked, file sparse (hugetlbfs: preallocated regardless)
  preallocate,  // fallocate the whole file
};

struct CacheFileOptions {
  DataWriteMode write_mode = DataWriteMode::automatic;
  SpaceReservation space = SpaceReservation::checked;
  // With `checked`: bytes of the filesystem's free space already promised to other
  // sparse files not yet filled (HostCache counts them), kept out of this file's reach.
  uint64_t promised_elsewhere = 0;
  // flock() the readiness map so a second writer fails with `locked`. HostCache turns
  // it off: it holds the lock of the whole cache root and keeps one writer per file
  // itself, and a per-file lock would race with a previous writer's destructor.
  bool writer_lock = true;
};

// What the filesystem of a cache directory needs to know to size files on it.
struct CacheFilesystem {
  bool hugetlbfs = false;
  uint64_t block_bytes = 4096;  // allocation granule: the huge page size on hugetlbfs
};
CacheResult<CacheFilesystem> probe_cache_filesystem(const std::filesystem::path& dir);

// Bytes the data file occupies on that filesystem: `size`, rounded to the block size
// (hugetlbfs files must also *be* that long, other files are exactly `size` long).
uint64_t data_file_bytes(uint64_t size, const CacheFilesystem& fs);
// Space a cached file takes there, as the cache budget counts it: the data rounded up
// to the block size plus the readiness map.
CacheResult<uint64_t> cache_allocation_bytes(CacheFileSpec spec, const CacheFilesystem& fs);

class CacheFile {
 public:
  // Creates the data file (full size reserved) and a fresh readiness map (filling).
  // Parent directories are created. Fails with `exists` if either path exists, with
  // no_space (message naming the directory, the size and what to do) if the
  // filesystem is full; nothing is left behind on failure.
  static CacheResult<CacheFile> create(const std::filesystem::path& data_path,
                                       const std::filesystem::path& readiness_path,
                                       CacheFileSpec spec, CacheFileOptions options = {});
  // Opens an existing pair to read its state or resume filling it. Validates the map
  // and that the data file has the size the map says. Takes the writer lock (flock on
  // the map) unless options say not to: a second CacheFile on the same pair then fails
  // with `locked`.
  static CacheResult<CacheFile> open(const std::filesystem::path& data_path,
                                     const std::filesystem::path& readiness_path,
                                     CacheFileOptions options = {});

  CacheFile(CacheFile&&) noexcept = default;
  CacheFile& operator=(CacheFile&&) noexcept = default;

  const std::filesystem::path& data_path() const { return data_path_; }
  const std::filesystem::path& readiness_path() const { return readiness_path_; }
  uint64_t size() const { return readiness_.file_size(); }
  uint64_t chunk_size() const { return readiness_.chunk_size(); }

  // Writes `bytes` at `offset` (must lie within size()). Handles short writes and EINTR.
  CacheResult<void> write_at(uint64_t offset, std::span<const std::byte> bytes);

  // Fresh read-only descriptors (new open file descriptions, so the receiver cannot
  // write) to pass to a consumer over SCM_RIGHTS.
  CacheResult<UniqueFd> reader_data_fd() const;
  CacheResult<UniqueFd> reader_readiness_fd() const { return readiness_.reopen_read_only(); }

  // A read-only shared mapping of [offset, offset + length) of the data file, for hashing
  // bytes where they lie instead of copying them out (pread) first.
  CacheResult<MappedRegion> map_range_read_only(uint64_t offset, uint64_t length) const;

  int data_fd() const { return data_fd_.get(); }
  ChunkReadiness& readiness() { return readiness_; }
  const ChunkReadiness& readiness() const { return readiness_; }

 private:
  CacheFile(std::filesystem::path data_path, std::filesystem::path readiness_path, UniqueFd data_fd,
            uint64_t data_bytes, ChunkReadiness readiness);
  CacheResult<void> set_up_writes(DataWriteMode mode, const CacheFilesystem& fs);

  std::filesystem::path data_path_;
  std::filesystem::path readiness_path_;
  UniqueFd data_fd_;
  uint64_t data_bytes_ = 0;
  ChunkReadiness readiness_;
  MappedRegion write_map_;  // only in mapping mode
};

}  // namespace thaw::store
