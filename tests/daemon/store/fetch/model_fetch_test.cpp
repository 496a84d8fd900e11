// ModelFetch against a real nginx: a whole sharded model, byte for byte; the fetch order
// (small files, then headers, then tensors); a model without a manifest; a second fetch
// that finds everything cached; and the errors a caller must be able to act on.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/safetensors/index.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::kModelName;
using testing::read_file;
using testing::RegistryFixture;

ModelFetchOptions full_options() {
  ModelFetchOptions options;
  options.model = kModelName;
  options.fetcher = RegistryFixture::fast_retry_config();
  return options;
}

std::uint64_t total_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  for (const std::string& name : testing::model_files(dir)) total += fs::file_size(dir / name);
  return total;
}

TEST(ModelFetchTest, FullFetchIsByteIdenticalVerifiedAndComplete) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetch fetch(*registry, cache, full_options());
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;

  const auto files = testing::model_files(fixture.model_dir());
  ASSERT_EQ(files.size(), 20u);  // config, index, 18 shards
  EXPECT_EQ(result->files.size(), files.size());
  EXPECT_EQ(result->cache_key, kModelName);
  EXPECT_EQ(result->bytes_fetched, total_bytes(fixture.model_dir()));
  EXPECT_EQ(result->bytes_cached, 0u);
  EXPECT_EQ(result->chunk_refetches, 0u);
  for (const std::string& name : files) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name));
    auto file = cache.find_file(kModelName, name);
    ASSERT_TRUE(file);
    EXPECT_EQ((*file)->readiness().state(), FillState::complete);
    EXPECT_EQ((*file)->chunk_size(), testing::kTestChunkBytes);  // the manifest's
  }
  for (const FetchedFile& f : result->files) {
    EXPECT_TRUE(f.sha256_checked) << f.path;
    EXPECT_EQ(f.chunks_ready, f.chunk_count) << f.path;
    EXPECT_EQ(f.bytes_fetched, f.size) << f.path;
  }
  // config.json leads the plan, then the other small files, then the shards in order.
  EXPECT_EQ(result->files.front().path, "config.json");
  EXPECT_EQ(result->files[1].path, "model.safetensors.index.json");
  ASSERT_TRUE(result->time_to_first_tensor_s);
  ASSERT_TRUE(result->time_to_plan_s);
  EXPECT_LE(*result->time_to_plan_s, *result->time_to_first_tensor_s);
  EXPECT_LE(*result->time_to_first_tensor_s, result->seconds);

  const ModelFetchProgress progress = fetch.progress();
  EXPECT_EQ(progress.phase, FetchPhase::done);
  EXPECT_EQ(progress.files_done, progress.files_total);
  EXPECT_EQ(progress.files_total, files.size());
  EXPECT_EQ(progress.bytes_done, progress.bytes_total);
  EXPECT_EQ(progress.bytes_verified, result->bytes_fetched);
}

// The access log is written as each request ends, and the steps wait for each other: every
// small file is served before any shard byte, and every shard's first chunk (its header)
// before any other shard range.
TEST(ModelFetchTest, SmallFilesThenHeadersThenTensors) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetch fetch(*registry, cache, full_options());
  ASSERT_TRUE(fetch.run());

  std::vector<std::string> shard_lines;
  std::size_t small_after_shard = 0;
  for (const std::string& line : fixture.server().access_log()) {
    if (line.find(".safetensors ") != std::string::npos) {
      shard_lines.push_back(line);
    } else if (line.find(".json ") != std::string::npos && !shard_lines.empty()) {
      ++small_after_shard;
    }
  }
  EXPECT_EQ(small_after_shard, 0u);
  ASSERT_GT(shard_lines.size(), 18u);
  const std::string first_chunk = fmt::format("\"bytes=0-{}\"", testing::kTestChunkBytes - 1);
  std::set<std::string> headers_seen;
  for (std::size_t i = 0; i < 18; ++i) {
    EXPECT_NE(shard_lines[i].find(first_chunk), std::string::npos) << shard_lines[i];
    headers_seen.insert(shard_lines[i].substr(0, shard_lines[i].find(' ', 4)));
  }
  EXPECT_EQ(headers_seen.size(), 18u);
  for (std::size_t i = 18; i < shard_lines.size(); ++i) {
    EXPECT_EQ(shard_lines[i].find(first_chunk), std::string::npos) << shard_lines[i];
  }
}

TEST(ModelFetchTest, WithoutManifestUsesTheListingAndDefaultChunks) {
  RegistryFixture fixture;
  fs::remove(fixture.model_dir() / kManifestName);
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options = full_options();
  options.default_chunk_size = 256 << 10;
  options.allow_unverified = true;  // no manifest: nothing to check the bytes against
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name))
        << name;
  }
  for (const FetchedFile& f : result->files) {
    EXPECT_EQ(f.chunk_size, 256u << 10) << f.path;
    EXPECT_FALSE(f.sha256_checked) << f.path;  // nginx gives no digests
    EXPECT_EQ(f.state, FillState::complete) << f.path;
  }
}

// A local directory as registry: bytes are copied with copy_file_range straight into the
// cache files (FetchSink::destination_fd), and still verified chunk by chunk.
TEST(ModelFetchTest, LocalRegistryCopiesInPlaceAndVerifies) {
  RegistryFixture fixture;
  auto registry = open_registry(fixture.registry_root().string());
  ASSERT_TRUE(registry) << registry.error().message;
  HostCache cache = fixture.open_cache();
  ModelFetch fetch(**registry, cache, full_options());
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->bytes_fetched, total_bytes(fixture.model_dir()));
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name))
        << name;
  }
  for (const FetchedFile& f : result->files) {
    EXPECT_EQ(f.state, FillState::complete) << f.path;
    EXPECT_TRUE(f.sha256_checked) << f.path;
  }
}

