// ChunkSet: rounding byte ranges out to whole chunks, and the runs requested from them.
#include <gtest/gtest.h>

#include "daemon/store/fetch/chunk_set.hpp"

namespace thaw::store {
namespace {

TEST(ChunkSetTest, RangesRoundOutToWholeChunks) {
  ChunkSet set(/*file_size=*/1000, /*chunk_size=*/100);
  EXPECT_EQ(set.chunk_count(), 10u);
  set.add_bytes(150, 151);  // one byte: its chunk
  set.add_bytes(299, 301);  // straddles chunks 2 and 3
  EXPECT_EQ(set.runs(), (std::vector<ChunkRun>{{1, 3}}));
  set.add_bytes(700, 700);   // empty: nothing
  set.add_bytes(900, 5000);  // clamped to the file
  EXPECT_EQ(set.runs(), (std::vector<ChunkRun>{{1, 3}, {9, 1}}));
  EXPECT_EQ(set.size(), 4u);
  EXPECT_EQ(set.bytes(), 400u);
}

TEST(ChunkSetTest, LastChunkIsShort) {
  ChunkSet set(1050, 100);
  EXPECT_EQ(set.chunk_count(), 11u);
  set.add_all();
  EXPECT_EQ(set.runs(), (std::vector<ChunkRun>{{0, 11}}));
  EXPECT_EQ(set.bytes(), 1050u);
  EXPECT_EQ(set.byte_range(ChunkRun{10, 1}), (ByteRange{1000, 50}));
  EXPECT_EQ(set.byte_range(ChunkRun{2, 3}), (ByteRange{200, 300}));
  set.remove(5);
  EXPECT_EQ(set.runs(), (std::vector<ChunkRun>{{0, 5}, {6, 5}}));
}

TEST(ChunkSetTest, HugeChunkSizeDoesNotOverflow) {
  ChunkSet set(1000, std::uint64_t{1} << 63);
  EXPECT_EQ(set.chunk_count(), 1u);
  set.add_bytes(10, 20);
  EXPECT_EQ(set.byte_range(set.runs().front()), (ByteRange{0, 1000}));
}

TEST(ChunkSetTest, EmptyFileHasNoChunks) {
  ChunkSet set(0, 100);
  EXPECT_EQ(set.chunk_count(), 0u);
  set.add_all();
  set.add_bytes(0, 10);
  EXPECT_TRUE(set.runs().empty());
}

}  // namespace
}  // namespace thaw::store
