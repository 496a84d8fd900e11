// FetchWindows on loopback TCP connections (no root): each class's share split over its live
// sockets, background cut to its guaranteed rate while a critical fetch lives, the windows
// re-clamped when the set or the rates change, read back with getsockopt(TCP_WINDOW_CLAMP).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "bpf/traffic_class.h"
#include "daemon/network/fetch_window.hpp"

namespace thaw::network {
namespace {

TEST(FetchWindowRate, ClassShareOverItsLiveSockets) {
  const FetchWindowRates r{1'000'000, 800'000, 50'000};
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_CRITICAL_FETCH, 1, 0, r), 1'000'000u);
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_CRITICAL_FETCH, 4, 3, r), 250'000u);
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_BACKGROUND_FETCH, 0, 2, r), 400'000u);
  // A critical fetch lives: background gets its guaranteed rate, split.
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_BACKGROUND_FETCH, 1, 2, r), 25'000u);
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_INFERENCE, 1, 1, r), 0u);
  EXPECT_EQ(fetch_window_rate(THAW_CLASS_CRITICAL_FETCH, 1, 0, FetchWindowRates{}), 0u)
      << "no rates: windows are left to the kernel";
}

// A connected loopback pair; the client end is what a fetcher registers.
struct Connection {
  int listen_fd = -1, client = -1, server = -1;
  Connection() {
    listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd, 1);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
      server = ::accept(listen_fd, nullptr, nullptr);
  }
  ~Connection() {
    for (int fd : {client, server, listen_fd})
      if (fd >= 0) ::close(fd);
  }
};

int window_clamp(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  getsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &v, &len);
  return v;
}

std::optional<FetchWindows::Live> find(const FetchWindows& w, int fd) {
  for (const auto& l : w.live())
    if (l.fd == fd) return l;
  return std::nullopt;
}

// Rates far above loopback's floor of 3 x 64 KB segments, so the shares show in the windows:
// 1 TB/s x a round trip of tens of microseconds is tens of MB.
constexpr FetchWindowRates kRates{1'000'000'000'000, 1'000'000'000'000, 40'000'000'000};

TEST(FetchWindows, SharesFollowTheLiveSetAndTheRates) {
  Connection a, b, g;
  ASSERT_TRUE(a.server >= 0 && b.server >= 0 && g.server >= 0);
  FetchWindows windows(kRates);
  auto ra = windows.add(a.client, THAW_CLASS_CRITICAL_FETCH, 7);
  ASSERT_TRUE(ra.has_value()) << ra.error();
  auto alone = find(windows, a.client);
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->model, 7u);
  EXPECT_EQ(static_cast<std::uint64_t>(window_clamp(a.client)), alone->window.bytes);
  const std::uint32_t rtt = alone->window.rtt_us;
  ASSERT_GT(rtt, 0u) << "loopback's handshake gives a round trip";
  EXPECT_EQ(alone->window.bytes, thaw_fetch_window_bytes(kRates.critical, rtt, 0));

  // A second critical fetch: the first one's window halves (same round trip as at connect).
  std::optional<FetchWindows::Registration> rb;
  {
    auto r = windows.add(b.client, THAW_CLASS_CRITICAL_FETCH, 8);
    ASSERT_TRUE(r.has_value()) << r.error();
    rb = std::move(*r);
  }
  EXPECT_EQ(find(windows, a.client)->window.bytes,
            thaw_fetch_window_bytes(kRates.critical / 2, rtt, 0));
  EXPECT_EQ(static_cast<std::uint64_t>(window_clamp(a.client)),
            thaw_fetch_window_bytes(kRates.critical / 2, rtt, 0));

  // A background fetch while critical ones live: its class's guaranteed rate.
  auto rg = windows.add(g.client, THAW_CLASS_BACKGROUND_FETCH, 9);
  ASSERT_TRUE(rg.has_value()) << rg.error();
  const auto bg = *find(windows, g.client);
  const std::uint64_t yielding = bg.window.bytes;
  EXPECT_LT(yielding, find(windows, a.client)->window.bytes);

  // Both critical fetches end: the background one gets its ceiling, and the window grows.
  ra->reset();
  rb.reset();
  ASSERT_EQ(windows.live().size(), 1u);
  const std::uint64_t alone_bg = find(windows, g.client)->window.bytes;
  EXPECT_EQ(alone_bg, thaw_fetch_window_bytes(kRates.background, bg.window.rtt_us, 0));
  EXPECT_GT(alone_bg, yielding);
  EXPECT_EQ(static_cast<std::uint64_t>(window_clamp(g.client)), alone_bg);

  // New class rates (the coordinator's): the live socket follows.
  FetchWindowRates lower = kRates;
  lower.background /= 4;
  ASSERT_TRUE(windows.set_rates(lower).has_value());
  EXPECT_EQ(find(windows, g.client)->window.bytes,
            thaw_fetch_window_bytes(lower.background, bg.window.rtt_us, 0));
  EXPECT_EQ(windows.reclamp_errors(), 0u) << windows.last_error();
  rg->reset();
  EXPECT_TRUE(windows.live().empty());
}

TEST(FetchWindows, ASocketThatCannotBeClampedIsRefusedAndNotRegistered) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  FetchWindows windows(kRates);
  auto r = windows.add(p[0], THAW_CLASS_CRITICAL_FETCH);
  ::close(p[0]);
  ::close(p[1]);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().find("TCP_INFO"), std::string::npos) << r.error();
  EXPECT_TRUE(windows.live().empty());
}

