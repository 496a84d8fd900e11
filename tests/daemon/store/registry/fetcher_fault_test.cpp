// RangeFetcher against a fault-injecting server: 5xx, resets, truncated bodies, stalls
// and ignored Range headers are retried and resumed from the last written byte;
// permanent faults and exhausted retries fail loudly; cancellation and sink errors.
#include <gtest/gtest.h>

#include <thread>

#include <fmt/format.h>

#include "daemon/store/registry/range_fetcher.hpp"
#include "fault_server.hpp"
#include "nginx_server.hpp"
#include "test_support.hpp"

namespace thaw::store {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::FaultServer;
using testing::make_bytes;
using testing::RecordingSink;
using testing::ServerFault;

constexpr std::size_t kSize = 1u << 20;

class FetcherFaultTest : public ::testing::Test {
 protected:
  FetcherFaultTest() : content_(make_bytes(kSize, 42)), server_(content_) {
    sink_.expect_file(0, kSize);
    // One part per request, so the server's request log reads as one part's attempts.
    config_.connections_per_file = 1;
    config_.backoff_initial = 10ms;
    config_.backoff_max = 50ms;
    config_.stall_timeout = 300ms;
    config_.max_retries = 4;
  }

  RangeRequest request(ByteRange range = {0, kSize}) {
    return RangeRequest{0, FileSource{FileSource::Kind::http, server_.url()}, range,
                        FetchClass::critical, kSize};
  }

  // Fetches `range` and checks it arrived exactly once, byte for byte.
  void fetch_and_expect_exact(ByteRange range = {0, kSize}) {
    RangeFetcher fetcher(config_, sink_);
    ASSERT_TRUE(fetcher.submit({request(range)}));
    ASSERT_TRUE(fetcher.wait_idle(20s));
    auto failures = fetcher.take_failures();
    ASSERT_TRUE(failures.empty()) << failures[0].message;
    auto got = sink_.contents(0);
    EXPECT_TRUE(std::equal(got.begin() + static_cast<std::ptrdiff_t>(range.offset),
                           got.begin() + static_cast<std::ptrdiff_t>(range.end()),
                           content_.begin() + static_cast<std::ptrdiff_t>(range.offset)));
    EXPECT_EQ(sink_.bytes_written_twice(0), 0u);
    EXPECT_EQ(sink_.total_written(), range.length);
    progress_ = fetcher.progress();
  }

  std::vector<std::byte> content_;
  FaultServer server_;
  RecordingSink sink_;
  FetcherConfig config_;
  FetchProgress progress_;
};

TEST_F(FetcherFaultTest, ServerErrorsAreRetried) {
  server_.push(ServerFault::http(503));
  server_.push(ServerFault::http(500));
  server_.push(ServerFault::http(503));
  fetch_and_expect_exact();
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(progress_.retries, 3u);
  EXPECT_EQ(requests[3].range_first, 0u);
}

TEST_F(FetcherFaultTest, ConnectionResetResumesFromTheLastWrittenByte) {
  server_.push(ServerFault::reset(300000));
  fetch_and_expect_exact();
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].fault, ServerFault::Kind::reset_after);
  // Data still in flight when the RST lands may be dropped by the kernel, so the resume
  // point is at most K; no byte was received twice.
  ASSERT_TRUE(requests[1].range_first);
  EXPECT_LE(*requests[1].range_first, 300000u);
  EXPECT_EQ(requests[1].range_last, kSize - 1);
  EXPECT_EQ(progress_.bytes_received, kSize);
}

TEST_F(FetcherFaultTest, TruncatedBodyResumesExactlyWhereItStopped) {
  server_.push(ServerFault::close_early(250000));
  fetch_and_expect_exact();
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range_first, 250000u);
}

TEST_F(FetcherFaultTest, ShortPartialAnswerIsResumed) {
  server_.push(ServerFault::short_range(100000));
  fetch_and_expect_exact({5000, 400000});
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].range_first, 5000u);
  EXPECT_EQ(requests[1].range_first, 105000u);
  EXPECT_EQ(requests[1].range_last, 404999u);
}

TEST_F(FetcherFaultTest, StalledTransferIsAbandonedAndResumed) {
  server_.push(ServerFault::stall(200000));
  auto start = std::chrono::steady_clock::now();
  fetch_and_expect_exact();
  EXPECT_GE(std::chrono::steady_clock::now() - start, config_.stall_timeout);
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].range_first, 200000u);
}

TEST_F(FetcherFaultTest, FaultsWithProgressDoNotExhaustTheRetries) {
  // More faults than max_retries, but each attempt writes bytes.
  for (int i = 0; i < 8; ++i) server_.push(ServerFault::close_early(50000));
  fetch_and_expect_exact();
  EXPECT_EQ(server_.requests().size(), 9u);
}

TEST_F(FetcherFaultTest, IgnoredRangeIsRetriedAndNeverWritten) {
  server_.push(ServerFault::whole_body());
  fetch_and_expect_exact({1000, 5000});
  auto requests = server_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].fault, ServerFault::Kind::ignore_range);
}

