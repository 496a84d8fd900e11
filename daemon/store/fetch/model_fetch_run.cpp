// ModelFetch::run(): one fetch, step by step (see model_fetch.hpp for the order and why).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/safetensors/header.hpp"
#include "common/safetensors/index.hpp"
#include "common/safetensors/model.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/model_fetch.hpp"

namespace thaw::store {

namespace {

using SteadyClock = std::chrono::steady_clock;
namespace st = safetensors;

ModelFetchError fail(ModelFetchErrc code, std::string message) {
  return ModelFetchError{code, std::move(message)};
}

ModelFetchError from_cache(const CacheError& error) {
  const bool full = error.code == CacheErrc::no_space || error.code == CacheErrc::over_budget;
  return fail(full ? ModelFetchErrc::cache_full : ModelFetchErrc::cache, error.message);
}

// A model's error messages start with the file they are about; make that "<model>/<file>".
ModelFetchError from_model(const st::Error& error, std::string_view label) {
  const ModelFetchErrc code = error.code == st::errc::invalid_stage
                                  ? ModelFetchErrc::invalid_argument
                                  : ModelFetchErrc::model;
  return fail(code, fmt::format("{}/{}", label, error.message));
}

bool is_top_level(std::string_view path) {
  return path.find('/') == std::string_view::npos;
}

// How long the fetcher may take to wind down after cancel_all() before the run gives up
// waiting for it (its destructor still joins it).
constexpr auto kWindDown = std::chrono::seconds(30);

}  // namespace

class ModelFetch::Run {
 public:
  explicit Run(ModelFetch& owner) : o_(owner), opt_(owner.options_) {}
  ~Run();

  std::expected<ModelFetchResult, ModelFetchError> execute();

 private:
  struct Target {
    FileSource source;
    std::optional<std::string> sha256;  // expected whole-file digest
    bool complete_at_start = false;
    bool sha256_checked = false;
  };

  std::expected<void, ModelFetchError> start();
  // Refuses a listing with files nothing can check, unless allowed; then marks the model
  // unverified in the cache before any of its bytes arrive.
  std::expected<void, ModelFetchError> check_verifiable();
  std::expected<void, ModelFetchError> open_target(FileId id);
  std::expected<void, ModelFetchError> fetch_small_files(std::vector<FileId>& small);
  std::expected<std::vector<FileId>, ModelFetchError> weight_files();
  std::expected<void, ModelFetchError> fetch_headers(const std::vector<FileId>& weights);
  std::expected<st::Model, ModelFetchError> assemble(const std::vector<FileId>& small,
                                                     const std::vector<FileId>& weights);
  std::expected<void, ModelFetchError> fetch_tensors(const st::Model& model,
                                                     const std::vector<FileId>& weights);
  std::expected<void, ModelFetchError> finish();
  ModelFetchResult result() const;

  // Requests the chunks of `wanted` not yet in or asked for.
  void claim(FileId id, const ChunkSet& wanted, FetchClass cls, std::vector<RangeRequest>& out);
  std::expected<void, ModelFetchError> submit(std::vector<RangeRequest> requests);
  // Waits for every claimed chunk.
  std::expected<void, ModelFetchError> wait();
  // Stops everything after `error` and marks files with missing chunks failed.
  ModelFetchError abort(ModelFetchError error);
  std::expected<std::string, ModelFetchError> read_cached(FileId id, std::uint64_t offset,
                                                          std::uint64_t length) const;
  std::expected<void, ModelFetchError> check_cancelled() const;
  const RemoteFile& remote(FileId id) const { return listing_.files[id]; }
  std::optional<FileId> find(std::string_view path) const;
  double elapsed() const;