TEST(FetchWindows, WithoutRatesSocketsAreRegisteredButLeftToTheKernel) {
  Connection a;
  ASSERT_GE(a.server, 0);
  const int before = window_clamp(a.client);
  FetchWindows windows;
  auto r = windows.add(a.client, THAW_CLASS_CRITICAL_FETCH);
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_EQ(window_clamp(a.client), before);
  ASSERT_TRUE(windows.set_rates(kRates).has_value());  // shaping's rates arrive later
  EXPECT_GT(find(windows, a.client)->window.bytes, 0u);
  EXPECT_EQ(static_cast<std::uint64_t>(window_clamp(a.client)),
            find(windows, a.client)->window.bytes);
}

}  // namespace
}  // namespace thaw::network

namespace thaw::network {
namespace {

int receive_buffer(int fd) {
  int v = 0;
  socklen_t len = sizeof v;
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &len);
  return v;
}

// thawd's mode: one model's fetch alone keeps the kernel's window (a clamp would only cost it
// goodput); inference traffic clamps it, and its end releases it to a buffer as large as
// autotuning's.
TEST(FetchWindows, WhenContendedAFetchAloneIsClampedOnlyWhileInferenceRuns) {
  Connection a, b;
  ASSERT_TRUE(a.server >= 0 && b.server >= 0);
  const int clamp_before = window_clamp(a.client), buffer_before = receive_buffer(a.client);
  // 1 GB/s: clamped windows of a few hundred KB, below what a release gives back.
  constexpr FetchWindowRates kGigabyte{1'000'000'000, 1'000'000'000, 40'000'000};
  FetchWindows windows(kGigabyte, ClampWhen::contended);
  auto ra = windows.add(a.client, THAW_CLASS_CRITICAL_FETCH, 7);
  auto rb = windows.add(b.client, THAW_CLASS_CRITICAL_FETCH, 7);  // the same model's second
  ASSERT_TRUE(ra.has_value() && rb.has_value());
  EXPECT_FALSE(windows.clamping());
  EXPECT_EQ(find(windows, a.client)->window.bytes, 0u);
  EXPECT_GT(find(windows, a.client)->window.rtt_us, 0u) << "the round trip at connect, kept";
  EXPECT_EQ(window_clamp(a.client), clamp_before);
  EXPECT_EQ(receive_buffer(a.client), buffer_before);

  windows.set_inference_active(true);
  EXPECT_TRUE(windows.clamping());
  const std::uint64_t clamped = find(windows, a.client)->window.bytes;
  EXPECT_GE(clamped, thaw_fetch_window_bytes(kGigabyte.critical / 2,
                                             find(windows, a.client)->window.rtt_us, 0))
      << "at least the share's window (loopback's 3-segment floor may be more)";
  EXPECT_TRUE(find(windows, a.client)->window.receive_buffer);
  EXPECT_EQ(static_cast<std::uint64_t>(window_clamp(a.client)), clamped);
  const int clamped_buffer = receive_buffer(a.client);

  windows.set_inference_active(false);
  EXPECT_FALSE(windows.clamping());
  EXPECT_EQ(find(windows, a.client)->window.bytes, 0u);
  EXPECT_GT(static_cast<std::uint64_t>(window_clamp(a.client)), clamped);
  EXPECT_GT(receive_buffer(a.client), clamped_buffer);
  EXPECT_GE(receive_buffer(b.client), buffer_before) << "released to at least the default";
  EXPECT_EQ(windows.reclamp_errors(), 0u) << windows.last_error();
}

// Fetches of two models, or of both fetch classes, share the link by the classes' rates:
// clamped while they overlap, released when one is left.
TEST(FetchWindows, WhenContendedFetchesOfTwoModelsOrClassesAreClamped) {
  Connection a, c, g;
  ASSERT_TRUE(a.server >= 0 && c.server >= 0 && g.server >= 0);
  FetchWindows windows(kRates, ClampWhen::contended);
  auto ra = windows.add(a.client, THAW_CLASS_CRITICAL_FETCH, 7);
  ASSERT_TRUE(ra.has_value());
  EXPECT_EQ(find(windows, a.client)->window.bytes, 0u);
  {
    auto rc = windows.add(c.client, THAW_CLASS_CRITICAL_FETCH, 8);
    ASSERT_TRUE(rc.has_value());
    EXPECT_TRUE(windows.clamping());
    EXPECT_GT(find(windows, a.client)->window.bytes, 0u);
    EXPECT_GT(find(windows, c.client)->window.bytes, 0u);
  }
  EXPECT_FALSE(windows.clamping());
  EXPECT_EQ(find(windows, a.client)->window.bytes, 0u);
  auto rg = windows.add(g.client, THAW_CLASS_BACKGROUND_FETCH, 7);
  ASSERT_TRUE(rg.has_value());
  EXPECT_TRUE(windows.clamping());
  EXPECT_GT(find(windows, a.client)->window.bytes, 0u);
  EXPECT_LT(find(windows, g.client)->window.bytes, find(windows, a.client)->window.bytes)
      << "background yields to the critical fetch";
  EXPECT_EQ(windows.reclamp_errors(), 0u) << windows.last_error();
}

}  // namespace
}  // namespace thaw::network
