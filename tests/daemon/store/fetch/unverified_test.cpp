// A model published without thaw-manifest.json has nothing to check its bytes against: the
// fetch refuses it before any byte moves and says how to publish it or accept it; accepted
// (allow_unverified), it is fetched and marked unverified in the cache, across a restart,
// until a fetch that checked every byte replaces it.
#include <gtest/gtest.h>

#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::kModelName;
using testing::kTestChunkBytes;
using testing::RegistryFixture;

std::expected<ModelFetchResult, ModelFetchError> fetch_from(Registry& registry, HostCache& cache,
                                                            bool allow_unverified) {
  ModelFetchOptions options;
  options.model = kModelName;
  options.allow_unverified = allow_unverified;
  ModelFetch fetch(registry, cache, options);
  return fetch.run();
}

bool unverified_in(const HostCache& cache) {
  for (const CachedModelInfo& m : cache.models()) {
    if (m.key == kModelName) return m.unverified;
  }
  ADD_FAILURE() << kModelName << " is not cached";
  return false;
}

class UnverifiedModel : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::remove(fixture_.model_dir() / kManifestName);
    auto registry = open_registry(fixture_.registry_root().string());  // a local directory
    ASSERT_TRUE(registry) << registry.error().message;
    registry_ = std::move(*registry);
  }

  RegistryFixture fixture_;
  std::unique_ptr<Registry> registry_;
};

TEST_F(UnverifiedModel, IsRefusedBeforeAnyByteMovesSayingWhatToDo) {
  HostCache cache = fixture_.open_cache();
  auto result = fetch_from(*registry_, cache, false);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ModelFetchErrc::unverified);
  const std::string& message = result.error().message;
  EXPECT_NE(message.find("cannot be verified"), std::string::npos) << message;
  EXPECT_NE(message.find("config.json"), std::string::npos) << message;
  EXPECT_NE(message.find("thaw-fetch publish"), std::string::npos) << message;
  EXPECT_NE(message.find("store.allow_unverified = true"), std::string::npos) << message;
  for (const CachedModelInfo& m : cache.models()) EXPECT_TRUE(m.files.empty()) << m.key;
}

TEST_F(UnverifiedModel, AcceptedItIsMarkedUntilAFetchChecksEveryByte) {
  {
    HostCache cache = fixture_.open_cache();
    auto result = fetch_from(*registry_, cache, true);
    ASSERT_TRUE(result) << result.error().message;
    EXPECT_EQ(result->unverified_files.size(), testing::model_files(fixture_.model_dir()).size());
    EXPECT_TRUE(unverified_in(cache));
  }
  // The mark is on disk: a restarted cache still knows.
  HostCache cache = fixture_.open_cache();
  EXPECT_TRUE(unverified_in(cache));

  // Published now (in the chunks it was cached in), but the cached bytes were never
  // checked: still unverified.
  PublishOptions publish;
  publish.chunk_size = kDefaultChunkBytes;
  ASSERT_TRUE(publish_manifest(fixture_.model_dir(), publish));
  auto again = fetch_from(*registry_, cache, false);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->unverified_files.empty());
  EXPECT_TRUE(unverified_in(cache));

  // Fetched afresh against the manifest: every byte checked, the mark goes.
  ASSERT_TRUE(cache.remove_model(kModelName));
  auto fresh = fetch_from(*registry_, cache, false);
  ASSERT_TRUE(fresh) << fresh.error().message;
  EXPECT_FALSE(unverified_in(cache));
}

TEST_F(UnverifiedModel, AVerifiedModelIsNeverMarked) {
  PublishOptions publish;
  publish.chunk_size = kTestChunkBytes;
  ASSERT_TRUE(publish_manifest(fixture_.model_dir(), publish));
  HostCache cache = fixture_.open_cache();
  auto result = fetch_from(*registry_, cache, false);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->unverified_files.empty());
  EXPECT_FALSE(unverified_in(cache));
}

}  // namespace
}  // namespace thaw::store
