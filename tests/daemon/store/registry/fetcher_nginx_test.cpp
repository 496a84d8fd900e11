// RangeFetcher against a real nginx: byte-exact fetches over parallel kept-alive
// connections, permanent errors, resume across an nginx restart, per-class rate limits
// and socket tags.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <set>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "bpf/traffic_class.h"
#include "daemon/network/fetch_window.hpp"
#include "daemon/store/registry/range_fetcher.hpp"
#include "nginx_server.hpp"
#include "test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::eventually;
using testing::make_bytes;
using testing::NginxServer;
using testing::RecordingSink;
using testing::TempDir;
using testing::write_file;

class FetcherNginxTest : public ::testing::Test {
 protected:
  // `/slow/` serves the same files at `limit_rate` per request.
  void start_server(const std::string& limit_rate = "1m") {
    server_ = std::make_unique<NginxServer>(testing::NginxOptions{
        root_.path(), fmt::format("location /slow/ {{ alias {}/; limit_rate {}; }}",
                                  root_.path().string(), limit_rate)});
  }

  std::vector<std::byte> add_file(const std::string& name, std::size_t size, std::uint64_t seed) {
    auto bytes = make_bytes(size, seed);
    write_file(root_.path() / name, bytes);
    return bytes;
  }

  RangeRequest whole(FileId id, const std::string& path, std::size_t size,
                     FetchClass cls = FetchClass::critical) {
    return RangeRequest{id, FileSource{FileSource::Kind::http, server_->base_url() + path},
                        ByteRange{0, size}, cls, size};
  }

  static FetcherConfig fast_retry_config() {
    FetcherConfig config;
    config.backoff_initial = 20ms;
    config.backoff_max = 200ms;
    config.max_retries = 20;
    return config;
  }

  TempDir root_;
  std::unique_ptr<NginxServer> server_;
};

TEST_F(FetcherNginxTest, FullFetchOverParallelPartsIsByteExact) {
  auto bytes = add_file("model.bin", (6u << 20) + 12345, 1);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config;
  config.connections_per_file = 4;
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/model.bin", bytes.size())}));
  ASSERT_TRUE(fetcher.wait_idle(20s));

  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_EQ(sink.problems(), "");
  EXPECT_TRUE(sink.contents(0) == bytes);
  EXPECT_EQ(sink.bytes_written_twice(0), 0u);
  auto finished = sink.finished();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_FALSE(finished[0].error);
  EXPECT_EQ(finished[0].range, (ByteRange{0, bytes.size()}));

  FetchProgress progress = fetcher.progress();
  EXPECT_EQ(progress.bytes_total, bytes.size());
  EXPECT_EQ(progress.bytes_done, bytes.size());
  EXPECT_EQ(progress.bytes_received, bytes.size());
  EXPECT_EQ(progress.requests_done, 1u);
  EXPECT_EQ(progress.requests_pending, 0u);
  EXPECT_EQ(progress.per_class[0].bytes_done, bytes.size());

  int partial_answers = 0;
  for (const auto& line : server_->access_log()) {
    if (line.starts_with("GET /model.bin \"bytes=") && line.find(" 206 ") != std::string::npos) {
      ++partial_answers;
    }
  }
  EXPECT_EQ(partial_answers, 4);
}

TEST_F(FetcherNginxTest, PartsRunConcurrently) {
  auto bytes = add_file("model.bin", 4u << 20, 2);
  start_server("512k");
  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config;
  config.connections_per_file = 4;
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/slow/model.bin", bytes.size())}));
  // nginx sends a second's worth at once, then 512 KB/s: each 1 MiB part takes about a
  // second, so the four must overlap.
  EXPECT_TRUE(eventually([&] { return fetcher.progress().active_transfers == 4; }, 10s));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(sink.contents(0) == bytes);
}

