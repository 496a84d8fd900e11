// ModelFetch: fetches a model, or pipeline stage k of n of it, from a Registry into the
// HostCache, exposing every chunk the moment its bytes are in and verified.
//
// Order of work, so an engine started alongside finds what it reads first:
//   1. list the model (thaw-manifest.json preferred: it has sizes and digests);
//   2. the small files whole (config.json first, then tokenizer files and the index);
//   3. each weight file's safetensors header [0, 8 + N): its first chunk, which gives N
//      and nearly always the whole header, then any further header chunks — so the
//      FetchPlan (plan_stage / plan_full) comes from the fetched headers before any
//      tensor byte moves;
//   4. the plan's tensor ranges, file by file in file order, each rounded out to whole
//      readiness chunks so every chunk fetched is complete and verifiable.
// With `consolidate`, the rest of the weight files follows at background class.
//
// Integrity: a chunk is marked verified (a waiting consumer wakes) only once all its bytes
// are written and, when the manifest has chunk digests, its sha256 matches; a mismatch
// fetches the chunk once more, then fails the file and the fetch loudly. The whole-file
// sha256 (manifest, or the hub's LFS digest) is checked when the whole file is in; only
// then is the file sealed complete. See fill_session.hpp. A model with a file that has no
// digest at all (published without thaw-manifest.json) is refused right after listing,
// before any byte moves, unless options.allow_unverified; then it is fetched, marked
// unverified in the cache (HostCache::set_unverified) and the result says so.
//
// Resume: chunks already verified in the cache (from an earlier, interrupted fetch) are
// not fetched again; a file left failed is reopened for filling.
//
// One ModelFetch runs once. Do not run two fetches of the same model key into one
// HostCache at the same time: both would write the same files.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors/fetch_plan.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/fetch/fill_session.hpp"
#include "daemon/store/fetch/model_fetch_error.hpp"
#include "daemon/store/registry/fetcher_config.hpp"
#include "daemon/store/registry/range_fetcher.hpp"
#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

inline constexpr std::uint64_t kDefaultChunkBytes = 4ull << 20;

struct StageSpec {
  int stage = 0;  // 0 <= stage < num_stages
  int num_stages = 1;
};

struct ModelFetchOptions {
  std::string model;               // the model's name on the registry (e.g. "gpt2", "org/name")
  std::string cache_key;           // its key in the cache; empty: cache_key_for(model)
  std::optional<StageSpec> stage;  // nullopt: the whole model
  // With a stage: after the stage's ranges, fetch the rest of the weight files at
  // background class (the consolidation that follows a pipelined cold start).
  bool consolidate = false;
  // Class of the plan's tensor ranges (small files and headers are always critical). A
  // consolidation run on its own is a full fetch with background here.
  FetchClass tensor_class = FetchClass::critical;
  // Cache chunk size for files the manifest gives no chunk_size for (with one, its chunk
  // size is used so that chunk digests line up with readiness chunks).
  std::uint64_t default_chunk_size = kDefaultChunkBytes;
  // Check the whole-file sha256 even of files whose every chunk was checked by digest.
  bool verify_whole_file = true;
  // Take a model some of whose files have no digest to check (no thaw-manifest.json, no
  // registry digest). Off: such a fetch fails with ModelFetchErrc::unverified, naming the
  // files, before fetching anything (thawd: store.allow_unverified).
  bool allow_unverified = false;
  unsigned verify_threads = 0;  // 0: min(4, hardware threads)
  FetcherConfig fetcher;
  // Called on run()'s thread once the plan is known, before tensor bytes are requested
  // (a consumer can start waiting on tensors then).
  std::function<void(const safetensors::FetchPlan&)> on_plan;
  // Called on a verifier thread for every chunk digest mismatch, before the refetch.
  std::function<void(const ChunkMismatch&)> on_chunk_mismatch;
};

// The default cache key for a registry model name: '/' becomes "--" (a hub repo id
// "org/name" → "org--name"). Fails (invalid_argument) if the result is not a valid key.
std::expected<std::string, ModelFetchError> cache_key_for(std::string_view model);

// The files of a listing that nothing can check: no whole-file or chunk digest in its
// thaw-manifest.json, and none from the registry (a hub's LFS digest). Sorted by path.
std::vector<std::string> files_without_digest(const ModelListing& listing);

