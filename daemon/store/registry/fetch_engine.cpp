#include "daemon/store/registry/fetch_engine.hpp"

#include <arpa/inet.h>
#include <curl/header.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include <fmt/format.h>

#include "bpf/traffic_class.h"
#include "daemon/store/registry/content_range.hpp"
#include "daemon/store/registry/local_copy.hpp"
#include "daemon/store/registry/range_split.hpp"
#include "daemon/store/registry/socket_tagging.hpp"

namespace thaw::store {

namespace {

using namespace std::chrono_literals;

std::size_t index_of(FetchClass cls) {
  return static_cast<std::size_t>(cls);
}

int window_class(FetchClass cls) {
  return cls == FetchClass::critical ? THAW_CLASS_CRITICAL_FETCH : THAW_CLASS_BACKGROUND_FETCH;
}

// A connection kept alive by one class may carry the next request of the other, so every
// class writes every option that some class sets (0 where it sets none): a reused socket
// never keeps the previous class's tag.
std::array<SocketTags, kFetchClassCount> effective_tags(
    const std::array<SocketTags, kFetchClassCount>& configured) {
  bool any_mark = false;
  bool any_priority = false;
  for (const auto& tags : configured) {
    any_mark = any_mark || tags.so_mark.has_value();
    any_priority = any_priority || tags.so_priority.has_value();
  }
  std::array<SocketTags, kFetchClassCount> out{};
  for (std::size_t i = 0; i < kFetchClassCount; ++i) {
    if (any_mark) out[i].so_mark = configured[i].so_mark.value_or(0);
    if (any_priority) out[i].so_priority = configured[i].so_priority.value_or(0);
    out[i].window_rate = configured[i].window_rate;
  }
  return out;
}

TokenBucket make_bucket(const RateLimit& limit, FetchClock::time_point now) {
  if (limit.bytes_per_s == 0) return TokenBucket();
  return TokenBucket(limit.bytes_per_s, limit.burst_bytes, now);
}

Fault transient(std::string cause) {
  Fault fault;
  fault.cause = std::move(cause);
  return fault;
}

Fault permanent(FetchErrc code, std::string cause) {
  Fault fault;
  fault.permanent = true;
  fault.code = code;
  fault.cause = std::move(cause);
  return fault;
}

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};

}  // namespace

FetchPart::~FetchPart() {
  if (local_fd >= 0) ::close(local_fd);
}

// libcurl's C callbacks, forwarding to the engine that owns the part.
struct FetchCallbacks {
  static size_t body(char* data, size_t size, size_t nmemb, void* user) {
    auto* part = static_cast<FetchPart*>(user);
    return part->engine->on_body(*part, data, size * nmemb);
  }
  static int socket_open(void* user, curl_socket_t fd, curlsocktype purpose) {
    if (purpose != CURLSOCKTYPE_IPCXN) return CURL_SOCKOPT_OK;
    auto* part = static_cast<FetchPart*>(user);
    return part->engine->on_socket_open(*part, fd);
  }
  static int socket_close(void* user, curl_socket_t fd) {
    return static_cast<FetchEngine*>(user)->on_socket_close(fd);
  }
  static int request_ready(void* user, char* /*primary_ip*/, char* /*local_ip*/, int primary_port,
                           int local_port) {
    auto* part = static_cast<FetchPart*>(user);
    return part->engine->on_request_ready(*part, local_port, primary_port);
  }
};

FetchEngine::FetchEngine(FetcherConfig config, FetchSink& sink,
                         std::shared_ptr<FetcherShared> shared)
    : config_(std::move(config)), sink_(sink), shared_(std::move(shared)) {
  ensure_curl_initialised();
  const auto now = FetchClock::now();
  tags_ = effective_tags(config_.socket_tags);
  tagging_ = static_cast<bool>(config_.on_socket_tagged);
  for (const auto& tags : tags_) tagging_ = tagging_ || tags.so_mark || tags.so_priority;
  tagging_ = tagging_ || config_.fetch_windows != nullptr;
  for (std::size_t i = 0; i < kFetchClassCount; ++i) {
    buckets_[i] = make_bucket(config_.rate_limits[i], now);
  }
  config_.connections_per_file = std::max<std::uint32_t>(config_.connections_per_file, 1);
  config_.max_connections = std::max<std::uint32_t>(config_.max_connections, 1);
  config_.local_slice_bytes = std::max<std::uint32_t>(config_.local_slice_bytes, 4096);
  multi_.reset(curl_multi_init());
  if (!multi_) throw std::bad_alloc();
  // Keep enough idle connections that every slot finds a kept-alive one to reuse.
  curl_multi_setopt(multi_.get(), CURLMOPT_MAXCONNECTS,
                    static_cast<long>(std::max<std::uint32_t>(config_.max_connections * 2, 8)));
  // Separate TCP connections, not HTTP/2 streams: aggregate bandwidth, and a socket tag
  // belongs to one class at a time.
  curl_multi_setopt(multi_.get(), CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_NOTHING));
  headers_ = make_header_list(config_.http_headers);
  jitter_rng_.seed(config_.jitter_seed != 0
                       ? config_.jitter_seed
                       : static_cast<std::uint64_t>(now.time_since_epoch().count()));
  local_buffer_.resize(config_.local_slice_bytes);
  last_sample_ = now;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "thaw-fetch");
    run();
  });
}

