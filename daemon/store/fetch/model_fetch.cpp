// ModelFetch's small public pieces: keys, stage specs, cancel and progress. The fetch
// itself is in model_fetch_run.cpp.
#include "daemon/store/fetch/model_fetch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "daemon/store/cache/cache_layout.hpp"

namespace thaw::store {

std::expected<std::string, ModelFetchError> cache_key_for(std::string_view model) {
  std::string key;
  for (char c : model) {
    if (c == '/') {
      key += "--";
    } else {
      key += c;
    }
  }
  if (auto ok = cache_layout::check_model_key(key); !ok) {
    return std::unexpected(
        ModelFetchError{ModelFetchErrc::invalid_argument,
                        fmt::format("model '{}' gives no valid cache key ({}); name one explicitly",
                                    model, ok.error().message)});
  }
  return key;
}

std::vector<std::string> files_without_digest(const ModelListing& listing) {
  std::vector<std::string> out;
  for (const RemoteFile& rf : listing.files) {
    if (rf.path == kManifestName || rf.sha256) continue;
    const ManifestFile* mf = listing.manifest ? listing.manifest->find(rf.path) : nullptr;
    if (mf != nullptr && (mf->sha256 || !mf->chunk_sha256.empty())) continue;
    out.push_back(rf.path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::expected<StageSpec, ModelFetchError> parse_stage(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return std::unexpected(ModelFetchError{
        ModelFetchErrc::invalid_argument,
        fmt::format("stage '{}': {} (write K/N with 0 <= K < N, e.g. 0/4)", text, why)});
  };
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return bad("no '/'");
  const auto number = [](std::string_view digits, int& out) {
    const char* end = digits.data() + digits.size();
    auto [ptr, ec] = std::from_chars(digits.data(), end, out);
    return !digits.empty() && ec == std::errc{} && ptr == end;
  };
  StageSpec spec;
  if (!number(text.substr(0, slash), spec.stage) ||
      !number(text.substr(slash + 1), spec.num_stages)) {
    return bad("K and N must be decimal integers");
  }
  if (spec.num_stages < 1 || spec.stage < 0 || spec.stage >= spec.num_stages) {
    return bad("out of range");
  }
  return spec;
}

std::string_view to_string(FetchPhase phase) {
  switch (phase) {
    case FetchPhase::starting:
      return "starting";
    case FetchPhase::listing:
      return "listing";
    case FetchPhase::small_files:
      return "small_files";
    case FetchPhase::headers:
      return "headers";
    case FetchPhase::tensors:
      return "tensors";
    case FetchPhase::finishing:
      return "finishing";
    case FetchPhase::done:
      return "done";
  }
  return "unknown";
}

ModelFetch::ModelFetch(Registry& registry, HostCache& cache, ModelFetchOptions options)
    : registry_(registry), cache_(cache), options_(std::move(options)) {}

ModelFetch::~ModelFetch() = default;

void ModelFetch::cancel() {
  cancelled_.store(true);
  std::lock_guard lock(control_mutex_);
  if (fetcher_ != nullptr) fetcher_->cancel_all();
  if (session_ != nullptr) session_->interrupt();
}

void ModelFetch::set_rate_limit(FetchClass cls, RateLimit limit) {
  std::lock_guard lock(control_mutex_);
  if (fetcher_ != nullptr) fetcher_->set_rate_limit(cls, limit);
}

ModelFetchProgress ModelFetch::progress() const {
  ModelFetchProgress p;
  FetchProgress fetch;
  {
    std::lock_guard lock(control_mutex_);
    fetch = fetcher_ != nullptr ? fetcher_->progress() : last_fetcher_progress_;
    if (finished_s_) {
      p.elapsed_s = *finished_s_;
    } else if (start_) {
      p.elapsed_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *start_).count();
    }
  }
  p.phase = phase_.load();
  p.bytes_total = counters_.bytes_requested.load();
  p.bytes_done = std::min(counters_.bytes_written.load(), p.bytes_total);
  p.bytes_verified = counters_.bytes_verified.load();
  p.files_total = counters_.files_total.load();
  p.files_done = counters_.files_done.load();
  p.chunk_refetches = counters_.chunk_refetches.load();
  p.retries = fetch.retries;
  const bool moving = p.phase != FetchPhase::done && p.phase != FetchPhase::finishing;
  p.rate_bytes_per_s = moving ? fetch.rate_bytes_per_s : 0;
  if (p.rate_bytes_per_s > 0) {
    p.eta_s = static_cast<double>(p.bytes_total - p.bytes_done) / p.rate_bytes_per_s;
  }
  return p;
}

}  // namespace thaw::store
