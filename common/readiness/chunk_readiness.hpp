// ChunkReadiness: which bytes of one cached file may be read.
//
// A small shared map (a readiness file next to the cached file, or a memfd) holding a
// contiguous-progress word (bytes [0, P) all verified — HydraServe §5.1's single
// counter) plus a bitmap of verified chunks, so ranges fetched out of order over
// several connections are readable before the prefix catches up. The layout is in
// readiness_layout.hpp.
//
// The daemon's fetcher is the only writer: after a chunk's bytes are written and its
// digest checked it calls mark_verified(chunk); mark_failed(reason) gives up;
// mark_complete() seals a fully verified file. Readers are any processes given the fd
// (over SCM_RIGHTS); a read-only mapping suffices. A reader never treats a byte as
// readable unless every chunk it lies in is marked verified.
//
// Waiting: a reader blocked in wait_ready() sleeps on the map's 32-bit epoch word with
// a shared futex. Each writer change bumps the epoch and wakes all waiters, which
// re-check their own range — so a waiter for chunk i wakes when chunk i lands, with no
// polling interval. The classic epoch pattern (read epoch, check, FUTEX_WAIT(epoch))
// loses no wake: if a change lands after the check, the epoch no longer matches and
// the kernel returns at once.
//
// Memory ordering. The fetcher's bytes reach the cache file (pwrite, or stores through
// a mapping) before mark_verified; mark_verified publishes the chunk bit and the
// progress word with release stores and then bumps the epoch with release. Readers
// load the epoch, progress word, bitmap and state with acquire. Hence a reader that
// sees a chunk's bit (or a progress word past it) also sees the chunk's bytes, and a
// reader that sees the new epoch also sees the bit that caused it — which is what the
// wait loop needs: after loading epoch E, a failed check either happened before the
// change (the kernel then sees epoch != E, or the wake comes after it sleeps) or
// cannot happen at all. The writer's own read-modify-write sequences (advancing the
// progress word over a run of set bits) are serialised by an in-process mutex, so the
// progress word is exact and never overtakes an unset bit.
//
// Thread safety: reader operations are lock-free and safe from any thread or process.
// Writer operations are safe from several threads of the writing process; a second
// writer process is kept out by the owner (HostCache holds the cache root's lock and
// CacheFile an flock on the readiness file).
//
// If the writer dies, waiters sleep until their timeout: consumers must pass one (the
// shim also watches the daemon's socket).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/readiness/cache_error.hpp"
#include "common/readiness/mapped_region.hpp"

namespace thaw::store {

enum class FillState : uint32_t {
  filling = 1,   // chunks are being fetched (or the fetch will resume)
  complete = 2,  // every chunk verified; the file is final
  failed = 3,    // the fetch gave up; failure_reason() says why
};
std::string_view to_string(FillState state);

// A run of consecutive chunks [first, first + count).
struct ChunkRun {
  uint64_t first = 0;
  uint64_t count = 0;
  friend bool operator==(const ChunkRun&, const ChunkRun&) = default;
};

enum class WaitStatus {
  ready,         // every byte of the range is verified
  timed_out,     // the timeout passed with part of the range unverified
  failed,        // the fetch failed before the range became ready (see reason)
  out_of_range,  // the range ends past the file: it can never become ready
};
std::string_view to_string(WaitStatus status);

struct WaitResult {
  WaitStatus status = WaitStatus::timed_out;
  std::string failure_reason;  // set when status == failed
};

class ChunkReadiness {
 public:
  // Waits with this timeout never time out.
  static constexpr std::chrono::nanoseconds kForever = std::chrono::nanoseconds::max();

  // The size of the map for a file of this geometry, rounded to `alignment` (the page
  // size; the huge page size on hugetlbfs). Fails on a chunk size of 0 or more than
  // readiness_layout::kMaxChunkCount chunks.
  static CacheResult<uint64_t> region_bytes_for(uint64_t file_size, uint64_t chunk_size,
                                                uint64_t alignment);

