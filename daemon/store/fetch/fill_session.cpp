#include "daemon/store/fetch/fill_session.hpp"

#include "daemon/store/fetch/sha256_chain.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::store {

namespace {

using SteadyClock = std::chrono::steady_clock;

// A digest shortened for the 255-byte failure reason of a readiness map.
std::string short_digest(const std::string& hex) {
  return hex.size() > 16 ? hex.substr(0, 16) + "..." : hex;
}

}  // namespace

FileFill::FileFill(FileId id_, FileFillSpec spec_, std::shared_ptr<CacheFile> file_)
    : id(id_),
      spec(std::move(spec_)),
      file(std::move(file_)),
      chunk_count(file->readiness().chunk_count()),
      written(new std::atomic<std::uint64_t>[chunk_count]()),
      refetched(new std::atomic<std::uint8_t>[chunk_count]()),
      chunk_class(chunk_count, FetchClass::critical),
      claimed(chunk_count, false) {
  if (spec.digest_whole_file) digest.emplace();
}

FillSession::FillSession(std::string label, std::size_t file_slots, unsigned verify_threads,
                         bool in_place, FillCounters& counters, FillHooks hooks,
                         SteadyClock::time_point start)
    : label_(std::move(label)),
      in_place_(in_place),
      counters_(counters),
      hooks_(std::move(hooks)),
      start_(start),
      slots_(file_slots),
      pool_(std::max(verify_threads, 1u)) {}

FillSession::~FillSession() {
  stop_refetching();
  pool_.drain();
}

CacheResult<MappedRegion> FileFill::map_chunk(std::uint64_t c) const {
  const ChunkReadiness& r = readiness();
  return file->map_range_read_only(r.chunk_offset(c), r.chunk_length(c));
}

FileFill& FillSession::add_file(FileId id, FileFillSpec spec, std::shared_ptr<CacheFile> file) {
  auto& slot = slots_.at(id);
  slot = std::make_unique<FileFill>(id, std::move(spec), std::move(file));
  counters_.files_total.fetch_add(1, std::memory_order_relaxed);
  return *slot;
}

FileFill* FillSession::file(FileId id) const {
  return id < slots_.size() ? slots_[id].get() : nullptr;
}

std::string FillSession::where(const FileFill& f) const {
  return fmt::format("{}/{}", label_, f.spec.path);
}

FillSession::Claim FillSession::claim(FileId id, const ChunkSet& wanted, FetchClass cls) {
  FileFill& f = *slots_.at(id);
  const ChunkReadiness& readiness = f.readiness();
  Claim out;
  ChunkSet take(readiness.file_size(), readiness.chunk_size());
  for (std::uint64_t c = 0; c < f.chunk_count && c < wanted.chunk_count(); ++c) {
    if (!wanted.contains(c)) continue;
    if (f.claimed[c]) continue;
    f.claimed[c] = true;
    if (readiness.chunk_verified(c)) {
      out.cached_bytes += readiness.chunk_length(c);
      continue;
    }
    f.chunk_class[c] = cls;
    take.add(c);
    ++out.claimed_chunks;
  }
  for (const ChunkRun& run : take.runs()) {
    const ByteRange range = take.byte_range(run);
    out.ranges.push_back(range);
    out.bytes += range.length;
  }
  if (out.claimed_chunks > 0) {
    f.outstanding.fetch_add(out.claimed_chunks, std::memory_order_relaxed);
    f.pending.fetch_add(out.claimed_chunks, std::memory_order_relaxed);
    counters_.bytes_requested.fetch_add(out.bytes, std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    outstanding_ += out.claimed_chunks;
  }
  return out;
}

void FillSession::seal(FileId id) {
  FileFill& f = *slots_.at(id);
  if (f.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    counters_.files_done.fetch_add(1, std::memory_order_relaxed);
  }
}

FillSession::WaitOutcome FillSession::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return outstanding_ == 0 || error_ || interrupted_; });
  if (error_) return WaitOutcome::failed;
  if (interrupted_) return WaitOutcome::interrupted;
  return WaitOutcome::idle;
}

void FillSession::interrupt() {
  {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
  }
  changed_.notify_all();
}

std::optional<ModelFetchError> FillSession::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void FillSession::record_error(ModelFetchError error) {
  {
    std::lock_guard lock(mutex_);
    if (error_) return;
    error_ = std::move(error);
  }
  changed_.notify_all();
}

