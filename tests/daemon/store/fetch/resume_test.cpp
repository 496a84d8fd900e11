// Resuming: nginx stopped and started again in the middle of a fetch (the fetcher resumes
// each transfer from its last written byte), and a fetch cancelled halfway that a second
// fetch completes from the chunks the first one verified.
#include <gtest/gtest.h>

#include <thread>

#include "daemon/store/fetch/model_fetch.hpp"
#include "fetch_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::eventually;
using testing::kModelName;
using testing::read_file;
using testing::RegistryFixture;

std::uint64_t total_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  for (const std::string& name : testing::model_files(dir)) total += fs::file_size(dir / name);
  return total;
}

void expect_cache_matches(const RegistryFixture& fixture) {
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    EXPECT_TRUE(read_file(fixture.cached_path(name)) == read_file(fixture.model_dir() / name))
        << name;
  }
}

// Tensors are under way (the plan is known, so bytes_total is the whole model) and at
// least `fraction` of them is written.
bool tensors_past(const ModelFetch& fetch, double fraction) {
  const ModelFetchProgress p = fetch.progress();
  return p.phase == FetchPhase::tensors &&
         static_cast<double>(p.bytes_done) >= fraction * static_cast<double>(p.bytes_total);
}

// Every range ModelFetch asks for starts on a chunk boundary; a range starting anywhere else
// is the fetcher resuming a transfer that was cut in the middle of its body.
std::size_t resumed_requests(const std::vector<std::string>& access_log) {
  std::size_t resumed = 0;
  for (const std::string& line : access_log) {
    const auto at = line.find("\"bytes=");
    if (at == std::string::npos) continue;
    const std::uint64_t first = std::stoull(line.substr(at + 7));
    if (first % testing::kTestChunkBytes != 0) ++resumed;
  }
  return resumed;
}

// Range requests that nginx answered with fewer body bytes than they asked for: cut by the
// server's stop. Log lines: `GET <uri> "bytes=<first>-<last>" <status> <body bytes sent>`.
std::size_t cut_requests(const std::vector<std::string>& access_log) {
  std::size_t cut = 0;
  for (const std::string& line : access_log) {
    const auto at = line.find("\"bytes=");
    if (at == std::string::npos) continue;
    const std::uint64_t first = std::stoull(line.substr(at + 7));
    const std::uint64_t last = std::stoull(line.substr(line.find('-', at) + 1));
    const auto fields = line.substr(line.find('"', at + 1) + 2);  // "<status> <sent>"
    const std::uint64_t sent = std::stoull(fields.substr(fields.find(' ') + 1));
    if (sent < last - first + 1) ++cut;
  }
  return cut;
}

// nginx's limit_rate lets a response run a second or two ahead of its rate into the socket
// buffers (which outlive nginx), so the rate is low enough, 500 KiB/s, that most of each
// shard's 1.8 MB is still unsent when the server stops: transfers are usually cut mid-body.
// (Not 512k: its burst would end exactly on a chunk boundary and hide the resumes.) Under
// ASan on a loaded machine nginx sometimes hands every body to the kernel before the stop
// (2 of 5 runs, even at 200k); then nothing is cut and there is nothing to resume, which the
// check below allows — the fault-server suite tests resume-from-last-byte deterministically.
TEST(ResumeTest, ServerStoppedAndStartedMidTransfer) {
  RegistryFixture fixture("500k");
  auto registry = fixture.registry("/slow");
  HostCache cache = fixture.open_cache();
  ModelFetchOptions options;
  options.model = kModelName;
  options.fetcher = RegistryFixture::fast_retry_config();
  options.fetcher.connections_per_file = 1;  // one range per file: all shards in parallel
  ModelFetch fetch(*registry, cache, options);

  std::expected<ModelFetchResult, ModelFetchError> result =
      std::unexpected(ModelFetchError{ModelFetchErrc::fetch, "did not run"});
  std::thread runner([&] { result = fetch.run(); });
  const bool midway = eventually([&] { return tensors_past(fetch, 0.1); }, 30s);
  fixture.server().stop();  // connections drop mid-body; new ones are refused
  const bool retried = midway && eventually([&] { return fetch.progress().retries > 0; }, 30s);
  const ModelFetchProgress while_down = fetch.progress();
  fixture.server().start();
  runner.join();

  ASSERT_TRUE(midway);
  ASSERT_TRUE(retried) << "phase " << to_string(while_down.phase) << ", " << while_down.bytes_done
                       << " of " << while_down.bytes_total << " bytes in";
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_LT(while_down.bytes_done, while_down.bytes_total);
  const auto log = fixture.server().access_log();
  std::string requests;
  for (const std::string& line : log) requests += line + "\n";
  if (cut_requests(log) > 0)
    EXPECT_GT(resumed_requests(log), 0u) << "transfers were cut but none resumed mid-body; "
                                         << "nginx access log:\n"
                                         << requests;
  EXPECT_EQ(result->bytes_fetched, total_bytes(fixture.model_dir()));
  EXPECT_GT(result->retries, 0u);
  expect_cache_matches(fixture);
}

