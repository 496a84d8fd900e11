// Publishing thaw-manifest.json: what registry/manifest.hpp parses, with digests that agree
// with coreutils' sha256sum (an independent implementation), chunk by chunk.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/sha256_chain.hpp"
#include "daemon/store/registry/manifest.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::make_bytes;
using testing::TempDir;
using testing::write_file;

// sha256sum's digest of a file.
std::string sha256sum(const fs::path& path) {
  std::string out;
  EXPECT_EQ(testing::run_program({"/usr/bin/sha256sum", path.string()}, &out), 0);
  return out.substr(0, 64);
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ManifestPublishTest, DigestsMatchSha256sumPerFileAndPerChunk) {
  TempDir dir;
  const auto big = make_bytes(300'000, 1);  // exactly 3 chunks of 100000
  write_file(dir.path() / "model.safetensors", big);
  write_file(dir.path() / "sub" / "tokenizer.json", make_bytes(1234, 2));
  write_file(dir.path() / "empty.txt", {});
  write_file(dir.path() / ".git" / "HEAD", make_bytes(10, 3));  // hidden directory: skipped

  PublishOptions options;
  options.chunk_size = 100'000;
  auto manifest = publish_manifest(dir.path(), options);
  ASSERT_TRUE(manifest) << manifest.error().message;

  auto parsed = parse_manifest(slurp(dir.path() / kManifestName), "test");
  ASSERT_TRUE(parsed) << parsed.error().message;
  ASSERT_EQ(parsed->files.size(), 3u);
  EXPECT_EQ(parsed->files[0].path, "empty.txt");
  EXPECT_EQ(parsed->files[1].path, "model.safetensors");
  EXPECT_EQ(parsed->files[2].path, "sub/tokenizer.json");

  const ManifestFile& model = parsed->files[1];
  EXPECT_EQ(model.size, big.size());
  EXPECT_EQ(model.chunk_size, 100'000u);
  EXPECT_EQ(*model.sha256, sha256sum(dir.path() / "model.safetensors"));
  ASSERT_EQ(model.chunk_sha256.size(), 3u);
  for (std::size_t c = 0; c < 3; ++c) {
    const fs::path piece = dir.path() / ("piece" + std::to_string(c));
    write_file(piece,
               std::vector<std::byte>(big.begin() + c * 100'000, big.begin() + (c + 1) * 100'000));
    EXPECT_EQ(model.chunk_sha256[c], sha256sum(piece)) << c;
    fs::remove(piece);
  }
  const ManifestFile& small = parsed->files[2];
  EXPECT_EQ(small.chunk_sha256.size(), 1u);
  EXPECT_EQ(small.chunk_sha256[0], *small.sha256);
  EXPECT_TRUE(parsed->files[0].chunk_sha256.empty());
  EXPECT_EQ(*parsed->files[0].sha256, sha256sum(dir.path() / "empty.txt"));

  // Publishing again leaves the manifest out of itself.
  auto again = publish_manifest(dir.path(), options);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->files.size(), 3u);
  EXPECT_FALSE(fs::exists(dir.path() / (std::string(kManifestName) + ".tmp")));
}

TEST(ManifestPublishTest, ShortLastChunk) {
  TempDir dir;
  write_file(dir.path() / "a.bin", make_bytes(250, 4));
  PublishOptions options;
  options.chunk_size = 100;
  auto manifest = make_manifest(dir.path(), options);
  ASSERT_TRUE(manifest);
  ASSERT_EQ(manifest->files.size(), 1u);
  EXPECT_EQ(manifest->files[0].chunk_sha256.size(), 3u);
}

TEST(ManifestPublishTest, ChainedStatesWhenTheChunkSizeIsAMultipleOf64) {
  TempDir dir;
  const auto bytes = make_bytes(3 * 6400 + 10, 5);
  write_file(dir.path() / "a.bin", bytes);
  PublishOptions options;
  options.chunk_size = 6400;
  auto manifest = make_manifest(dir.path(), options);
  ASSERT_TRUE(manifest);
  const ManifestFile& f = manifest->files[0];
  ASSERT_TRUE(f.chained);
  ASSERT_EQ(f.chunk_chain_sha256.size(), 3u);  // 4 chunks: a state after each but the last
  EXPECT_TRUE(f.chunk_sha256.empty());         // one digest per chunk, not two
  // Each published state, with the next chunk's bytes, leads to the next one; the last
  // chunk leads to the file's sha256.
  for (std::size_t c = 0; c < 4; ++c) {
    const auto piece = std::span(bytes).subspan(c * 6400, c == 3 ? 10 : 6400);
    auto state = sha256_chain_step(c == 0 ? std::string() : f.chunk_chain_sha256[c - 1], c * 6400,
                                   piece, c == 3);
    ASSERT_TRUE(state);
    EXPECT_EQ(*state, c == 3 ? *f.sha256 : f.chunk_chain_sha256[c]) << c;
  }
  options.chunk_size = 6401;  // not a multiple of 64: plain chunk digests only
  auto plain = make_manifest(dir.path(), options);
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->files[0].chained);
  EXPECT_EQ(plain->files[0].chunk_sha256.size(), 4u);
  options.chunk_size = 6400;
  options.chain = false;  // asked for plain digests
  auto unchained = make_manifest(dir.path(), options);
  ASSERT_TRUE(unchained);
  EXPECT_FALSE(unchained->files[0].chained);
  EXPECT_EQ(unchained->files[0].chunk_sha256.size(), 4u);
}

TEST(ManifestPublishTest, OneChunkFileIsChainedWithNoStates) {
  TempDir dir;
  write_file(dir.path() / "config.json", make_bytes(100, 9));
  PublishOptions options;
  options.chunk_size = 6400;
  auto manifest = make_manifest(dir.path(), options);
  ASSERT_TRUE(manifest);
  auto parsed = parse_manifest(manifest_to_json(*manifest).dump(), "round trip");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_TRUE(parsed->files[0].chained);
  EXPECT_TRUE(parsed->files[0].chunk_chain_sha256.empty());
}

TEST(ManifestPublishTest, BadInputsAreNamed) {
  TempDir dir;
  auto missing = make_manifest(dir.path() / "nope");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("nope"), std::string::npos);
  PublishOptions zero;
  zero.chunk_size = 0;
  EXPECT_FALSE(make_manifest(dir.path(), zero));
}

}  // namespace
}  // namespace thaw::store
