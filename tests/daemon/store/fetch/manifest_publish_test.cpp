// Publishing thaw-manifest.json: what registry/manifest.hpp parses, with digests that agree
// with coreutils' sha256sum (an independent implementation), chunk by chunk.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/sha256_chain.hpp"
#include "daemon/store/registry/manifest.hpp"
#include "fetch_test_support.hpp"
#include "tests/common/safetensors/builder.hpp"

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
  // Not safetensors (a publish would refuse random bytes under that name): the digests are
  // what this test is about.
  const auto big = make_bytes(300'000, 1);  // exactly 3 chunks of 100000
  write_file(dir.path() / "weights.bin", big);
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
  EXPECT_EQ(parsed->files[1].path, "sub/tokenizer.json");
  EXPECT_EQ(parsed->files[2].path, "weights.bin");

  const ManifestFile& model = parsed->files[2];
  EXPECT_EQ(model.size, big.size());
  EXPECT_EQ(model.chunk_size, 100'000u);
  EXPECT_EQ(*model.sha256, sha256sum(dir.path() / "weights.bin"));
  ASSERT_EQ(model.chunk_sha256.size(), 3u);
  for (std::size_t c = 0; c < 3; ++c) {
    const fs::path piece = dir.path() / ("piece" + std::to_string(c));
    write_file(piece,
               std::vector<std::byte>(big.begin() + c * 100'000, big.begin() + (c + 1) * 100'000));
    EXPECT_EQ(model.chunk_sha256[c], sha256sum(piece)) << c;
    fs::remove(piece);
  }
  const ManifestFile& small = parsed->files[1];
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

// Each kind of safetensors damage the fetch side refuses, refused by publish too, naming the
// file and the rule, with no manifest left behind.
TEST(ManifestPublishTest, MalformedSafetensorsAreRefusedWithNoManifestWritten) {
  using safetensors::testing::file_with_header;
  using safetensors::testing::FileBuilder;
  using safetensors::testing::le64;
  auto good = [] { return FileBuilder().tensor("a", "F32", {2, 2}).tensor("b", "F16", {4}); };
  struct Case {
    std::string name;
    std::string bytes;
    std::string rule;  // errc_name of the parser's verdict
  };
  const std::vector<Case> cases = {
      {"overlapping offsets",
       FileBuilder().tensor_at("a", "F32", {2}, 0, 8).tensor_at("b", "F32", {2}, 4, 12).build(),
       "offsets_overlap"},
      {"offsets past the end",
       FileBuilder().tensor_at("a", "F32", {4}, 0, 16).data_bytes(8).build(), "out_of_bounds"},
      {"reversed offsets", FileBuilder().tensor_at("a", "F32", {0}, 8, 0).data_bytes(8).build(),
       "offsets_reversed"},
      {"a gap between tensors",
       FileBuilder().tensor_at("a", "F32", {1}, 0, 4).tensor_at("b", "F32", {1}, 8, 12).build(),
       "offsets_gap"},
      {"bytes after the last tensor", good().data_bytes(64).build(), "trailing_bytes"},
      {"unknown dtype", FileBuilder().tensor("a", "F33", {2}).build(), "unknown_dtype"},
      {"shape that does not match the offsets",
       FileBuilder().tensor_at("a", "F32", {3}, 0, 8).build(), "size_mismatch"},
      {"header that is not JSON", file_with_header("{\"a\": nope}   ", 0), "invalid_json"},
      {"header length past the end", le64(1000) + "{}", "truncated"},
      {"fewer than 8 bytes", std::string("\x10\x00", 2), "truncated"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    std::ofstream(dir.path() / "config.json") << "{}";
    std::ofstream(dir.path() / "model.safetensors", std::ios::binary) << c.bytes;
    auto published = publish_manifest(dir.path());
    ASSERT_FALSE(published) << c.name << ": published";
    const std::string& message = published.error().message;
    EXPECT_NE(message.find("model.safetensors"), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find(c.rule), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find("no manifest was written"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(dir.path() / kManifestName)) << c.name;
  }
  // The same model, well formed, publishes.
  TempDir dir;
  std::ofstream(dir.path() / "config.json") << "{}";
  std::ofstream(dir.path() / "model.safetensors", std::ios::binary) << good().build();
  auto published = publish_manifest(dir.path());
  EXPECT_TRUE(published) << published.error().message;
}

TEST(ManifestPublishTest, ShardsThatDisagreeWithTheirIndexAreRefused) {
  using safetensors::testing::FileBuilder;
  TempDir dir;
  std::ofstream(dir.path() / "model-00001-of-00002.safetensors", std::ios::binary)
      << FileBuilder().tensor("a", "F32", {2}).build();
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
      << R"("b":"model-00002-of-00002.safetensors"}})";
  auto missing_shard = publish_manifest(dir.path());
  ASSERT_FALSE(missing_shard);
  EXPECT_NE(missing_shard.error().message.find("index_missing_shard"), std::string::npos)
      << missing_shard.error().message;
  // A shard in a subdirectory, not named by any index, is still checked on its own.
  TempDir other;
  fs::create_directories(other.path() / "onnx");
  std::ofstream(other.path() / "onnx" / "extra.safetensors", std::ios::binary) << "garbage!";
  auto stray = publish_manifest(other.path());
  ASSERT_FALSE(stray);
  EXPECT_NE(stray.error().message.find("onnx/extra.safetensors"), std::string::npos)
      << stray.error().message;
}

}  // namespace
}  // namespace thaw::store
