// The registry module's pure pieces: range splitting, Content-Range parsing, retry
// classification and backoff, the token bucket, name checks and the JSON shapes it reads.
#include <gtest/gtest.h>

#include "daemon/store/registry/autoindex.hpp"
#include "daemon/store/registry/content_range.hpp"
#include "daemon/store/registry/hf_registry.hpp"
#include "daemon/store/registry/manifest.hpp"
#include "daemon/store/registry/range_split.hpp"
#include "daemon/store/registry/relative_path.hpp"
#include "daemon/store/registry/retry_policy.hpp"
#include "daemon/store/registry/token_bucket.hpp"

namespace thaw::store {
namespace {

using namespace std::chrono_literals;

void expect_exact_cover(ByteRange range, const std::vector<ByteRange>& parts) {
  ASSERT_FALSE(parts.empty());
  EXPECT_EQ(parts.front().offset, range.offset);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].offset, parts[i - 1].end()) << "gap or overlap before part " << i;
  }
  EXPECT_EQ(parts.back().end(), range.end());
  for (const auto& part : parts) EXPECT_GT(part.length, 0u);
}

TEST(RangeSplit, SmallRangeIsOnePart) {
  auto parts = split_range({100, 1000}, 32 << 20, 1 << 20, 8);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], (ByteRange{100, 1000}));
}

TEST(RangeSplit, MediumRangeSpreadsOverConnections) {
  ByteRange range{12345, 16u << 20};
  auto parts = split_range(range, 32u << 20, 1u << 20, 8);
  expect_exact_cover(range, parts);
  EXPECT_EQ(parts.size(), 8u);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) EXPECT_EQ(parts[i].length % (64u << 10), 0u);
}

TEST(RangeSplit, NoPartBelowTheMinimumWhenSpreading) {
  ByteRange range{0, 3u << 20};
  auto parts = split_range(range, 32u << 20, 1u << 20, 8);
  expect_exact_cover(range, parts);
  EXPECT_EQ(parts.size(), 3u);
}

TEST(RangeSplit, LargeRangeRespectsPartSize) {
  ByteRange range{7, (1ull << 30) + 3};
  auto parts = split_range(range, 32u << 20, 1u << 20, 4);
  expect_exact_cover(range, parts);
  for (const auto& part : parts) EXPECT_LE(part.length, 32u << 20);
  EXPECT_GE(parts.size(), 33u);
}

TEST(RangeSplit, EmptyRangeHasNoParts) {
  EXPECT_TRUE(split_range({5, 0}, 10, 1, 4).empty());
}

TEST(ContentRange, ParsesTheForms) {
  auto range = parse_content_range("bytes 100-199/1000");
  ASSERT_TRUE(range);
  EXPECT_EQ(range->first, 100u);
  EXPECT_EQ(range->last, 199u);
  EXPECT_EQ(range->total, 1000u);
  auto unknown_total = parse_content_range("bytes 0-0/*");
  ASSERT_TRUE(unknown_total);
  EXPECT_FALSE(unknown_total->total);
}

TEST(ContentRange, RejectsMalformed) {
  for (const char* bad : {"", "bytes", "bytes 5-4/10", "bytes 0-10/10", "items 0-1/2",
                          "bytes 0-1/2 junk", "bytes -1/2", "bytes 0-/2", "bytes */10"}) {
    EXPECT_FALSE(parse_content_range(bad)) << bad;
  }
}

TEST(RetryPolicy, StatusClasses) {
  EXPECT_FALSE(classify_http_status(503).permanent);
  EXPECT_FALSE(classify_http_status(500).permanent);
  EXPECT_FALSE(classify_http_status(429).permanent);
  EXPECT_FALSE(classify_http_status(408).permanent);
  auto not_found = classify_http_status(404);
  EXPECT_TRUE(not_found.permanent);
  EXPECT_EQ(not_found.code, FetchErrc::not_found);
  EXPECT_EQ(classify_http_status(403).code, FetchErrc::forbidden);
  EXPECT_EQ(classify_http_status(416).code, FetchErrc::range_not_satisfiable);
  EXPECT_TRUE(classify_http_status(400).permanent);
}

TEST(RetryPolicy, TransferFailureClasses) {
  EXPECT_FALSE(classify_transfer_failure(CURLE_RECV_ERROR, "Connection reset by peer").permanent);
  EXPECT_FALSE(classify_transfer_failure(CURLE_PARTIAL_FILE, nullptr).permanent);
  EXPECT_FALSE(classify_transfer_failure(CURLE_COULDNT_CONNECT, "").permanent);
  EXPECT_FALSE(classify_transfer_failure(CURLE_OPERATION_TIMEDOUT, "").permanent);
  EXPECT_TRUE(classify_transfer_failure(CURLE_URL_MALFORMAT, "").permanent);
  EXPECT_TRUE(classify_transfer_failure(CURLE_TOO_MANY_REDIRECTS, "").permanent);
  EXPECT_NE(classify_transfer_failure(CURLE_RECV_ERROR, "Connection reset by peer")
                .cause.find("Connection reset by peer"),
            std::string::npos);
}

