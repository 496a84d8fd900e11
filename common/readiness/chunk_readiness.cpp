#include "common/readiness/chunk_readiness.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

#include "common/readiness/readiness_layout.hpp"
#include "common/readiness/shared_futex.hpp"

namespace thaw::store {
namespace {

namespace layout = readiness_layout;
using layout::Header;

// Shared-memory fields are accessed only through these (see readiness_layout.hpp). They
// are GCC builtins rather than std::atomic_ref because readers map the region
// PROT_READ and C++23's atomic_ref cannot be formed over const objects.
template <class T>
T load_acquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <class T>
T load_relaxed(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <class T>
void store_release(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

const Header* as_header(const void* p) {
  return static_cast<const Header*>(p);
}
Header* as_mutable_header(const void* p) {
  return static_cast<Header*>(const_cast<void*>(p));
}

uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

uint64_t page_size() {
  return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The mapping granule of the filesystem holding `fd`: the huge page size on hugetlbfs,
// the base page size elsewhere.
uint64_t map_alignment(int fd) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) == 0 && static_cast<unsigned long>(fs.f_type) == HUGETLBFS_MAGIC &&
      fs.f_bsize > 0) {
    return static_cast<uint64_t>(fs.f_bsize);
  }
  return page_size();
}

timespec monotonic_now() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now;
}

// now + timeout, saturating (a timeout of years is "forever" for practical purposes).
timespec deadline_after(std::chrono::nanoseconds timeout) {
  timespec now = monotonic_now();
  const int64_t ns = std::max<int64_t>(0, timeout.count());
  const int64_t secs = ns / 1'000'000'000;
  const int64_t rest = ns % 1'000'000'000;
  if (secs > INT64_MAX / 2 - now.tv_sec) return timespec{INT64_MAX / 2, 0};
  now.tv_sec += secs;
  now.tv_nsec += rest;
  if (now.tv_nsec >= 1'000'000'000) {
    now.tv_sec += 1;
    now.tv_nsec -= 1'000'000'000;
  }
  return now;
}

bool passed(const timespec& deadline) {
  const timespec now = monotonic_now();
  return now.tv_sec > deadline.tv_sec ||
         (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec);
}

bool valid_state(uint32_t s) {
  return s == layout::kStateFilling || s == layout::kStateComplete || s == layout::kStateFailed;
}

}  // namespace

std::string_view to_string(FillState state) {
  switch (state) {
    case FillState::filling:
      return "filling";
    case FillState::complete:
      return "complete";
    case FillState::failed:
      return "failed";
  }
  return "unknown";
}

std::string_view to_string(WaitStatus status) {
  switch (status) {
    case WaitStatus::ready:
      return "ready";
    case WaitStatus::timed_out:
      return "timed_out";
    case WaitStatus::failed:
      return "failed";
    case WaitStatus::out_of_range:
      return "out_of_range";
  }
  return "unknown";
}

CacheResult<uint64_t> ChunkReadiness::region_bytes_for(uint64_t file_size, uint64_t chunk_size,
                                                       uint64_t alignment) {
  if (chunk_size == 0) {
    return cache_failure(CacheErrc::invalid_argument, "readiness map: chunk size must be > 0");
  }
  const uint64_t chunks = file_size / chunk_size + (file_size % chunk_size != 0 ? 1 : 0);
  if (chunks > layout::kMaxChunkCount) {
    return cache_failure(
        CacheErrc::invalid_argument,
        fmt::format("readiness map: {} bytes in chunks of {} is {} chunks, more than the {} a "
                    "map can track; use a larger chunk size",
                    file_size, chunk_size, chunks, layout::kMaxChunkCount));
  }
  return round_up(layout::kHeaderBytes + 8 * layout::bitmap_words(chunks),
                  std::max<uint64_t>(alignment, 1));
}

ChunkReadiness::ChunkReadiness(UniqueFd fd, MappedRegion map, std::string name, bool writable)
    : fd_(std::move(fd)), map_(std::move(map)), name_(std::move(name)) {
  const Header* h = as_header(map_.data());
  file_size_ = h->file_size;
  chunk_size_ = h->chunk_size;
  chunk_count_ = h->chunk_count;
  if (writable) writer_mutex_ = std::make_unique<std::mutex>();
}

