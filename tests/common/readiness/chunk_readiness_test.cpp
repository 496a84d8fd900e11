// ChunkReadiness within one process: progress word, bitmap, states, waits.
#include "common/readiness/chunk_readiness.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

namespace thaw::store {
namespace {

using namespace std::chrono_literals;

ChunkReadiness make_map(uint64_t file_size, uint64_t chunk_size) {
  UniqueFd fd(::memfd_create("readiness-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  auto map = ChunkReadiness::create(std::move(fd), "memfd:test", file_size, chunk_size);
  EXPECT_TRUE(map.has_value()) << map.error().message;
  return std::move(*map);
}

ChunkReadiness reader_of(const ChunkReadiness& writer) {
  auto fd = writer.reopen_read_only();
  EXPECT_TRUE(fd.has_value());
  auto reader = ChunkReadiness::open_reader(std::move(*fd), "reader");
  EXPECT_TRUE(reader.has_value()) << reader.error().message;
  return std::move(*reader);
}

TEST(ChunkReadiness, FreshMapHasGeometryAndNothingReady) {
  auto map = make_map(950, 100);
  EXPECT_EQ(map.file_size(), 950u);
  EXPECT_EQ(map.chunk_size(), 100u);
  EXPECT_EQ(map.chunk_count(), 10u);
  EXPECT_EQ(map.chunk_length(9), 50u);
  EXPECT_EQ(map.chunk_length(10), 0u);
  EXPECT_EQ(map.state(), FillState::filling);
  EXPECT_EQ(map.contiguous_bytes(), 0u);
  EXPECT_EQ(map.verified_chunks(), 0u);
  EXPECT_EQ(map.generation(), 1u);
  EXPECT_FALSE(map.is_ready(0, 1));
  EXPECT_TRUE(map.is_ready(0, 0));
  EXPECT_TRUE(map.writable());
  EXPECT_EQ(map.missing_chunks(), (std::vector<ChunkRun>{{0, 10}}));
}

TEST(ChunkReadiness, ProgressWordAdvancesOverOutOfOrderMarks) {
  auto map = make_map(950, 100);
  ASSERT_TRUE(map.mark_verified(2));
  ASSERT_TRUE(map.mark_verified(1));
  EXPECT_EQ(map.contiguous_bytes(), 0u) << "chunk 0 is missing: no prefix is verified";
  EXPECT_TRUE(map.is_ready(100, 200));
  EXPECT_TRUE(map.is_ready(150, 100));
  EXPECT_FALSE(map.is_ready(99, 2)) << "touches unverified chunk 0";
  EXPECT_FALSE(map.is_ready(250, 51)) << "touches unverified chunk 3";

  ASSERT_TRUE(map.mark_verified(0));
  EXPECT_EQ(map.contiguous_bytes(), 300u) << "advances over the run 0,1,2";
  ASSERT_TRUE(map.mark_verified(4));
  EXPECT_EQ(map.contiguous_bytes(), 300u);
  ASSERT_TRUE(map.mark_verified(3));
  EXPECT_EQ(map.contiguous_bytes(), 500u);
  ASSERT_TRUE(map.mark_verified(9));
  EXPECT_TRUE(map.is_ready(900, 50));
  EXPECT_FALSE(map.is_ready(900, 51)) << "past the end of the file";
  EXPECT_EQ(map.missing_chunks(), (std::vector<ChunkRun>{{5, 4}}));
  for (uint64_t c : {8, 6, 7, 5}) ASSERT_TRUE(map.mark_verified(c));
  EXPECT_EQ(map.contiguous_bytes(), 950u) << "the last, short chunk ends at the file size";
  EXPECT_EQ(map.verified_chunks(), 10u);
  EXPECT_TRUE(map.missing_chunks().empty());
}

TEST(ChunkReadiness, MarkingIsIdempotentAndBumpsTheEpochOncePerChange) {
  auto map = make_map(400, 100);
  const uint32_t e0 = map.epoch();
  ASSERT_TRUE(map.mark_verified(1));
  EXPECT_EQ(map.epoch(), e0 + 1);
  ASSERT_TRUE(map.mark_verified(1));
  EXPECT_EQ(map.epoch(), e0 + 1);
  EXPECT_EQ(map.verified_chunks(), 1u);
  auto past = map.mark_verified(4);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, CacheErrc::invalid_argument);
}

TEST(ChunkReadiness, BitmapWorksAcrossWordBoundaries) {
  auto map = make_map(130 * 10, 10);
  ASSERT_EQ(map.chunk_count(), 130u);
  ASSERT_TRUE(map.mark_verified(63));
  ASSERT_TRUE(map.mark_verified(64));
  ASSERT_TRUE(map.mark_verified(129));
  EXPECT_TRUE(map.is_ready(635, 10)) << "chunks 63 and 64, in two bitmap words";
  EXPECT_FALSE(map.is_ready(625, 20)) << "needs chunk 62";
  EXPECT_FALSE(map.is_ready(645, 10)) << "needs chunk 65";
  EXPECT_TRUE(map.is_ready(1290, 10));
  EXPECT_EQ(map.missing_chunks(), (std::vector<ChunkRun>{{0, 63}, {65, 64}}));
  for (uint64_t c = 0; c < 130; ++c) ASSERT_TRUE(map.mark_verified(c));
  EXPECT_EQ(map.contiguous_bytes(), 1300u);
  EXPECT_TRUE(map.is_ready(0, 1300));
}

TEST(ChunkReadiness, RegionIsSizedToTheChunkCountAndPageRounded) {
  const uint64_t page = static_cast<uint64_t>(::getpagesize());
  auto small = ChunkReadiness::region_bytes_for(1000, 100, page);
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, page);
  // 1 Mi chunks: 512 header bytes + 128 KiB of bitmap.
  auto big = ChunkReadiness::region_bytes_for(uint64_t{1} << 40, uint64_t{1} << 20, page);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, (512 + (uint64_t{1} << 17) + page - 1) / page * page);
  auto map = make_map(uint64_t{1} << 30, 4096);  // 256 Ki chunks
  EXPECT_EQ(map.region_bytes(), (512 + 32768 + page - 1) / page * page);