TEST(RetryPolicy, BackoffDoublesWithinJitterAndCaps) {
  EXPECT_EQ(backoff_delay(1, 100ms, 5s, 1.0), 100ms);
  EXPECT_EQ(backoff_delay(1, 100ms, 5s, 0.0), 50ms);
  EXPECT_EQ(backoff_delay(3, 100ms, 5s, 1.0), 400ms);
  EXPECT_EQ(backoff_delay(30, 100ms, 5s, 1.0), 5s);
  EXPECT_EQ(backoff_delay(30, 100ms, 5s, 0.0), 2500ms);
}

TEST(TokenBucket, UnlimitedNeverPauses) {
  TokenBucket bucket;
  auto now = TokenBucket::Clock::now();
  EXPECT_TRUE(bucket.try_take(1ull << 40, now));
  EXPECT_EQ(bucket.time_until(1ull << 40, now), 0ns);
}

TEST(TokenBucket, DebtPausesUntilRefilled) {
  auto t0 = TokenBucket::Clock::now();
  TokenBucket bucket(1000, 500, t0);  // 1000 B/s, 500 B deep
  EXPECT_TRUE(bucket.try_take(400, t0));
  EXPECT_TRUE(bucket.try_take(400, t0));  // 100 tokens left: taken, now 300 in debt
  EXPECT_FALSE(bucket.try_take(1, t0));
  EXPECT_FALSE(bucket.has_tokens(t0 + 299ms));
  EXPECT_TRUE(bucket.has_tokens(t0 + 301ms));
  // Refill stops at the burst depth.
  EXPECT_GT(bucket.time_until(501, t0 + 100s), 0ns);
  EXPECT_EQ(bucket.time_until(500, t0 + 100s), 0ns);
}

TEST(RelativePath, AcceptsModelPaths) {
  for (const char* ok :
       {"model.safetensors", "org/name", "a/b/c.json", ".gitattributes", "dir/.hidden", "a..b"}) {
    EXPECT_TRUE(check_relative_path(ok, "test")) << ok;
  }
}

TEST(RelativePath, RejectsEscapes) {
  for (const char* bad :
       {"", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "a\\b", "a\nb", "."}) {
    auto result = check_relative_path(bad, "file name");
    ASSERT_FALSE(result) << bad;
    EXPECT_EQ(result.error().code, RegistryErrc::bad_spec);
    EXPECT_NE(result.error().message.find("file name"), std::string::npos);
  }
}

TEST(RelativePath, EscapesSegmentsForUrls) {
  EXPECT_EQ(url_escape_path("dir/a b#c.bin"), "dir/a%20b%23c.bin");
  EXPECT_EQ(join_url("http://h/base/", "/m/f"), "http://h/base/m/f");
}

constexpr const char* kDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(Manifest, ParsesKnownFieldsAndKeepsUnknownOnes) {
  std::string text = std::string(R"({"version": 1, "files": [
    {"path": "model.safetensors", "size": 10, "sha256": ")") +
                     "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef" +
                     R"(", "chunk_size": 4, "chunk_sha256": [")" + kDigest + R"(", ")" + kDigest +
                     R"(", ")" + kDigest + R"("], "dtype_hint": "bf16"},
    {"path": "config.json", "size": 0}]})";
  auto manifest = parse_manifest(text, "test-manifest");
  ASSERT_TRUE(manifest) << manifest.error().message;
  ASSERT_EQ(manifest->files.size(), 2u);
  const ManifestFile& model = manifest->files[0];
  EXPECT_EQ(model.path, "model.safetensors");
  EXPECT_EQ(model.size, 10u);
  EXPECT_EQ(model.sha256, kDigest);  // lowercased
  EXPECT_EQ(model.chunk_size, 4u);
  EXPECT_EQ(model.chunk_sha256.size(), 3u);
  EXPECT_EQ(model.extra.at("dtype_hint"), "bf16");
  EXPECT_EQ(manifest->extra.at("version"), 1);
  EXPECT_FALSE(manifest->files[1].sha256);
  ASSERT_NE(manifest->find("config.json"), nullptr);

  auto again = parse_manifest(manifest_to_json(*manifest).dump(), "round trip");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->files[0].extra.at("dtype_hint"), "bf16");
  EXPECT_EQ(again->files[0].chunk_sha256, model.chunk_sha256);
}

TEST(Manifest, ChainedStatesRoundTrip) {
  const std::string text = std::string(R"({"files": [{"path": "m", "size": 200, "sha256": ")") +
                           kDigest + R"(", "chunk_size": 64, "chunk_chain_sha256": [")" + kDigest +
                           R"(", ")" + kDigest + R"(", ")" + kDigest + R"("]}]})";
  auto manifest = parse_manifest(text, "chained");
  ASSERT_TRUE(manifest) << manifest.error().message;
  EXPECT_EQ(manifest->files[0].chunk_chain_sha256.size(), 3u);
  EXPECT_TRUE(manifest->files[0].extra.empty());
  auto again = parse_manifest(manifest_to_json(*manifest).dump(), "round trip");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->files[0].chunk_chain_sha256, manifest->files[0].chunk_chain_sha256);
}