TEST_F(FetcherNginxTest, SeveralFilesAndSubRanges) {
  auto a = add_file("a.bin", 3u << 20, 3);
  auto b = add_file("dir/b.bin", 1, 4);
  auto c = add_file("c.bin", 700000, 5);
  start_server();
  RecordingSink sink;
  sink.expect_file(1, a.size());
  sink.expect_file(2, b.size());
  sink.expect_file(3, c.size());
  FetcherConfig config;
  config.min_part_bytes = 256u << 10;
  RangeFetcher fetcher(config, sink);
  // c.bin in two requests that meet at an odd offset.
  RangeRequest c_head = whole(3, "/c.bin", c.size());
  c_head.range = {0, 333333};
  RangeRequest c_tail = c_head;
  c_tail.range = {333333, c.size() - 333333};
  ASSERT_TRUE(fetcher.submit(
      {whole(1, "/a.bin", a.size()), whole(2, "/dir/b.bin", b.size()), c_head, c_tail}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_TRUE(sink.contents(1) == a);
  EXPECT_TRUE(sink.contents(2) == b);
  EXPECT_TRUE(sink.contents(3) == c);
  EXPECT_EQ(sink.bytes_written_twice(3), 0u);
  EXPECT_EQ(sink.finished().size(), 4u);
  EXPECT_EQ(fetcher.progress().requests_done, 4u);
}

TEST_F(FetcherNginxTest, MissingFileIsPermanentAndNamesTheUrl) {
  start_server();
  RecordingSink sink;
  RangeFetcher fetcher(fast_retry_config(), sink);
  RangeRequest request = whole(9, "/absent.bin", 1000);
  ASSERT_TRUE(fetcher.submit({request}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::not_found);
  EXPECT_EQ(failures[0].http_status, 404);
  EXPECT_NE(failures[0].message.find(request.source.location), std::string::npos)
      << failures[0].message;
  EXPECT_NE(failures[0].message.find("404"), std::string::npos);
  EXPECT_EQ(server_->access_log().size(), 1u) << "a 404 must not be retried";
  auto finished = sink.finished();
  ASSERT_EQ(finished.size(), 1u);
  ASSERT_TRUE(finished[0].error);
  EXPECT_EQ(fetcher.progress().requests_failed, 1u);
}

TEST_F(FetcherNginxTest, RangePastTheEndIsPermanent) {
  auto bytes = add_file("small.bin", 1000, 6);
  start_server();
  RecordingSink sink;
  RangeFetcher fetcher(fast_retry_config(), sink);
  RangeRequest request = whole(0, "/small.bin", 1000);
  request.file_size = 0;  // unknown: the server is the one to object
  request.range = {5000, 10};
  ASSERT_TRUE(fetcher.submit({request}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto failures = fetcher.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code, FetchErrc::range_not_satisfiable);
  EXPECT_NE(failures[0].message.find("bytes 5000-5009"), std::string::npos) << failures[0].message;
}

TEST_F(FetcherNginxTest, ResumesAfterNginxIsStoppedAndStartedMidTransfer) {
  auto bytes = add_file("model.bin", 3u << 20, 7);
  start_server("1m");
  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config = fast_retry_config();
  config.connections_per_file = 2;
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/slow/model.bin", bytes.size())}));

  ASSERT_TRUE(eventually([&] { return fetcher.progress().bytes_done >= (512u << 10); }));
  server_->stop();
  const std::uint64_t done_at_stop = fetcher.progress().bytes_done;
  ASSERT_LT(done_at_stop, bytes.size()) << "the transfer finished before nginx stopped";
  // The fetcher notices (truncated bodies, refused connections) and backs off.
  ASSERT_TRUE(eventually([&] { return fetcher.progress().retries >= 2; }));
  const std::size_t log_lines_before = server_->access_log().size();
  server_->start();
  ASSERT_TRUE(fetcher.wait_idle(30s));

  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_TRUE(sink.contents(0) == bytes);
  // Resumed, not restarted: no byte was fetched or written twice.
  EXPECT_EQ(sink.bytes_written_twice(0), 0u);
  EXPECT_EQ(fetcher.progress().bytes_received, bytes.size());
  // After the restart both parts asked for their remainder only.
  auto log = server_->access_log();
  std::vector<std::string> resumed(log.begin() + static_cast<std::ptrdiff_t>(log_lines_before),
                                   log.end());
  ASSERT_EQ(resumed.size(), 2u) << fmt::format("{}", fmt::join(log, "\n"));
  for (const auto& line : resumed) {
    EXPECT_NE(line.find(" 206 "), std::string::npos) << line;
    EXPECT_EQ(line.find("\"bytes=0-"), std::string::npos) << "restarted from 0: " << line;
    EXPECT_EQ(line.find("\"bytes=1572864-"), std::string::npos)
        << "second part restarted from its start: " << line;
  }
}

TEST_F(FetcherNginxTest, RateLimitIsSharedByAClassAndSparesTheOther) {
  auto background = add_file("background.bin", 2u << 20, 8);
  auto critical = add_file("critical.bin", 4u << 20, 9);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, background.size());
  sink.expect_file(1, critical.size());
  FetcherConfig config;
  config.connections_per_file = 4;
  constexpr std::uint64_t kRate = 1u << 20;
  constexpr std::uint64_t kBurst = 256u << 10;
  config.rate_limits[static_cast<std::size_t>(FetchClass::background)] = RateLimit{kRate, kBurst};
  RangeFetcher fetcher(config, sink);
  auto start = std::chrono::steady_clock::now();
  // Background first, so it cannot win by being submitted second.
  ASSERT_TRUE(
      fetcher.submit({whole(0, "/background.bin", background.size(), FetchClass::background),
                      whole(1, "/critical.bin", critical.size(), FetchClass::critical)}));
  ASSERT_TRUE(fetcher.wait_idle(30s));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  EXPECT_TRUE(fetcher.take_failures().empty());
  EXPECT_TRUE(sink.contents(0) == background);
  EXPECT_TRUE(sink.contents(1) == critical);
  // A token bucket of depth B at rate R cannot pass N bytes in less than (N - B) / R;
  // unlimited, loopback moves 2 MiB in milliseconds.
  double floor_seconds = static_cast<double>(background.size() - kBurst) / kRate;
  EXPECT_GE(seconds, 0.8 * floor_seconds);
  // The unlimited class finished while the limited one was still being held back.
  auto finished = sink.finished();
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(finished[0].file, 1u);
  EXPECT_EQ(finished[1].file, 0u);
  auto progress = fetcher.progress();
  EXPECT_EQ(progress.per_class[static_cast<std::size_t>(FetchClass::background)].bytes_done,
            background.size());
  EXPECT_EQ(progress.per_class[static_cast<std::size_t>(FetchClass::critical)].bytes_done,
            critical.size());
}

// Records, in order, each file's first write and each part's end.
class OrderSink : public RecordingSink {
 public:
  std::expected<void, std::string> write(FileId file, std::uint64_t offset,
                                         std::span<const std::byte> bytes) override {
    {
      std::lock_guard lock(mutex_);
      if (started_.insert(file).second) events_.push_back(fmt::format("start {}", file));
    }
    return RecordingSink::write(file, offset, bytes);
  }
  void done(FileId file, ByteRange range) override {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(fmt::format("done {}", file));
    }
    RecordingSink::done(file, range);
  }
  std::vector<std::string> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  mutable std::mutex mutex_;
  std::set<FileId> started_;
  std::vector<std::string> events_;
};

// A cold start's critical parts get every connection: background parts submitted with them
// (first, even) start only once the last critical part is done, also without any shaping in
// the kernel. With the hold off, both classes run at once (what made the cluster box's
// stage-0 TTFT bimodal, docs/BENCHMARKS.md).
TEST_F(FetcherNginxTest, BackgroundPartsWaitUntilNoCriticalPartIsPending) {
  auto background = add_file("background.bin", 1u << 20, 11);
  auto critical = add_file("critical.bin", 1u << 20, 12);
  // /slow/: 512 KB/s per request. nginx sends the first second's worth at once, so each
  // 1 MB file (one part) takes about 1 s.
  start_server("512k");
  for (const bool hold : {true, false}) {
    OrderSink sink;
    sink.expect_file(0, background.size());
    sink.expect_file(1, critical.size());
    FetcherConfig config;
    config.connections_per_file = 2;
    config.background_waits_for_critical = hold;
    RangeFetcher fetcher(config, sink);
    ASSERT_TRUE(
        fetcher.submit({whole(0, "/slow/background.bin", background.size(), FetchClass::background),
                        whole(1, "/slow/critical.bin", critical.size(), FetchClass::critical)}));
    ASSERT_TRUE(fetcher.wait_idle(30s));
    EXPECT_TRUE(fetcher.take_failures().empty());
    EXPECT_TRUE(sink.contents(0) == background);
    EXPECT_TRUE(sink.contents(1) == critical);
    const std::vector<std::string> events = sink.events();
    const auto at = [&](const std::string& e) {
      return std::find(events.begin(), events.end(), e) - events.begin();
    };
    // The critical file's last part ends at its last "done 1".
    const auto last_critical_done =
        events.rend() - std::find(events.rbegin(), events.rend(), std::string("done 1")) - 1;
    if (hold) {
      EXPECT_GT(at("start 0"), last_critical_done) << fmt::format("{}", fmt::join(events, ", "));
    } else {
      EXPECT_LT(at("start 0"), last_critical_done) << "without the hold both classes run at once: "
                                                   << fmt::format("{}", fmt::join(events, ", "));
    }
  }
}

TEST_F(FetcherNginxTest, RateLimitCanBeLiftedWhileRunning) {
  auto bytes = add_file("model.bin", 8u << 20, 10);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, bytes.size());
  FetcherConfig config;
  config.rate_limits[0] = RateLimit{256u << 10, 64u << 10};  // 8 MiB would take 30 s
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/model.bin", bytes.size())}));
  ASSERT_TRUE(eventually([&] { return fetcher.progress().bytes_done > 0; }));
  fetcher.set_rate_limit(FetchClass::critical, RateLimit{});
  ASSERT_TRUE(fetcher.wait_idle(15s));
  EXPECT_TRUE(sink.contents(0) == bytes);
}

struct TagRecord {
  FetchClass cls;
  bool new_connection;
  int priority;
  std::uint32_t mark;
};

TEST_F(FetcherNginxTest, SocketsCarryTheirClassTagsAlsoWhenReused) {
  auto a = add_file("a.bin", 100000, 11);
  auto b = add_file("b.bin", 100000, 12);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, a.size());
  sink.expect_file(1, b.size());

  // SO_MARK needs CAP_NET_ADMIN; tag it only where the test may.
  int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  unsigned int probe_mark = 1;
  const bool can_mark =
      ::setsockopt(probe, SOL_SOCKET, SO_MARK, &probe_mark, sizeof probe_mark) == 0;
  ::close(probe);

  std::mutex mutex;
  std::vector<TagRecord> records;
  FetcherConfig config;
  config.max_connections = 1;  // one connection: the second request must reuse it
  config.socket_tags[0].so_priority = 5;
  config.socket_tags[1].so_priority = 2;
  if (can_mark) {
    config.socket_tags[0].so_mark = 0x71;
    config.socket_tags[1].so_mark = 0x72;
  }
  config.on_socket_tagged = [&](const SocketTagEvent& event) {
    TagRecord record{event.cls, event.new_connection, -1, 0};
    socklen_t len = sizeof record.priority;
    ::getsockopt(event.fd, SOL_SOCKET, SO_PRIORITY, &record.priority, &len);
    len = sizeof record.mark;
    ::getsockopt(event.fd, SOL_SOCKET, SO_MARK, &record.mark, &len);
    std::lock_guard lock(mutex);
    records.push_back(record);
  };
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/a.bin", a.size(), FetchClass::critical)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  ASSERT_TRUE(fetcher.submit({whole(1, "/b.bin", b.size(), FetchClass::background)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(sink.contents(0) == a);
  EXPECT_TRUE(sink.contents(1) == b);

  std::lock_guard lock(mutex);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].cls, FetchClass::critical);
  EXPECT_TRUE(records[0].new_connection);
  EXPECT_EQ(records[0].priority, 5);
  EXPECT_EQ(records[1].cls, FetchClass::background);
  EXPECT_FALSE(records[1].new_connection) << "the kept-alive connection was not reused";
  EXPECT_EQ(records[1].priority, 2);
  if (can_mark) {
    EXPECT_EQ(records[0].mark, 0x71u);
    EXPECT_EQ(records[1].mark, 0x72u);
  }
}