uint64_t* ChunkReadiness::bitmap() const {
  return reinterpret_cast<uint64_t*>(map_.data() + layout::kHeaderBytes);
}

CacheResult<ChunkReadiness> ChunkReadiness::create(UniqueFd fd, std::string name,
                                                   uint64_t file_size, uint64_t chunk_size) {
  auto region = region_bytes_for(file_size, chunk_size, map_alignment(fd.get()));
  if (!region) return std::unexpected(region.error());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return std::unexpected(errno_error(errno, fmt::format("readiness map {}: fstat", name)));
  }
  if (st.st_size != 0) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("readiness map {}: create() needs an empty file, this one "
                                     "has {} bytes",
                                     name, st.st_size));
  }

  // Reserve the blocks now: writing through a mapping of a hole on a full tmpfs raises
  // SIGBUS, which no caller could handle.
  int rc = 0;
  do {
    rc = ::fallocate(fd.get(), 0, 0, static_cast<off_t>(*region));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno == EOPNOTSUPP) rc = ::ftruncate(fd.get(), static_cast<off_t>(*region));
  if (rc != 0) {
    return std::unexpected(
        errno_error(errno, fmt::format("readiness map {}: reserving {} bytes", name, *region)));
  }
  auto map = MappedRegion::map(fd.get(), *region, /*writable=*/true, name);
  if (!map) return std::unexpected(map.error());

  Header* h = as_mutable_header(map->data());
  std::memset(map->data(), 0, *region);
  h->version = layout::kVersion;
  h->header_bytes = layout::kHeaderBytes;
  h->region_bytes = *region;
  h->file_size = file_size;
  h->chunk_size = chunk_size;
  h->chunk_count = file_size / chunk_size + (file_size % chunk_size != 0 ? 1 : 0);
  h->generation = 1;
  h->state = layout::kStateFilling;
  // The magic goes last, with release: a reader that opens the file while it is being
  // initialised (it should not be visible yet) sees either no magic or all of it.
  store_release(&h->magic, layout::kMagic);
  return ChunkReadiness(std::move(fd), std::move(*map), std::move(name), /*writable=*/true);
}

CacheResult<ChunkReadiness> ChunkReadiness::open_writer(UniqueFd fd, std::string name) {
  return open(std::move(fd), std::move(name), /*writable=*/true);
}

CacheResult<ChunkReadiness> ChunkReadiness::open_reader(UniqueFd fd, std::string name) {
  return open(std::move(fd), std::move(name), /*writable=*/false);
}

