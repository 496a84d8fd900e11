// Integrity: a registry serving a modified copy of a shard (its manifest made from the
// original). The bad chunk is caught by its digest, fetched once more, then the file and
// the fetch fail loudly; the chunk is never marked ready and a consumer waiting on it gets
// the failure, not the bytes. A chunk corrupted only once is repaired by the refetch. A
// file without chunk digests is caught by its whole-file sha256.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/safetensors/header.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/fetch/sha256.hpp"
#include "daemon/store/fetch/sha256_chain.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::kModelName;
using testing::kTestChunkBytes;
using testing::read_file;
using testing::RegistryFixture;

constexpr const char* kShard = "model-00004-of-00018.safetensors";

struct Corruption {
  std::string tensor;  // a tensor of kShard
  std::uint64_t tensor_begin = 0;
  std::uint64_t tensor_end = 0;
  std::uint64_t offset = 0;  // the flipped byte
  std::uint64_t chunk = 0;
  std::vector<std::byte> original;
};

// Flips one byte in the middle of kShard's third tensor, after the manifest was made.
Corruption corrupt_shard(const fs::path& model_dir) {
  auto header = safetensors::read_header(model_dir / kShard);
  EXPECT_TRUE(header);
  const safetensors::TensorInfo& tensor = header->tensors()[2];
  Corruption c;
  c.tensor = tensor.name;
  c.tensor_begin = tensor.begin;
  c.tensor_end = tensor.end;
  c.offset = tensor.begin + tensor.bytes() / 2;
  c.chunk = c.offset / kTestChunkBytes;
  c.original = read_file(model_dir / kShard);
  auto bytes = c.original;
  bytes[c.offset] ^= std::byte{0x5a};
  testing::write_file(model_dir / kShard, bytes);
  return c;
}

std::span<const std::byte> chunk_of(const std::vector<std::byte>& file, std::uint64_t chunk) {
  const std::uint64_t begin = chunk * kTestChunkBytes;
  const std::uint64_t end = std::min<std::uint64_t>(begin + kTestChunkBytes, file.size());
  return std::span(file).subspan(begin, end - begin);
}

// The digests a fetch compares for `chunk`: its plain sha256, or (chained manifests) the
// chaining state it leads to from the published state before it.
struct ChunkDigests {
  std::string expected, actual;
};
ChunkDigests digests(const fs::path& model_dir, const Corruption& bad, bool chained) {
  const auto now = read_file(model_dir / kShard);
  if (!chained)
    return {sha256_hex(chunk_of(bad.original, bad.chunk)), sha256_hex(chunk_of(now, bad.chunk))};
  Sha256ChainBuilder builder(kTestChunkBytes);
  builder.update(bad.original);
  auto published = builder.finish();
  const bool last = bad.chunk == published.chain.size();
  const std::string before = bad.chunk == 0 ? std::string() : published.chain[bad.chunk - 1];
  return {last ? published.sha256 : published.chain[bad.chunk],
          *sha256_chain_step(before, bad.chunk * kTestChunkBytes, chunk_of(now, bad.chunk), last)};
}

// Rewrites the registry's manifest with plain chunk digests only (no chaining states), as
// an older publisher would have made it.
PublishOptions test_chunks() {
  PublishOptions options;
  options.chunk_size = kTestChunkBytes;
  return options;
}

void drop_chain_from_manifest(const fs::path& model_dir) {
  PublishOptions options = test_chunks();
  options.chain = false;
  ASSERT_TRUE(publish_manifest(model_dir, options));
}

class IntegrityTest : public ::testing::TestWithParam<bool> {};  // param: chained manifest

INSTANTIATE_TEST_SUITE_P(Manifests, IntegrityTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "chained" : "chunk_digests"; });

TEST_P(IntegrityTest, CorruptChunkIsCaughtNeverReadyAndFailsTheFetchLoudly) {
  RegistryFixture fixture;
  if (!GetParam()) drop_chain_from_manifest(fixture.model_dir());
  const Corruption bad = corrupt_shard(fixture.model_dir());
  const auto [expected, actual] = digests(fixture.model_dir(), bad, GetParam());
  ASSERT_NE(expected, actual);

  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  std::mutex mutex;
  std::vector<ChunkMismatch> mismatches;
  std::optional<WaitResult> consumer_saw;
  std::thread consumer;
  ModelFetchOptions options;
  options.model = kModelName;
  options.on_chunk_mismatch = [&](const ChunkMismatch& m) {
    std::lock_guard lock(mutex);
    mismatches.push_back(m);
  };
  // A consumer, as another process would: the readiness map opened read-only by path,
  // waiting on the corrupted tensor from the moment the plan is known.
  options.on_plan = [&](const safetensors::FetchPlan&) {
    consumer = std::thread([&] {
      const fs::path map = cache_layout::readiness_path(fixture.cache_root(), kModelName, kShard);
      auto readiness = ChunkReadiness::open_reader(UniqueFd(::open(map.c_str(), O_RDONLY)), "r");
      ASSERT_TRUE(readiness) << readiness.error().message;
      WaitResult r =
          readiness->wait_ready(bad.tensor_begin, bad.tensor_end - bad.tensor_begin, 30s);
      std::lock_guard lock(mutex);
      consumer_saw = r;
    });
  };
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  consumer.join();

  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::integrity);
  const std::string& message = result.error().message;
  EXPECT_NE(message.find(kShard), std::string::npos) << message;
  EXPECT_NE(message.find("chunk " + std::to_string(bad.chunk)), std::string::npos) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << message;
  EXPECT_NE(message.find(actual), std::string::npos) << message;
  EXPECT_NE(message.find("again after a refetch"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);

  // Seen twice: the first time it was fetched again, the second time the file failed.
  ASSERT_EQ(mismatches.size(), 2u);
  EXPECT_TRUE(mismatches[0].refetching);
  EXPECT_FALSE(mismatches[1].refetching);
  for (const ChunkMismatch& m : mismatches) {
    EXPECT_EQ(m.path, kShard);
    EXPECT_EQ(m.chunk, bad.chunk);
    EXPECT_EQ(m.expected_sha256, expected);
    EXPECT_EQ(m.actual_sha256, actual);
  }

  auto file = cache.find_file(kModelName, kShard);
  ASSERT_TRUE(file);
  const ChunkReadiness& readiness = (*file)->readiness();
  EXPECT_FALSE(readiness.chunk_verified(bad.chunk));
  EXPECT_FALSE(readiness.is_ready(bad.tensor_begin, bad.tensor_end - bad.tensor_begin));
  EXPECT_EQ(readiness.state(), FillState::failed);
  EXPECT_NE(readiness.failure_reason().find("chunk " + std::to_string(bad.chunk)),
            std::string::npos)
      << readiness.failure_reason();
  ASSERT_TRUE(consumer_saw);
  EXPECT_EQ(consumer_saw->status, WaitStatus::failed);
  EXPECT_FALSE(consumer_saw->failure_reason.empty());
}