// "3/4" → {3, 4}: 0 <= K < N.
std::expected<StageSpec, ModelFetchError> parse_stage(std::string_view text);

enum class FetchPhase { starting, listing, small_files, headers, tensors, finishing, done };
std::string_view to_string(FetchPhase phase);

struct ModelFetchProgress {
  FetchPhase phase = FetchPhase::starting;
  std::uint64_t bytes_total = 0;  // bytes to fetch in this run, as known so far (it grows
                                  // when the headers give the plan, and with refetches)
  std::uint64_t bytes_done = 0;   // bytes written into the cache in this run
  std::uint64_t bytes_verified = 0;
  double rate_bytes_per_s = 0;  // over the last ~2 s
  std::optional<double> eta_s;  // while the rate is known
  std::uint32_t files_total = 0;
  std::uint32_t files_done = 0;  // files whose planned chunks are all verified
  std::uint64_t retries = 0;     // transfers resumed after a transient fault
  std::uint64_t chunk_refetches = 0;
  double elapsed_s = 0;
};

struct FetchedFile {
  std::string path;
  std::uint64_t size = 0;
  std::uint64_t chunk_size = 0;
  std::uint64_t chunk_count = 0;
  bool whole = false;                // a small file, fetched whole
  std::uint64_t plan_bytes = 0;      // bytes of the plan's ranges in the file
  std::uint64_t chunks_fetched = 0;  // fetched and verified in this run
  std::uint64_t bytes_fetched = 0;
  std::uint64_t chunks_ready = 0;        // verified in the cache now
  FillState state = FillState::filling;  // complete once every chunk is in and checked
  bool sha256_checked = false;           // the whole-file digest was checked in this run
};

struct ModelFetchResult {
  std::string model;
  std::string cache_key;
  std::optional<StageSpec> stage;
  safetensors::FetchPlan plan;
  std::uint64_t bytes_fetched = 0;  // bytes of chunks fetched and verified in this run
  std::uint64_t bytes_planned = 0;  // bytes the plan's ranges hold (exact, not rounded)
  std::uint64_t bytes_cached = 0;   // bytes of needed chunks already verified in the cache
  double seconds = 0;
  std::optional<double> time_to_plan_s;          // headers in, plan computed
  std::optional<double> time_to_first_tensor_s;  // the plan's first tensor verified
  std::uint64_t retries = 0;
  std::uint64_t chunk_refetches = 0;
  std::vector<FetchedFile> files;  // plan order
  // Files listed with no digest to check them (allow_unverified let them in); empty when
  // every file had one.
  std::vector<std::string> unverified_files;

  double goodput_bytes_per_s() const { return seconds > 0 ? bytes_fetched / seconds : 0; }
};

class ModelFetch {
 public:
  // `registry` and `cache` must outlive the ModelFetch.
  ModelFetch(Registry& registry, HostCache& cache, ModelFetchOptions options);
  ~ModelFetch();
  ModelFetch(const ModelFetch&) = delete;
  ModelFetch& operator=(const ModelFetch&) = delete;

  // Fetches; blocks until done, failed or cancelled. Call once. On failure the files with
  // chunks still missing are marked failed (waiters wake), and what was verified stays
  // in the cache for a later fetch to resume from.
  std::expected<ModelFetchResult, ModelFetchError> run();

  // Stops run() soon (it fails with `cancelled`). Any thread; idempotent.
  void cancel();

  // A snapshot; any thread, any time.
  ModelFetchProgress progress() const;

  // Changes a class's rate limit while run() is fetching (e.g. throttles a consolidation
  // when inference traffic needs the link). Before run() starts, set options.fetcher.
  void set_rate_limit(FetchClass cls, RateLimit limit);

 private:
  class Run;
  friend class Run;

  Registry& registry_;
  HostCache& cache_;
  ModelFetchOptions options_;
  FillCounters counters_;
  std::atomic<FetchPhase> phase_{FetchPhase::starting};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> started_{false};

  // The running fetch's clock, fetcher and session, for cancel() and progress().
  mutable std::mutex control_mutex_;
  std::optional<std::chrono::steady_clock::time_point> start_;
  std::optional<double> finished_s_;
  RangeFetcher* fetcher_ = nullptr;
  FillSession* session_ = nullptr;
  FetchProgress last_fetcher_progress_{};
};

}  // namespace thaw::store