FetchEngine::~FetchEngine() {
  wake();
  if (thread_.joinable()) thread_.join();
}

void FetchEngine::wake() {
  curl_multi_wakeup(multi_.get());
}

void FetchEngine::run() {
  while (drain_inbox()) {
    auto now = FetchClock::now();
    promote_waiting(now);
    start_parts(now);
    step_local(now);
    resume_paused(now);
    int running = 0;
    curl_multi_perform(multi_.get(), &running);
    now = FetchClock::now();
    reap_transfers(now);
    check_stalls(now);
    publish(now);
    if (int timeout = poll_timeout_ms(now); timeout > 0) {
      curl_multi_poll(multi_.get(), nullptr, 0, timeout, nullptr);
    }
  }
  cancel(std::nullopt);
  publish(FetchClock::now());
}

bool FetchEngine::drain_inbox() {
  std::vector<FetchCommand> commands;
  bool shutdown = false;
  {
    std::lock_guard lock(shared_->mutex);
    commands.swap(shared_->inbox);
    shutdown = shared_->shutdown;
  }
  for (auto& command : commands) {
    std::visit(Overloaded{
                   [&](SubmitCommand& submit) {
                     for (auto& request : submit.requests) accept(std::move(request));
                   },
                   [&](CancelCommand& cancel_command) { cancel(cancel_command.file); },
                   [&](RateCommand& rate) {
                     buckets_[index_of(rate.cls)] = make_bucket(rate.limit, FetchClock::now());
                   },
               },
               command);
  }
  return !shutdown;
}

void FetchEngine::accept(RangeRequest request) {
  auto state = std::make_unique<FetchRequestState>();
  state->id = next_request_id_++;
  state->spec = std::move(request);
  const RangeRequest& spec = state->spec;
  // A local copy gains nothing from parallel parts: they would share this thread.
  std::vector<ByteRange> ranges =
      spec.source.kind == FileSource::Kind::local
          ? std::vector<ByteRange>{spec.range}
          : split_range(spec.range, config_.part_bytes, config_.min_part_bytes,
                        config_.connections_per_file);
  state->parts_left = static_cast<std::uint32_t>(ranges.size());
  auto& queue = ready_[index_of(spec.cls)];
  for (const ByteRange& range : ranges) {
    auto part = std::make_unique<FetchPart>();
    part->engine = this;
    part->request = state.get();
    part->range = range;
    part->next = range.offset;
    queue.push_back(std::move(part));
  }
  startable_changed_ = true;
  counters_.bytes_total += spec.range.length;
  counters_.per_class[index_of(spec.cls)].bytes_total += spec.range.length;
  requests_.emplace(state->id, std::move(state));
}

void FetchEngine::cancel(std::optional<FileId> file) {
  std::vector<FetchRequestState*> doomed;
  for (auto& [id, request] : requests_) {
    if (!file || request->spec.file == *file) doomed.push_back(request.get());
  }
  for (FetchRequestState* request : doomed) {
    const RangeRequest& spec = request->spec;
    fail_request(request, FetchError{FetchErrc::cancelled,
                                     fmt::format("fetch of {} bytes {}-{} (file {}) cancelled",
                                                 spec.source.location, spec.range.offset,
                                                 spec.range.end() - 1, spec.file),
                                     0});
  }
}

