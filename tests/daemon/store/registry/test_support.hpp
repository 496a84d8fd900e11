// Shared helpers of the registry suites: temporary directories, deterministic file
// contents, a sink that records what the fetcher writes, and bounded waits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/store/registry/fetch_types.hpp"
#include "tests/support/temp_dir.hpp"

namespace thaw::store::testing {

using thaw::testing::TempDir;  // the suites' shared one (tests/support)

// `size` pseudo-random bytes that differ per `seed` (so a misplaced range shows).
std::vector<std::byte> make_bytes(std::size_t size, std::uint64_t seed);
void write_file(const std::filesystem::path& path, const std::vector<std::byte>& bytes);
void write_text(const std::filesystem::path& path, const std::string& text);

// Waits (polling every few ms) until `condition` holds or `timeout` passes.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(20));

// Records every write into a per-file buffer, counting how often each byte was written.
class RecordingSink : public FetchSink {
 public:
  struct Finished {
    FileId file;
    ByteRange range;
    std::optional<FetchError> error;  // nullopt: done
  };

  // Files must be declared (with their size) before bytes for them arrive.
  void expect_file(FileId file, std::size_t size);

  std::expected<void, std::string> write(FileId file, std::uint64_t offset,
                                         std::span<const std::byte> bytes) override;
  void done(FileId file, ByteRange range) override;
  void failed(FileId file, ByteRange range, const FetchError& error) override;

  // Makes write() fail once this many bytes were written in all (sink error tests).
  void fail_after(std::uint64_t bytes);

  std::vector<std::byte> contents(FileId file) const;
  // Bytes of `file` written more than once / never, over the whole file.
  std::uint64_t bytes_written_twice(FileId file) const;
  std::uint64_t bytes_missing(FileId file) const;
  std::uint64_t total_written() const;
  std::vector<Finished> finished() const;
  std::string problems() const;  // out-of-bounds writes and the like, empty if none

 private:
  mutable std::mutex mutex_;
  std::map<FileId, std::vector<std::byte>> data_;
  std::map<FileId, std::vector<std::uint8_t>> writes_;
  std::vector<Finished> finished_;
  std::uint64_t total_ = 0;
  std::optional<std::uint64_t> fail_after_;
  std::string problems_;
};

}  // namespace thaw::store::testing