void FillSession::watch_first_tensor(FileId id, std::uint64_t begin, std::uint64_t end) {
  first_begin_ = begin;
  first_end_ = end;
  first_file_.store(static_cast<std::int64_t>(id), std::memory_order_release);
  if (FileFill* f = file(id)) check_first_tensor(*f);
}

std::optional<double> FillSession::first_tensor_seconds() const {
  const std::int64_t ns = first_ready_ns_.load(std::memory_order_acquire);
  if (ns < 0) return std::nullopt;
  return static_cast<double>(ns) / 1e9;
}

void FillSession::check_first_tensor(const FileFill& f) {
  if (first_file_.load(std::memory_order_acquire) != static_cast<std::int64_t>(f.id)) return;
  if (first_ready_ns_.load(std::memory_order_relaxed) >= 0) return;
  if (!f.readiness().is_ready(first_begin_, first_end_ - first_begin_)) return;
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start_).count();
  std::int64_t none = -1;
  first_ready_ns_.compare_exchange_strong(none, static_cast<std::int64_t>(ns),
                                          std::memory_order_acq_rel);
}

void FillSession::stop_refetching() {
  std::lock_guard lock(refetch_mutex_);
  refetch_stopped_ = true;
}

void FillSession::drain() {
  pool_.drain();
}

void FillSession::fail_unfinished(std::string_view reason) {
  for (const auto& slot : slots_) {
    if (!slot || slot->failed.load()) continue;
    FileFill& f = *slot;
    bool missing = false;
    for (std::uint64_t c = 0; c < f.chunk_count && !missing; ++c) {
      missing = f.claimed[c] && !f.readiness().chunk_verified(c);
    }
    if (!missing) continue;
    f.failed = true;
    // A map that cannot record the failure leaves its waiters to their timeouts; the
    // fetch already reports the error that matters.
    (void)f.readiness().mark_failed(reason);
  }
}

void FillSession::fail_file(FileFill& f, ModelFetchError error, std::string_view reason) {
  if (!f.failed.exchange(true)) (void)f.readiness().mark_failed(reason);
  record_error(std::move(error));
}

// --- The fetcher's side ---------------------------------------------------------------

std::expected<void, std::string> FillSession::write(FileId id, std::uint64_t offset,
                                                    std::span<const std::byte> bytes) {
  FileFill* f = file(id);
  if (f == nullptr) return std::unexpected(fmt::format("no cache file for file id {}", id));
  if (auto ok = f->file->write_at(offset, bytes); !ok) {
    return std::unexpected(ok.error().message);
  }
  counters_.bytes_written.fetch_add(bytes.size(), std::memory_order_relaxed);
  return credit(*f, offset, bytes.size());
}

std::expected<void, std::string> FillSession::written_in_place(FileId id, std::uint64_t offset,
                                                               std::uint64_t length) {
  FileFill* f = file(id);
  if (f == nullptr) return std::unexpected(fmt::format("no cache file for file id {}", id));
  counters_.bytes_written.fetch_add(length, std::memory_order_relaxed);
  return credit(*f, offset, length);
}

int FillSession::destination_fd(FileId id) {
  FileFill* f = file(id);
  return in_place_ && f != nullptr ? f->file->data_fd() : -1;
}

std::expected<void, std::string> FillSession::credit(FileFill& f, std::uint64_t offset,
                                                     std::uint64_t length) {
  const ChunkReadiness& readiness = f.readiness();
  const std::uint64_t chunk_size = readiness.chunk_size();
  while (length > 0) {
    const std::uint64_t c = offset / chunk_size;
    if (c >= f.chunk_count) {
      return std::unexpected(
          fmt::format("{}: bytes at {} lie past the file's end", where(f), offset));
    }
    const std::uint64_t chunk_begin = readiness.chunk_offset(c);
    const std::uint64_t chunk_length = readiness.chunk_length(c);
    const std::uint64_t n = std::min(length, chunk_begin + chunk_length - offset);
    const std::uint64_t now = f.written[c].fetch_add(n, std::memory_order_acq_rel) + n;
    if (now > chunk_length) {
      // The fetcher writes each byte of a request once; more means two requests overlap.
      return std::unexpected(fmt::format("{}: chunk {} received {} bytes, more than its {}",
                                         where(f), c, now, chunk_length));
    }
    if (now == chunk_length) {
      pool_.submit([this, ff = &f, c](unsigned) { verify(*ff, c); });
    }
    offset += n;
    length -= n;
  }
  return {};
}

