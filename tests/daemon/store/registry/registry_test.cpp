// Registries against a real nginx (plain directory with autoindex JSON, the Hugging Face
// API shape served as static files with 302 redirects) and against a local directory.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>

#include "daemon/store/registry/hf_registry.hpp"
#include "daemon/store/registry/http_directory_registry.hpp"
#include "daemon/store/registry/http_get.hpp"
#include "daemon/store/registry/local_registry.hpp"
#include "daemon/store/registry/range_fetcher.hpp"
#include "nginx_server.hpp"
#include "test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::make_bytes;
using testing::NginxServer;
using testing::RecordingSink;
using testing::TempDir;
using testing::write_file;
using testing::write_text;

constexpr const char* kDigest = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

class HttpDirectoryRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = root_.path() / "models" / "tiny";
    write_text(model_ / "config.json", R"({"n_layer": 2})");
    write_file(model_ / "model.safetensors", make_bytes(1 << 20, 1));
    write_text(model_ / "sub" / "tokenizer.json", "{}");
    server_ = std::make_unique<NginxServer>(testing::NginxOptions{root_.path(), ""});
    registry_ =
        std::make_unique<HttpDirectoryRegistry>(server_->base_url() + "/models", RegistryOptions{});
  }

  TempDir root_;
  fs::path model_;
  std::unique_ptr<NginxServer> server_;
  std::unique_ptr<HttpDirectoryRegistry> registry_;
};

TEST_F(HttpDirectoryRegistryTest, ListsFromAutoindexRecursively) {
  auto listing = registry_->list("tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  EXPECT_FALSE(listing->manifest);
  ASSERT_EQ(listing->files.size(), 3u);
  EXPECT_EQ(listing->files[0].path, "config.json");
  EXPECT_EQ(listing->files[0].size, fs::file_size(model_ / "config.json"));
  EXPECT_EQ(listing->files[1].path, "model.safetensors");
  EXPECT_EQ(listing->files[1].size, 1u << 20);
  EXPECT_EQ(listing->files[2].path, "sub/tokenizer.json");
  EXPECT_EQ(listing->files[2].size, 2u);
}

TEST_F(HttpDirectoryRegistryTest, ManifestIsTheAuthority) {
  write_text(model_ / "thaw-manifest.json",
             fmt::format(R"({{"files": [{{"path": "model.safetensors", "size": {}, "sha256": "{}",
                             "publisher": "test"}}]}})",
                         1 << 20, kDigest));
  auto listing = registry_->list("tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  ASSERT_TRUE(listing->manifest);
  ASSERT_EQ(listing->files.size(), 1u);
  EXPECT_EQ(listing->files[0].sha256, kDigest);
  EXPECT_EQ(listing->manifest->files[0].extra.at("publisher"), "test");
}

TEST_F(HttpDirectoryRegistryTest, BrokenManifestIsReportedWithItsUrl) {
  write_text(model_ / "thaw-manifest.json",
             R"({"files": [{"path": "../../etc/passwd", "size": 1}]})");
  auto listing = registry_->list("tiny");
  ASSERT_FALSE(listing);
  EXPECT_EQ(listing.error().code, RegistryErrc::bad_listing);
  EXPECT_NE(listing.error().message.find("/models/tiny/thaw-manifest.json"), std::string::npos)
      << listing.error().message;
}

TEST_F(HttpDirectoryRegistryTest, UnknownModelIsNotFound) {
  auto listing = registry_->list("nope");
  ASSERT_FALSE(listing);
  EXPECT_EQ(listing.error().code, RegistryErrc::not_found);
  EXPECT_NE(listing.error().message.find(server_->base_url() + "/models/nope/"), std::string::npos)
      << listing.error().message;
}