TEST(ModelFetchTest, SecondFetchFindsEverythingCached) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  std::uint64_t total = 0;
  {
    HostCache cache = fixture.open_cache();
    ModelFetch fetch(*registry, cache, full_options());
    auto first = fetch.run();
    ASSERT_TRUE(first) << first.error().message;
    total = first->bytes_fetched;
  }
  const std::size_t requests_before = fixture.server().access_log().size();
  HostCache cache = fixture.open_cache();  // re-indexes the root
  ModelFetch fetch(*registry, cache, full_options());
  auto second = fetch.run();
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(second->bytes_fetched, 0u);
  EXPECT_EQ(second->bytes_cached, total);
  // Only the manifest was asked for again.
  EXPECT_EQ(fixture.server().access_log().size(), requests_before + 1);
}

TEST(ModelFetchTest, BudgetTooSmallIsCacheFull) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache(/*budget=*/3 << 20);
  ModelFetch fetch(*registry, cache, full_options());
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::cache_full) << result.error().message;
  EXPECT_NE(result.error().message.find("budget"), std::string::npos) << result.error().message;
}

// Runs `body` in a child with a private mount namespace and an 8 MB tmpfs; the child's
// one-line report ("SKIP: ..." when the tmpfs cannot be mounted here).
std::string on_tiny_tmpfs(const std::function<std::string(const fs::path&)>& body) {
  testing::TempDir mount_point;
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::string report;
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", mount_point.path().c_str(), "tmpfs", 0, "size=8m") != 0) {
      report = std::string("SKIP: cannot mount a tmpfs: ") + std::strerror(errno);
    } else {
      report = body(mount_point.path() / "cache");
    }
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buffer[1024];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) {
    report.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(pipe_fds[0]);
  ::waitpid(pid, nullptr, 0);
  return report;
}

TEST(ModelFetchTest, FullCacheDiskIsCacheFullAndNothingLooksComplete) {
  RegistryFixture fixture;
  const std::string report = on_tiny_tmpfs([&](const fs::path& root) -> std::string {
    auto registry = fixture.registry();
    // A budget far beyond the filesystem: the disk, not the budget, runs out.
    HostCache cache = fixture.open_cache_at(root, std::uint64_t{1} << 40);
    ModelFetch fetch(*registry, cache, full_options());
    auto result = fetch.run();
    if (result) return "the fetch succeeded on an 8 MB disk";
    for (const CachedModelInfo& model : cache.models()) {
      for (const CachedFileInfo& file : model.files) {
        if (file.state == FillState::complete && file.verified_chunks != file.chunk_count) {
          return "complete but unverified: " + file.relative_path;
        }
      }
    }
    return fmt::format("{}|{}", to_string(result.error().code), result.error().message);
  });
  if (report.starts_with("SKIP")) GTEST_SKIP() << report;
  EXPECT_TRUE(report.starts_with("cache_full|")) << report;
  EXPECT_NE(report.find("space"), std::string::npos) << report;
}

TEST(ModelFetchTest, UnknownModelIsARegistryError) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options = full_options();
  options.model = "no-such-model";
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::registry);
  EXPECT_NE(result.error().message.find("no-such-model"), std::string::npos);
  EXPECT_EQ(result.error().message.find('\n'), std::string::npos);
}

TEST(ModelFetchTest, StageBeyondTheLayersIsInvalid) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options = full_options();
  options.stage = StageSpec{3, 16};  // 8 layers cannot make 16 stages
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::invalid_argument) << result.error().message;
  EXPECT_NE(result.error().message.find("16"), std::string::npos);
}

TEST(ModelFetchTest, ShardMissingFromTheRegistryIsNamed) {
  RegistryFixture fixture;
  fs::remove(fixture.model_dir() / kManifestName);
  fs::remove(fixture.model_dir() / "model-00007-of-00018.safetensors");
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options = full_options();
  options.allow_unverified = true;  // the manifest is gone: this is about the listing
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::registry);
  EXPECT_NE(result.error().message.find("model-00007-of-00018.safetensors"), std::string::npos)
      << result.error().message;
}

TEST(ModelFetchTest, MalformedHeaderIsAModelError) {
  RegistryFixture fixture;
  fs::remove(fixture.model_dir() / kManifestName);
  // A header length far past the file's end.
  const fs::path shard = fixture.model_dir() / "model-00003-of-00018.safetensors";
  auto bytes = read_file(shard);
  bytes[5] = std::byte{0x7f};
  testing::write_file(shard, bytes);
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options = full_options();
  options.allow_unverified = true;  // the manifest is gone: this is about the listing
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::model);
  EXPECT_NE(result.error().message.find("gpt-syn/model-00003-of-00018.safetensors"),
            std::string::npos)
      << result.error().message;
}

TEST(ModelFetchTest, CacheKeysAndStageSpecs) {
  EXPECT_EQ(*cache_key_for("org/name"), "org--name");
  EXPECT_EQ(cache_key_for("bad key").error().code, ModelFetchErrc::invalid_argument);
  auto stage = parse_stage("2/4");
  ASSERT_TRUE(stage);
  EXPECT_EQ(stage->stage, 2);
  EXPECT_EQ(stage->num_stages, 4);
  for (const char* bad : {"4/4", "-1/4", "1", "a/b", "1/0", "1/4x", ""}) {
    EXPECT_FALSE(parse_stage(bad)) << bad;
  }
}

}  // namespace
}  // namespace thaw::store
