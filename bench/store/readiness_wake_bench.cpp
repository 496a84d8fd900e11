// Wake-up latency of a consumer blocked on a chunk (issue 5, benchmark 4, second half).
//
// A consumer process waits on chunk i; the writer process stamps CLOCK_MONOTONIC and
// marks chunk i; the consumer stamps again on waking. Latency = the difference. The
// writer pauses between chunks so the consumer is really asleep each time (this
// measures a wake-up, not a lucky check).
//
// Peers, measured in the same run with the same protocol:
//   pipe      the consumer blocks in read() on a pipe the writer writes a byte to —
//             the classic kernel notification a readiness page replaces
//   poll-100us the consumer polls a progress word every 100 µs (a HydraServe-style
//             prefetcher reader: one counter in shared memory, checked by polling)
//
// Usage: readiness_wake_bench [wakes=2000]
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/readiness/chunk_readiness.hpp"

namespace {

using thaw::store::ChunkReadiness;
using thaw::store::UniqueFd;

constexpr uint64_t kChunk = 4096;

uint64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1'000'000'000 + uint64_t(t.tv_nsec);
}

// Shared between writer and consumer: the writer's stamps, the consumer's latencies,
// and an ack word the writer waits on before the next chunk.
struct Shared {
  uint32_t ack;
  uint32_t pad;
  uint64_t progress;  // for the polling peer
  uint64_t stamp[1];  // [wakes] then latency[wakes]
};

Shared* map_shared(size_t wakes) {
  const size_t bytes = sizeof(Shared) + 2 * wakes * sizeof(uint64_t);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return static_cast<Shared*>(p);
}

void ack(Shared* s, uint32_t value) {
  __atomic_store_n(&s->ack, value, __ATOMIC_RELEASE);
  ::syscall(SYS_futex, &s->ack, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void wait_ack(Shared* s, uint32_t value) {
  for (uint32_t v; (v = __atomic_load_n(&s->ack, __ATOMIC_ACQUIRE)) < value;) {
    ::syscall(SYS_futex, &s->ack, FUTEX_WAIT, v, nullptr, nullptr, 0);
  }
}

struct Method {
  std::string name;
  std::function<void(size_t i)> consumer_wait;  // in the consumer, blocks until chunk i
  std::function<void(size_t i)> writer_signal;  // in the writer, publishes chunk i
};

// Runs one method; returns latencies in ns, sorted.
std::vector<uint64_t> run(const Method& m, size_t wakes) {
  Shared* s = map_shared(wakes);
  uint64_t* stamps = s->stamp;
  uint64_t* latency = s->stamp + wakes;
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (size_t i = 0; i < wakes; ++i) {
      m.consumer_wait(i);
      const uint64_t t = now_ns();
      latency[i] = t - __atomic_load_n(&stamps[i], __ATOMIC_ACQUIRE);
      ack(s, uint32_t(i + 1));
    }
    ::_exit(0);
  }
  for (size_t i = 0; i < wakes; ++i) {
    // Let the consumer fall asleep (or into its poll sleep) before publishing.
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    __atomic_store_n(&stamps[i], now_ns(), __ATOMIC_RELEASE);
    m.writer_signal(i);
    wait_ack(s, uint32_t(i + 1));
  }
  ::waitpid(pid, nullptr, 0);
  std::vector<uint64_t> out(latency, latency + wakes);
  std::sort(out.begin(), out.end());
  return out;
}

double pct(const std::vector<uint64_t>& v, double p) {
  return double(v[std::min(v.size() - 1, size_t(p * double(v.size())))]) / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t wakes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 2000;

  UniqueFd fd(::memfd_create("readiness-bench", MFD_CLOEXEC));
  auto writer = ChunkReadiness::create(std::move(fd), "bench", wakes * kChunk, kChunk);
  if (!writer) {
    fmt::print(stderr, "{}\n", writer.error().message);
    return 1;
  }
  auto reader_fd = writer->reopen_read_only();
  auto reader = ChunkReadiness::open_reader(std::move(*reader_fd), "bench reader");
  if (!reader) return 1;

  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return 1;
  uint64_t* progress = &map_shared(1)->progress;

  std::vector<Method> methods = {
      {"thaw futex",
       [&](size_t i) {
         if (reader->wait_ready(i * kChunk, kChunk, std::chrono::seconds(10)).status !=
             thaw::store::WaitStatus::ready) {
           std::abort();
         }
       },
       [&](size_t i) {
         if (!writer->mark_verified(i)) std::abort();
       }},
      {"pipe",
       [&](size_t) {
         char c;
         if (::read(pipe_fds[0], &c, 1) != 1) std::abort();
       },
       [&](size_t) {
         if (::write(pipe_fds[1], "x", 1) != 1) std::abort();
       }},
      {"poll-100us",
       [&](size_t i) {
         while (__atomic_load_n(progress, __ATOMIC_ACQUIRE) < (i + 1) * kChunk) {
           std::this_thread::sleep_for(std::chrono::microseconds(100));
         }
       },
       [&](size_t i) { __atomic_store_n(progress, (i + 1) * kChunk, __ATOMIC_RELEASE); }},
  };

  fmt::print("wake-up latency of a consumer blocked on a chunk, {} wakes each (µs)\n", wakes);
  fmt::print("{:<12} {:>9} {:>9} {:>9} {:>9}\n", "method", "p50", "p99", "max", "p50 ratio");
  double thaw_p50 = 0;
  for (const Method& m : methods) {
    auto lat = run(m, wakes);
    const double p50 = pct(lat, 0.50);
    if (thaw_p50 == 0) thaw_p50 = p50;
    fmt::print("{:<12} {:>9.1f} {:>9.1f} {:>9.1f} {:>8.2f}x\n", m.name, p50, pct(lat, 0.99),
               double(lat.back()) / 1000.0, p50 / thaw_p50);
  }
  fmt::print("(ratio = peer p50 / thaw p50; > 1 means thaw wakes sooner)\n");
  return 0;
}