void FetchEngine::promote_waiting(FetchClock::time_point now) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->retry_at <= now) {
      // A retried part resumes ahead of parts not yet begun: readers wait on it.
      ready_[index_of((*it)->request->spec.cls)].push_front(std::move(*it));
      it = waiting_.erase(it);
      startable_changed_ = true;
    } else {
      ++it;
    }
  }
}

void FetchEngine::release_slot(FileId file) {
  auto it = running_per_file_.find(file);
  if (--it->second == 0) running_per_file_.erase(it);
  startable_changed_ = true;
}

void FetchEngine::start_parts(FetchClock::time_point now) {
  // Scanning the ready queues is linear in the plan's parts: do it only when a part
  // became ready or a slot became free since the last scan.
  if (!startable_changed_) return;
  startable_changed_ = false;
  // Critical parts take free connections first; background parts get what is left, and
  // nothing while a critical part is pending (FetcherConfig::background_waits_for_critical).
  const bool hold_background = config_.background_waits_for_critical && critical_pending();
  for (std::size_t cls = 0; cls < ready_.size(); ++cls) {
    if (hold_background && cls == index_of(FetchClass::background)) return;
    auto& queue = ready_[cls];
    for (auto it = queue.begin(); it != queue.end();) {
      if (active_.size() + local_.size() >= config_.max_connections) return;
      const FileId file = (*it)->request->spec.file;
      std::uint32_t& running = running_per_file_[file];
      if (running >= config_.connections_per_file) {
        ++it;
        continue;
      }
      std::unique_ptr<FetchPart> part = std::move(*it);
      it = queue.erase(it);
      ++running;
      if (part->request->spec.source.kind == FileSource::Kind::local) {
        ++part->attempts;
        local_.push_back(std::move(part));
      } else {
        start_http(std::move(part), now);
      }
    }
  }
}

bool FetchEngine::critical_pending() const {
  if (!ready_[index_of(FetchClass::critical)].empty()) return true;
  auto critical_http = [](const std::unique_ptr<FetchPart>& p) {
    return p->request->spec.cls == FetchClass::critical &&
           p->request->spec.source.kind != FileSource::Kind::local;
  };
  return std::ranges::any_of(active_, critical_http) ||
         std::ranges::any_of(waiting_, critical_http);
}

void FetchEngine::start_http(std::unique_ptr<FetchPart> owned, FetchClock::time_point now) {
  FetchPart& part = *owned;
  part.easy.reset(curl_easy_init());
  if (!part.easy) throw std::bad_alloc();
  ++part.attempts;
  part.response_checked = false;
  part.paused = false;
  part.overrun = false;
  part.attempt_written = 0;
  part.abort.reset();
  part.last_activity = now;
  part.fresh_sockets.clear();
  part.error_buffer[0] = '\0';
  part.range_header = fmt::format("{}-{}", part.next, part.range.end() - 1);

  CURL* easy = part.easy.get();
  curl_easy_setopt(easy, CURLOPT_URL, part.request->spec.source.location.c_str());
  curl_easy_setopt(easy, CURLOPT_RANGE, part.range_header.c_str());
  curl_easy_setopt(easy, CURLOPT_PRIVATE, &part);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &FetchCallbacks::body);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &part);
  if (tagging_) {
    curl_easy_setopt(easy, CURLOPT_SOCKOPTFUNCTION, &FetchCallbacks::socket_open);
    curl_easy_setopt(easy, CURLOPT_SOCKOPTDATA, &part);
    // Stored with the connection, which may outlive this part: the engine is the client.
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, &FetchCallbacks::socket_close);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, this);
    curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, &FetchCallbacks::request_ready);
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, &part);
  }
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, part.error_buffer);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  // 4xx/5xx end the transfer before any error page reaches the sink.
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(config_.connect_timeout.count()));
  curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, static_cast<long>(config_.receive_buffer_bytes));
  curl_easy_setopt(easy, CURLOPT_USERAGENT, "thaw-store/0.1");
  if (headers_) curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers_.get());

  active_.push_back(std::move(owned));
  if (CURLMcode rc = curl_multi_add_handle(multi_.get(), easy); rc != CURLM_OK) {
    auto back = std::move(active_.back());
    active_.pop_back();
    release_slot(back->request->spec.file);
    part_faulted(std::move(back),
                 permanent(FetchErrc::transport,
                           fmt::format("curl_multi_add_handle: {}", curl_multi_strerror(rc))),
                 now);
  }
}