  auto zero = ChunkReadiness::region_bytes_for(1000, 0, page);
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code, CacheErrc::invalid_argument);
  auto too_many = ChunkReadiness::region_bytes_for(uint64_t{1} << 40, 1, page);
  ASSERT_FALSE(too_many);
  EXPECT_NE(too_many.error().message.find("larger chunk size"), std::string::npos);
}

TEST(ChunkReadiness, CreateNeedsAnEmptyFile) {
  UniqueFd fd(::memfd_create("not-empty", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(fd.get(), 8192), 0);
  auto map = ChunkReadiness::create(std::move(fd), "not-empty", 100, 10);
  ASSERT_FALSE(map);
  EXPECT_EQ(map.error().code, CacheErrc::invalid_argument);
}

TEST(ChunkReadiness, CompleteRequiresEveryChunk) {
  auto map = make_map(300, 100);
  ASSERT_TRUE(map.mark_verified(0));
  ASSERT_TRUE(map.mark_verified(2));
  auto early = map.mark_complete();
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code, CacheErrc::wrong_state);
  EXPECT_NE(early.error().message.find("first missing chunk 1"), std::string::npos)
      << early.error().message;
  EXPECT_EQ(map.state(), FillState::filling);
  ASSERT_TRUE(map.mark_verified(1));
  ASSERT_TRUE(map.mark_complete());
  EXPECT_EQ(map.state(), FillState::complete);
  EXPECT_TRUE(map.is_ready(0, 300));
  auto fail = map.mark_failed("late");
  ASSERT_FALSE(fail);
  EXPECT_EQ(fail.error().code, CacheErrc::wrong_state);
  EXPECT_FALSE(map.resume_filling());
}

TEST(ChunkReadiness, EmptyFileIsCompleteAtOnce) {
  auto map = make_map(0, 4096);
  EXPECT_EQ(map.chunk_count(), 0u);
  EXPECT_TRUE(map.is_ready(0, 0));
  EXPECT_FALSE(map.is_ready(0, 1));
  ASSERT_TRUE(map.mark_complete());
  EXPECT_EQ(map.wait_ready(0, 0, 0ns).status, WaitStatus::ready);
}