CacheResult<ChunkReadiness> ChunkReadiness::open(UniqueFd fd, std::string name, bool writable) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return std::unexpected(errno_error(errno, fmt::format("readiness map {}: fstat", name)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // The largest map any geometry can need, on any filesystem's granule (up to 1 GiB
  // huge pages): bigger files are not readiness maps.
  const uint64_t max_region = round_up(
      layout::kHeaderBytes + 8 * layout::bitmap_words(layout::kMaxChunkCount), uint64_t{1} << 30);
  if (!S_ISREG(st.st_mode) || size < layout::kHeaderBytes || size > max_region) {
    return cache_failure(
        CacheErrc::corrupt,
        fmt::format("readiness map {}: {} bytes is not the size of a readiness map (at least "
                    "{}); the file is truncated or not a thaw readiness map",
                    name, size, layout::kHeaderBytes));
  }
  auto map = MappedRegion::map(fd.get(), size, writable, name);
  if (!map) return std::unexpected(map.error());
  ChunkReadiness readiness(std::move(fd), std::move(*map), std::move(name), writable);
  if (auto ok = readiness.validate(); !ok) return std::unexpected(ok.error());
  return readiness;
}

CacheResult<void> ChunkReadiness::validate() const {
  const Header* h = as_header(header());
  auto corrupt = [&](std::string rule) {
    return cache_failure(CacheErrc::corrupt,
                         fmt::format("readiness map {}: {}", name_, std::move(rule)));
  };
  if (load_acquire(&h->magic) != layout::kMagic) {
    return corrupt(fmt::format("magic {:#018x} is not a thaw readiness map's ({:#018x})",
                               load_relaxed(&h->magic), layout::kMagic));
  }
  if (h->version != layout::kVersion) {
    return corrupt(fmt::format("layout version {}, this build reads version {}", h->version,
                               layout::kVersion));
  }
  if (h->header_bytes != layout::kHeaderBytes) {
    return corrupt(fmt::format("header size {} != {}", h->header_bytes, layout::kHeaderBytes));
  }
  auto needed = region_bytes_for(h->file_size, h->chunk_size, 1);
  if (!needed) return corrupt(needed.error().message);
  const uint64_t chunks =
      h->file_size / h->chunk_size + (h->file_size % h->chunk_size != 0 ? 1 : 0);
  if (h->chunk_count != chunks) {
    return corrupt(fmt::format("chunk count {} != ceil(file size {} / chunk size {}) = {}",
                               h->chunk_count, h->file_size, h->chunk_size, chunks));
  }
  if (h->region_bytes != map_.size() || h->region_bytes < *needed ||
      h->region_bytes % page_size() != 0) {
    return corrupt(fmt::format(
        "recorded size {} does not match the file's size {} (needs {} bytes, page-rounded)",
        h->region_bytes, map_.size(), *needed));
  }
  const uint32_t state = load_acquire(&h->state);
  if (!valid_state(state)) return corrupt(fmt::format("unknown state {}", state));
  if (std::memchr(h->failure_reason, '\0', layout::kReasonBytes) == nullptr) {
    return corrupt("failure reason is not NUL-terminated");
  }
  // Load order matters against a live writer: state and progress first (acquire), then
  // the bits they imply (published before them with release).
  const uint64_t progress = load_acquire(&h->contiguous_bytes);
  if (progress > h->file_size || (progress % h->chunk_size != 0 && progress != h->file_size)) {
    return corrupt(fmt::format("progress word {} is not a chunk boundary within the {} bytes",
                               progress, h->file_size));
  }
  const uint64_t* bits = bitmap();
  const uint64_t prefix_chunks = progress == h->file_size ? chunks : progress / h->chunk_size;
  for (uint64_t word = 0; word * 64 < prefix_chunks; ++word) {
    const uint64_t in_prefix = std::min<uint64_t>(64, prefix_chunks - word * 64);
    const uint64_t want = in_prefix == 64 ? ~uint64_t{0} : (uint64_t{1} << in_prefix) - 1;
    const uint64_t clear = ~load_acquire(&bits[word]) & want;
    if (clear != 0) {
      const uint64_t chunk = word * 64 + static_cast<uint64_t>(std::countr_zero(clear));
      return corrupt(
          fmt::format("progress word {} covers chunk {}, whose bit is clear", progress, chunk));
    }
  }
  if (chunks % 64 != 0 && (load_acquire(&bits[chunks / 64]) >> (chunks % 64)) != 0) {
    return corrupt(fmt::format("bits set past the last chunk ({})", chunks - 1));
  }
  if (state == layout::kStateComplete && progress != h->file_size) {
    return corrupt(
        fmt::format("state complete but only {} of {} bytes verified", progress, h->file_size));
  }
  if (load_relaxed(&h->verified_chunks) > chunks) {
    return corrupt(
        fmt::format("{} verified chunks of {}", load_relaxed(&h->verified_chunks), chunks));
  }
  return {};
}

CacheResult<UniqueFd> ChunkReadiness::reopen_read_only() const {
  const std::string proc = fmt::format("/proc/self/fd/{}", fd_.get());
  UniqueFd fd(::open(proc.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    return std::unexpected(
        errno_error(errno, fmt::format("readiness map {}: reopening read-only", name_)));
  }
  return fd;
}

uint64_t ChunkReadiness::chunk_length(uint64_t chunk) const {
  if (chunk >= chunk_count_) return 0;
  return std::min(chunk_size_, file_size_ - chunk * chunk_size_);
}

FillState ChunkReadiness::state() const {
  return static_cast<FillState>(load_acquire(&as_header(header())->state));
}

std::string ChunkReadiness::failure_reason() const {
  const Header* h = as_header(header());
  // The writer may rewrite the reason (a resume, then a new failure) while a reader
  // copies it: copy between two epoch reads and retry if a change slipped in.
  for (;;) {
    const uint32_t before = load_acquire(&h->epoch);
    if (load_acquire(&h->state) != layout::kStateFailed) return {};
    std::string reason;
    for (size_t i = 0; i + 1 < layout::kReasonBytes; ++i) {
      const char c = load_relaxed(&h->failure_reason[i]);
      if (c == '\0') break;
      reason.push_back(c);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (load_relaxed(&h->epoch) == before) return reason;
  }
}

uint64_t ChunkReadiness::contiguous_bytes() const {
  return load_acquire(&as_header(header())->contiguous_bytes);
}

uint64_t ChunkReadiness::verified_chunks() const {
  return load_acquire(&as_header(header())->verified_chunks);
}

uint64_t ChunkReadiness::generation() const {
  return load_acquire(&as_header(header())->generation);
}

uint32_t ChunkReadiness::epoch() const {
  return load_acquire(&as_header(header())->epoch);
}

bool ChunkReadiness::chunk_verified(uint64_t chunk) const {
  if (chunk >= chunk_count_) return false;
  return (load_acquire(&bitmap()[chunk / 64]) >> (chunk % 64) & 1) != 0;
}

bool ChunkReadiness::is_ready(uint64_t offset, uint64_t length) const {
  if (offset > file_size_ || length > file_size_ - offset) return false;
  if (length == 0) return true;
  const uint64_t end = offset + length;
  // Fast path: the common streaming case (reading behind the progress word).
  if (contiguous_bytes() >= end) return true;
  const uint64_t first = offset / chunk_size_;
  const uint64_t last = (end - 1) / chunk_size_;
  const uint64_t* bits = bitmap();
  for (uint64_t word = first / 64; word <= last / 64; ++word) {
    uint64_t want = ~uint64_t{0};
    if (word == first / 64) want &= ~uint64_t{0} << (first % 64);
    if (word == last / 64 && last % 64 != 63) want &= (uint64_t{1} << (last % 64 + 1)) - 1;
    if ((load_acquire(&bits[word]) & want) != want) return false;
  }
  return true;
}

WaitResult ChunkReadiness::wait_ready(uint64_t offset, uint64_t length,
                                      std::chrono::nanoseconds timeout) const {
  if (offset > file_size_ || length > file_size_ - offset) {
    return WaitResult{WaitStatus::out_of_range, {}};
  }
  const Header* h = as_header(header());
  const bool forever = timeout == kForever;
  const timespec deadline = forever ? timespec{} : deadline_after(timeout);
  for (;;) {
    // Epoch first (acquire), then the condition: see the header comment.
    const uint32_t seen = load_acquire(&h->epoch);
    if (is_ready(offset, length)) return WaitResult{WaitStatus::ready, {}};
    if (load_acquire(&h->state) == layout::kStateFailed) {
      return WaitResult{WaitStatus::failed, failure_reason()};
    }
    if (!forever && passed(deadline)) return WaitResult{WaitStatus::timed_out, {}};
    const FutexWaitResult r = futex_wait_shared(&h->epoch, seen, forever ? nullptr : &deadline);
    if (r == FutexWaitResult::timed_out) {
      // One last look: the chunk may have landed just as the deadline passed.
      if (is_ready(offset, length)) return WaitResult{WaitStatus::ready, {}};
      if (load_acquire(&h->state) == layout::kStateFailed) {
        return WaitResult{WaitStatus::failed, failure_reason()};
      }
      return WaitResult{WaitStatus::timed_out, {}};
    }
  }
}

std::vector<ChunkRun> ChunkReadiness::missing_chunks() const {
  std::vector<ChunkRun> runs;
  const uint64_t* bits = bitmap();
  uint64_t c = contiguous_bytes() / chunk_size_;
  while (c < chunk_count_) {
    const uint64_t word = load_acquire(&bits[c / 64]) >> (c % 64);
    if (word == ~uint64_t{0} >> (c % 64)) {  // the rest of this word is verified
      c = (c / 64 + 1) * 64;
      continue;
    }
    if ((word & 1) != 0) {
      c += static_cast<uint64_t>(std::countr_one(word));
      continue;
    }
    // Clear bits from c: extend the current run or start one.
    const uint64_t clear = std::min<uint64_t>(
        word == 0 ? 64 - c % 64 : static_cast<uint64_t>(std::countr_zero(word)), chunk_count_ - c);
    if (!runs.empty() && runs.back().first + runs.back().count == c) {
      runs.back().count += clear;
    } else {
      runs.push_back(ChunkRun{c, clear});
    }
    c += clear;
  }
  return runs;
}

CacheResult<void> ChunkReadiness::require_writer(std::string_view op) const {
  if (writable()) return {};
  return cache_failure(CacheErrc::wrong_state,
                       fmt::format("readiness map {}: {} on a map opened read-only", name_, op));
}

void ChunkReadiness::publish_change() {
  Header* h = as_mutable_header(header());
  // Release: whoever sees the new epoch sees the change that preceded it.
  __atomic_fetch_add(&h->epoch, 1u, __ATOMIC_RELEASE);
  // Always wake: a waiter count would need readers to write to the map, and readers
  // map it read-only. One FUTEX_WAKE per chunk (chunks are MiBs) costs about a
  // microsecond when nobody waits.
  futex_wake_all_shared(&h->epoch);
}

CacheResult<void> ChunkReadiness::mark_verified(uint64_t chunk) {
  if (auto ok = require_writer("mark_verified"); !ok) return ok;
  if (chunk >= chunk_count_) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("readiness map {}: chunk {} past the last chunk {}", name_,
                                     chunk, chunk_count_ == 0 ? 0 : chunk_count_ - 1));
  }
  std::lock_guard lock(*writer_mutex_);
  Header* h = as_mutable_header(header());
  uint64_t* bits = bitmap();
  const uint64_t mask = uint64_t{1} << (chunk % 64);
  const uint64_t before = __atomic_fetch_or(&bits[chunk / 64], mask, __ATOMIC_RELEASE);
  if ((before & mask) != 0) return {};
  __atomic_fetch_add(&h->verified_chunks, uint64_t{1}, __ATOMIC_RELEASE);

  const uint64_t progress = load_relaxed(&h->contiguous_bytes);
  uint64_t next = progress / chunk_size_;
  if (progress != file_size_ && next == chunk) {
    while (next < chunk_count_ && (load_relaxed(&bits[next / 64]) >> (next % 64) & 1) != 0) {
      ++next;
    }
    store_release(&h->contiguous_bytes, std::min(next * chunk_size_, file_size_));
  }
  publish_change();
  return {};
}

CacheResult<void> ChunkReadiness::mark_failed(std::string_view reason) {
  if (auto ok = require_writer("mark_failed"); !ok) return ok;
  std::lock_guard lock(*writer_mutex_);
  Header* h = as_mutable_header(header());
  if (load_relaxed(&h->state) == layout::kStateComplete) {
    return cache_failure(
        CacheErrc::wrong_state,
        fmt::format("readiness map {}: cannot fail a complete file ({})", name_, reason));
  }
  const size_t n = std::min(reason.size(), layout::kReasonBytes - 1);
  for (size_t i = 0; i < layout::kReasonBytes; ++i) {
    __atomic_store_n(&h->failure_reason[i], i < n ? reason[i] : '\0', __ATOMIC_RELAXED);
  }
  store_release(&h->state, uint32_t{layout::kStateFailed});
  publish_change();
  return {};
}

CacheResult<void> ChunkReadiness::mark_complete() {
  if (auto ok = require_writer("mark_complete"); !ok) return ok;
  std::lock_guard lock(*writer_mutex_);
  Header* h = as_mutable_header(header());
  const uint64_t progress = load_relaxed(&h->contiguous_bytes);
  if (progress != file_size_) {
    return cache_failure(
        CacheErrc::wrong_state,
        fmt::format("readiness map {}: cannot mark complete with {} of {} chunks verified "
                    "(first missing chunk {})",
                    name_, load_relaxed(&h->verified_chunks), chunk_count_,
                    progress / chunk_size_));
  }
  if (load_relaxed(&h->state) == layout::kStateComplete) return {};
  store_release(&h->state, uint32_t{layout::kStateComplete});
  publish_change();
  return {};
}

CacheResult<void> ChunkReadiness::resume_filling() {
  if (auto ok = require_writer("resume_filling"); !ok) return ok;
  std::lock_guard lock(*writer_mutex_);
  Header* h = as_mutable_header(header());
  const uint32_t state = load_relaxed(&h->state);
  if (state == layout::kStateComplete) {
    return cache_failure(CacheErrc::wrong_state,
                         fmt::format("readiness map {}: complete; nothing to resume", name_));
  }
  if (state == layout::kStateFilling) return {};
  __atomic_fetch_add(&h->generation, uint64_t{1}, __ATOMIC_RELEASE);
  store_release(&h->state, uint32_t{layout::kStateFilling});
  publish_change();
  return {};
}

}  // namespace thaw::store