// With thawd's FetchWindows the socket of a running transfer is registered (its window at the
// class's share) and leaves the registry when the transfer ends, though libcurl keeps the
// connection alive: an idle connection is no fetch, and counted as one it would keep
// background fetches yielding and split its class's share.
TEST_F(FetcherNginxTest, FetchWindowsHoldOnlySocketsWithARunningTransfer) {
  auto a = add_file("a.bin", 2u << 20, 31);
  auto b = add_file("b.bin", 2u << 20, 32);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, a.size());
  sink.expect_file(1, b.size());
  auto windows = std::make_shared<network::FetchWindows>(
      network::FetchWindowRates{1'000'000, 1'000'000, 50'000});
  FetcherConfig config;
  config.max_connections = 1;  // the background request reuses the kept-alive connection
  config.fetch_windows = windows;
  std::atomic<bool> done{false};
  std::atomic<int> seen_critical{0}, seen_background{0};
  std::thread watcher([&] {
    while (!done) {
      for (const auto& l : windows->live()) {
        if (l.traffic_class == THAW_CLASS_CRITICAL_FETCH) ++seen_critical;
        if (l.traffic_class == THAW_CLASS_BACKGROUND_FETCH) ++seen_background;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/a.bin", a.size(), FetchClass::critical)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  const auto after_critical = windows->live().size();
  ASSERT_TRUE(fetcher.submit({whole(1, "/b.bin", b.size(), FetchClass::background)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  const auto after_background = windows->live().size();
  done = true;
  watcher.join();
  EXPECT_TRUE(sink.contents(0) == a && sink.contents(1) == b);
  EXPECT_GT(seen_critical.load(), 0) << "the critical transfer's socket was never registered";
  EXPECT_GT(seen_background.load(), 0) << "the background transfer's socket was never registered";
  EXPECT_EQ(after_critical, 0u) << "the idle kept-alive connection stayed registered";
  EXPECT_EQ(after_background, 0u);
  EXPECT_EQ(windows->reclamp_errors(), 0u) << windows->last_error();
}

TEST_F(FetcherNginxTest, AClassWithAWindowRateGetsItsReceiveWindowClampedAfterConnect) {
  auto a = add_file("a.bin", 100000, 21);
  auto b = add_file("b.bin", 4u << 20, 22);
  start_server();
  RecordingSink sink;
  sink.expect_file(0, a.size());
  sink.expect_file(1, b.size());

  struct Seen {
    int clamp = 0;
    std::uint32_t advmss = 0;
  };
  std::mutex mutex;
  std::vector<Seen> seen;
  FetcherConfig config;
  config.max_connections = 1;                // the background request reuses the connection
  config.socket_tags[1].window_rate = 1000;  // 1 KB/s x a loopback round trip: the floor
  config.socket_tags[0].so_priority = 0;     // something to tag, so the callback runs
  config.socket_tags[1].so_priority = 0;
  config.on_socket_tagged = [&](const SocketTagEvent& event) {
    Seen s;
    socklen_t l = sizeof s.clamp;
    ::getsockopt(event.fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &s.clamp, &l);
    tcp_info info{};
    l = sizeof info;
    ::getsockopt(event.fd, IPPROTO_TCP, TCP_INFO, &info, &l);
    s.advmss = info.tcpi_advmss;
    std::lock_guard lock(mutex);
    seen.push_back(s);
  };
  RangeFetcher fetcher(config, sink);
  ASSERT_TRUE(fetcher.submit({whole(0, "/a.bin", a.size(), FetchClass::critical)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(fetcher.submit({whole(1, "/b.bin", b.size(), FetchClass::background)}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(sink.contents(0) == a);
  EXPECT_TRUE(sink.contents(1) == b) << "a fetch through a clamped window must still be whole";
  EXPECT_LT(secs, 5.0) << "4 MiB on loopback through the clamped window: a window below a "
                          "segment stalls on the persist timer";
  std::lock_guard lock(mutex);
  ASSERT_GE(seen.size(), 2u);  // critical's new connection, then background's parts on it
  // Background, on the kept-alive connection, is clamped to the floor (or three segments)
  // after connect and before each request; critical (no window rate) was not.
  for (std::size_t i = 1; i < seen.size(); ++i) {
    std::uint64_t expected =
        std::max<std::uint64_t>(network::kFetchWindowFloorBytes, 3ull * seen[i].advmss);
    EXPECT_EQ(static_cast<std::uint64_t>(seen[i].clamp), expected) << "request " << i;
  }
  EXPECT_NE(seen[0].clamp, seen[1].clamp);
}

TEST_F(FetcherNginxTest, RefetchDeliversARangeAgain) {
  auto bytes = add_file("model.bin", 2u << 20, 13);
  start_server();
  RecordingSink sink;
  sink.expect_file(4, bytes.size());
  RangeFetcher fetcher(FetcherConfig{}, sink);
  ASSERT_TRUE(fetcher.submit({whole(4, "/model.bin", bytes.size())}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  ASSERT_TRUE(fetcher.refetch(4, ByteRange{100000, 65536}));
  ASSERT_TRUE(fetcher.wait_idle(20s));
  EXPECT_TRUE(sink.contents(4) == bytes);
  EXPECT_EQ(sink.bytes_written_twice(4), 65536u);
  auto finished = sink.finished();
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(finished[1].range, (ByteRange{100000, 65536}));
  auto unknown = fetcher.refetch(99, ByteRange{0, 1});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, FetchErrc::bad_request);
}

}  // namespace
}  // namespace thaw::store
