// FillSession: the FetchSink between a RangeFetcher and the host cache for one model
// fetch. It writes arriving bytes into the cache files, counts each readiness chunk's
// bytes, and hands a chunk that is whole to a verifier thread, which checks its sha256
// (when the manifest has chunk digests) and only then marks it verified — the moment a
// consumer waiting on it wakes. A chunk whose digest does not match is fetched once more;
// a second mismatch fails the file (readiness state failed, so waiters get the failure,
// never the bytes) and the whole fetch with a message naming file, chunk and digests.
//
// When the manifest publishes SHA-256 chaining states (sha256_chain.hpp), each chunk is
// checked against them instead: one hashing pass per byte gates every chunk and, with the
// last chunk, checks the whole file's sha256 too. Otherwise the whole-file sha256, when
// wanted, is computed as the file's chunks become verified in order (so it overlaps the
// transfer instead of re-reading gigabytes at the end), and is compared by the caller once
// every chunk is in.
//
// Digests hash the bytes where they lie, through a read-only mapping of just that chunk,
// populated in one call and dropped after: copying them out first (pread) cost as much CPU
// as the hashing itself, and on a small machine CPU is what bounds a loopback or 10 Gbit/s
// fetch; one mapping of the whole file instead took ~75 ms per 2 GB to tear down at the
// end, on the fetch's critical path.
//
// Threads: sink calls come from the fetcher's thread; verification runs on the pool's
// threads; claim/seal/wait and the rest on the thread that drives the fetch. Files are
// registered into fixed slots before any request for them is submitted, so the other
// threads never see the slot table change under them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/readiness/mapped_region.hpp"
#include "daemon/store/cache/cache_file.hpp"
#include "daemon/store/fetch/chunk_set.hpp"
#include "daemon/store/fetch/model_fetch_error.hpp"
#include "daemon/store/fetch/sha256.hpp"
#include "daemon/store/fetch/worker_pool.hpp"
#include "daemon/store/registry/fetch_types.hpp"

namespace thaw::store {

// A chunk whose bytes did not match the manifest's digest.
struct ChunkMismatch {
  std::string path;  // the file, relative to the model
  std::uint64_t chunk = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::string expected_sha256;
  std::string actual_sha256;
  bool refetching = false;  // true: fetched once more; false: the file is failed
};

// Progress counters of a whole model fetch (shared with ModelFetch::progress()).
struct FillCounters {
  std::atomic<std::uint64_t> bytes_requested{0};  // chunk bytes asked of the fetcher
  std::atomic<std::uint64_t> bytes_written{0};    // bytes written into the cache
  std::atomic<std::uint64_t> bytes_verified{0};   // bytes of chunks verified in this fetch
  std::atomic<std::uint64_t> chunk_refetches{0};
  std::atomic<std::uint32_t> files_total{0};
  std::atomic<std::uint32_t> files_done{0};
};

struct FillHooks {
  // Fetches a chunk again (RangeFetcher::refetch).
  std::function<std::expected<void, FetchError>(FileId, ByteRange, FetchClass)> refetch;
  // Told of every digest mismatch, on a verifier thread (for logs and tests), before the
  // chunk is requested again; it must return promptly and not call into the fetch.
  std::function<void(const ChunkMismatch&)> on_chunk_mismatch;
};

struct FileFillSpec {
  std::string path;                       // relative to the model
  std::vector<std::string> chunk_sha256;  // per cache chunk; empty: no chunk digests
  // Chained verification (takes precedence over chunk_sha256): the chaining state after
  // each chunk but the last, and the file's sha256, which the last chunk must produce.
  bool chained = false;
  std::vector<std::string> chain_sha256;
  std::string file_sha256;
  bool digest_whole_file = false;  // compute the file's sha256 as chunks land in order
};

// One file being filled. Owned by the session; fields the other threads touch are atomic.
struct FileFill {
  FileFill(FileId id, FileFillSpec spec, std::shared_ptr<CacheFile> file);

  const FileId id;
  const FileFillSpec spec;
  const std::shared_ptr<CacheFile> file;
  const std::uint64_t chunk_count;

  ChunkReadiness& readiness() const { return file->readiness(); }
  // A read-only mapping of chunk `c` (only verified or complete chunks hold the fetched
  // bytes).
  CacheResult<MappedRegion> map_chunk(std::uint64_t c) const;

  // Per chunk: bytes written since it was (re)requested; whether it was refetched; its
  // class; whether this session claimed it (requested it, or found it verified already).
  std::unique_ptr<std::atomic<std::uint64_t>[]> written;
  std::unique_ptr<std::atomic<std::uint8_t>[]> refetched;
  std::vector<FetchClass> chunk_class;
  std::vector<bool> claimed;  // the driving thread only

  std::atomic<std::uint64_t> outstanding{0};  // requested, not yet verified
  // outstanding + 1 until seal(): reaching 0 makes the file count as done.
  std::atomic<std::uint64_t> pending{1};
  std::atomic<std::uint64_t> chunks_fetched{0};  // verified in this session
  std::atomic<std::uint64_t> bytes_fetched{0};
  std::atomic<bool> failed{false};