  // Initialises a fresh map (state filling, nothing verified) in `fd`, which must be
  // empty and open read-write; reserves its space first (fallocate), so a full
  // filesystem is an error here, not a SIGBUS later. `name` names it in errors.
  static CacheResult<ChunkReadiness> create(UniqueFd fd, std::string name, uint64_t file_size,
                                            uint64_t chunk_size);
  // Opens an existing map to keep filling it (fd open read-write). Validated.
  static CacheResult<ChunkReadiness> open_writer(UniqueFd fd, std::string name);
  // Opens an existing map to read or wait on (read-only fd suffices). Validated:
  // magic, version, geometry, size against the fd's size, and the invariants between
  // state, progress word and bitmap. A corrupt or foreign file is an error.
  static CacheResult<ChunkReadiness> open_reader(UniqueFd fd, std::string name);

  ChunkReadiness(ChunkReadiness&&) noexcept = default;
  ChunkReadiness& operator=(ChunkReadiness&&) noexcept = default;
  ~ChunkReadiness() = default;

  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }
  bool writable() const { return writer_mutex_ != nullptr; }
  // A new read-only open file description of the same map, to hand to a consumer
  // (a dup() would share this one's read-write access mode).
  CacheResult<UniqueFd> reopen_read_only() const;

  uint64_t file_size() const { return file_size_; }
  uint64_t chunk_size() const { return chunk_size_; }
  uint64_t chunk_count() const { return chunk_count_; }
  uint64_t region_bytes() const { return map_.size(); }
  uint64_t chunk_offset(uint64_t chunk) const { return chunk * chunk_size_; }
  // Bytes in `chunk` (chunk_size but for the last one). 0 past the end.
  uint64_t chunk_length(uint64_t chunk) const;

  // --- Reader side (any process, any thread) ---
  FillState state() const;
  // Why the fetch failed; empty unless state() == failed.
  std::string failure_reason() const;
  uint64_t contiguous_bytes() const;
  uint64_t verified_chunks() const;
  uint64_t generation() const;
  uint32_t epoch() const;
  bool chunk_verified(uint64_t chunk) const;
  // True iff [offset, offset + length) lies in the file and all its chunks are verified.
  bool is_ready(uint64_t offset, uint64_t length) const;
  // Blocks until the range is ready, the fetch fails, or `timeout` passes. A range that
  // is already verified is ready even if the fetch later failed.
  WaitResult wait_ready(uint64_t offset, uint64_t length, std::chrono::nanoseconds timeout) const;
  // Chunks not yet verified, as runs in file order (what a resumed fetch must get).
  std::vector<ChunkRun> missing_chunks() const;

  // --- Writer side (the daemon; thread-safe within it) ---
  // Marks `chunk` verified: sets its bit, advances the progress word over any run of
  // set bits, bumps the epoch and wakes waiters. Idempotent.
  CacheResult<void> mark_verified(uint64_t chunk);
  // Gives up on the file: state failed with `reason` (truncated to 255 bytes); wakes
  // waiters, whose ranges that are not verified yet then report failed.
  CacheResult<void> mark_failed(std::string_view reason);
  // Seals the file. Fails (wrong_state) unless every chunk is verified.
  CacheResult<void> mark_complete();
  // After a failure, back to filling (generation + 1) so a fetch can resume from the
  // verified chunks. No-op while filling; wrong_state once complete.
  CacheResult<void> resume_filling();

 private:
  ChunkReadiness(UniqueFd fd, MappedRegion map, std::string name, bool writable);
  static CacheResult<ChunkReadiness> open(UniqueFd fd, std::string name, bool writable);
  CacheResult<void> validate() const;
  CacheResult<void> require_writer(std::string_view op) const;
  void publish_change();  // epoch + 1 and wake everyone

  const void* header() const { return map_.data(); }
  uint64_t* bitmap() const;

  UniqueFd fd_;
  MappedRegion map_;
  std::string name_;
  uint64_t file_size_ = 0;
  uint64_t chunk_size_ = 1;
  uint64_t chunk_count_ = 0;
  // Present only on a writable map; serialises writer read-modify-write sequences.
  std::unique_ptr<std::mutex> writer_mutex_;
};

}  // namespace thaw::store
