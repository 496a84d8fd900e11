// The KV-transfer body (tools/refengine/kv_transfer_format.*): round trip, every header field's
// check, truncation at every length, and random mutations (a bounded fuzz): a parse either
// fails with a message or returns a view whose sizes are exactly consistent with the body.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <string>

#include "kv_transfer_format.hpp"

namespace refengine {
namespace {

KvBlobHeader sample_header() {
  KvBlobHeader h;
  h.request_id = 42;
  h.layer_begin = 2;
  h.layer_end = 4;
  h.n_layer = 4;
  h.n_head = 2;
  h.head_dim = 3;
  h.block_size = 16;
  h.token_count = 17;  // two blocks, the second holding one position
  return h;
}

std::string sample_body(KvBlobHeader& h) {
  std::string body = encode_kv_header(h);
  for (std::uint64_t i = 0; i < h.payload_bytes; ++i) body.push_back(char(i * 7 + 1));
  return body;
}

template <class T>
void poke(std::string& s, std::size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}

TEST(KvTransferFormat, RoundTripsAndLaysOutKThenVPerLayer) {
  KvBlobHeader h = sample_header();
  const std::string body = sample_body(h);
  EXPECT_EQ(h.num_blocks, 2u);
  EXPECT_EQ(h.block_bytes(), 2u * 16 * 3 * 4);
  EXPECT_EQ(h.payload_bytes, 2u * 2 * 2 * h.block_bytes());
  auto v = parse_kv_blob(body, 1 << 20);
  ASSERT_TRUE(v) << v.error();
  EXPECT_EQ(v->header.request_id, 42u);
  EXPECT_EQ(v->header.layer_begin, 2u);
  EXPECT_EQ(v->header.layer_end, 4u);
  EXPECT_EQ(v->header.token_count, 17u);
  EXPECT_EQ(v->payload.size(), h.payload_bytes);
  EXPECT_EQ(v->payload.data(), body.data() + kKvHeaderBytes);
  // Layer 3's V, block 1 is the last block of the payload.
  EXPECT_EQ(h.offset(3, true, 1) + h.block_bytes(), h.payload_bytes);
  EXPECT_EQ(h.offset(2, false, 0), 0u);
  EXPECT_EQ(h.offset(2, true, 0), 2 * h.block_bytes());
}

TEST(KvTransferFormat, EachBadFieldIsRefusedWithItsName) {
  KvBlobHeader h = sample_header();
  const std::string good = sample_body(h);
  struct Case {
    std::size_t at;
    std::uint64_t value;
    int width;
    const char* says;
  };
  const Case cases[] = {
      {0, 0x12345678, 4, "magic"},   {4, 2, 2, "version 2"},
      {6, 80, 2, "header of 80"},    {16, 4, 4, "layers [4, 4)"},
      {20, 5, 4, "layers [2, 5)"},   {24, 0, 4, "n_layer 0"},
      {24, 5000, 4, "n_layer 5000"}, {28, 0, 4, "n_head 0"},
      {32, 1u << 20, 4, "head_dim"}, {36, 0, 4, "block_size 0"},
      {40, 2, 4, "dtype 2"},         {44, 0, 4, "token_count 0"},
      {44, 33, 4, "blocks for 33"},  {48, 3, 4, "3 blocks"},
      {52, 1, 4, "flags"},           {56, 1ull << 62, 8, "payload_bytes"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    if (c.width == 2) poke<std::uint16_t>(bad, c.at, std::uint16_t(c.value));
    if (c.width == 4) poke<std::uint32_t>(bad, c.at, std::uint32_t(c.value));
    if (c.width == 8) poke<std::uint64_t>(bad, c.at, c.value);
    auto v = parse_kv_blob(bad, 1 << 20);
    ASSERT_FALSE(v) << "offset " << c.at << " = " << c.value << " was accepted";
    EXPECT_NE(v.error().find(c.says), std::string::npos) << v.error();
  }
}

TEST(KvTransferFormat, TruncatedOrPaddedBodiesAndOverLimitPayloadsAreRefused) {
  KvBlobHeader h = sample_header();
  const std::string good = sample_body(h);
  for (std::size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(parse_kv_blob(std::string_view(good).substr(0, n), 1 << 20)) << n << " bytes";
  EXPECT_FALSE(parse_kv_blob(good + "x", 1 << 20));
  auto over = parse_kv_blob(good, h.payload_bytes - 1);
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().find("exceed the limit"), std::string::npos) << over.error();
  // A header claiming the largest shape the bounds allow is refused by size, before any
  // allocation: the parser never sizes anything from the header.
  KvBlobHeader huge;
  huge.layer_end = huge.n_layer = kKvMaxLayers;
  huge.n_head = kKvMaxHeads;
  huge.head_dim = kKvMaxHeadDim;
  huge.block_size = kKvMaxBlockSize;
  huge.token_count = kKvMaxTokens;
  std::string hb = encode_kv_header(huge);
  EXPECT_FALSE(parse_kv_blob(hb, std::uint64_t(1) << 30));
}

TEST(KvTransferFormat, RandomMutationsNeverYieldAnInconsistentView) {
  KvBlobHeader h = sample_header();
  const std::string good = sample_body(h);
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string m = good;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:  // a random byte, mostly in the header
          m[rng() % (rng() % 2 ? kKvHeaderBytes : m.size())] = char(rng());
          break;
        case 1:
          m.resize(rng() % (m.size() + 1));
          break;
        case 2:
          m.append(rng() % 64, char(rng()));
          break;
        default:  // a field set to a boundary value
          if (m.size() >= kKvHeaderBytes)
            poke<std::uint32_t>(m, 16 + 4 * (rng() % 10),
                                std::uint32_t(std::array<std::uint64_t, 5>{
                                    0, 1, 0xFFFFFFFF, 0x80000000, 4096}[rng() % 5]));
      }
    }
    auto v = parse_kv_blob(m, 1 << 20);
    if (!v) {
      EXPECT_FALSE(v.error().empty());
      continue;
    }
    ++accepted;
    const KvBlobHeader& p = v->header;
    ASSERT_EQ(m.size(), kKvHeaderBytes + p.payload_bytes);
    ASSERT_EQ(p.num_blocks, (p.token_count + p.block_size - 1) / p.block_size);
    ASSERT_EQ(p.payload_bytes,
              std::uint64_t(p.layer_end - p.layer_begin) * 2 * p.num_blocks * p.block_bytes());
    ASSERT_LT(p.layer_begin, p.layer_end);
    ASSERT_LE(p.layer_end, p.n_layer);
  }
  // Mutations of the payload bytes alone keep the body valid: some must be accepted.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace refengine