  // The whole-file digest over chunks [0, digest_next), under digest_mutex.
  std::mutex digest_mutex;
  std::optional<Sha256> digest;
  std::uint64_t digest_next = 0;
  std::atomic<std::uint64_t> digest_requests{0};
};

class FillSession final : public FetchSink {
 public:
  // `label` names the model in messages. `file_slots`: FileIds are below it. `in_place`:
  // local sources may copy_file_range() straight into the cache files.
  FillSession(std::string label, std::size_t file_slots, unsigned verify_threads, bool in_place,
              FillCounters& counters, FillHooks hooks, std::chrono::steady_clock::time_point start);
  ~FillSession() override;
  FillSession(const FillSession&) = delete;
  FillSession& operator=(const FillSession&) = delete;

  // Registers file `id` before any request for it (the slot must be empty).
  FileFill& add_file(FileId id, FileFillSpec spec, std::shared_ptr<CacheFile> file);
  FileFill* file(FileId id) const;

  struct Claim {
    std::vector<ByteRange> ranges;     // chunk runs to request, in file order
    std::uint64_t bytes = 0;           // bytes in them
    std::uint64_t cached_bytes = 0;    // bytes of newly claimed chunks already verified
    std::uint64_t claimed_chunks = 0;  // chunks in `ranges`
  };
  // Claims the chunks of `wanted` not claimed before in this session: those not verified
  // in the cache yet become requested (outstanding until verified) with class `cls`.
  Claim claim(FileId id, const ChunkSet& wanted, FetchClass cls);
  // No more claims for `id`: it is done once its outstanding chunks are verified.
  void seal(FileId id);

  enum class WaitOutcome { idle, failed, interrupted };
  // Blocks until no chunk is outstanding, an error is recorded, or interrupt() is called.
  WaitOutcome wait();
  void interrupt();

  // The first error recorded (later ones are consequences of it).
  std::optional<ModelFetchError> error() const;
  void record_error(ModelFetchError error);

  // The first tensor of the plan: when its bytes are all verified, first_tensor_seconds()
  // says how long after `start` that was.
  void watch_first_tensor(FileId id, std::uint64_t begin, std::uint64_t end);
  std::optional<double> first_tensor_seconds() const;

  // After this returns no chunk is refetched any more (a mismatch then fails the file):
  // the fetcher may be cancelled and destroyed.
  void stop_refetching();
  // Waits until every queued verification has run.
  void drain();
  // Marks failed (readiness state failed, with `reason`) every file that has requested
  // chunks not yet verified, so consumers waiting on them wake with the failure.
  void fail_unfinished(std::string_view reason);
  // Finishes the whole-file digest of a file whose chunks are all verified (reading the
  // chunks not digested yet). Call after drain().
  std::expected<std::string, ModelFetchError> whole_file_sha256(FileId id);

  // FetchSink (the fetcher's thread).
  std::expected<void, std::string> write(FileId id, std::uint64_t offset,
                                         std::span<const std::byte> bytes) override;
  std::expected<void, std::string> written_in_place(FileId id, std::uint64_t offset,
                                                    std::uint64_t length) override;
  int destination_fd(FileId id) override;
  void failed(FileId id, ByteRange range, const FetchError& error) override;

 private:
  std::expected<void, std::string> credit(FileFill& f, std::uint64_t offset, std::uint64_t length);
  void verify(FileFill& f, std::uint64_t chunk);
  // Chained mode: the state (or, for the last chunk, file sha256) chunk `c` must produce.
  std::string chained_actual(const FileFill& f, std::uint64_t c,
                             std::span<const std::byte> bytes) const;
  // Fails the file when chunk `c` cannot be mapped to be hashed.
  void unreadable(FileFill& f, std::uint64_t c, const CacheError& error);
  void chunk_mismatch(FileFill& f, std::uint64_t chunk, std::string expected, std::string actual);
  void chunk_verified(FileFill& f, std::uint64_t chunk);
  void fail_file(FileFill& f, ModelFetchError error, std::string_view reason);
  void advance_digest(FileFill& f);
  // Digests verified chunks from digest_next on; digest_mutex held.
  std::expected<void, ModelFetchError> digest_ready_chunks(FileFill& f);
  void check_first_tensor(const FileFill& f);
  std::string where(const FileFill& f) const;  // "<label>/<path>"

  const std::string label_;
  const bool in_place_;
  FillCounters& counters_;
  const FillHooks hooks_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<std::unique_ptr<FileFill>> slots_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t outstanding_ = 0;
  std::optional<ModelFetchError> error_;
  bool interrupted_ = false;

  std::mutex refetch_mutex_;  // serialises refetches with stop_refetching()
  bool refetch_stopped_ = false;

  std::atomic<std::int64_t> first_file_{-1};
  std::uint64_t first_begin_ = 0;
  std::uint64_t first_end_ = 0;
  std::atomic<std::int64_t> first_ready_ns_{-1};

  WorkerPool pool_;  // last: its threads stop before the rest is destroyed
};

}  // namespace thaw::store
