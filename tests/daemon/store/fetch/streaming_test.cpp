// Streaming: a consumer waiting on tensor i (readiness map and data file opened read-only by
// path, as another process would) wakes when i's chunks land — before its file is complete
// — and reads the source's bytes. The registry is throttled and each file comes over one
// connection, in order, so "before the file is complete" is a matter of bytes, not timing.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <mutex>
#include <thread>

#include "common/safetensors/header.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::kModelName;
using testing::RegistryFixture;

constexpr const char* kShard = "model-00002-of-00018.safetensors";

struct Wake {
  std::string tensor;
  bool ready_before = true;  // already ready when the consumer began to wait
  WaitStatus status = WaitStatus::timed_out;
  std::uint64_t verified_chunks = 0;  // of the file, right after waking
  FillState state = FillState::filling;
  bool bytes_match = false;
};

TEST(StreamingTest, ConsumerWakesWhenItsTensorLandsBeforeTheFileIsComplete) {
  // nginx lets each request send one second's worth at full speed before limit_rate bites:
  // at 1m the tensor came over loopback about as fast as this test's consumer thread started
  // (it once found it ready before waiting). At 256k it lands well after.
  RegistryFixture fixture("256k");
  auto header = safetensors::read_header(fixture.model_dir() / kShard);
  ASSERT_TRUE(header);
  ASSERT_GE(header->tensors().size(), 3u);
  auto registry = fixture.registry("/slow");
  HostCache cache = fixture.open_cache();

  ModelFetchOptions options;
  options.model = kModelName;
  options.fetcher.connections_per_file = 1;
  std::unique_ptr<ModelFetch> fetch;
  std::mutex mutex;
  std::vector<Wake> wakes;
  std::uint64_t chunk_count = 0;
  std::thread consumer;
  options.on_plan = [&](const safetensors::FetchPlan&) {
    consumer = std::thread([&] {
      const fs::path map = cache_layout::readiness_path(fixture.cache_root(), kModelName, kShard);
      const fs::path data = cache_layout::data_path(fixture.cache_root(), kModelName, kShard);
      auto readiness = ChunkReadiness::open_reader(UniqueFd(::open(map.c_str(), O_RDONLY)), "r");
      ASSERT_TRUE(readiness) << readiness.error().message;
      {
        std::lock_guard lock(mutex);
        chunk_count = readiness->chunk_count();
      }
      // The first tensor that starts past the header's chunk (h.0.ln_1.bias, in chunk 12 of
      // the shard's 29), as an engine loads it.
      for (const safetensors::TensorInfo& t : header->tensors()) {
        if (t.begin < testing::kTestChunkBytes || t.bytes() == 0) continue;
        if (!wakes.empty()) break;
        Wake wake;
        wake.tensor = t.name;
        wake.ready_before = readiness->is_ready(t.begin, t.bytes());
        wake.status = readiness->wait_ready(t.begin, t.bytes(), 30s).status;
        wake.verified_chunks = readiness->verified_chunks();
        wake.state = readiness->state();
        if (wake.status == WaitStatus::ready) {
          wake.bytes_match = testing::read_range(data, t.begin, t.bytes()) ==
                             testing::read_range(fixture.model_dir() / kShard, t.begin, t.bytes());
        }
        std::lock_guard lock(mutex);
        wakes.push_back(std::move(wake));
      }
      fetch->cancel();  // the point is made; the rest of the model need not come
    });
  };
  fetch = std::make_unique<ModelFetch>(*registry, cache, options);
  auto result = fetch->run();
  consumer.join();

  ASSERT_FALSE(result);  // cancelled by the consumer
  EXPECT_EQ(result.error().code, ModelFetchErrc::cancelled);
  ASSERT_EQ(wakes.size(), 1u);
  for (const Wake& wake : wakes) {
    SCOPED_TRACE(wake.tensor);
    EXPECT_FALSE(wake.ready_before);  // it really waited
    EXPECT_EQ(wake.status, WaitStatus::ready);
    EXPECT_TRUE(wake.bytes_match);
    EXPECT_NE(wake.state, FillState::complete);
    EXPECT_LT(wake.verified_chunks, chunk_count);  // woke before the whole file was in
  }
}

// Time to first tensor is measured for the plan's first tensor and lies between the plan
// and the end of the fetch.
TEST(StreamingTest, FirstTensorIsReadyBeforeTheFetchEnds) {
  RegistryFixture fixture("8m");
  auto registry = fixture.registry("/slow");
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options;
  options.model = kModelName;
  options.stage = StageSpec{0, 2};
  ModelFetch fetch(*registry, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_TRUE(result->time_to_first_tensor_s);
  EXPECT_GE(*result->time_to_first_tensor_s, *result->time_to_plan_s);
  EXPECT_LT(*result->time_to_first_tensor_s, result->seconds);
}

}  // namespace
}  // namespace thaw::store