void FillSession::failed(FileId id, ByteRange range, const FetchError& error) {
  // Cancellations are ours (cancel() or an abort after another error), reported there.
  if (error.code == FetchErrc::cancelled) return;
  FileFill* f = file(id);
  const std::string what = f != nullptr ? where(*f) : fmt::format("{} file {}", label_, id);
  record_error(ModelFetchError{
      ModelFetchErrc::fetch,
      fmt::format("{}: bytes {}-{} could not be fetched: {}; check that the registry is up and "
                  "serves the file, then fetch again (verified chunks are kept)",
                  what, range.offset, range.end() - 1, error.message)});
}

// --- Verification (pool threads) --------------------------------------------------------

// The fetcher wrote a chunk before crediting it (the pool's queue orders the two), and
// nothing writes it again until it is requested again, so its bytes are hashed in place.
void FillSession::verify(FileFill& f, std::uint64_t chunk) {
  if (f.failed.load()) return;
  if (f.spec.chained || !f.spec.chunk_sha256.empty()) {
    auto mapped = f.map_chunk(chunk);
    if (!mapped) return unreadable(f, chunk, mapped.error());
    const std::span<const std::byte> bytes(mapped->data(), mapped->size());
    std::string actual;
    const std::string* expected = nullptr;
    if (f.spec.chained) {
      actual = chained_actual(f, chunk, bytes);
      const bool last = chunk + 1 == f.chunk_count;
      expected = last ? &f.spec.file_sha256 : &f.spec.chain_sha256[chunk];
    } else {
      actual = sha256_hex(bytes);
      expected = &f.spec.chunk_sha256[chunk];
    }
    if (actual != *expected) return chunk_mismatch(f, chunk, *expected, std::move(actual));
  }
  chunk_verified(f, chunk);
}

std::string FillSession::chained_actual(const FileFill& f, std::uint64_t c,
                                        std::span<const std::byte> bytes) const {
  const std::string_view before = c == 0 ? std::string_view() : f.spec.chain_sha256[c - 1];
  // The states were checked as 64 hex digits when the manifest was parsed.
  return sha256_chain_step(before, f.readiness().chunk_offset(c), bytes, c + 1 == f.chunk_count)
      .value_or(std::string());
}

void FillSession::unreadable(FileFill& f, std::uint64_t c, const CacheError& error) {
  fail_file(f,
            ModelFetchError{ModelFetchErrc::cache,
                            fmt::format("{}: mapping chunk {} of the cache file {} to verify it: "
                                        "{}",
                                        where(f), c, f.file->data_path().string(), error.message)},
            "a chunk could not be read back from the cache to verify it");
}

void FillSession::chunk_mismatch(FileFill& f, std::uint64_t chunk, std::string expected,
                                 std::string actual) {
  const ChunkReadiness& readiness = f.readiness();
  ChunkMismatch info{f.spec.path,
                     chunk,
                     readiness.chunk_offset(chunk),
                     readiness.chunk_length(chunk),
                     std::move(expected),
                     std::move(actual),
                     false};
  const ByteRange range{info.offset, info.length};
  std::unique_lock lock(refetch_mutex_);
  info.refetching = !refetch_stopped_ && f.refetched[chunk].exchange(1) == 0;
  if (hooks_.on_chunk_mismatch) hooks_.on_chunk_mismatch(info);
  if (info.refetching) {
    // Reset before asking: the new bytes count from zero.
    f.written[chunk].store(0, std::memory_order_release);
    counters_.chunk_refetches.fetch_add(1, std::memory_order_relaxed);
    counters_.bytes_requested.fetch_add(info.length, std::memory_order_relaxed);
    auto ok = hooks_.refetch(f.id, range, f.chunk_class[chunk]);
    lock.unlock();
    if (ok) return;
    fail_file(f,
              ModelFetchError{ModelFetchErrc::fetch,
                              fmt::format("{}: chunk {} failed its sha256 and could not be "
                                          "requested again: {}",
                                          where(f), chunk, ok.error().message)},
              "chunk failed its sha256; refetch impossible");
    return;
  }
  lock.unlock();
  const bool twice = f.refetched[chunk].load() != 0;
  fail_file(
      f,
      ModelFetchError{
          ModelFetchErrc::integrity,
          fmt::format("{}: chunk {} (bytes {}-{}) failed its sha256{}: expected {}, got {}; the "
                      "registry serves bytes that differ from its {}: re-publish the manifest "
                      "from the right files or fix the registry's copy",
                      where(f), chunk, info.offset, info.offset + info.length - 1,
                      twice ? " again after a refetch" : "", info.expected_sha256,
                      info.actual_sha256, "thaw-manifest.json")},
      fmt::format("chunk {} failed its sha256{}: expected {}, got {}", chunk, twice ? " twice" : "",
                  short_digest(info.expected_sha256), short_digest(info.actual_sha256)));
}