void FetchEngine::step_local(FetchClock::time_point now) {
  for (std::size_t i = 0; i < local_.size();) {
    FetchPart& part = *local_[i];
    const std::size_t cls = index_of(part.request->spec.cls);
    // A local copy is paced by its class's rate limit like a download (store.max_rate
    // holds for a local-directory registry too): one slice while the bucket has tokens.
    TokenBucket& bucket = buckets_[cls];
    if (bucket.limited() && !bucket.has_tokens(now)) {
      ++i;
      continue;
    }
    LocalSliceResult slice =
        copy_local_slice(part, sink_, local_buffer_, config_.local_slice_bytes);
    if (bucket.limited()) (void)bucket.try_take(slice.copied, now);
    counters_.bytes_done += slice.copied;
    counters_.per_class[cls].bytes_done += slice.copied;
    if (!slice.fault && part.next < part.range.end()) {
      ++i;
      continue;
    }
    std::unique_ptr<FetchPart> owned = std::move(local_[i]);
    local_.erase(local_.begin() + static_cast<std::ptrdiff_t>(i));
    release_slot(owned->request->spec.file);
    if (slice.fault) {
      part_faulted(std::move(owned), std::move(*slice.fault), now);
    } else {
      part_succeeded(std::move(owned));
    }
  }
}

void FetchEngine::resume_paused(FetchClock::time_point now) {
  std::vector<std::pair<FetchPart*, CURLcode>> broken;
  for (auto& owned : active_) {
    FetchPart& part = *owned;
    if (!part.paused) continue;
    if (!buckets_[index_of(part.request->spec.cls)].has_tokens(now)) continue;
    part.paused = false;
    part.last_activity = now;
    // Unpausing hands libcurl's held data to on_body() right here; it may pause again.
    if (CURLcode rc = curl_easy_pause(part.easy.get(), CURLPAUSE_CONT); rc != CURLE_OK) {
      broken.emplace_back(&part, rc);
    }
  }
  for (auto [part, rc] : broken) finish_http(part, rc, now);
}

void FetchEngine::reap_transfers(FetchClock::time_point now) {
  // Copy the messages first: removing a handle invalidates what info_read returned.
  std::vector<std::pair<CURL*, CURLcode>> finished;
  int left = 0;
  while (CURLMsg* message = curl_multi_info_read(multi_.get(), &left)) {
    if (message->msg == CURLMSG_DONE)
      finished.emplace_back(message->easy_handle, message->data.result);
  }
  for (auto [easy, result] : finished) {
    auto it = std::find_if(active_.begin(), active_.end(),
                           [easy](const auto& part) { return part->easy.get() == easy; });
    // Gone already when an earlier failure in this batch failed its whole request.
    if (it == active_.end()) continue;
    finish_http(it->get(), result, now);
  }
}

void FetchEngine::check_stalls(FetchClock::time_point now) {
  std::vector<FetchPart*> stalled;
  for (auto& part : active_) {
    if (!part->paused && now - part->last_activity > config_.stall_timeout) {
      stalled.push_back(part.get());
    }
  }
  for (FetchPart* part : stalled) {
    auto owned = detach_active(part);
    if (!owned) continue;  // failed with a sibling part just before
    part_faulted(
        std::move(owned),
        transient(fmt::format("stalled: no bytes for {} ms", config_.stall_timeout.count())), now);
  }
}

std::unique_ptr<FetchPart> FetchEngine::detach_active(FetchPart* part) {
  auto it = std::find_if(active_.begin(), active_.end(),
                         [part](const auto& p) { return p.get() == part; });
  if (it == active_.end()) return nullptr;
  std::unique_ptr<FetchPart> owned = std::move(*it);
  active_.erase(it);
  curl_multi_remove_handle(multi_.get(), owned->easy.get());
  unregister_window(*owned);
  release_slot(owned->request->spec.file);
  return owned;
}

void FetchEngine::unregister_window(const FetchPart& part) {
  std::erase_if(window_registrations_, [&](const auto& r) { return r.second.part == &part; });
}

