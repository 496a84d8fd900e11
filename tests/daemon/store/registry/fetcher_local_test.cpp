// RangeFetcher with local sources: pread into the sink, or copy_file_range straight into
// a descriptor the sink offers.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "daemon/store/registry/local_registry.hpp"
#include "daemon/store/registry/range_fetcher.hpp"
#include "test_support.hpp"

namespace thaw::store {
namespace {

using namespace std::chrono_literals;
using testing::make_bytes;
using testing::RecordingSink;
using testing::TempDir;
using testing::write_file;

TEST(FetcherLocal, CopiesRangesFromALocalRegistry) {
  TempDir root;
  auto bytes = make_bytes((9u << 20) + 77, 21);
  write_file(root.path() / "m" / "model.safetensors", bytes);
  LocalRegistry registry(root.path());
  auto source = registry.source("m", "model.safetensors");
  ASSERT_TRUE(source);

  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config;
  config.local_slice_bytes = 1u << 20;
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit(
      {RangeRequest{0, *source, {0, 4000000}, FetchClass::critical, 0},
       RangeRequest{
           0, *source, {4000000, bytes.size() - 4000000}, FetchClass::background, bytes.size()}}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_TRUE(sink.contents(0) == bytes);
  EXPECT_EQ(sink.bytes_written_twice(0), 0u);
  EXPECT_EQ(fetcher.progress().bytes_done, bytes.size());
}

// store.max_rate holds for a local-directory registry as for HTTP: 3 MiB at 4 MiB/s (1 MiB
// of burst) takes about half a second, not the few milliseconds of an unpaced copy.
TEST(FetcherLocal, ARateLimitPacesLocalCopies) {
  TempDir root;
  auto bytes = make_bytes(3u << 20, 5);
  write_file(root.path() / "m" / "model.safetensors", bytes);
  LocalRegistry registry(root.path());
  auto source = registry.source("m", "model.safetensors");
  ASSERT_TRUE(source);
  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config;
  config.local_slice_bytes = 256u << 10;
  config.rate_limits[static_cast<std::size_t>(FetchClass::critical)] =
      RateLimit{4u << 20, 1u << 20};
  RangeFetcher fetcher(config, sink);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(fetcher.submit(
      {RangeRequest{0, *source, {0, bytes.size()}, FetchClass::critical, bytes.size()}}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_TRUE(sink.contents(0) == bytes);
  // (3 MiB - 1 MiB burst - one slice of debt) / 4 MiB/s ≈ 0.44 s; no upper bound (a
  // loaded machine only makes it slower).
  EXPECT_GE(took, 350ms);
}

// A sink backed by a file, as the cache on tmpfs will be.
class FileBackedSink : public FetchSink {
 public:
  explicit FileBackedSink(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) {}
  ~FileBackedSink() override { ::close(fd_); }

  std::expected<void, std::string> write(FileId, std::uint64_t offset,
                                         std::span<const std::byte> bytes) override {
    written_through_write += bytes.size();
    if (::pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset)) !=
        static_cast<ssize_t>(bytes.size())) {
      return std::unexpected(std::string("pwrite failed"));
    }
    return {};
  }
  int destination_fd(FileId) override { return fd_; }
  std::expected<void, std::string> written_in_place(FileId, std::uint64_t,
                                                    std::uint64_t length) override {
    written_in_place_bytes += length;
    return {};
  }

  std::uint64_t written_through_write = 0;
  std::uint64_t written_in_place_bytes = 0;

 private:
  int fd_;
};

TEST(FetcherLocal, CopiesInPlaceWhenTheSinkOffersADescriptor) {
  TempDir root;
  auto bytes = make_bytes(3u << 20, 22);
  write_file(root.path() / "m" / "weights.bin", bytes);
  const auto destination = root.path() / "cache.bin";
  FileBackedSink sink(destination);
  RangeFetcher fetcher(FetcherConfig{}, sink);
  FileSource source{FileSource::Kind::local, (root.path() / "m" / "weights.bin").string()};
  ASSERT_TRUE(fetcher.submit({RangeRequest{0, source, {0, bytes.size()}}}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(fetcher.take_failures().empty());
  // Either path is correct; together they cover every byte exactly once.
  EXPECT_EQ(sink.written_through_write + sink.written_in_place_bytes, bytes.size());
  std::ifstream in(destination, std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(got.size(), bytes.size());
  EXPECT_EQ(std::memcmp(got.data(), bytes.data(), bytes.size()), 0);
}

TEST(FetcherLocal, MissingAndShortFilesFail) {
  TempDir root;
  write_file(root.path() / "short.bin", make_bytes(1000, 23));
  RecordingSink sink;
  sink.expect_file(0, 5000);
  sink.expect_file(1, 5000);
  RangeFetcher fetcher(FetcherConfig{}, sink);
  ASSERT_TRUE(fetcher.submit(
      {RangeRequest{
           0, FileSource{FileSource::Kind::local, (root.path() / "absent.bin").string()}, {0, 10}},
       RangeRequest{1,
                    FileSource{FileSource::Kind::local, (root.path() / "short.bin").string()},
                    {0, 5000}}}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 2u);
  std::sort(failures.begin(), failures.end(),
            [](const auto& a, const auto& b) { return a.code < b.code; });
  EXPECT_EQ(failures[0].code, FetchErrc::not_found);
  EXPECT_NE(failures[0].message.find("absent.bin"), std::string::npos);
  EXPECT_EQ(failures[1].code, FetchErrc::local_io);
  EXPECT_NE(failures[1].message.find("ends at byte 1000"), std::string::npos)
      << failures[1].message;
}

}  // namespace
}  // namespace thaw::store
