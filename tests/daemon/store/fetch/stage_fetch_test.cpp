// Pipeline-stage fetches: four stages together cover every tensor exactly once (the token
// embedding excepted: GPT-2 ties its LM head to it, so the last stage holds it as well);
// each stage's cache has exactly its plan's chunks verified, with the source's bytes; and
// consolidation brings a stage's cache to the whole model.
#include <gtest/gtest.h>

#include <map>

#include "common/safetensors/model.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::kModelName;
using testing::read_file;
using testing::RegistryFixture;
using testing::TempDir;

constexpr const char* kTiedEmbedding = "transformer.wte.weight";

TEST(StageFetchTest, FourStagesCoverEveryTensorOnceAndMarkExactlyTheirChunks) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  auto source = safetensors::Model::open(fixture.model_dir());
  ASSERT_TRUE(source) << source.error().message;

  std::map<std::string, int> times_fetched;
  for (int stage = 0; stage < 4; ++stage) {
    SCOPED_TRACE(stage);
    TempDir root;
    HostCache cache = fixture.open_cache_at(root.path());
    ModelFetchOptions options;
    options.model = kModelName;
    options.stage = StageSpec{stage, 4};
    ModelFetch fetch(*registry, cache, options);
    auto result = fetch.run();
    ASSERT_TRUE(result) << result.error().message;
    const safetensors::FetchPlan& plan = result->plan;
    EXPECT_EQ(plan.layer_begin, 2 * stage);
    EXPECT_EQ(plan.layer_end, 2 * stage + 2);
    EXPECT_EQ(plan.tied_embedding, stage == 3);
    for (const std::string& tensor : plan.tensors()) ++times_fetched[tensor];

    for (const safetensors::FileFetch& file : plan.files) {
      SCOPED_TRACE(file.file);
      auto cached = cache.find_file(kModelName, file.file);
      ASSERT_TRUE(cached);
      const ChunkReadiness& readiness = (*cached)->readiness();
      const ChunkSet planned = testing::planned_chunks(file, readiness.chunk_size());
      const ChunkSet verified = testing::verified_chunks(readiness);
      EXPECT_EQ(verified.runs(), planned.runs());
      // And the verified chunks hold the source's bytes.
      const fs::path data = cache_layout::data_path(root.path(), kModelName, file.file);
      for (const ChunkRun& run : verified.runs()) {
        const ByteRange range = verified.byte_range(run);
        EXPECT_TRUE(
            testing::read_range(data, range.offset, range.length) ==
            testing::read_range(fixture.model_dir() / file.file, range.offset, range.length));
      }
      const bool whole = planned.size() == planned.chunk_count();
      EXPECT_EQ(readiness.state(), whole ? FillState::complete : FillState::filling);
    }
    // A stage fetches less than the model, and at least its plan.
    EXPECT_GE(result->bytes_fetched, result->bytes_planned);
    EXPECT_LT(result->bytes_fetched, source->tensor_bytes());
  }

  std::size_t tensors = 0;
  for (const auto& shard : source->shards()) {
    for (const auto& tensor : shard.tensors()) {
      ++tensors;
      EXPECT_EQ(times_fetched[tensor.name], tensor.name == kTiedEmbedding ? 2 : 1) << tensor.name;
    }
  }
  EXPECT_EQ(times_fetched.size(), tensors);  // and nothing the model lacks
}

TEST(StageFetchTest, ConsolidationFetchesTheRestInTheBackground) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options;
  options.model = kModelName;
  options.stage = StageSpec{1, 4};
  options.consolidate = true;
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name))
        << name;
  }
  for (const FetchedFile& f : result->files) EXPECT_EQ(f.state, FillState::complete) << f.path;
}

// A stage fetched first, then a full fetch (at background class) takes only the rest.
TEST(StageFetchTest, FullFetchAfterAStageTakesOnlyTheRest) {
  RegistryFixture fixture;
  auto registry = fixture.registry();
  HostCache cache = fixture.open_cache();
  ModelFetchOptions stage_options;
  stage_options.model = kModelName;
  stage_options.stage = StageSpec{2, 4};
  ModelFetch stage_fetch(*registry, cache, stage_options);
  auto stage = stage_fetch.run();
  ASSERT_TRUE(stage) << stage.error().message;

  ModelFetchOptions full_options;
  full_options.model = kModelName;
  full_options.tensor_class = FetchClass::background;
  ModelFetch full_fetch(*registry, cache, full_options);
  auto full = full_fetch.run();
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(full->bytes_cached, stage->bytes_fetched);
  std::uint64_t total = 0;
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    total += fs::file_size(fixture.model_dir() / name);
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name))
        << name;
  }
  EXPECT_EQ(full->bytes_fetched + full->bytes_cached, total);
}

}  // namespace
}  // namespace thaw::store
