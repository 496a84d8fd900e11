// A readiness map is validated when opened: a corrupt or foreign file is an error,
// never trusted (a consumer trusting a bogus bitmap would read unfetched bytes).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "common/readiness/chunk_readiness.hpp"
#include "common/readiness/readiness_layout.hpp"

namespace thaw::store {
namespace {

namespace layout = readiness_layout;

// A valid map for 1000 bytes in 10 chunks (chunks 0 and 1 verified, 2 missing) in a
// memfd, then modified by `damage` and re-opened as a reader.
CacheResult<ChunkReadiness> open_damaged(void (*damage)(int fd)) {
  UniqueFd fd(::memfd_create("readiness-validation", MFD_CLOEXEC));
  const int raw = fd.get();
  {
    auto map = ChunkReadiness::create(UniqueFd(::dup(raw)), "memfd", 1000, 100);
    EXPECT_TRUE(map.has_value());
    EXPECT_TRUE(map->mark_verified(0));
    EXPECT_TRUE(map->mark_verified(1));
  }
  damage(raw);
  return ChunkReadiness::open_reader(std::move(fd), "damaged");
}

template <class T>
void put(int fd, size_t offset, T value) {
  ASSERT_EQ(::pwrite(fd, &value, sizeof value, static_cast<off_t>(offset)),
            static_cast<ssize_t>(sizeof value));
}

void expect_corrupt(const CacheResult<ChunkReadiness>& result, std::string_view mentions) {
  ASSERT_FALSE(result.has_value()) << "a damaged map was accepted";
  EXPECT_EQ(result.error().code, CacheErrc::corrupt) << result.error().message;
  EXPECT_NE(result.error().message.find(mentions), std::string::npos)
      << "message should mention '" << mentions << "': " << result.error().message;
  EXPECT_NE(result.error().message.find("damaged"), std::string::npos)
      << "message should name the map: " << result.error().message;
}

TEST(ReadinessValidation, UndamagedMapOpens) {
  auto map = open_damaged([](int) {});
  ASSERT_TRUE(map.has_value()) << map.error().message;
  EXPECT_EQ(map->contiguous_bytes(), 200u);
}

TEST(ReadinessValidation, EmptyFileIsRejected) {
  expect_corrupt(open_damaged([](int fd) { ASSERT_EQ(::ftruncate(fd, 0), 0); }), "not the size");
}

TEST(ReadinessValidation, ForeignFileIsRejected) {
  expect_corrupt(open_damaged([](int fd) {
                   std::string junk(4096, '\0');
                   for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 7);
                   ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), 4096);
                 }),
                 "magic");
}

TEST(ReadinessValidation, WrongVersionIsRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint32_t>(fd, offsetof(layout::Header, version), 2); }),
      "layout version 2");
}

TEST(ReadinessValidation, WrongHeaderSizeIsRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint32_t>(fd, offsetof(layout::Header, header_bytes), 64); }),
      "header size");
}

TEST(ReadinessValidation, ChunkCountInconsistentWithSizesIsRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint64_t>(fd, offsetof(layout::Header, chunk_count), 9); }),
      "chunk count");
}

TEST(ReadinessValidation, ZeroChunkSizeIsRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint64_t>(fd, offsetof(layout::Header, chunk_size), 0); }),
      "chunk size");
}

TEST(ReadinessValidation, FileSizeNotMatchingTheRecordedRegionIsRejected) {
  expect_corrupt(open_damaged([](int fd) { ASSERT_EQ(::ftruncate(fd, 2 * ::getpagesize()), 0); }),
                 "does not match the file's size");
}

TEST(ReadinessValidation, GeometryTooLargeForTheFileIsRejected) {
  // 1000 bytes in chunks of 1 need a 640-byte map: claims that do not fit the file.
  expect_corrupt(open_damaged([](int fd) {
                   put<uint64_t>(fd, offsetof(layout::Header, file_size), uint64_t{1} << 20);
                   put<uint64_t>(fd, offsetof(layout::Header, chunk_size), 1);
                   put<uint64_t>(fd, offsetof(layout::Header, chunk_count), uint64_t{1} << 20);
                 }),
                 "does not match");
}

TEST(ReadinessValidation, UnknownStateIsRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint32_t>(fd, offsetof(layout::Header, state), 7); }),
      "unknown state 7");
}

TEST(ReadinessValidation, UnterminatedFailureReasonIsRejected) {
  expect_corrupt(open_damaged([](int fd) {
                   std::string reason(layout::kReasonBytes, 'r');
                   ASSERT_EQ(::pwrite(fd, reason.data(), reason.size(),
                                      offsetof(layout::Header, failure_reason)),
                             static_cast<ssize_t>(reason.size()));
                 }),
                 "NUL");
}

TEST(ReadinessValidation, ProgressWordPastTheFileIsRejected) {
  expect_corrupt(open_damaged([](int fd) {
                   put<uint64_t>(fd, offsetof(layout::Header, contiguous_bytes), 1100);
                 }),
                 "progress word");
}

TEST(ReadinessValidation, ProgressWordOverAClearBitIsRejected) {
  // Claims chunks 0..2 verified; chunk 2's bit is clear.
  expect_corrupt(open_damaged([](int fd) {
                   put<uint64_t>(fd, offsetof(layout::Header, contiguous_bytes), 300);
                 }),
                 "chunk 2, whose bit is clear");
}

TEST(ReadinessValidation, ProgressWordOffAChunkBoundaryIsRejected) {
  expect_corrupt(open_damaged([](int fd) {
                   put<uint64_t>(fd, offsetof(layout::Header, contiguous_bytes), 150);
                 }),
                 "chunk boundary");
}

TEST(ReadinessValidation, BitsPastTheLastChunkAreRejected) {
  expect_corrupt(
      open_damaged([](int fd) { put<uint64_t>(fd, layout::kHeaderBytes, 0x3 | (1ull << 12)); }),
      "past the last chunk");
}

TEST(ReadinessValidation, CompleteWithChunksMissingIsRejected) {
  expect_corrupt(open_damaged([](int fd) {
                   put<uint32_t>(fd, offsetof(layout::Header, state), layout::kStateComplete);
                 }),
                 "state complete");
}

TEST(ReadinessValidation, WriterOpenValidatesToo) {
  UniqueFd fd(::memfd_create("junk", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  auto map = ChunkReadiness::open_writer(std::move(fd), "junk");
  ASSERT_FALSE(map);
  EXPECT_EQ(map.error().code, CacheErrc::corrupt);
}

}  // namespace
}  // namespace thaw::store