TEST_F(FetcherFaultTest, WholeFileAnsweredWith200IsAccepted) {
  server_.set_fallback(ServerFault::whole_body());
  fetch_and_expect_exact({0, kSize});
  EXPECT_EQ(server_.requests().size(), 1u);
}

TEST_F(FetcherFaultTest, PersistentServerErrorsFailLoudlyAfterTheRetries) {
  server_.set_fallback(ServerFault::http(503));
  RangeFetcher fetcher(config_, sink_);
  ASSERT_TRUE(fetcher.submit({request({4096, 8192})}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::retries_exhausted);
  EXPECT_EQ(failures[0].http_status, 503);
  const std::string& message = failures[0].message;
  EXPECT_NE(message.find(server_.url()), std::string::npos) << message;
  EXPECT_NE(message.find("bytes 4096-12287"), std::string::npos) << message;
  EXPECT_NE(message.find("last cause: HTTP 503"), std::string::npos) << message;
  EXPECT_EQ(server_.requests().size(), config_.max_retries + 1);
}

TEST_F(FetcherFaultTest, ForbiddenIsPermanent) {
  server_.push(ServerFault::http(403));
  RangeFetcher fetcher(config_, sink_);
  ASSERT_TRUE(fetcher.submit({request()}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::forbidden);
  EXPECT_EQ(server_.requests().size(), 1u);
}

TEST_F(FetcherFaultTest, UnreachableServerExhaustsTheRetries) {
  RangeFetcher fetcher(config_, sink_);
  RangeRequest unreachable = request();
  unreachable.source.location =
      fmt::format("http://127.0.0.1:{}/model.bin", testing::free_loopback_port());
  ASSERT_TRUE(fetcher.submit({unreachable}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::retries_exhausted);
  EXPECT_NE(failures[0].message.find("cannot connect"), std::string::npos) << failures[0].message;
}

TEST_F(FetcherFaultTest, ChangedFileSizeIsPermanent) {
  RangeFetcher fetcher(config_, sink_);
  RangeRequest changed = request({0, 1000});
  changed.file_size = kSize + 1;
  ASSERT_TRUE(fetcher.submit({changed}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::file_changed);
  EXPECT_EQ(sink_.total_written(), 0u);
}

TEST_F(FetcherFaultTest, SinkErrorIsPermanent) {
  sink_.fail_after(100000);
  RangeFetcher fetcher(config_, sink_);
  ASSERT_TRUE(fetcher.submit({request()}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::sink);
  EXPECT_NE(failures[0].message.find("disk full"), std::string::npos);
  // The server records a request once its send ends, which for a transfer the client
  // dropped can be after the fetcher is idle: give it a moment, then expect no retry.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server_.requests().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(server_.requests().size(), 1u);
}

TEST_F(FetcherFaultTest, CancelStopsAStalledTransfer) {
  server_.set_fallback(ServerFault::stall(1000));
  config_.stall_timeout = 60s;
  RangeFetcher fetcher(config_, sink_);
  ASSERT_TRUE(fetcher.submit({request()}));
  ASSERT_TRUE(eventually([&] { return fetcher.progress().bytes_done == 1000; }));
  fetcher.cancel_file(0);
  ASSERT_TRUE(fetcher.wait_idle(5s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::cancelled);
  EXPECT_EQ(fetcher.progress().active_transfers, 0u);
}

TEST_F(FetcherFaultTest, DestroyingTheFetcherCancelsWhatIsPending) {
  server_.set_fallback(ServerFault::stall(0));
  config_.stall_timeout = 60s;
  {
    RangeFetcher fetcher(config_, sink_);
    ASSERT_TRUE(fetcher.submit({request({0, 10}), request({10, 10})}));
    ASSERT_TRUE(eventually([&] { return server_.requests().size() == 1; }));
  }
  auto finished = sink_.finished();
  ASSERT_EQ(finished.size(), 2u);
  for (const auto& f : finished) {
    ASSERT_TRUE(f.error);
    EXPECT_EQ(f.error->code, FetchErrc::cancelled);
  }
}

TEST_F(FetcherFaultTest, MalformedRequestsAreRejectedUpFront) {
  RangeFetcher fetcher(config_, sink_);
  RangeRequest empty = request({0, 0});
  EXPECT_EQ(fetcher.submit({request(), empty}).error().code, FetchErrc::bad_request);
  RangeRequest ftp = request();
  ftp.source.location = "ftp://example/model.bin";
  EXPECT_EQ(fetcher.submit({ftp}).error().code, FetchErrc::bad_request);
  RangeRequest relative{0, FileSource{FileSource::Kind::local, "model.bin"}, {0, 1}};
  EXPECT_EQ(fetcher.submit({relative}).error().code, FetchErrc::bad_request);
  RangeRequest past_end = request({kSize - 1, 2});
  EXPECT_EQ(fetcher.submit({past_end}).error().code, FetchErrc::bad_request);
  EXPECT_TRUE(fetcher.wait_idle(1s));
  EXPECT_TRUE(server_.requests().empty());
}

}  // namespace
}  // namespace thaw::store