void FetchEngine::finish_http(FetchPart* raw, CURLcode result, FetchClock::time_point now) {
  std::unique_ptr<FetchPart> owned = detach_active(raw);
  if (!owned) return;  // failed with a sibling part just before
  FetchPart& part = *owned;
  if (part.overrun && part.next == part.range.end()) return part_succeeded(std::move(owned));
  if (part.abort) {
    Fault fault = *part.abort;
    return part_faulted(std::move(owned), std::move(fault), now);
  }
  if (result == CURLE_OK) {
    if (part.next == part.range.end()) return part_succeeded(std::move(owned));
    return part_faulted(
        std::move(owned),
        transient(fmt::format("truncated body: the answer ended at byte {}", part.next)), now);
  }
  if (result == CURLE_HTTP_RETURNED_ERROR) {
    long status = 0;
    curl_easy_getinfo(part.easy.get(), CURLINFO_RESPONSE_CODE, &status);
    return part_faulted(std::move(owned), classify_http_status(status), now);
  }
  Fault fault = classify_transfer_failure(result, part.error_buffer);
  return part_faulted(std::move(owned), std::move(fault), now);
}

void FetchEngine::part_succeeded(std::unique_ptr<FetchPart> owned) {
  FetchRequestState* request = owned->request;
  owned.reset();
  if (--request->parts_left > 0) return;
  sink_.done(request->spec.file, request->spec.range);
  ++counters_.requests_done;
  ++requests_finished_;
  requests_.erase(request->id);
}

void FetchEngine::part_faulted(std::unique_ptr<FetchPart> owned, Fault fault,
                               FetchClock::time_point now) {
  FetchPart& part = *owned;
  part.easy.reset();
  part.last_cause = fault.cause;
  if (fault.http_status != 0) part.last_status = fault.http_status;
  if (fault.permanent) {
    FetchError error{fault.code, fmt::format("{}: {}", describe(part), fault.cause),
                     part.last_status};
    return fail_request(part.request, std::move(error));
  }
  part.failures = part.attempt_written > 0 ? 1 : part.failures + 1;
  if (part.failures > config_.max_retries) {
    FetchError error{FetchErrc::retries_exhausted,
                     fmt::format("{}: gave up after {} consecutive failed attempts ({} in all); "
                                 "last cause: {}",
                                 describe(part), part.failures, part.attempts, fault.cause),
                     part.last_status};
    return fail_request(part.request, std::move(error));
  }
  ++counters_.retries;
  double jitter = std::uniform_real_distribution<double>(0.0, 1.0)(jitter_rng_);
  part.retry_at =
      now + backoff_delay(part.failures, config_.backoff_initial, config_.backoff_max, jitter);
  waiting_.push_back(std::move(owned));
}

void FetchEngine::fail_request(FetchRequestState* request, FetchError error) {
  auto belongs = [request](const std::unique_ptr<FetchPart>& part) {
    return part->request == request;
  };
  for (auto& queue : ready_) std::erase_if(queue, belongs);
  std::erase_if(waiting_, belongs);
  for (auto it = active_.begin(); it != active_.end();) {
    if (belongs(*it)) {
      curl_multi_remove_handle(multi_.get(), (*it)->easy.get());
      unregister_window(**it);
      release_slot(request->spec.file);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = local_.begin(); it != local_.end();) {
    if (belongs(*it)) {
      release_slot(request->spec.file);
      it = local_.erase(it);
    } else {
      ++it;
    }
  }
  sink_.failed(request->spec.file, request->spec.range, error);
  {
    std::lock_guard lock(shared_->mutex);
    shared_->failures.push_back(std::move(error));
  }
  ++counters_.requests_failed;
  ++requests_finished_;
  requests_.erase(request->id);
}

std::string FetchEngine::describe(const FetchPart& part) const {
  const RangeRequest& spec = part.request->spec;
  return fmt::format("{} {} bytes {}-{} (file {}; {} of the part's {} bytes written)",
                     spec.source.kind == FileSource::Kind::http ? "GET" : "copy of",
                     spec.source.location, part.range.offset, part.range.end() - 1, spec.file,
                     part.next - part.range.offset, part.range.length);
}

std::size_t FetchEngine::on_body(FetchPart& part, const char* data, std::size_t size) {
  if (!part.response_checked) {
    if (!check_response(part)) return 0;
    part.response_checked = true;
  }
  const auto now = FetchClock::now();
  const std::size_t cls = index_of(part.request->spec.cls);
  if (!buckets_[cls].try_take(size, now)) {
    part.paused = true;
    return CURL_WRITEFUNC_PAUSE;
  }
  counters_.bytes_received += size;
  const std::uint64_t wanted = part.range.end() - part.next;
  const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(size, wanted));
  if (take > 0) {
    auto ok = sink_.write(part.request->spec.file, part.next,
                          std::span(reinterpret_cast<const std::byte*>(data), take));
    if (!ok) {
      part.abort = permanent(FetchErrc::sink,
                             fmt::format("sink refused bytes at {}: {}", part.next, ok.error()));
      return 0;
    }
    part.next += take;
    part.attempt_written += take;
    counters_.bytes_done += take;
    counters_.per_class[cls].bytes_done += take;
  }
  part.last_activity = now;
  if (take < size) {
    part.overrun = true;  // stop reading: the part is complete
    return 0;
  }
  return size;
}