TEST_P(IntegrityTest, ChunkCorruptedOnceIsRepairedByItsRefetch) {
  RegistryFixture fixture;
  if (!GetParam()) drop_chain_from_manifest(fixture.model_dir());
  const Corruption bad = corrupt_shard(fixture.model_dir());
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  std::atomic<int> mismatches{0};
  ModelFetchOptions options;
  options.model = kModelName;
  // The registry's copy is fixed before the chunk is asked for again.
  options.on_chunk_mismatch = [&](const ChunkMismatch& m) {
    ++mismatches;
    if (m.refetching) testing::write_file(fixture.model_dir() / kShard, bad.original);
  };
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(mismatches.load(), 1);
  EXPECT_EQ(result->chunk_refetches, 1u);
  EXPECT_TRUE(read_file(fixture.cached_path(kShard)) == bad.original);
  auto file = cache.find_file(kModelName, kShard);
  ASSERT_TRUE(file);
  EXPECT_EQ((*file)->readiness().state(), FillState::complete);
  const auto& shard = result->files;
  auto it =
      std::find_if(shard.begin(), shard.end(), [](const auto& f) { return f.path == kShard; });
  ASSERT_NE(it, shard.end());
  EXPECT_TRUE(it->sha256_checked);
}

// Chained manifest whose chunk states are right but whose file sha256 is another file's:
// every chunk but the last passes, the last one fails, and so does the fetch.
TEST(IntegrityChainTest, AManifestLyingAboutTheFileSha256FailsTheLastChunk) {
  RegistryFixture fixture;
  auto manifest = make_manifest(fixture.model_dir(), test_chunks());
  ASSERT_TRUE(manifest);
  std::uint64_t chunks = 0;
  for (ManifestFile& f : manifest->files) {
    if (f.path != kShard) continue;
    ASSERT_FALSE(f.chunk_chain_sha256.empty());
    chunks = f.chunk_chain_sha256.size() + 1;
    f.sha256 = std::string(64, 'e');
  }
  std::ofstream(fixture.model_dir() / kManifestName) << manifest_to_json(*manifest).dump();
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options;
  options.model = kModelName;
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::integrity);
  EXPECT_NE(result.error().message.find("chunk " + std::to_string(chunks - 1)), std::string::npos)
      << result.error().message;
  auto file = cache.find_file(kModelName, kShard);
  ASSERT_TRUE(file);
  EXPECT_FALSE((*file)->readiness().chunk_verified(chunks - 1));
  EXPECT_TRUE((*file)->readiness().chunk_verified(0));
  EXPECT_NE((*file)->readiness().state(), FillState::complete);
}

TEST(IntegrityTest, WithoutChunkDigestsTheWholeFileDigestCatchesIt) {
  RegistryFixture fixture;
  // A manifest with whole-file digests only, made from the original files.
  auto manifest = make_manifest(fixture.model_dir());
  ASSERT_TRUE(manifest);
  for (ManifestFile& f : manifest->files) {
    f.chunk_size = 0;
    f.chunk_sha256.clear();
    f.chained = false;
    f.chunk_chain_sha256.clear();
  }
  std::ofstream(fixture.model_dir() / kManifestName) << manifest_to_json(*manifest).dump();
  corrupt_shard(fixture.model_dir());

  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options;
  options.model = kModelName;
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::integrity);
  EXPECT_NE(result.error().message.find(kShard), std::string::npos) << result.error().message;
  EXPECT_NE(result.error().message.find("sha256"), std::string::npos);
  auto file = cache.find_file(kModelName, kShard);
  ASSERT_TRUE(file);
  EXPECT_EQ((*file)->readiness().state(), FillState::failed);  // never sealed complete
}

}  // namespace
}  // namespace thaw::store
