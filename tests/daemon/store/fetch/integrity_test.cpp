// Integrity: a registry serving a modified copy of a shard (its manifest made from the
// original). The bad chunk is caught by its digest, fetched once more, then the file and
// the fetch fail loudly; the chunk is never marked ready and a consumer waiting on it gets
// the failure, not the bytes. A chunk corrupted only once is repaired by the refetch. A
// file without chunk digests is caught by its whole-file sha256.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/safetensors/header.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/fetch/sha256.hpp"
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

std::string chunk_sha256(const std::vector<std::byte>& file, std::uint64_t chunk) {
  const std::uint64_t begin = chunk * kTestChunkBytes;
  const std::uint64_t end = std::min<std::uint64_t>(begin + kTestChunkBytes, file.size());
  return sha256_hex(std::span(file).subspan(begin, end - begin));
}

TEST(IntegrityTest, CorruptChunkIsCaughtNeverReadyAndFailsTheFetchLoudly) {
  RegistryFixture fixture;
  const Corruption bad = corrupt_shard(fixture.model_dir());
  const std::string expected = chunk_sha256(bad.original, bad.chunk);
  const std::string actual = chunk_sha256(read_file(fixture.model_dir() / kShard), bad.chunk);

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

TEST(IntegrityTest, ChunkCorruptedOnceIsRepairedByItsRefetch) {
  RegistryFixture fixture;
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
}

TEST(IntegrityTest, WithoutChunkDigestsTheWholeFileDigestCatchesIt) {
  RegistryFixture fixture;
  // A manifest with whole-file digests only, made from the original files.
  auto manifest = make_manifest(fixture.model_dir());
  ASSERT_TRUE(manifest);
  for (ManifestFile& f : manifest->files) {
    f.chunk_size = 0;
    f.chunk_sha256.clear();
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