bool FetchEngine::check_response(FetchPart& part) {
  CURL* easy = part.easy.get();
  const RangeRequest& spec = part.request->spec;
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  part.last_status = status;
  if (status == 206) {
    curl_header* header = nullptr;
    if (curl_easy_header(easy, "Content-Range", 0, CURLH_HEADER, -1, &header) != CURLHE_OK) {
      part.abort = transient("HTTP 206 without a Content-Range header");
      return false;
    }
    auto range = parse_content_range(header->value);
    if (!range) {
      part.abort =
          transient(fmt::format("HTTP 206 with malformed Content-Range '{}'", header->value));
      return false;
    }
    if (range->first != part.next) {
      part.abort = transient(
          fmt::format("HTTP 206 starts at byte {}, asked for {}", range->first, part.next));
      return false;
    }
    if (spec.file_size != 0 && range->total && *range->total != spec.file_size) {
      part.abort = permanent(
          FetchErrc::file_changed,
          fmt::format("the registry says the file has {} bytes, expected {} (changed since "
                      "it was listed?)",
                      *range->total, spec.file_size));
      return false;
    }
    return true;
  }
  if (status == 200) {
    // A 200 carries the whole file from byte 0: right only if that is exactly the part.
    curl_off_t length = -1;
    curl_easy_getinfo(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    bool whole_file = part.next == 0 && length >= 0 &&
                      static_cast<std::uint64_t>(length) == part.range.end() &&
                      (spec.file_size == 0 || spec.file_size == part.range.end());
    if (whole_file) return true;
    part.abort = transient(
        fmt::format("server ignored the Range request (HTTP 200, Content-Length {})", length));
    return false;
  }
  part.abort = permanent(FetchErrc::http_status,
                         fmt::format("unexpected HTTP {} to a Range request", status));
  return false;
}

int FetchEngine::on_socket_open(FetchPart& part, curl_socket_t fd) {
  const FetchClass cls = part.request->spec.cls;
  part.fresh_sockets.push_back(fd);
  live_sockets_[fd] = 0;
  if (auto ok = apply_socket_tags(fd, tags_[index_of(cls)]); !ok) {
    part.abort = permanent(FetchErrc::socket_tag, ok.error());
    return CURL_SOCKOPT_ERROR;
  }
  if (config_.on_socket_tagged) config_.on_socket_tagged(SocketTagEvent{fd, cls, true});
  return CURL_SOCKOPT_OK;
}

int FetchEngine::on_socket_close(curl_socket_t fd) {
  live_sockets_.erase(fd);
  window_registrations_.erase(fd);  // out of the registry before the fd number is reused
  return ::close(fd);
}

curl_socket_t FetchEngine::find_socket(int local_port, int remote_port) {
  auto port_of = [](int fd, bool peer) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    auto* generic = reinterpret_cast<sockaddr*>(&address);
    if ((peer ? ::getpeername(fd, generic, &length) : ::getsockname(fd, generic, &length)) != 0) {
      return 0;
    }
    if (address.ss_family == AF_INET) {
      return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port));
    }
    if (address.ss_family == AF_INET6) {
      return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port));
    }
    return 0;
  };
  for (auto& [fd, port] : live_sockets_) {
    if (port == 0) port = port_of(fd, false);
    if (port == local_port && port_of(fd, true) == remote_port) return fd;
  }
  return CURL_SOCKET_BAD;
}

