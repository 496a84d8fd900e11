#include "daemon/store/registry/range_fetcher.hpp"

#include <fmt/format.h>

#include "daemon/store/registry/fetch_engine.hpp"

namespace thaw::store {

namespace {

std::expected<void, FetchError> check_request(const RangeRequest& request) {
  auto bad = [&](std::string_view rule) {
    return std::unexpected(FetchError{
        FetchErrc::bad_request,
        fmt::format("request for file {} at '{}' range {}+{}: {}", request.file,
                    request.source.location, request.range.offset, request.range.length, rule)});
  };
  if (request.range.length == 0) return bad("empty range");
  if (request.range.offset + request.range.length < request.range.offset) {
    return bad("range overflows 64 bits");
  }
  if (request.file_size != 0 && request.range.end() > request.file_size) {
    return bad(fmt::format("range ends past the file's size {}", request.file_size));
  }
  const std::string& where = request.source.location;
  if (where.empty()) return bad("empty location");
  if (request.source.kind == FileSource::Kind::http) {
    if (!where.starts_with("http://") && !where.starts_with("https://")) {
      return bad("not an http:// or https:// URL");
    }
  } else if (!where.starts_with('/')) {
    return bad("local path is not absolute");
  }
  return {};
}

}  // namespace

RangeFetcher::RangeFetcher(FetcherConfig config, FetchSink& sink)
    : shared_(std::make_shared<FetcherShared>()),
      engine_(std::make_unique<FetchEngine>(std::move(config), sink, shared_)) {}

RangeFetcher::~RangeFetcher() {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->shutdown = true;
  }
  engine_.reset();  // wakes the thread, which cancels what is left, and joins it
}

std::expected<void, FetchError> RangeFetcher::submit(std::vector<RangeRequest> requests) {
  for (const auto& request : requests) {
    if (auto ok = check_request(request); !ok) return ok;
  }
  if (requests.empty()) return {};
  {
    std::lock_guard lock(shared_->mutex);
    for (const auto& request : requests) shared_->last_source[request.file] = request;
    shared_->requests_submitted += requests.size();
    shared_->inbox.emplace_back(SubmitCommand{std::move(requests)});
  }
  engine_->wake();
  return {};
}

std::expected<void, FetchError> RangeFetcher::refetch(FileId file, ByteRange range,
                                                      FetchClass cls) {
  RangeRequest request;
  {
    std::lock_guard lock(shared_->mutex);
    auto it = shared_->last_source.find(file);
    if (it == shared_->last_source.end()) {
      return std::unexpected(
          FetchError{FetchErrc::bad_request,
                     fmt::format("refetch of file {} range {}+{}: the file was never submitted",
                                 file, range.offset, range.length)});
    }
    request = it->second;
  }
  request.range = range;
  request.cls = cls;
  return submit({std::move(request)});
}

void RangeFetcher::cancel_file(FileId file) {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->inbox.emplace_back(CancelCommand{file});
  }
  engine_->wake();
}

void RangeFetcher::cancel_all() {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->inbox.emplace_back(CancelCommand{std::nullopt});
  }
  engine_->wake();
}

void RangeFetcher::set_rate_limit(FetchClass cls, RateLimit limit) {
  {
    std::lock_guard lock(shared_->mutex);
    shared_->inbox.emplace_back(RateCommand{cls, limit});
  }
  engine_->wake();
}

bool RangeFetcher::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(shared_->mutex);
  return shared_->idle.wait_for(
      lock, timeout, [&] { return shared_->requests_finished == shared_->requests_submitted; });
}

std::vector<FetchError> RangeFetcher::take_failures() {
  std::lock_guard lock(shared_->mutex);
  return std::exchange(shared_->failures, {});
}

FetchProgress RangeFetcher::progress() const {
  std::lock_guard lock(shared_->mutex);
  FetchProgress snapshot = shared_->progress;
  snapshot.requests_pending = shared_->requests_submitted - shared_->requests_finished;
  return snapshot;
}

std::string_view to_string(FetchClass cls) {
  return cls == FetchClass::critical ? "critical" : "background";
}

}  // namespace thaw::store