  ModelFetch& o_;
  const ModelFetchOptions& opt_;
  SteadyClock::time_point start_ = SteadyClock::now();
  std::string key_;
  ModelPin pin_;
  ModelListing listing_;
  std::vector<std::optional<Target>> targets_;  // by FileId (index into listing_.files)
  std::vector<st::Header> headers_;             // by position in weight_files()
  st::FetchPlan plan_;
  std::optional<double> time_to_plan_s_;
  std::uint64_t bytes_cached_ = 0;
  std::vector<std::string> unverified_;  // files_without_digest(listing_)
  bool aborted_ = false;
  std::unique_ptr<FillSession> session_;
  std::unique_ptr<RangeFetcher> fetcher_;  // after session_: destroyed first
};

ModelFetch::Run::~Run() {
  {
    std::lock_guard lock(o_.control_mutex_);
    if (fetcher_) o_.last_fetcher_progress_ = fetcher_->progress();
    o_.fetcher_ = nullptr;
    o_.session_ = nullptr;
    o_.finished_s_ = elapsed();
  }
  if (session_) session_->stop_refetching();
  fetcher_.reset();  // cancels what is left and joins its thread
  session_.reset();  // runs the verifications still queued
}

double ModelFetch::Run::elapsed() const {
  return std::chrono::duration<double>(SteadyClock::now() - start_).count();
}

std::optional<FileId> ModelFetch::Run::find(std::string_view path) const {
  for (std::size_t i = 0; i < listing_.files.size(); ++i) {
    if (listing_.files[i].path == path) return static_cast<FileId>(i);
  }
  return std::nullopt;
}

std::expected<void, ModelFetchError> ModelFetch::Run::check_cancelled() const {
  if (!o_.cancelled_.load()) return {};
  return std::unexpected(
      fail(ModelFetchErrc::cancelled, fmt::format("fetch of model '{}' cancelled", opt_.model)));
}

std::expected<ModelFetchResult, ModelFetchError> ModelFetch::Run::execute() {
  if (auto ok = start(); !ok) {
    if (fetcher_) abort(ok.error());
    return std::unexpected(ok.error());
  }
  // From here on every failure stops the fetcher and fails the files it left unfinished.
  const auto failed = [&](const ModelFetchError& error) { return std::unexpected(abort(error)); };
  std::vector<FileId> small;
  if (auto ok = fetch_small_files(small); !ok) return failed(ok.error());
  auto weights = weight_files();
  if (!weights) return failed(weights.error());
  if (auto ok = fetch_headers(*weights); !ok) return failed(ok.error());
  auto model = assemble(small, *weights);
  if (!model) return failed(model.error());
  if (auto ok = fetch_tensors(*model, *weights); !ok) return failed(ok.error());
  if (auto ok = finish(); !ok) return failed(ok.error());
  o_.phase_.store(FetchPhase::done);
  return result();
}

std::expected<void, ModelFetchError> ModelFetch::Run::start() {
  {
    std::lock_guard lock(o_.control_mutex_);
    o_.start_ = start_;
  }
  if (opt_.model.empty()) {
    return std::unexpected(fail(ModelFetchErrc::invalid_argument, "no model name given"));
  }
  if (opt_.default_chunk_size == 0) {
    return std::unexpected(
        fail(ModelFetchErrc::invalid_argument, "the default chunk size must be > 0 bytes"));
  }
  if (opt_.stage && (opt_.stage->num_stages < 1 || opt_.stage->stage < 0 ||
                     opt_.stage->stage >= opt_.stage->num_stages)) {
    return std::unexpected(fail(ModelFetchErrc::invalid_argument,
                                fmt::format("stage {}/{} does not exist (need 0 <= K < N)",
                                            opt_.stage->stage, opt_.stage->num_stages)));
  }
  if (opt_.consolidate && !opt_.stage) {
    return std::unexpected(fail(ModelFetchErrc::invalid_argument,
                                "consolidate needs a stage: a full fetch already takes "
                                "everything"));
  }
  if (opt_.cache_key.empty()) {
    auto key = cache_key_for(opt_.model);
    if (!key) return std::unexpected(key.error());
    key_ = std::move(*key);
  } else {
    if (auto ok = cache_layout::check_model_key(opt_.cache_key); !ok) {
      return std::unexpected(fail(ModelFetchErrc::invalid_argument, ok.error().message));
    }
    key_ = opt_.cache_key;
  }
  if (auto ok = check_cancelled(); !ok) return ok;

  auto pin = o_.cache_.pin(key_);
  if (!pin) return std::unexpected(from_cache(pin.error()));
  pin_ = std::move(*pin);

  o_.phase_.store(FetchPhase::listing);
  auto listing = o_.registry_.list(opt_.model);
  if (!listing) {
    return std::unexpected(fail(ModelFetchErrc::registry,
                                fmt::format("listing model '{}' on {}: {}", opt_.model,
                                            o_.registry_.describe(), listing.error().message)));
  }
  listing_ = std::move(*listing);
  targets_.resize(listing_.files.size());
  if (auto ok = check_verifiable(); !ok) return ok;

  const unsigned threads = opt_.verify_threads != 0
                               ? opt_.verify_threads
                               : std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  auto filesystem = probe_cache_filesystem(o_.cache_.root());
  if (!filesystem) return std::unexpected(from_cache(filesystem.error()));
  FillHooks hooks;
  hooks.refetch = [this](FileId id, ByteRange range, FetchClass cls) {
    return fetcher_->refetch(id, range, cls);
  };
  hooks.on_chunk_mismatch = opt_.on_chunk_mismatch;
  // copy_file_range from local registries straight into the cache file, except on
  // hugetlbfs, which only takes bytes through a mapping.
  session_ =
      std::make_unique<FillSession>(opt_.model, listing_.files.size(), threads,
                                    !filesystem->hugetlbfs, o_.counters_, std::move(hooks), start_);
  fetcher_ = std::make_unique<RangeFetcher>(opt_.fetcher, *session_);
  {
    std::lock_guard lock(o_.control_mutex_);
    o_.fetcher_ = fetcher_.get();
    o_.session_ = session_.get();
  }
  // A cancel() that came before the pointers were set saw nothing to stop.
  return check_cancelled();
}

std::expected<void, ModelFetchError> ModelFetch::Run::check_verifiable() {
  unverified_ = files_without_digest(listing_);
  if (unverified_.empty()) return {};
  std::string names;
  for (std::size_t i = 0; i < unverified_.size() && i < 3; ++i) {
    names += (i == 0 ? "" : ", ") + unverified_[i];
  }
  if (unverified_.size() > 3) names += fmt::format(" and {} more", unverified_.size() - 3);
  if (!opt_.allow_unverified) {
    return std::unexpected(fail(
        ModelFetchErrc::unverified,
        fmt::format("model '{}' on {} cannot be verified: {} {} no digest ({}); publish it "
                    "with `thaw-fetch publish <model dir>` (writes {}), or accept it "
                    "unchecked with store.allow_unverified = true in thawd.toml",
                    opt_.model, o_.registry_.describe(), unverified_.size(),
                    unverified_.size() == 1 ? "file has" : "files have", names, kManifestName)));
  }
  if (auto ok = o_.cache_.set_unverified(key_, true); !ok) {
    return std::unexpected(from_cache(ok.error()));
  }
  return {};
}

std::expected<void, ModelFetchError> ModelFetch::Run::open_target(FileId id) {
  const RemoteFile& rf = remote(id);
  const ManifestFile* mf = listing_.manifest ? listing_.manifest->find(rf.path) : nullptr;
  const bool chunked = mf != nullptr && mf->chunk_size != 0;
  const std::uint64_t chunk_size = chunked ? mf->chunk_size : opt_.default_chunk_size;

  auto source = o_.registry_.source(opt_.model, rf.path);
  if (!source) {
    return std::unexpected(
        fail(ModelFetchErrc::registry,
             fmt::format("{}/{}: {}", opt_.model, rf.path, source.error().message)));
  }
  auto file = o_.cache_.open_file(key_, rf.path, CacheFileSpec{rf.size, chunk_size});
  if (!file) return std::unexpected(from_cache(file.error()));
  ChunkReadiness& readiness = (*file)->readiness();
  if (readiness.state() == FillState::failed) {
    if (auto ok = readiness.resume_filling(); !ok) return std::unexpected(from_cache(ok.error()));
  }

  Target target;
  target.source = std::move(*source);
  target.sha256 = mf != nullptr && mf->sha256 ? mf->sha256 : rf.sha256;
  target.complete_at_start = readiness.state() == FillState::complete;
  FileFillSpec spec;
  spec.path = rf.path;
  if (chunked) spec.chunk_sha256 = mf->chunk_sha256;
  // Chained states check every chunk and the whole file in one pass; the manifest parser
  // made sure they come with the file's sha256 and a chunk size that allows them.
  spec.chained = chunked && mf->chained && mf->sha256 &&
                 mf->chunk_chain_sha256.size() + 1 == readiness.chunk_count();
  if (spec.chained) {
    spec.chain_sha256 = mf->chunk_chain_sha256;
    spec.file_sha256 = *mf->sha256;
  }
  spec.digest_whole_file = target.sha256 && !target.complete_at_start && !spec.chained &&
                           (opt_.verify_whole_file || spec.chunk_sha256.empty());
  session_->add_file(id, std::move(spec), std::move(*file));
  targets_[id] = std::move(target);
  return {};
}

void ModelFetch::Run::claim(FileId id, const ChunkSet& wanted, FetchClass cls,
                            std::vector<RangeRequest>& out) {
  FillSession::Claim claimed = session_->claim(id, wanted, cls);
  bytes_cached_ += claimed.cached_bytes;
  for (const ByteRange& range : claimed.ranges) {
    out.push_back(RangeRequest{id, targets_[id]->source, range, cls, remote(id).size});
  }
}

std::expected<void, ModelFetchError> ModelFetch::Run::submit(std::vector<RangeRequest> requests) {
  if (auto ok = fetcher_->submit(std::move(requests)); !ok) {
    return std::unexpected(fail(ModelFetchErrc::fetch, ok.error().message));
  }
  return {};
}

std::expected<void, ModelFetchError> ModelFetch::Run::wait() {
  // interrupt() comes only from cancel(), which sets the flag first.
  if (session_->wait() == FillSession::WaitOutcome::failed) {
    return std::unexpected(*session_->error());
  }
  return check_cancelled();
}

ModelFetchError ModelFetch::Run::abort(ModelFetchError error) {
  if (std::exchange(aborted_, true)) return error;
  session_->stop_refetching();
  fetcher_->cancel_all();
  fetcher_->wait_idle(std::chrono::duration_cast<std::chrono::milliseconds>(kWindDown));
  session_->drain();
  // The 255-byte reason every waiter on a missing chunk will read.
  std::string reason = fmt::format("fetch stopped ({}): {}", to_string(error.code), error.message);
  if (reason.size() > 250) reason = reason.substr(0, 247) + "...";
  session_->fail_unfinished(reason);
  return error;
}

std::expected<std::string, ModelFetchError> ModelFetch::Run::read_cached(
    FileId id, std::uint64_t offset, std::uint64_t length) const {
  const FileFill& f = *session_->file(id);
  std::string out(static_cast<std::size_t>(length), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(f.file->data_fd(), out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return std::unexpected(
          fail(ModelFetchErrc::cache,
               fmt::format("{}/{}: reading {} bytes at {} back from {}: {}", opt_.model,
                           f.spec.path, length, offset, f.file->data_path().string(),
                           n < 0 ? std::strerror(errno) : "end of file")));
    }
    done += static_cast<std::size_t>(n);
  }
  return out;
}

// Every stage needs all of them, and the engine reads config.json before anything else.
std::expected<void, ModelFetchError> ModelFetch::Run::fetch_small_files(
    std::vector<FileId>& small) {
  o_.phase_.store(FetchPhase::small_files);
  for (std::size_t i = 0; i < listing_.files.size(); ++i) {
    const std::string& path = listing_.files[i].path;
    if (is_top_level(path) && path != kManifestName && st::is_small_model_file(path)) {
      small.push_back(static_cast<FileId>(i));
    }
  }
  std::stable_partition(small.begin(), small.end(),
                        [&](FileId id) { return remote(id).path == st::kConfigFileName; });
  std::vector<RangeRequest> requests;
  for (FileId id : small) {
    if (auto ok = open_target(id); !ok) return ok;
    ChunkSet all(remote(id).size, session_->file(id)->readiness().chunk_size());
    all.add_all();
    claim(id, all, FetchClass::critical, requests);
    session_->seal(id);
  }
  if (auto ok = submit(std::move(requests)); !ok) return ok;
  return wait();
}

std::expected<std::vector<FileId>, ModelFetchError> ModelFetch::Run::weight_files() {
  const auto missing = [&](std::string_view what) {
    return std::unexpected(fail(
        ModelFetchErrc::registry,
        fmt::format("model '{}' on {} {}; is the model name right, and was it published whole?",
                    opt_.model, o_.registry_.describe(), what)));
  };
  if (auto single = find(st::kSingleFileName)) return std::vector<FileId>{*single};
  auto index_id = find(st::kIndexFileName);
  if (!index_id) {
    return missing(fmt::format("has neither {} nor {}", st::kSingleFileName, st::kIndexFileName));
  }
  auto text = read_cached(*index_id, 0, remote(*index_id).size);
  if (!text) return std::unexpected(text.error());
  auto index = st::parse_index(*text, fmt::format("{}/{}", opt_.model, st::kIndexFileName));
  if (!index) return std::unexpected(fail(ModelFetchErrc::model, index.error().message));
  std::vector<FileId> weights;
  for (const std::string& shard : index->files) {
    auto id = find(shard);
    if (!id)
      return missing(fmt::format("lacks shard {} that its {} names", shard, st::kIndexFileName));
    weights.push_back(*id);
  }
  return weights;
}

// Each header's first chunk gives its length N (and usually holds all of it); a header
// longer than a chunk takes a second round for the rest.
std::expected<void, ModelFetchError> ModelFetch::Run::fetch_headers(
    const std::vector<FileId>& weights) {
  o_.phase_.store(FetchPhase::headers);
  std::vector<RangeRequest> requests;
  for (FileId id : weights) {
    if (auto ok = open_target(id); !ok) return ok;
    ChunkSet first(remote(id).size, session_->file(id)->readiness().chunk_size());
    first.add_bytes(0, st::kLengthPrefixBytes);
    claim(id, first, FetchClass::critical, requests);
  }
  if (auto ok = submit(std::move(requests)); !ok) return ok;
  if (auto ok = wait(); !ok) return ok;

  std::vector<std::uint64_t> header_end(weights.size());
  for (std::size_t w = 0; w < weights.size(); ++w) {
    const FileId id = weights[w];
    const RemoteFile& rf = remote(id);
    const std::uint64_t available = std::min<std::uint64_t>(rf.size, st::kLengthPrefixBytes);
    auto prefix = read_cached(id, 0, available);
    if (!prefix) return std::unexpected(prefix.error());
    auto n = st::header_length(std::as_bytes(std::span(*prefix)), rf.size, rf.path);
    if (!n) return std::unexpected(from_model(n.error(), opt_.model));
    header_end[w] = st::kLengthPrefixBytes + *n;
    ChunkSet rest(rf.size, session_->file(id)->readiness().chunk_size());
    rest.add_bytes(0, header_end[w]);
    claim(id, rest, FetchClass::critical, requests);
  }
  if (!requests.empty()) {
    if (auto ok = submit(std::move(requests)); !ok) return ok;
    if (auto ok = wait(); !ok) return ok;
  }
  for (std::size_t w = 0; w < weights.size(); ++w) {
    const RemoteFile& rf = remote(weights[w]);
    auto bytes = read_cached(weights[w], 0, header_end[w]);
    if (!bytes) return std::unexpected(bytes.error());
    auto header = st::parse_header(std::as_bytes(std::span(*bytes)), rf.size, rf.path);
    if (!header) return std::unexpected(from_model(header.error(), opt_.model));
    headers_.push_back(std::move(*header));
  }
  return {};
}

std::expected<st::Model, ModelFetchError> ModelFetch::Run::assemble(
    const std::vector<FileId>& small, const std::vector<FileId>& weights) {
  st::ModelParts parts;
  parts.label = opt_.model;
  for (FileId id : small) {
    const RemoteFile& rf = remote(id);
    parts.small_files.push_back(st::FileEntry{rf.path, rf.size});
    if (rf.path == st::kConfigFileName || rf.path == st::kIndexFileName) {
      auto text = read_cached(id, 0, rf.size);
      if (!text) return std::unexpected(text.error());
      (rf.path == st::kConfigFileName ? parts.config_json : parts.index_json) = std::move(*text);
    }
  }
  // A single model.safetensors wins over an index next to it, as in transformers.
  if (weights.size() == 1 && remote(weights[0]).path == st::kSingleFileName) {
    parts.index_json.reset();
  }
  parts.shards = headers_;
  auto model = st::Model::assemble(std::move(parts));
  // Its messages already start with the label, the model's name.
  if (!model) return std::unexpected(fail(ModelFetchErrc::model, model.error().message));
  if (opt_.stage) {
    auto plan = st::plan_stage(*model, opt_.stage->stage, opt_.stage->num_stages);
    if (!plan) {
      return std::unexpected(fail(plan.error().code == st::errc::invalid_stage
                                      ? ModelFetchErrc::invalid_argument
                                      : ModelFetchErrc::model,
                                  plan.error().message));
    }
    plan_ = std::move(*plan);
  } else {
    plan_ = st::plan_full(*model);
  }
  time_to_plan_s_ = elapsed();
  return std::move(*model);
}

std::expected<void, ModelFetchError> ModelFetch::Run::fetch_tensors(
    const st::Model& model, const std::vector<FileId>& weights) {
  if (opt_.on_plan) opt_.on_plan(plan_);
  if (auto ok = check_cancelled(); !ok) return ok;
  o_.phase_.store(FetchPhase::tensors);

  std::vector<RangeRequest> critical;
  std::vector<RangeRequest> background;
  bool watching = false;
  for (const st::FileFetch& ff : plan_.files) {
    if (ff.whole) continue;
    const FileId id = *find(ff.file);
    ChunkSet wanted(ff.size, session_->file(id)->readiness().chunk_size());
    for (const st::ByteRange& r : ff.ranges) wanted.add_bytes(r.begin, r.end);
    if (!watching && ff.ranges.size() > 1 && !ff.ranges[1].tensors.empty()) {
      const st::TensorInfo* first = model.find(ff.ranges[1].tensors.front());
      if (first != nullptr) {
        session_->watch_first_tensor(id, first->begin, first->end);
        watching = true;
      }
    }
    claim(id, wanted, opt_.tensor_class,
          opt_.tensor_class == FetchClass::critical ? critical : background);
  }
  if (opt_.consolidate) {
    for (FileId id : weights) {
      ChunkSet rest(remote(id).size, session_->file(id)->readiness().chunk_size());
      rest.add_all();
      claim(id, rest, FetchClass::background, background);
    }
  }
  critical.insert(critical.end(), std::make_move_iterator(background.begin()),
                  std::make_move_iterator(background.end()));
  for (FileId id : weights) session_->seal(id);
  if (auto ok = submit(std::move(critical)); !ok) return ok;
  return wait();
}

std::expected<void, ModelFetchError> ModelFetch::Run::finish() {
  o_.phase_.store(FetchPhase::finishing);
  session_->stop_refetching();
  session_->drain();
  if (auto error = session_->error()) return std::unexpected(*error);
  for (std::size_t i = 0; i < targets_.size(); ++i) {
    if (!targets_[i] || targets_[i]->complete_at_start) continue;
    Target& target = *targets_[i];
    const FileId id = static_cast<FileId>(i);
    FileFill& f = *session_->file(id);
    ChunkReadiness& readiness = f.readiness();
    if (readiness.verified_chunks() != readiness.chunk_count()) continue;  // a stage's part
    if (f.digest) {
      auto actual = session_->whole_file_sha256(id);
      if (!actual) return std::unexpected(actual.error());
      if (*actual != *target.sha256) {
        const std::string message = fmt::format(
            "{}/{}: the whole file's sha256 is {}, but the {} says {}; the registry serves "
            "other bytes than were published: re-publish or fix the registry's copy",
            opt_.model, f.spec.path, *actual, listing_.manifest ? "manifest" : "registry",
            *target.sha256);
        (void)readiness.mark_failed(fmt::format("the file's sha256 is {}..., expected {}...",
                                                actual->substr(0, 16),
                                                target.sha256->substr(0, 16)));
        f.failed = true;
        return std::unexpected(fail(ModelFetchErrc::integrity, message));
      }
      target.sha256_checked = true;
    } else if (f.spec.chained) {
      target.sha256_checked = true;  // the last chunk's check was the file's sha256
    }
    if (auto ok = readiness.mark_complete(); !ok) {
      return std::unexpected(from_cache(ok.error()));
    }
  }
  // A model once taken unverified becomes verified only when this run checked all of it:
  // chunks already in the cache (a file complete at the start, or resumed) were not.
  const bool all_checked =
      bytes_cached_ == 0 && std::ranges::none_of(targets_, [](const std::optional<Target>& t) {
        return t && t->complete_at_start;
      });
  if (unverified_.empty() && all_checked && !opt_.stage) {
    if (auto ok = o_.cache_.set_unverified(key_, false); !ok) {
      return std::unexpected(from_cache(ok.error()));
    }
  }
  return {};
}

ModelFetchResult ModelFetch::Run::result() const {
  ModelFetchResult r;
  r.model = opt_.model;
  r.cache_key = key_;
  r.stage = opt_.stage;
  r.plan = plan_;
  r.bytes_fetched = o_.counters_.bytes_verified.load();
  r.bytes_planned = plan_.bytes();
  r.bytes_cached = bytes_cached_;
  r.seconds = elapsed();
  r.time_to_plan_s = time_to_plan_s_;
  r.time_to_first_tensor_s = session_->first_tensor_seconds();
  r.retries = fetcher_->progress().retries;
  r.chunk_refetches = o_.counters_.chunk_refetches.load();
  r.unverified_files = unverified_;
  for (const st::FileFetch& ff : plan_.files) {
    const FileId id = *find(ff.file);
    const FileFill& f = *session_->file(id);
    const ChunkReadiness& readiness = f.readiness();
    FetchedFile out;
    out.path = ff.file;
    out.size = ff.size;
    out.chunk_size = readiness.chunk_size();
    out.chunk_count = readiness.chunk_count();
    out.whole = ff.whole;
    out.plan_bytes = ff.bytes();
    out.chunks_fetched = f.chunks_fetched.load();
    out.bytes_fetched = f.bytes_fetched.load();
    out.chunks_ready = readiness.verified_chunks();
    out.state = readiness.state();
    out.sha256_checked = targets_[id]->sha256_checked;
    r.files.push_back(std::move(out));
  }
  return r;
}

std::expected<ModelFetchResult, ModelFetchError> ModelFetch::run() {
  if (started_.exchange(true)) {
    return std::unexpected(
        fail(ModelFetchErrc::invalid_argument, "ModelFetch::run() may be called only once"));
  }
  Run run(*this);
  auto result = run.execute();
  phase_.store(FetchPhase::done);
  return result;
}

}  // namespace thaw::store