TEST(ResumeTest, CancelledFetchIsResumedFromItsVerifiedChunks) {
  RegistryFixture fixture;
  const std::uint64_t total = total_bytes(fixture.model_dir());
  HostCache cache = fixture.open_cache();
  {
    // Slowed by the fetcher's own rate limit: nginx's limit_rate barely slows small range
    // requests on keep-alive connections, so the fetch could end before it was cancelled.
    auto slow = fixture.registry();
    ModelFetchOptions options;
    options.model = kModelName;
    options.fetcher.rate_limits[static_cast<std::size_t>(FetchClass::critical)] =
        RateLimit{4u << 20, 0};
    ModelFetch fetch(*slow, cache, options);
    std::expected<ModelFetchResult, ModelFetchError> result =
        std::unexpected(ModelFetchError{ModelFetchErrc::fetch, "did not run"});
    std::thread runner([&] { result = fetch.run(); });
    const bool midway = eventually([&] { return tensors_past(fetch, 0.3); }, 30s);
    fetch.cancel();
    runner.join();
    ASSERT_TRUE(midway);
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, ModelFetchErrc::cancelled);
  }

  // What the first fetch left: verified chunks, and files with missing chunks marked
  // failed so that nobody waits on them in vain.
  std::uint64_t verified_bytes = 0;
  std::size_t failed_files = 0;
  for (const std::string& name : testing::model_files(fixture.model_dir())) {
    auto file = cache.find_file(kModelName, name);
    ASSERT_TRUE(file) << name;
    const ChunkReadiness& readiness = (*file)->readiness();
    for (std::uint64_t c = 0; c < readiness.chunk_count(); ++c) {
      if (readiness.chunk_verified(c)) verified_bytes += readiness.chunk_length(c);
    }
    if (readiness.state() == FillState::failed) {
      ++failed_files;
      EXPECT_NE(readiness.failure_reason().find("cancelled"), std::string::npos);
    }
  }
  EXPECT_GT(verified_bytes, 0u);
  EXPECT_LT(verified_bytes, total);
  EXPECT_GT(failed_files, 0u);

  auto fast = fixture.registry();
  ModelFetchOptions options;
  options.model = kModelName;
  ModelFetch fetch(*fast, cache, options);
  auto result = fetch.run();
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->bytes_cached, verified_bytes);
  EXPECT_EQ(result->bytes_fetched, total - verified_bytes);
  for (const FetchedFile& f : result->files) {
    EXPECT_EQ(f.state, FillState::complete) << f.path;
    EXPECT_TRUE(f.sha256_checked) << f.path;  // over the old chunks and the new
  }
  expect_cache_matches(fixture);
}

}  // namespace
}  // namespace thaw::store