TEST_F(HttpDirectoryRegistryTest, SourceUrlServesTheFile) {
  auto source = registry_->source("tiny", "sub/tokenizer.json");
  ASSERT_TRUE(source);
  EXPECT_EQ(source->kind, FileSource::Kind::http);
  EXPECT_EQ(source->location, server_->base_url() + "/models/tiny/sub/tokenizer.json");
  auto answer = http_request(source->location, RegistryOptions{}, false);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body, "{}");
  EXPECT_FALSE(registry_->source("tiny", "../secret"));
}

// The hub's API answer is a static file; resolve URLs redirect (302) to blob storage,
// like the hub's redirects to its CDN.
class HfRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    blobs_ = root_.path() / "blobs" / "org" / "tiny";
    weights_ = make_bytes(3u << 20, 7);
    write_file(blobs_ / "model.safetensors", weights_);
    write_text(blobs_ / "config.json", R"({"n_layer": 2})");
    write_text(blobs_ / "README.md", "# tiny\n");
    server_ = std::make_unique<NginxServer>(testing::NginxOptions{
        root_.path(),
        R"(location ~ ^/(?<repo>[^/]+/[^/]+)/resolve/(?<rev>[^/]+)/(?<file>.+)$ {
             return 302 /blobs/$repo/$file;
           })"});
    registry_ = std::make_unique<HfHubRegistry>(server_->base_url(), RegistryOptions{});
  }

  void write_model_info(const std::string& siblings) {
    write_text(root_.path() / "api" / "models" / "org" / "tiny" / "revision" / "main",
               fmt::format(R"({{"id": "org/tiny", "sha": "0123", "siblings": [{}]}})", siblings));
  }

  TempDir root_;
  fs::path blobs_;
  std::vector<std::byte> weights_;
  std::unique_ptr<NginxServer> server_;
  std::unique_ptr<HfHubRegistry> registry_;
};

TEST_F(HfRegistryTest, ListsSiblingsWithSizesFromBlobsAndHead) {
  // README.md has no size in the answer: the registry sizes it with a HEAD that follows
  // the 302.
  write_model_info(fmt::format(
      R"({{"rfilename": "config.json", "size": 14}},
         {{"rfilename": "model.safetensors", "lfs": {{"sha256": "{}", "size": {}}}}},
         {{"rfilename": "README.md"}})",
      kDigest, 3u << 20));
  auto listing = registry_->list("org/tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  ASSERT_EQ(listing->files.size(), 3u);
  EXPECT_EQ(listing->files[0].path, "README.md");
  EXPECT_EQ(listing->files[0].size, 7u);
  EXPECT_EQ(listing->files[1].path, "config.json");
  EXPECT_EQ(listing->files[1].size, 14u);
  EXPECT_EQ(listing->files[2].size, 3u << 20);
  EXPECT_EQ(listing->files[2].sha256, kDigest);
  EXPECT_EQ(registry_->model_info_url("org/tiny"),
            server_->base_url() + "/api/models/org/tiny/revision/main?blobs=true");
}

