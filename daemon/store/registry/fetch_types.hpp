// What the RangeFetcher is asked for and where it delivers: requests of byte ranges, the
// sink bytes stream into, priority classes and progress.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>

#include "daemon/store/registry/fetch_error.hpp"
#include "daemon/store/registry/registry.hpp"

namespace thaw::store {

// The caller's name for a file (e.g. its index in the cache); the fetcher only passes it
// back to the sink.
using FileId = std::uint32_t;

// [offset, offset + length)
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;

  std::uint64_t end() const { return offset + length; }
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// Bytes on the engine's critical path (the layers a cold start waits for) versus
// everything else (consolidation, prefetch of remaining layers). Each class has its own
// rate limit and socket tags.
enum class FetchClass : std::uint8_t { critical = 0, background = 1 };
inline constexpr std::size_t kFetchClassCount = 2;
std::string_view to_string(FetchClass cls);

struct RangeRequest {
  FileId file = 0;
  FileSource source;  // URL or local path of the file
  ByteRange range;    // length > 0
  FetchClass cls = FetchClass::critical;
  // The file's total size if known (0 = unknown): a 206 whose Content-Range names another
  // total means the file changed on the registry, which is permanent (file_changed).
  std::uint64_t file_size = 0;
};

// Where fetched bytes go. Every call comes from the fetcher's own thread, one at a time;
// ranges handed to write() never overlap within one request, and bytes are written
// exactly once per request (a resumed transfer starts after the last byte written).
class FetchSink {
 public:
  virtual ~FetchSink() = default;

  // Bytes [offset, offset + bytes.size()) of `file` arrived. An error is permanent for the
  // request (e.g. the cache disk is full): it fails with FetchErrc::sink and that message.
  // Called as bytes arrive, so it should not block for long.
  virtual std::expected<void, std::string> write(FileId file, std::uint64_t offset,
                                                 std::span<const std::byte> bytes) = 0;

  // Every byte of a request's `range` has been written.
  virtual void done(FileId /*file*/, ByteRange /*range*/) {}

  // The request failed for good (after retries) or was cancelled. Bytes already written
  // for it stay written; the rest of the range never comes.
  virtual void failed(FileId /*file*/, ByteRange /*range*/, const FetchError& /*error*/) {}

  // Local sources only: a file descriptor the fetcher may copy_file_range() into at the
  // file's own offsets, sparing a copy through user space; -1 (the default) means "use
  // write()". Bytes copied this way are announced with written_in_place().
  virtual int destination_fd(FileId /*file*/) { return -1; }
  virtual std::expected<void, std::string> written_in_place(FileId /*file*/,
                                                            std::uint64_t /*offset*/,
                                                            std::uint64_t /*length*/) {
    return {};
  }
};

struct ClassProgress {
  std::uint64_t bytes_total = 0;  // sum of submitted request lengths
  std::uint64_t bytes_done = 0;   // bytes written to the sink
  double rate_bytes_per_s = 0;    // over the last ~2 s
};

struct FetchProgress {
  std::uint64_t bytes_total = 0;
  std::uint64_t bytes_done = 0;
  double rate_bytes_per_s = 0;
  std::uint64_t requests_pending = 0;  // submitted, neither done nor failed
  std::uint64_t requests_done = 0;
  std::uint64_t requests_failed = 0;
  std::uint64_t retries = 0;         // attempts restarted after a transient fault
  std::uint64_t bytes_received = 0;  // body bytes off the wire (≥ bytes_done from HTTP)
  std::uint32_t active_transfers = 0;
  std::array<ClassProgress, kFetchClassCount> per_class{};
};

}  // namespace thaw::store