TEST(Manifest, RejectsBrokenManifests) {
  const std::string digest = kDigest;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {R"({"nofiles": []})", "no \"files\""},
      {R"({"files": [{"size": 1}]})", "\"path\""},
      {R"({"files": [{"path": "../x", "size": 1}]})", "'..'"},
      {R"({"files": [{"path": "a", "size": -1}]})", "size"},
      {R"({"files": [{"path": "a", "size": 1, "sha256": "xyz"}]})", "64 hex"},
      {R"({"files": [{"path": "a", "size": 1}, {"path": "a", "size": 2}]})", "twice"},
      {R"({"files": [{"path": "a", "size": 9, "chunk_size": 4, "chunk_sha256": [")" + digest +
           R"("]}]})",
       "need 3"},
      {R"({"files": [{"path": "a", "size": 9, "chunk_sha256": [")" + digest + R"("]}]})",
       "without a chunk_size"},
      {R"({"files": [{"path": "a", "size": 200, "chunk_size": 64, "chunk_chain_sha256": [")" +
           digest + R"(", ")" + digest + R"(", ")" + digest + R"("]}]})",
       "without a \"sha256\""},
      {R"({"files": [{"path": "a", "size": 200, "sha256": ")" + digest +
           R"(", "chunk_size": 64, "chunk_chain_sha256": [")" + digest + R"("]}]})",
       "need 3"},
      {R"({"files": [{"path": "a", "size": 200, "sha256": ")" + digest +
           R"(", "chunk_size": 100, "chunk_chain_sha256": [")" + digest + R"("]}]})",
       "multiple of 64"},
      {R"({"files": [{"path": "a", "size": 200, "sha256": ")" + digest +
           R"(", "chunk_size": 64, "chunk_chain_sha256": ["x", "y", "z"]}]})",
       "chunk_chain_sha256[0]"},
  };
  for (const auto& [text, needle] : cases) {
    auto manifest = parse_manifest(text, "bad-manifest.json");
    ASSERT_FALSE(manifest) << text;
    EXPECT_EQ(manifest.error().code, RegistryErrc::bad_listing);
    EXPECT_NE(manifest.error().message.find(needle), std::string::npos) << manifest.error().message;
    EXPECT_NE(manifest.error().message.find("bad-manifest.json"), std::string::npos);
  }
}

TEST(Autoindex, ParsesNginxJson) {
  auto entries = parse_autoindex(R"([
    { "name":"sub", "type":"directory", "mtime":"Sun, 22 Nov 2026 07:58:29 GMT" },
    { "name":"a.bin", "type":"file", "mtime":"Sun, 22 Nov 2026 07:58:29 GMT", "size":1000 },
    { "name":"fifo", "type":"other", "mtime":"x" }
  ])",
                                 "http://h/m/");
  ASSERT_TRUE(entries) << entries.error().message;
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_TRUE((*entries)[0].directory);
  EXPECT_EQ((*entries)[1].name, "a.bin");
  EXPECT_EQ((*entries)[1].size, 1000u);
}

TEST(Autoindex, RejectsHtmlAndEscapingNames) {
  EXPECT_FALSE(parse_autoindex("<html>Index of /</html>", "u"));
  EXPECT_FALSE(parse_autoindex(R"([{"name":"..","type":"directory"}])", "u"));
  EXPECT_FALSE(parse_autoindex(R"([{"name":"a/b","type":"file","size":1}])", "u"));
}

TEST(HfSiblings, ReadsSizesAndLfsDigests) {
  auto siblings = parse_hf_siblings(std::string(R"({"id": "org/tiny", "siblings": [
      {"rfilename": "config.json", "size": 665, "blobId": "abc"},
      {"rfilename": "model.safetensors", "lfs": {"sha256": ")") +
                                        kDigest + R"(", "size": 4096, "pointerSize": 134}},
      {"rfilename": "README.md"}]})",
                                    "http://hub/api");
  ASSERT_TRUE(siblings) << siblings.error().message;
  ASSERT_EQ(siblings->size(), 3u);
  EXPECT_EQ((*siblings)[0].size, 665u);
  EXPECT_EQ((*siblings)[1].size, 4096u);
  EXPECT_EQ((*siblings)[1].sha256, kDigest);
  EXPECT_FALSE((*siblings)[2].size);
}

TEST(HfSiblings, RejectsEscapingNames) {
  auto siblings = parse_hf_siblings(R"({"siblings": [{"rfilename": "../../etc/passwd"}]})", "u");
  ASSERT_FALSE(siblings);
  EXPECT_EQ(siblings.error().code, RegistryErrc::bad_listing);
}

}  // namespace
}  // namespace thaw::store