TEST_F(HfRegistryTest, ManifestAmongSiblingsIsTheAuthority) {
  write_text(
      blobs_ / "thaw-manifest.json",
      fmt::format(R"({{"files": [{{"path": "model.safetensors", "size": {}}}]}})", 3u << 20));
  write_model_info(R"({"rfilename": "thaw-manifest.json"}, {"rfilename": "model.safetensors"})");
  auto listing = registry_->list("org/tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  ASSERT_TRUE(listing->manifest);
  ASSERT_EQ(listing->files.size(), 1u);
  EXPECT_EQ(listing->files[0].size, 3u << 20);
}

TEST_F(HfRegistryTest, UnknownRepositoryIsNotFound) {
  auto listing = registry_->list("org/missing");
  ASSERT_FALSE(listing);
  EXPECT_EQ(listing.error().code, RegistryErrc::not_found);
  EXPECT_NE(listing.error().message.find("/api/models/org/missing/revision/main"),
            std::string::npos);
}

TEST_F(HfRegistryTest, FetcherFollowsResolveRedirects) {
  write_model_info(fmt::format(R"({{"rfilename": "model.safetensors", "size": {}}})", 3u << 20));
  auto listing = registry_->list("org/tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  auto source = registry_->source("org/tiny", "model.safetensors");
  ASSERT_TRUE(source);
  EXPECT_EQ(source->location, server_->base_url() + "/org/tiny/resolve/main/model.safetensors");

  RecordingSink sink;
  sink.expect_file(0, weights_.size());
  FetcherConfig config;
  config.connections_per_file = 3;
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({RangeRequest{
      0, *source, {0, weights_.size()}, FetchClass::critical, listing->files[0].size}}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_EQ(sink.contents(0), weights_);
  EXPECT_EQ(sink.bytes_written_twice(0), 0u);
  // Each part went through the redirect.
  int redirects = 0;
  for (const auto& line : server_->access_log()) {
    if (line.find("/resolve/main/model.safetensors") != std::string::npos &&
        line.find(" 302 ") != std::string::npos) {
      ++redirects;
    }
  }
  EXPECT_EQ(redirects, 3);
}

TEST(LocalRegistry, ListsRegularFilesAndSymlinksSkippingHiddenDirectories) {
  TempDir root;
  const fs::path model = root.path() / "org" / "tiny";
  write_file(root.path() / "blobs" / "weights", make_bytes(4096, 3));
  write_text(model / "config.json", "{}");
  write_text(model / ".cache" / "huggingface" / "download" / "x.lock", "");
  fs::create_directories(model / "shards");
  fs::create_symlink(root.path() / "blobs" / "weights", model / "shards" / "model.safetensors");
  LocalRegistry registry(root.path());
  auto listing = registry.list("org/tiny");
  ASSERT_TRUE(listing) << listing.error().message;
  ASSERT_EQ(listing->files.size(), 2u);
  EXPECT_EQ(listing->files[0].path, "config.json");
  EXPECT_EQ(listing->files[1].path, "shards/model.safetensors");
  EXPECT_EQ(listing->files[1].size, 4096u);
  auto source = registry.source("org/tiny", "shards/model.safetensors");
  ASSERT_TRUE(source);
  EXPECT_EQ(source->kind, FileSource::Kind::local);
  EXPECT_EQ(source->location, (model / "shards" / "model.safetensors").string());
}

TEST(LocalRegistry, ManifestSizesMustMatchTheFiles) {
  TempDir root;
  const fs::path model = root.path() / "m";
  write_text(model / "a.bin", "12345");
  write_text(model / "thaw-manifest.json", R"({"files": [{"path": "a.bin", "size": 6}]})");
  LocalRegistry registry(root.path());
  auto listing = registry.list("m");
  ASSERT_FALSE(listing);
  EXPECT_EQ(listing.error().code, RegistryErrc::bad_listing);
  EXPECT_NE(listing.error().message.find("a.bin"), std::string::npos);
  EXPECT_EQ(registry.list("absent").error().code, RegistryErrc::not_found);
}

TEST(OpenRegistry, PicksTheKindFromTheAddress) {
  auto hf = open_registry("hf+https://huggingface.co");
  ASSERT_TRUE(hf);
  EXPECT_NE((*hf)->describe().find("hugging face hub https://huggingface.co"), std::string::npos);
  auto http = open_registry("http://10.0.0.1/models");
  ASSERT_TRUE(http);
  EXPECT_NE((*http)->describe().find("http directory"), std::string::npos);
  auto local = open_registry("file:///var/lib/models");
  ASSERT_TRUE(local);
  EXPECT_NE((*local)->describe().find("/var/lib/models"), std::string::npos);
  EXPECT_EQ(open_registry("ftp://x").error().code, RegistryErrc::bad_spec);
  EXPECT_EQ(open_registry("file://relative").error().code, RegistryErrc::bad_spec);
}

}  // namespace
}  // namespace thaw::store