TEST(ChunkReadiness, FailureIsReportedAndResumable) {
  auto map = make_map(300, 100);
  ASSERT_TRUE(map.mark_verified(0));
  ASSERT_TRUE(map.mark_failed("chunk 1: sha256 mismatch after 3 attempts"));
  EXPECT_EQ(map.state(), FillState::failed);
  EXPECT_EQ(map.failure_reason(), "chunk 1: sha256 mismatch after 3 attempts");

  auto unverified = map.wait_ready(100, 10, 10s);
  EXPECT_EQ(unverified.status, WaitStatus::failed);
  EXPECT_EQ(unverified.failure_reason, "chunk 1: sha256 mismatch after 3 attempts");
  EXPECT_EQ(map.wait_ready(0, 100, 10s).status, WaitStatus::ready)
      << "bytes verified before the failure stay readable";

  ASSERT_TRUE(map.resume_filling());
  EXPECT_EQ(map.state(), FillState::filling);
  EXPECT_EQ(map.generation(), 2u);
  EXPECT_EQ(map.failure_reason(), "");
  EXPECT_TRUE(map.chunk_verified(0)) << "resuming keeps verified chunks";
}

TEST(ChunkReadiness, LongFailureReasonsAreTruncated) {
  auto map = make_map(300, 100);
  ASSERT_TRUE(map.mark_failed(std::string(1000, 'x')));
  EXPECT_EQ(map.failure_reason(), std::string(255, 'x'));
}

TEST(ChunkReadiness, WaitTimesOutOnAnUnverifiedRangeAndRejectsRangesPastTheEnd) {
  auto map = make_map(300, 100);
  ASSERT_TRUE(map.mark_verified(0));
  ASSERT_TRUE(map.mark_verified(2));
  EXPECT_EQ(map.wait_ready(50, 200, 30ms).status, WaitStatus::timed_out);
  EXPECT_EQ(map.wait_ready(0, 0, 0ns).status, WaitStatus::ready);
  EXPECT_EQ(map.wait_ready(200, 101, 10s).status, WaitStatus::out_of_range);
  EXPECT_EQ(map.wait_ready(UINT64_MAX, 2, 10s).status, WaitStatus::out_of_range);
}

TEST(ChunkReadiness, ReaderSeesWriterChangesAndCannotWrite) {
  auto writer = make_map(300, 100);
  auto reader = reader_of(writer);
  EXPECT_FALSE(reader.writable());
  ASSERT_TRUE(writer.mark_verified(1));
  EXPECT_TRUE(reader.chunk_verified(1));
  EXPECT_TRUE(reader.is_ready(100, 100));
  auto denied = reader.mark_verified(0);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, CacheErrc::wrong_state);
  EXPECT_FALSE(reader.chunk_verified(0));
}

TEST(ChunkReadiness, ThreadWaitingOnAChunkWakesWhenItLands) {
  auto writer = make_map(1000, 100);
  auto reader = reader_of(writer);
  std::atomic<bool> waiting{false};
  WaitResult result;
  std::thread waiter([&] {
    waiting = true;
    result = reader.wait_ready(500, 100, ChunkReadiness::kForever);
  });
  while (!waiting) std::this_thread::yield();
  for (uint64_t c : {0, 1, 2, 3, 4, 6, 7, 8, 9}) ASSERT_TRUE(writer.mark_verified(c));
  EXPECT_FALSE(reader.is_ready(500, 100));
  ASSERT_TRUE(writer.mark_verified(5));
  waiter.join();
  EXPECT_EQ(result.status, WaitStatus::ready);
}

TEST(ChunkReadiness, ConcurrentWritersLeaveAnExactProgressWord) {
  constexpr uint64_t kChunks = 5000;
  auto map = make_map(kChunks * 64 - 7, 64);
  std::vector<uint64_t> order(kChunks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < order.size(); i += 4) {
        ASSERT_TRUE(map.mark_verified(order[i]));
        // Invariant seen by any reader at any time: the prefix is really verified.
        const uint64_t p = map.contiguous_bytes();
        if (p > 0) {
          ASSERT_TRUE(map.chunk_verified((p - 1) / 64));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(map.verified_chunks(), kChunks);
  EXPECT_EQ(map.contiguous_bytes(), map.file_size());
  ASSERT_TRUE(map.mark_complete());
}

}  // namespace
}  // namespace thaw::store