int FetchEngine::on_request_ready(FetchPart& part, int local_port, int remote_port) {
  curl_socket_t fd = find_socket(local_port, remote_port);
  const FetchClass cls = part.request->spec.cls;
  // Connected, the request not sent yet: the round trip is known and no body is in flight,
  // so the class's receive window is set here (new and kept-alive connections alike).
  if (fd != CURL_SOCKET_BAD && config_.fetch_windows) {
    // Registered anew for each request: a kept-alive connection may change class.
    window_registrations_.erase(fd);
    const SocketTags& tags = tags_[index_of(cls)];
    auto registered = config_.fetch_windows->add(fd, window_class(cls),
                                                 tags.so_mark ? thaw_mark_model(*tags.so_mark) : 0);
    if (!registered) {
      part.abort = permanent(FetchErrc::socket_tag, registered.error());
      return CURL_PREREQFUNC_ABORT;
    }
    window_registrations_.emplace(fd, WindowRegistration{std::move(*registered), &part});
  } else if (fd != CURL_SOCKET_BAD) {
    if (auto ok = apply_fetch_window(fd, tags_[index_of(cls)]); !ok) {
      part.abort = permanent(FetchErrc::socket_tag, ok.error());
      return CURL_PREREQFUNC_ABORT;
    }
  }
  // Opened for this attempt (several with happy eyeballs): tagged then already.
  if (std::find(part.fresh_sockets.begin(), part.fresh_sockets.end(), fd) !=
      part.fresh_sockets.end()) {
    return CURL_PREREQFUNC_OK;
  }
  if (fd == CURL_SOCKET_BAD) {
    part.abort = permanent(
        FetchErrc::socket_tag,
        fmt::format("cannot find the socket of the kept-alive connection (local port {}) to tag "
                    "it as {}",
                    local_port, to_string(cls)));
    return CURL_PREREQFUNC_ABORT;
  }
  // A kept-alive connection, last used by some other request: tag it for this class.
  if (auto ok = apply_socket_tags(fd, tags_[index_of(cls)]); !ok) {
    part.abort = permanent(FetchErrc::socket_tag, ok.error());
    return CURL_PREREQFUNC_ABORT;
  }
  if (config_.on_socket_tagged) config_.on_socket_tagged(SocketTagEvent{fd, cls, false});
  return CURL_PREREQFUNC_OK;
}

int FetchEngine::poll_timeout_ms(FetchClock::time_point now) {
  if (startable_changed_) return 0;
  std::chrono::nanoseconds timeout = 1s;
  for (const auto& part : local_) {
    TokenBucket& bucket = buckets_[index_of(part->request->spec.cls)];
    if (!bucket.limited() || bucket.has_tokens(now)) return 0;  // a slice to copy now
    timeout = std::min(timeout, bucket.time_until(1, now));
  }
  if (!active_.empty()) {
    // Wake often enough to notice stalls and to sample the rate.
    auto stall_tick = std::clamp<std::chrono::nanoseconds>(config_.stall_timeout / 4, 10ms, 100ms);
    timeout = std::min(timeout, stall_tick);
  }
  for (const auto& part : waiting_) {
    timeout = std::min<std::chrono::nanoseconds>(timeout, part->retry_at - now);
  }
  for (const auto& part : active_) {
    if (!part->paused) continue;
    auto& bucket = buckets_[index_of(part->request->spec.cls)];
    timeout = std::min(timeout, bucket.time_until(1, now));
  }
  if (timeout <= std::chrono::nanoseconds::zero()) return 0;
  // Round up so a wait for a few microseconds does not spin.
  return static_cast<int>(
      std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(timeout).count()));
}

void FetchEngine::publish(FetchClock::time_point now) {
  if (rate_samples_.empty() || now - last_sample_ >= 100ms) {
    std::array<std::uint64_t, kFetchClassCount> done{};
    for (std::size_t i = 0; i < kFetchClassCount; ++i) done[i] = counters_.per_class[i].bytes_done;
    rate_samples_.emplace_back(now, done);
    while (rate_samples_.size() > 2 && now - rate_samples_.front().first > 2s) {
      rate_samples_.pop_front();
    }
    last_sample_ = now;
    const auto& [t0, first] = rate_samples_.front();
    double seconds = std::chrono::duration<double>(now - t0).count();
    double total = 0;
    for (std::size_t i = 0; i < kFetchClassCount; ++i) {
      double rate = seconds > 0 ? static_cast<double>(done[i] - first[i]) / seconds : 0.0;
      counters_.per_class[i].rate_bytes_per_s = rate;
      total += rate;
    }
    counters_.rate_bytes_per_s = total;
  }
  counters_.active_transfers = static_cast<std::uint32_t>(active_.size() + local_.size());
  {
    std::lock_guard lock(shared_->mutex);
    shared_->progress = counters_;
    shared_->requests_finished = requests_finished_;
  }
  shared_->idle.notify_all();
}

}  // namespace thaw::store
