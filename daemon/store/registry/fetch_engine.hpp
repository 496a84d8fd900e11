// Internals of RangeFetcher: the state shared with callers' threads (FetcherShared) and
// the loop on the fetcher's own thread (FetchEngine). Not part of the public API.
#pragma once

#include <curl/curl.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "daemon/network/fetch_window.hpp"
#include "daemon/store/registry/curl_handles.hpp"
#include "daemon/store/registry/fetch_types.hpp"
#include "daemon/store/registry/fetcher_config.hpp"
#include "daemon/store/registry/retry_policy.hpp"
#include "daemon/store/registry/token_bucket.hpp"

namespace thaw::store {

using FetchClock = std::chrono::steady_clock;

struct SubmitCommand {
  std::vector<RangeRequest> requests;
};
struct CancelCommand {
  std::optional<FileId> file;  // nullopt: everything
};
struct RateCommand {
  FetchClass cls;
  RateLimit limit;
};
using FetchCommand = std::variant<SubmitCommand, CancelCommand, RateCommand>;

// Everything a caller's thread touches, under one mutex.
struct FetcherShared {
  std::mutex mutex;
  std::condition_variable idle;
  std::vector<FetchCommand> inbox;
  bool shutdown = false;
  std::uint64_t requests_submitted = 0;
  std::uint64_t requests_finished = 0;  // published by the engine
  FetchProgress progress;               // published by the engine (requests_* set on read)
  std::vector<FetchError> failures;
  std::unordered_map<FileId, RangeRequest> last_source;  // for refetch(): source + size
};

struct FetchRequestState;
class FetchEngine;

// One part of a request: a contiguous byte range fetched by one transfer at a time.
struct FetchPart {
  FetchEngine* engine = nullptr;
  FetchRequestState* request = nullptr;
  ByteRange range;
  std::uint64_t next = 0;      // first byte not yet written to the sink
  std::uint32_t failures = 0;  // consecutive failed attempts without progress
  std::uint32_t attempts = 0;
  std::string last_cause;
  long last_status = 0;
  FetchClock::time_point retry_at{};

  // The current HTTP attempt.
  CurlEasy easy;
  std::string range_header;
  bool response_checked = false;
  bool paused = false;
  bool overrun = false;  // the server sent past the part's end; the part is complete
  std::uint64_t attempt_written = 0;
  std::optional<Fault> abort;  // why a callback stopped the transfer
  FetchClock::time_point last_activity{};
  std::vector<curl_socket_t> fresh_sockets;  // opened (and tagged) for this attempt
  char error_buffer[CURL_ERROR_SIZE] = {};

  // The current local copy.
  int local_fd = -1;
  bool copy_range_unsupported = false;

  ~FetchPart();
};

struct FetchRequestState {
  std::uint64_t id = 0;
  RangeRequest spec;
  std::uint32_t parts_left = 0;
};

class FetchEngine {
 public:
  FetchEngine(FetcherConfig config, FetchSink& sink, std::shared_ptr<FetcherShared> shared);
  ~FetchEngine();  // asks the thread to stop and joins it

  void wake();

 private:
  void run();
  bool drain_inbox();  // false once shut down
  void accept(RangeRequest request);
  void cancel(std::optional<FileId> file);

  void promote_waiting(FetchClock::time_point now);
  void start_parts(FetchClock::time_point now);
  void start_http(std::unique_ptr<FetchPart> part, FetchClock::time_point now);
  void step_local(FetchClock::time_point now);
  void resume_paused(FetchClock::time_point now);
  void reap_transfers(FetchClock::time_point now);
  void check_stalls(FetchClock::time_point now);
  void release_slot(FileId file);  // a part of `file` stopped running
  int poll_timeout_ms(FetchClock::time_point now);
  void publish(FetchClock::time_point now);

  // An HTTP attempt ended with `result`: completes, retries or fails the part.
  void finish_http(FetchPart* part, CURLcode result, FetchClock::time_point now);
  void part_succeeded(std::unique_ptr<FetchPart> part);
  void part_faulted(std::unique_ptr<FetchPart> part, Fault fault, FetchClock::time_point now);
  void fail_request(FetchRequestState* request, FetchError error);
  // A critical HTTP part is queued, running or backing off before a retry.
  bool critical_pending() const;
  // Removes the part from active_ and the multi handle; null if it is no longer there.
  std::unique_ptr<FetchPart> detach_active(FetchPart* part);
  // Its connection's socket leaves config_.fetch_windows (when `part` registered it).
  void unregister_window(const FetchPart& part);

  std::string describe(const FetchPart& part) const;

  // libcurl callbacks (static trampolines in the .cpp call these).
  friend struct FetchCallbacks;
  std::size_t on_body(FetchPart& part, const char* data, std::size_t size);
  bool check_response(FetchPart& part);
  int on_socket_open(FetchPart& part, curl_socket_t fd);
  int on_socket_close(curl_socket_t fd);
  int on_request_ready(FetchPart& part, int local_port, int remote_port);
  curl_socket_t find_socket(int local_port, int remote_port);

  FetcherConfig config_;
  FetchSink& sink_;
  std::shared_ptr<FetcherShared> shared_;
  std::array<SocketTags, kFetchClassCount> tags_;
  bool tagging_ = false;  // some class has tags, or someone observes tagging
  // Sockets libcurl opened and has not closed yet, with their local port (0 until looked
  // up): libcurl 7.88 gives no CURLINFO_ACTIVESOCKET before a request is sent, so a
  // kept-alive connection is found by its ports. Declared before multi_, whose cleanup
  // closes the last connections through on_socket_close().
  std::unordered_map<curl_socket_t, int> live_sockets_;
  // Sockets registered with config_.fetch_windows while a transfer of theirs runs: out when
  // that part leaves the multi handle (an idle kept-alive connection is no live fetch: it
  // would keep background fetches yielding and split its class's share) or when libcurl
  // closes the socket, whichever is first.
  struct WindowRegistration {
    network::FetchWindows::Registration registration;
    const FetchPart* part = nullptr;
  };
  std::unordered_map<curl_socket_t, WindowRegistration> window_registrations_;
  std::array<TokenBucket, kFetchClassCount> buckets_;
  CurlMulti multi_;
  CurlSlist headers_;
  std::mt19937_64 jitter_rng_;

  std::uint64_t next_request_id_ = 1;
  std::map<std::uint64_t, std::unique_ptr<FetchRequestState>> requests_;
  std::array<std::deque<std::unique_ptr<FetchPart>>, kFetchClassCount> ready_;
  std::vector<std::unique_ptr<FetchPart>> waiting_;  // backing off before a retry
  std::vector<std::unique_ptr<FetchPart>> active_;   // HTTP transfers in the multi handle
  std::vector<std::unique_ptr<FetchPart>> local_;    // local copies in progress
  std::unordered_map<FileId, std::uint32_t> running_per_file_;
  bool startable_changed_ = false;  // a part became ready or a slot free since start_parts()
  std::vector<std::byte> local_buffer_;

  // Counters, published to shared_->progress by publish().
  FetchProgress counters_;
  std::uint64_t requests_finished_ = 0;
  std::deque<std::pair<FetchClock::time_point, std::array<std::uint64_t, kFetchClassCount>>>
      rate_samples_;
  FetchClock::time_point last_sample_{};

  std::thread thread_;
};

}  // namespace thaw::store