void FillSession::chunk_verified(FileFill& f, std::uint64_t chunk) {
  ChunkReadiness& readiness = f.readiness();
  if (auto ok = readiness.mark_verified(chunk); !ok) {
    fail_file(
        f,
        ModelFetchError{ModelFetchErrc::cache, fmt::format("{}: marking chunk {} verified: {}",
                                                           where(f), chunk, ok.error().message)},
        "the readiness map could not be updated");
    return;
  }
  const std::uint64_t length = readiness.chunk_length(chunk);
  f.chunks_fetched.fetch_add(1, std::memory_order_relaxed);
  f.bytes_fetched.fetch_add(length, std::memory_order_relaxed);
  counters_.bytes_verified.fetch_add(length, std::memory_order_relaxed);
  check_first_tensor(f);
  f.outstanding.fetch_sub(1, std::memory_order_acq_rel);
  if (f.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    counters_.files_done.fetch_add(1, std::memory_order_relaxed);
  }
  bool idle = false;
  {
    std::lock_guard lock(mutex_);
    idle = --outstanding_ == 0;
  }
  if (idle) changed_.notify_all();
  if (f.digest) advance_digest(f);
}

// Several workers may verify chunks of one file at once, but the digest must see them in
// order: whoever holds digest_mutex digests every verified chunk from digest_next on; a
// worker that finds it held only bumps digest_requests, which makes the holder look again
// before it leaves, so no verified chunk is left waiting.
void FillSession::advance_digest(FileFill& f) {
  f.digest_requests.fetch_add(1, std::memory_order_acq_rel);
  if (!f.digest_mutex.try_lock()) return;
  for (;;) {
    const std::uint64_t seen = f.digest_requests.load(std::memory_order_acquire);
    auto ok = digest_ready_chunks(f);
    f.digest_mutex.unlock();
    if (!ok) return fail_file(f, ok.error(), "reading the file back for its sha256 failed");
    if (f.digest_requests.load(std::memory_order_acquire) == seen) return;
    if (!f.digest_mutex.try_lock()) return;
  }
}

std::expected<void, ModelFetchError> FillSession::digest_ready_chunks(FileFill& f) {
  const ChunkReadiness& readiness = f.readiness();
  while (f.digest_next < f.chunk_count && readiness.chunk_verified(f.digest_next)) {
    auto mapped = f.map_chunk(f.digest_next);
    if (!mapped) {
      return std::unexpected(ModelFetchError{
          ModelFetchErrc::cache,
          fmt::format("{}: mapping chunk {} of {} for the file's sha256: {}", where(f),
                      f.digest_next, f.file->data_path().string(), mapped.error().message)});
    }
    f.digest->update(std::span<const std::byte>(mapped->data(), mapped->size()));
    ++f.digest_next;
  }
  return {};
}

std::expected<std::string, ModelFetchError> FillSession::whole_file_sha256(FileId id) {
  FileFill& f = *slots_.at(id);
  if (!f.digest) {
    return std::unexpected(ModelFetchError{ModelFetchErrc::invalid_argument,
                                           fmt::format("{}: no whole-file digest kept", where(f))});
  }
  std::lock_guard lock(f.digest_mutex);
  if (auto ok = digest_ready_chunks(f); !ok) return std::unexpected(ok.error());
  if (f.digest_next != f.chunk_count) {
    return std::unexpected(ModelFetchError{
        ModelFetchErrc::invalid_argument,
        fmt::format("{}: chunk {} is not verified; the file's sha256 needs every chunk", where(f),
                    f.digest_next)});
  }
  return f.digest->hex_digest();
}

}  // namespace thaw::store
