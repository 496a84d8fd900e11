// Chained SHA-256: the states a publisher records let any chunk be checked on its own, and
// the last chunk's check is the whole file's sha256 — one pass for both.
#include "daemon/store/fetch/sha256_chain.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "daemon/store/fetch/sha256.hpp"

namespace thaw::store {
namespace {

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

struct Chained {
  std::vector<std::byte> data;
  std::uint64_t chunk = 0;
  Sha256ChainBuilder::Result published;
  std::uint64_t chunks() const { return (data.size() + chunk - 1) / chunk; }
  std::span<const std::byte> bytes(std::uint64_t c) const {
    const std::size_t begin = static_cast<std::size_t>(c * chunk);
    return std::span(data).subspan(begin, std::min<std::size_t>(chunk, data.size() - begin));
  }
  std::optional<std::string> step(std::uint64_t c, std::span<const std::byte> b) const {
    return sha256_chain_step(c == 0 ? std::string() : published.chain[c - 1], c * chunk, b,
                             c + 1 == chunks());
  }
  std::string expected(std::uint64_t c) const {
    return c + 1 == chunks() ? published.sha256 : published.chain[c];
  }
};

// Fed in uneven pieces, as a file read in buffers that do not line up with chunks.
Chained publish(std::size_t size, std::uint64_t chunk, unsigned seed) {
  Chained c;
  c.data = random_bytes(size, seed);
  c.chunk = chunk;
  Sha256ChainBuilder builder(chunk);
  std::size_t at = 0, piece = 1;
  while (at < size) {
    const std::size_t n = std::min(piece, size - at);
    builder.update(std::span(c.data).subspan(at, n));
    at += n;
    piece = piece * 3 + 7;
  }
  c.published = builder.finish();
  return c;
}

TEST(Sha256Chain, BuilderGivesTheFileSha256AndOneStatePerChunkButTheLast) {
  for (std::size_t size : {0ul, 1ul, 4095ul, 4096ul, 4097ul, 3 * 4096ul, 3 * 4096ul + 100}) {
    const Chained c = publish(size, 4096, static_cast<unsigned>(size));
    EXPECT_EQ(c.published.sha256, sha256_hex(c.data)) << size;
    const std::size_t chunks = (size + 4095) / 4096;
    EXPECT_EQ(c.published.chain.size(), chunks == 0 ? 0 : chunks - 1) << size;
  }
}

TEST(Sha256Chain, EveryChunkChecksOnItsOwnInAnyOrder) {
  const Chained c = publish(5 * 4096 + 1000, 4096, 7);
  ASSERT_EQ(c.chunks(), 6u);
  for (std::uint64_t c_ = c.chunks(); c_-- > 0;) {  // last first
    auto actual = c.step(c_, c.bytes(c_));
    ASSERT_TRUE(actual);
    EXPECT_EQ(*actual, c.expected(c_)) << "chunk " << c_;
  }
}

TEST(Sha256Chain, AFlippedByteFailsItsChunkOnly) {
  const Chained c = publish(4 * 4096 + 64, 4096, 11);
  for (std::uint64_t bad = 0; bad < c.chunks(); ++bad) {
    std::vector<std::byte> copy(c.bytes(bad).begin(), c.bytes(bad).end());
    copy[copy.size() / 2] ^= std::byte{0x01};
    EXPECT_NE(*c.step(bad, copy), c.expected(bad)) << "chunk " << bad;
    for (std::uint64_t other = 0; other < c.chunks(); ++other) {
      if (other != bad) EXPECT_EQ(*c.step(other, c.bytes(other)), c.expected(other));
    }
  }
}

TEST(Sha256Chain, ALyingFileDigestFailsTheLastChunk) {
  Chained c = publish(3 * 4096, 4096, 13);
  c.published.sha256 = sha256_hex(random_bytes(10, 1));
  EXPECT_EQ(*c.step(0, c.bytes(0)), c.expected(0));
  EXPECT_NE(*c.step(2, c.bytes(2)), c.expected(2));
}

TEST(Sha256Chain, ChunkAtTheWrongOffsetFails) {
  const Chained c = publish(3 * 4096, 4096, 17);
  // Right bytes and state, wrong length accounting: only matters for the last chunk.
  EXPECT_NE(*sha256_chain_step(c.published.chain[1], 4096, c.bytes(2), true), c.published.sha256);
}

TEST(Sha256Chain, MalformedStateIsRefused) {
  const auto bytes = random_bytes(64, 3);
  EXPECT_FALSE(sha256_chain_step("abc", 64, bytes, false));
  EXPECT_FALSE(sha256_chain_step(std::string(64, 'g'), 64, bytes, false));
  EXPECT_TRUE(sha256_chain_step(std::string(64, 'A'), 64, bytes, false));
}

}  // namespace
}  // namespace thaw::store
