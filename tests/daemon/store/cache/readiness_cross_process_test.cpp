// A consumer in another process, given the cache file's descriptors over SCM_RIGHTS
// (as the shim gets them from the daemon), waits on a range with a read-only mapping
// and wakes exactly when the chunks it needs are verified — not before, and not by
// polling: the parent checks that the child is asleep in futex() before marking.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "common/readiness/chunk_readiness.hpp"
#include "daemon/store/cache/cache_file.hpp"
#include "tests/daemon/store/cache/cache_test_support.hpp"

namespace thaw::store {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::TempDir;

constexpr uint64_t kChunk = 4096;
constexpr uint64_t kChunks = 10;
constexpr uint64_t kSize = kChunk * kChunks - 100;

std::string describe(const WaitResult& r) {
  std::string s(to_string(r.status));
  if (r.status == WaitStatus::failed) s += "|" + r.failure_reason;
  return s;
}

struct Fixture {
  TempDir dir;
  CacheFile file;
  std::vector<std::byte> bytes = testing::pattern_bytes(kSize, 7);

  static CacheFile make(const TempDir& dir) {
    auto f = CacheFile::create(dir.path() / "model.safetensors", dir.path() / "model.ready",
                               CacheFileSpec{kSize, kChunk});
    EXPECT_TRUE(f.has_value()) << f.error().message;
    return std::move(*f);
  }
  Fixture() : file(make(dir)) {}

  // Writes and marks chunk c, as a fetcher does after checking its digest.
  void land(uint64_t c) {
    const uint64_t off = c * kChunk;
    const uint64_t len = file.readiness().chunk_length(c);
    ASSERT_TRUE(file.write_at(off, std::span(bytes).subspan(off, len)));
    ASSERT_TRUE(file.readiness().mark_verified(c));
  }

