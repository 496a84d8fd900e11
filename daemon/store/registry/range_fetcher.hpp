// RangeFetcher: streams byte ranges of model files from HTTP(S) registries (or local
// paths) into a FetchSink.
//
// One thread drives a libcurl multi handle (curl_multi_poll): ranges are cut into parts
// spread over several kept-alive connections per file, bytes go to the sink as they
// arrive, and every part remembers its last written byte so that after a 5xx, a reset,
// a truncated body, a stall or a timeout it resumes there with a new Range request
// (exponential backoff with jitter, a bounded number of consecutive failures). 404, 403
// and 416 are permanent. Two priority classes each share a token-bucket rate limit over
// all of their transfers (paused with CURL_WRITEFUNC_PAUSE, resumed as tokens refill)
// and tag their sockets with SO_MARK / SO_PRIORITY.
#pragma once

#include <chrono>
#include <expected>
#include <memory>
#include <vector>

#include "daemon/store/registry/fetch_error.hpp"
#include "daemon/store/registry/fetch_types.hpp"
#include "daemon/store/registry/fetcher_config.hpp"

namespace thaw::store {

class FetchEngine;
struct FetcherShared;

class RangeFetcher {
 public:
  // `sink` must outlive the fetcher; it is called from the fetcher's thread only.
  RangeFetcher(FetcherConfig config, FetchSink& sink);
  // Cancels what is still pending (sink.failed with FetchErrc::cancelled) and joins.
  ~RangeFetcher();
  RangeFetcher(const RangeFetcher&) = delete;
  RangeFetcher& operator=(const RangeFetcher&) = delete;

  // Queues requests and returns at once. A malformed request (zero length, empty or
  // non-absolute location, offset overflow) rejects the whole batch, queuing nothing.
  std::expected<void, FetchError> submit(std::vector<RangeRequest> requests);

  // Fetches `range` of `file` again from the source it was last submitted with (e.g. a
  // chunk that failed its digest). Error if `file` was never submitted.
  std::expected<void, FetchError> refetch(FileId file, ByteRange range,
                                          FetchClass cls = FetchClass::critical);

  // Stop requests (of one file, or all); each gets sink.failed(FetchErrc::cancelled).
  // Takes effect on the fetcher's thread shortly after the call; wait_idle() to sync.
  void cancel_file(FileId file);
  void cancel_all();

  // Changes a class's rate limit for the transfers running and to come.
  void set_rate_limit(FetchClass cls, RateLimit limit);

  // Blocks until every submitted request is done or failed (false if `timeout` passed).
  // When it returns true, every sink callback for those requests has returned.
  bool wait_idle(std::chrono::milliseconds timeout);

  // Failures since the last call, oldest first (also given to sink.failed).
  std::vector<FetchError> take_failures();

  // A consistent snapshot; safe from any thread.
  FetchProgress progress() const;

 private:
  std::shared_ptr<FetcherShared> shared_;
  std::unique_ptr<FetchEngine> engine_;
};

}  // namespace thaw::store