  void pass_fds(Child& child) {
    auto data = file.reader_data_fd();
    auto map = file.reader_readiness_fd();
    ASSERT_TRUE(data && map);
    ASSERT_TRUE(child.send_fds({data->get(), map->get()}));
  }
};

// The consumer's side: receives (data fd, readiness fd), opens the map read-only.
ChunkReadiness consumer_map(Child& self, UniqueFd* data_out = nullptr) {
  auto fds = self.receive_fds(2);
  if (fds.size() != 2) {
    self.send("no fds");
    ::_exit(1);
  }
  UniqueFd data(fds[0]);
  auto map = ChunkReadiness::open_reader(UniqueFd(fds[1]), "passed readiness fd");
  if (!map) {
    self.send("open failed: " + map.error().message);
    ::_exit(1);
  }
  if (data_out != nullptr) *data_out = std::move(data);
  return std::move(*map);
}

TEST(ReadinessCrossProcess, ConsumerWakesWhenExactlyItsChunkLands) {
  Fixture fx;
  const uint64_t wanted = 5;
  Child child([&](Child& self) {
    UniqueFd data;
    ChunkReadiness map = consumer_map(self, &data);
    self.send("waiting");
    // Phase 1: with every other chunk landing meanwhile, chunk 5 must not be reported.
    self.send(describe(map.wait_ready(wanted * kChunk + 10, 100, 1s)));
    // Phase 2: until it lands.
    WaitResult r = map.wait_ready(wanted * kChunk + 10, 100, 60s);
    std::string line = describe(r);
    if (r.status == WaitStatus::ready) {
      // The bytes the consumer now reads through its own descriptor are the fetched ones.
      std::vector<std::byte> got(100);
      if (::pread(data.get(), got.data(), got.size(), wanted * kChunk + 10) != 100 ||
          std::memcmp(got.data(), fx.bytes.data() + wanted * kChunk + 10, 100) != 0) {
        line += "|bytes differ";
      }
    }
    self.send(line);
  });
  fx.pass_fds(child);
  ASSERT_EQ(child.receive(20s), "waiting");

  ASSERT_GE(child.wait_until_in_futex(), 0) << "consumer never went to sleep in futex()";
  for (uint64_t c = 0; c < kChunks - 1; ++c) {
    if (c != wanted) fx.land(c);
  }
  EXPECT_EQ(child.receive(20s), "timed_out") << "woke for chunks it does not need";

  const long asleep = child.wait_until_in_futex();
  ASSERT_GE(asleep, 0);
  fx.land(kChunks - 1);
  ASSERT_TRUE(child.wait_until_slept_again(asleep)) << "the last chunk's wake-up got lost";
  EXPECT_EQ(child.receive(0ms), std::nullopt) << "reported before its chunk landed";
  fx.land(wanted);
  EXPECT_EQ(child.receive(20s), "ready");
  EXPECT_EQ(child.join(), 0);
}

TEST(ReadinessCrossProcess, RangeSpanningChunksWaitsForAllOfThem) {
  Fixture fx;
  Child child([&](Child& self) {
    ChunkReadiness map = consumer_map(self);
    self.send("waiting");
    // Bytes 2.5 .. 4.5 chunks: needs chunks 2, 3 and 4.
    self.send(describe(map.wait_ready(2 * kChunk + kChunk / 2, 2 * kChunk, 60s)));
  });
  fx.pass_fds(child);
  ASSERT_EQ(child.receive(20s), "waiting");
  for (uint64_t c : {2, 4}) {
    const long asleep = child.wait_until_in_futex();
    ASSERT_GE(asleep, 0);
    fx.land(c);
    ASSERT_TRUE(child.wait_until_slept_again(asleep)) << "not woken by chunk " << c;
    EXPECT_EQ(child.receive(0ms), std::nullopt) << "ready with chunk 3 missing";
  }
  fx.land(3);
  EXPECT_EQ(child.receive(20s), "ready");
}

TEST(ReadinessCrossProcess, FailureWakesWaitersWithTheReason) {
  Fixture fx;
  fx.land(0);
  Child child([&](Child& self) {
    ChunkReadiness map = consumer_map(self);
    self.send("waiting");
    self.send(describe(map.wait_ready(3 * kChunk, 10, ChunkReadiness::kForever)));
    // What was verified before the failure stays readable.
    self.send(describe(map.wait_ready(0, kChunk, 0s)));
  });
  fx.pass_fds(child);
  ASSERT_EQ(child.receive(20s), "waiting");
  ASSERT_GE(child.wait_until_in_futex(), 0);
  ASSERT_TRUE(
      fx.file.readiness().mark_failed("chunk 3: sha256 mismatch (registry served bad bytes)"));
  EXPECT_EQ(child.receive(20s), "failed|chunk 3: sha256 mismatch (registry served bad bytes)");
  EXPECT_EQ(child.receive(20s), "ready");
}

TEST(ReadinessCrossProcess, SeveralConsumersEachWakeForTheirOwnChunk) {
  Fixture fx;
  auto consumer = [&](uint64_t chunk) {
    return [&fx, chunk](Child& self) {
      ChunkReadiness map = consumer_map(self);
      self.send("waiting");
      self.send(describe(map.wait_ready(chunk * kChunk, 1, 60s)));
    };
  };
  Child a(consumer(1));
  Child b(consumer(8));
  fx.pass_fds(a);
  fx.pass_fds(b);
  ASSERT_EQ(a.receive(20s), "waiting");
  ASSERT_EQ(b.receive(20s), "waiting");
  const long a_asleep = a.wait_until_in_futex();
  ASSERT_GE(a_asleep, 0);
  ASSERT_GE(b.wait_until_in_futex(), 0);
  fx.land(8);
  EXPECT_EQ(b.receive(20s), "ready");
  ASSERT_TRUE(a.wait_until_slept_again(a_asleep)) << "chunk 8's wake-up did not reach a";
  EXPECT_EQ(a.receive(0ms), std::nullopt) << "a woke for b's chunk";
  fx.land(1);
  EXPECT_EQ(a.receive(20s), "ready");
}

}  // namespace
}  // namespace thaw::store
