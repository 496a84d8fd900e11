// TrafficShaper end to end: real veth, real HTB and IFB, the real BPF classifier, TCP and
// UDP traffic between two network namespaces (netns_fixture.hpp). Root only; skipped with the
// reason otherwise. Each test prints what it measured.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "daemon/network/fetch_window.hpp"
#include "daemon/network/inference_activity.hpp"
#include "daemon/network/traffic_shaper.hpp"
#include "tests/network/netns_fixture.hpp"
#include "tests/network/tcp_peer_window.hpp"

namespace thaw::network::test {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::uint64_t kLink = 25'000'000;        // emulated link: 200 Mbit/s (CPU-bound above)
constexpr std::uint64_t kShaped = kLink * 9 / 10;  // thaw shapes just below it
constexpr std::uint16_t kEnginePort = 8000;

// A socket created in netns ns (a socket keeps the netns it was made in).
int socket_in(const std::string& ns, int type) {
  int fd = -1;
  in_netns(ns, [&] { fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0); }).join();
  return fd;
}

sockaddr_in addr(const char* ip, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

int listener(const std::string& ns, const char* ip, std::uint16_t port) {
  int fd = socket_in(ns, SOCK_STREAM);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = addr(ip, port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 8) != 0) return -1;
  return fd;
}

void set_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// A model download: the registry (peer) answers a one-byte request by sending as fast as TCP
// lets it; the store's socket in the node carries thaw's mark for its class, set before
// connect as the store does. With thaw shaping its receive window is clamped after connect
// and before the request as thawd does it: registered with a FetchWindows
// (daemon/network/fetch_window.hpp; the store registers its sockets in
// FetchEngine::on_request_ready), which keeps it at its class's current share.
class Fetch {
 public:
  Fetch(const NetnsPair& net, std::uint16_t port, std::uint32_t mark,
        FetchWindows* windows = nullptr) {
    lfd_ = listener(net.peer, "10.77.0.2", port);
    set_timeout(lfd_, 3000);  // accept gives up if the client never connects
    server_ = std::thread([this] {
      int c = accept(lfd_, nullptr, nullptr);
      if (c < 0) return;
      set_timeout(c, 200);
      char request = 0;
      while (!stop_ && recv(c, &request, 1, 0) != 1) {
      }
      {
        std::lock_guard lock(server_mutex_);
        server_fd_ = c;
      }
      std::vector<char> buf(64 * 1024, 'm');
      while (!stop_) {
        if (paused_) {
          std::this_thread::sleep_for(1ms);
          continue;
        }
        ssize_t n = send(c, buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
      }
      std::lock_guard lock(server_mutex_);
      server_fd_ = -1;
      close(c);
    });
    cfd_ = socket_in(net.node, SOCK_STREAM);
    setsockopt(cfd_, SOL_SOCKET, SO_MARK, &mark, sizeof mark);
    set_timeout(cfd_, 200);
    sockaddr_in a = addr("10.77.0.2", port);
    connected_ = connect(cfd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (connected_ && windows != nullptr) connected_ = register_window(*windows, mark);
    connected_ = connected_ && send(cfd_, "G", 1, MSG_NOSIGNAL) == 1;
    client_ = std::thread([this] {
      std::vector<char> buf(256 * 1024);
      while (!stop_) {
        ssize_t n = recv(cfd_, buf.data(), buf.size(), 0);
        if (n > 0)
          bytes_ += static_cast<std::uint64_t>(n);
        else if (n == 0)
          break;
      }
    });
  }
  ~Fetch() {
    stop_ = true;
    client_.join();
    server_.join();
    registration_.reset();  // unregistered before the socket closes, as the store does
    close(cfd_);
    close(lfd_);
  }
  // Registers the (connected) socket with `windows` under the class and model of `mark`; a
  // live connection too (how a re-clamp of a running fetch is measured).
  bool register_window(FetchWindows& windows, std::uint32_t mark) {
    auto r = windows.add(cfd_, thaw_mark_class(mark), thaw_mark_model(mark));
    if (!r) {
      window_error_ = r.error();
      return false;
    }
    registration_ = std::move(*r);
    return true;
  }
  bool connected() const { return connected_; }
  std::uint64_t bytes() const { return bytes_; }
  // The registry stops sending (the connection stays) until resumed.
  void pause(bool paused) { paused_ = paused; }
  const std::string& window_error() const { return window_error_; }
  // The window the node's socket advertises, as the registry's socket sees it.
  std::optional<std::uint32_t> peer_window() {
    std::lock_guard lock(server_mutex_);
    return server_fd_ >= 0 ? peer_advertised_window(server_fd_) : std::nullopt;
  }

 private:
  int lfd_ = -1, cfd_ = -1;
  bool connected_ = false;
  std::string window_error_;
  FetchWindows::Registration registration_;
  std::atomic<bool> stop_{false}, paused_{false};
  std::atomic<std::uint64_t> bytes_{0};
  std::mutex server_mutex_;
  int server_fd_ = -1;
  std::thread server_, client_;
};

// Real-time priority for the calling thread (restored by the returned guard): the round
// trips measure queueing on the link, and on a shared 2-core test machine a compile next door
// would otherwise delay the measuring threads by milliseconds and read as network latency.
// Without CAP_SYS_NICE it stays as it was (the figures are then noisier).
class RealtimeThread {
 public:
  RealtimeThread() {
    pthread_getschedparam(pthread_self(), &policy_, &param_);
    sched_param rt{};
    rt.sched_priority = 10;
    active_ = pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt) == 0;
  }
  ~RealtimeThread() {
    if (active_) pthread_setschedparam(pthread_self(), policy_, &param_);
  }
  RealtimeThread(const RealtimeThread&) = delete;
  RealtimeThread& operator=(const RealtimeThread&) = delete;

 private:
  int policy_ = SCHED_OTHER;
  sched_param param_{};
  bool active_ = false;
};

// Inference: the engine (node, port 8000) answers 200-byte requests from a client in the peer
// with 200-byte responses; one request every 2 ms; round trips in microseconds.
class Inference {
 public:
  explicit Inference(const NetnsPair& net) {
    lfd_ = listener(net.node, "10.77.0.1", kEnginePort);
    set_timeout(lfd_, 3000);
    engine_ = std::thread([this] {
      RealtimeThread rt;
      int c = accept(lfd_, nullptr, nullptr);
      if (c < 0) return;
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char buf[200];
      for (;;) {
        if (recv(c, buf, sizeof buf, MSG_WAITALL) != sizeof buf) break;
        if (send(c, buf, sizeof buf, MSG_NOSIGNAL) != sizeof buf) break;
      }
      close(c);
    });
    cfd_ = socket_in(net.peer, SOCK_STREAM);
    int one = 1;
    setsockopt(cfd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in a = addr("10.77.0.1", kEnginePort);
    connected_ = connect(cfd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Inference() {
    shutdown(cfd_, SHUT_RDWR);
    close(cfd_);
    engine_.join();
    close(lfd_);
  }
  bool connected() const { return connected_; }
  struct Rtt {
    double p50 = -1, p99 = -1;  // microseconds
  };
  // Round trips measured for `d`.
  Rtt rtt_us(std::chrono::milliseconds d) {
    RealtimeThread rt;
    std::vector<double> rtt;
    char buf[200] = {};
    auto end = Clock::now() + d;
    while (Clock::now() < end) {
      auto t0 = Clock::now();
      if (send(cfd_, buf, sizeof buf, MSG_NOSIGNAL) != sizeof buf) break;
      if (recv(cfd_, buf, sizeof buf, MSG_WAITALL) != sizeof buf) break;
      rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      std::this_thread::sleep_for(2ms);
    }
    if (rtt.empty()) return {};
    std::sort(rtt.begin(), rtt.end());
    return {rtt[rtt.size() / 2], rtt[rtt.size() * 99 / 100]};
  }

 private:
  int lfd_ = -1, cfd_ = -1;
  bool connected_ = false;
  std::thread engine_;
};

double rate_over(const Fetch& f, std::chrono::milliseconds d) {
  std::uint64_t b0 = f.bytes();
  auto t0 = Clock::now();
  std::this_thread::sleep_for(d);
  return (f.bytes() - b0) / std::chrono::duration<double>(Clock::now() - t0).count();
}

std::uint64_t rx_bytes(const std::string& dev) {
  // /proc/thread-self/net: the calling thread's netns (this thread entered the node's).
  std::ifstream in("/proc/thread-self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != dev) continue;
    std::istringstream s(line.substr(colon + 1));
    std::uint64_t v = 0;
    s >> v;
    return v;
  }
  return 0;
}

class ShaperNetns : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces, qdiscs and BPF";
    if (sh("ip -V") != 0) GTEST_SKIP() << "needs ip(8) from iproute2";
    state_dir_ = fmt::format("/tmp/thaw-network-test-{}", getpid());
    setenv("THAW_NETWORK_STATE_DIR", state_dir_.c_str(), 1);
    net_ = std::make_unique<NetnsPair>(kLink);
    ASSERT_TRUE(net_->ok) << "could not build the veth pair and tbf link";
    enter_netns(net_->node);  // this thread is thawd: shaping runs in the node's netns
    settings_ = default_shaping_settings("up0", kShaped);
    settings_.inference_ports = {kEnginePort};
  }
  void TearDown() override {
    shaper_.stop();
    net_.reset();
    sh("rm -rf " + state_dir_);
  }
  void start() {
    auto st = shaper_.start(settings_);
    ASSERT_TRUE(st.has_value()) << st.error().message;
  }
  std::unique_ptr<NetnsPair> net_;
  ShapingSettings settings_;
  TrafficShaper shaper_;
  std::string state_dir_;
};

// The rates thawd gives its FetchWindows for these shaping settings (node_service.cpp).
FetchWindowRates window_rates(const ShapingSettings& s) {
  auto ceil = [&](int c) {
    return s.classes[c].ceil_bytes_per_s ? s.classes[c].ceil_bytes_per_s : s.link_bytes_per_s;
  };
  return {ceil(THAW_CLASS_CRITICAL_FETCH), ceil(THAW_CLASS_BACKGROUND_FETCH),
          s.classes[THAW_CLASS_BACKGROUND_FETCH].rate_bytes_per_s};
}

void print_windows(const FetchWindows& windows) {
  for (const auto& l : windows.live())
    fmt::print("  window of fd {} (class {}, model {}): {} B (rtt {} us)\n", l.fd, l.traffic_class,
               l.model, l.window.bytes, l.window.rtt_us);
}

// Bytes queued in the emulated uplink's buffer (the tbf on the peer's egress), the largest of
// a few samples: what waits upstream of the node, out of reach of thaw's ingress shaping.
std::uint64_t upstream_backlog_bytes(const NetnsPair& net) {
  std::uint64_t most = 0;
  for (int i = 0; i < 5; ++i) {
    std::string out = capture(fmt::format("ip netns exec {} tc -s qdisc show dev pe0", net.peer));
    auto at = out.find("backlog ");
    if (at != std::string::npos) {
      std::istringstream in(out.substr(at + 8));
      double v = 0;
      std::string unit;
      in >> v >> unit;  // "48448b" or "48Kb" / "1Mb"
      char u = unit.empty() ? 'b' : unit[0];
      if (std::isdigit(static_cast<unsigned char>(u)) || u == '.') u = 'b';
      double scale = u == 'K' ? 1024 : u == 'M' ? 1024 * 1024 : 1;
      most = std::max(most, static_cast<std::uint64_t>(v * scale));
    }
    std::this_thread::sleep_for(100ms);
  }
  return most;
}

// Idle and loaded round trips in alternating windows (the fetch paused, then sending), each
// the median over the windows: a load change on the shared machine hits both alike instead
// of whichever phase it fell in.
void alternate_rtt_us(Inference& inf, Fetch& f, Inference::Rtt& idle, Inference::Rtt& loaded) {
  constexpr int kWindows = 5;
  std::vector<double> i50, i99, l50, l99;
  for (int i = 0; i < kWindows; ++i) {
    f.pause(true);
    std::this_thread::sleep_for(200ms);  // what was in flight drains
    auto r = inf.rtt_us(600ms);
    i50.push_back(r.p50);
    i99.push_back(r.p99);
    f.pause(false);
    std::this_thread::sleep_for(400ms);  // the fetch is back at its rate
    r = inf.rtt_us(600ms);
    l50.push_back(r.p50);
    l99.push_back(r.p99);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  idle = {median(i50), median(i99)};
  loaded = {median(l50), median(l99)};
}

// What thawd does with ClampWhen::contended windows (lifecycle/thawd.cpp): samples the
// classifier's inference counter every 50 ms and tells the windows whether inference runs.
class InferenceSampler {
 public:
  InferenceSampler(const TrafficShaper& shaper, FetchWindows& windows)
      : thread_([this, &shaper, &windows] {
          InferenceActivity activity;
          while (!stop_) {
            if (auto p = shaper.class_packets(TrafficClass::inference))
              windows.set_inference_active(activity.sample(*p, InferenceActivity::Clock::now()));
            std::this_thread::sleep_for(50ms);
          }
        }) {}
  ~InferenceSampler() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(ShaperNetns, InferenceLatencyUnderSaturatingFetch) {
  std::uint32_t crit = socket_mark(TrafficClass::critical_fetch, 1);
  Inference::Rtt idle_plain, loaded_plain, idle_shaped, loaded_shaped;
  std::uint64_t backlog_plain = 0, backlog_shaped = 0;
  double rate_plain = 0, rate_shaped = 0, rate_shaped_alone = 0, rate_unclamped_alone = 0;
  {
    Inference inf(*net_);
    ASSERT_TRUE(inf.connected());
    Fetch f(*net_, 9001, crit);
    ASSERT_TRUE(f.connected());
    std::this_thread::sleep_for(1000ms);  // let the fetch fill the link's buffer
    alternate_rtt_us(inf, f, idle_plain, loaded_plain);
    backlog_plain = upstream_backlog_bytes(*net_);
    rate_plain = rate_over(f, 1000ms);
  }
  start();
  {
    // A shaped fetch alone, without and with the window clamp: the clamp must not cost the
    // fetch its goodput.
    Fetch f(*net_, 9004, crit);
    ASSERT_TRUE(f.connected());
    std::this_thread::sleep_for(500ms);
    rate_unclamped_alone = rate_over(f, 2000ms);
  }
  // Windows as thawd sets them: a FetchWindows at the shaped link's rates, clamping only
  // while inference runs (the one critical fetch then gets the class's ceiling × its round
  // trip), told so by the classifier's counter as thawd samples it.
  FetchWindows windows(window_rates(settings_), ClampWhen::contended);
  InferenceSampler sampler(shaper_, windows);
  bool clamped_alone = true;
  {
    Fetch f(*net_, 9003, crit, &windows);
    ASSERT_TRUE(f.connected()) << f.window_error();
    std::this_thread::sleep_for(500ms);
    rate_shaped_alone = rate_over(f, 2000ms);
    clamped_alone = windows.clamping();
  }
  EXPECT_FALSE(clamped_alone) << "a fetch alone on the link keeps the kernel's window";
  // The clamp itself, as the fetch gets it while inference runs, for the rate it costs.
  double rate_clamped_alone = 0;
  {
    FetchWindows always(window_rates(settings_));
    Fetch f(*net_, 9005, crit, &always);
    ASSERT_TRUE(f.connected()) << f.window_error();
    std::this_thread::sleep_for(500ms);
    rate_clamped_alone = rate_over(f, 2000ms);
  }
  FetchWindow window;
  // Up to three measurements of the shaped link, each of 5 alternating windows: on the shared
  // 2-core CI machine a compile landing in one window can double a p99 of a few hundred
  // microseconds (about 1 run in 7 without the retry). Unshaped, every attempt would be far
  // above the bound (15-64x in the runs for issue 26), so a retry cannot hide a broken shaper.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Inference inf(*net_);
    ASSERT_TRUE(inf.connected());
    Fetch f(*net_, static_cast<std::uint16_t>(9000 + 10 * attempt), crit, &windows);
    ASSERT_TRUE(f.connected()) << f.window_error();
    ASSERT_EQ(windows.live().size(), 1u);
    std::this_thread::sleep_for(1000ms);
    ASSERT_TRUE(windows.clamping()) << "inference runs: the fetch's window must be clamped";
    window = windows.live().front().window;
    alternate_rtt_us(inf, f, idle_shaped, loaded_shaped);
    backlog_shaped = upstream_backlog_bytes(*net_);
    rate_shaped = rate_over(f, 1000ms);
    fmt::print("shaped attempt {}: idle p99 {:.0f} us, under fetch {:.0f} us ({:.2f}x)\n", attempt,
               idle_shaped.p99, loaded_shaped.p99, loaded_shaped.p99 / idle_shaped.p99);
    if (loaded_shaped.p99 <= 1.5 * idle_shaped.p99) break;
  }
  fmt::print(
      "fetch alone: {:.2f} MB/s unshaped; shaped {:.2f} MB/s with the kernel's window, {:.2f} "
      "MB/s with thawd's windows (not clamped: nothing competes), {:.2f} MB/s clamped to {} B "
      "(as under inference; rtt at connect {} us, SO_RCVBUF {}); shaped link {:.2f} MB/s\n",
      rate_plain / 1e6, rate_unclamped_alone / 1e6, rate_shaped_alone / 1e6,
      rate_clamped_alone / 1e6, window.bytes, window.rtt_us,
      window.receive_buffer ? "set" : "not set", kShaped / 1e6);
  fmt::print("upstream buffer under the fetch: {} B unshaped, {} B shaped\n", backlog_plain,
             backlog_shaped);
  fmt::print(
      "inference round trip, link {} Mbit/s, p50/p99 in us (medians of 5 alternating windows): "
      "without "
      "shaping idle {:.0f}/{:.0f}, under fetch {:.0f}/{:.0f} (p99 {:.1f}x idle); with shaping "
      "idle {:.0f}/{:.0f}, under fetch {:.0f}/{:.0f} (p99 {:.2f}x idle, fetch {:.2f} MB/s)\n",
      kLink * 8 / 1'000'000, idle_plain.p50, idle_plain.p99, loaded_plain.p50, loaded_plain.p99,
      loaded_plain.p99 / idle_plain.p99, idle_shaped.p50, idle_shaped.p99, loaded_shaped.p50,
      loaded_shaped.p99, loaded_shaped.p99 / idle_shaped.p99, rate_shaped / 1e6);
  // The set-up must really contend, or the shaped figures would prove nothing.
  EXPECT_GE(loaded_plain.p50 / idle_plain.p50, 5.0) << "the unshaped fetch did not hurt inference";
  // Issue 26's acceptance: with shaping, p99 under a saturating fetch within 1.5x idle.
  EXPECT_LE(loaded_shaped.p99, 1.5 * idle_shaped.p99);
  // Alone on the link the fetch is not clamped: its goodput is the shaped link's with the
  // kernel's window (issue 26: unchanged with shaping and no competing traffic). The two are
  // measured one after the other on a shared machine: within 10 %.
  EXPECT_GE(rate_shaped_alone, 0.9 * rate_unclamped_alone)
      << "thawd's windows cost a fetch alone its rate";
  // Clamped, the fetch loses some rate: with 3 segments in flight a receiver thread late by a
  // few hundred microseconds idles the link (4-11 % lower in the runs for issue 26 on a
  // shared 2-core VM). Asserted: within 15 %.
  EXPECT_GE(rate_clamped_alone, 0.85 * rate_unclamped_alone)
      << "the window clamp cost the fetch its rate";
  EXPECT_GE(rate_shaped, 0.7 * kShaped) << "shaping must not starve the fetch";
}

TEST_F(ShaperNetns, TwoCriticalFetchesShareTheLink) {
  start();
  // Windows as thawd sets them: registered with a FetchWindows at the shaped link's rates,
  // clamped once the second model's fetch starts (each critical fetch the class's rate over
  // the two × its round trip; on this link the 3-segment floor decides). Window-limited flows queue
  // mostly upstream (the emulated switch's FIFO), not in thaw's IFB, so they share by how soon each
  // receiver reopens its window rather than by HTB's round robin: 3 of 15 single 4 s measurements
  // on the shared 2-core machine fell outside 45-55 % (43/57 at worst; issue 26 runs). Up to three
  // measurements, each printed. This retry can hide an occasional unfair run; a systematic
  // skew (every measurement outside) still fails.
  FetchWindows windows(window_rates(settings_), ClampWhen::contended);
  double share_a = 0, da = 0, db = 0;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Fetch a(*net_, static_cast<std::uint16_t>(9010 + 2 * attempt),
            socket_mark(TrafficClass::critical_fetch, 11), &windows);
    Fetch b(*net_, static_cast<std::uint16_t>(9011 + 2 * attempt),
            socket_mark(TrafficClass::critical_fetch, 12), &windows);
    ASSERT_TRUE(a.connected() && b.connected()) << a.window_error() << b.window_error();
    print_windows(windows);
    std::this_thread::sleep_for(1000ms);
    std::uint64_t a0 = a.bytes(), b0 = b.bytes();
    std::this_thread::sleep_for(4000ms);
    da = static_cast<double>(a.bytes() - a0);
    db = static_cast<double>(b.bytes() - b0);
    share_a = da / (da + db);
    fmt::print(
        "two critical fetches over 4 s (attempt {}): {:.2f} MB/s and {:.2f} MB/s, shares {:.3f} "
        "/ {:.3f}\n",
        attempt, da / 4e6, db / 4e6, share_a, 1 - share_a);
    if (std::abs(share_a - 0.5) <= 0.05) break;
  }
  EXPECT_NEAR(share_a, 0.5, 0.05) << "each should get half, within 10 % of its share";
  EXPECT_GE((da + db) / 4, 0.85 * kShaped) << "together they should fill the shaped link";
}

TEST_F(ShaperNetns, BackgroundYieldsToCriticalWithinOneSecond) {
  start();
  // Windows as thawd sets them: the background fetch alone keeps the kernel's window; it is
  // clamped to its class's guaranteed rate when the critical one registers, and released
  // when that one ends (on this link both are at the 3-segment floor, so the
  // yield is HTB's priority in the IFB). Each window-limited flow idles while its receiver is
  // late: with the 2-core machine at load average 6 (other builds), 2 of 4 single
  // measurements gave 76-89 % critical, at load 3.5 all of 9 gave 91-95 % (issue 26 runs). Up
  // to three measurements, each printed; without HTB's priority (one FIFO) the two flows
  // would split about evenly, so a retry cannot hide a broken shaper.
  FetchWindows windows(window_rates(settings_), ClampWhen::contended);
  double bg_alone = 0, link = 0, crit_share = 0, crit_rate = 0, bg_rate = 0, bg_after = 0;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const auto port = static_cast<std::uint16_t>(9020 + 2 * attempt);
    Fetch bg(*net_, port, socket_mark(TrafficClass::background_fetch, 21), &windows);
    ASSERT_TRUE(bg.connected()) << bg.window_error();
    std::this_thread::sleep_for(1500ms);
    bg_alone = rate_over(bg, 500ms);
    print_windows(windows);
    std::optional<Fetch> crit_fetch;
    crit_fetch.emplace(*net_, port + 1, socket_mark(TrafficClass::critical_fetch, 22), &windows);
    Fetch& crit = *crit_fetch;
    ASSERT_TRUE(crit.connected()) << crit.window_error();
    print_windows(windows);
    std::this_thread::sleep_for(1000ms);
    // The link's bytes by class, from the classifier's ingress counters (what arrived on the
    // uplink, headers included, before thaw's IFB queue), and the payload the fetches received.
    auto k0 = shaper_.counters();
    ASSERT_TRUE(k0.has_value());
    std::uint64_t c0 = crit.bytes(), g0 = bg.bytes();
    auto t0 = Clock::now();
    std::this_thread::sleep_for(1000ms);
    auto k1 = shaper_.counters();
    ASSERT_TRUE(k1.has_value());
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    auto wire = [&](int c) {
      return (k1->classes[THAW_DIR_INGRESS][c].bytes - k0->classes[THAW_DIR_INGRESS][c].bytes) /
             secs;
    };
    link = 0;
    for (int c = 0; c < THAW_CLASS_COUNT; ++c) link += wire(c);
    crit_share = wire(THAW_CLASS_CRITICAL_FETCH) / link;
    crit_rate = (crit.bytes() - c0) / secs;
    bg_rate = (bg.bytes() - g0) / secs;
    // The critical fetch ends: the background one's window is re-clamped to its ceiling and it
    // must take the link back (a window it yielded must not leave it stalled).
    crit_fetch.reset();
    std::this_thread::sleep_for(500ms);
    bg_after = rate_over(bg, 500ms);
    fmt::print(
        "attempt {}: background alone {:.2f} MB/s; from 1 s to 2 s after a critical fetch "
        "starts: the link carried {:.2f} MB/s, {:.1f} % of it critical; payload received: "
        "critical {:.2f} MB/s, background {:.2f} MB/s; background 0.5-1 s after it ended "
        "{:.2f} MB/s\n",
        attempt, bg_alone / 1e6, link / 1e6, 100 * crit_share, crit_rate / 1e6, bg_rate / 1e6,
        bg_after / 1e6);
    if (bg_alone >= 0.8 * kShaped && crit_share >= 0.9 && crit_rate >= 0.8 * kShaped &&
        bg_after >= 0.8 * kShaped)
      break;
  }
  EXPECT_GE(bg_alone, 0.8 * kShaped) << "alone, background should use the idle link";
  EXPECT_GE(crit_share, 0.9);
  EXPECT_GE(crit_rate, 0.8 * kShaped) << "critical should get the link, not just a share of it";
  EXPECT_GE(bg_after, 0.8 * kShaped) << "background should take the link back once critical ends";
}

TEST_F(ShaperNetns, ReclampOfALiveFetchShrinksItsAdvertisedWindowPromptly) {
  // A fetch running with the kernel's autotuned window is registered with a FetchWindows
  // mid-transfer (what happens to a live background fetch when a critical one starts): how
  // soon does the window the registry sees shrink to the clamp? Linux never retracts a window
  // it offered (net.ipv4.tcp_shrink_window = 0), so the new one shows once the data already
  // allowed has arrived.
  start();
  FetchWindows windows(window_rates(settings_));
  std::uint32_t mark = socket_mark(TrafficClass::background_fetch, 31);
  Fetch f(*net_, 9041, mark);
  ASSERT_TRUE(f.connected());
  std::this_thread::sleep_for(1000ms);  // autotuning grows the window
  std::uint32_t before = 0;
  for (int i = 0; i < 20; ++i) {
    auto w = f.peer_window();
    if (!w) GTEST_SKIP() << "the kernel does not report tcpi_snd_wnd (Linux 6.2+)";
    before = std::max(before, *w);
    std::this_thread::sleep_for(5ms);
  }
  std::uint64_t backlog_before = upstream_backlog_bytes(*net_);
  ASSERT_TRUE(f.register_window(windows, mark)) << f.window_error();
  const std::uint64_t clamp = windows.live().at(0).window.bytes;
  auto t0 = Clock::now();
  double shrunk_ms = -1;
  std::uint32_t last = 0;
  while (Clock::now() - t0 < 1000ms) {
    last = f.peer_window().value_or(0);
    if (last <= clamp) {
      shrunk_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      break;
    }
    std::this_thread::sleep_for(100us);
  }
  std::this_thread::sleep_for(200ms);
  std::uint64_t backlog_after = upstream_backlog_bytes(*net_);
  double rate_after = rate_over(f, 1000ms);
  fmt::print(
      "live re-clamp: advertised window {} B before, clamped to {} B: at or below it after "
      "{:.1f} ms (last seen {} B); upstream buffer {} B before, {} B after; fetch {:.2f} MB/s "
      "after\n",
      before, clamp, shrunk_ms, last, backlog_before, backlog_after, rate_after / 1e6);
  EXPECT_GT(before, 2 * clamp) << "autotuning should have grown the window past the clamp";
  // What the old window still allowed arrives at the shaped rate first: 1.36 MB took 88 ms
  // (3 runs for issue 26), so the bound is twice that drain time, at least 100 ms.
  const double drain_ms = 1000.0 * before / kShaped;
  EXPECT_GE(shrunk_ms, 0) << "the advertised window did not shrink within 1 s";
  EXPECT_LE(shrunk_ms, std::max(100.0, 2 * drain_ms))
      << "slower than draining the window already offered (" << drain_ms << " ms)";
  EXPECT_LE(backlog_after, 2 * clamp) << "the upstream buffer still holds the old window";
}

TEST_F(ShaperNetns, EngineCgroupIsInferenceWithoutMarksOrPorts) {
  // An engine in its own cgroup v2 (as in a systemd transient unit) sends from an unmarked
  // socket on an arbitrary port: the cgroup id alone makes its uploads inference.
  std::string root;
  for (const char* r : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"})
    if (std::filesystem::exists(std::string(r) + "/cgroup.procs") &&
        capture(fmt::format("stat -f -c %T {}", r)).find("cgroup2") != std::string::npos) {
      root = r;
      break;
    }
  if (root.empty()) GTEST_SKIP() << "no cgroup v2 hierarchy mounted";
  std::string dir = fmt::format("{}/thaw-net-test-{}", root, getpid());
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  start();
  ASSERT_TRUE(shaper_.add_inference_cgroup(st.st_ino).has_value());
  int rx = socket_in(net_->peer, SOCK_DGRAM);
  sockaddr_in to = addr("10.77.0.2", 9998);
  ASSERT_EQ(bind(rx, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  auto before = shaper_.counters();
  pid_t child = fork();
  if (child == 0) {
    std::ofstream(dir + "/cgroup.procs") << getpid() << std::endl;
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);  // made inside the cgroup: carries its id
    char buf[100] = {};
    for (int i = 0; i < 100; ++i)
      sendto(fd, buf, sizeof buf, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  auto after = shaper_.counters();
  close(rx);
  std::filesystem::remove(dir);
  ASSERT_TRUE(before && after);
  std::uint64_t inf = after->classes[THAW_DIR_EGRESS][THAW_CLASS_INFERENCE].packets -
                      before->classes[THAW_DIR_EGRESS][THAW_CLASS_INFERENCE].packets;
  fmt::print("cgroup {} ({}): {} of 100 datagrams classed inference\n", st.st_ino, dir, inf);
  EXPECT_EQ(inf, 100u);
}

TEST_F(ShaperNetns, ClassRatesChangeInPlaceAndBadRatesAreRefused) {
  start();
  auto rates = settings_.classes;
  rates[THAW_CLASS_BACKGROUND_FETCH] = ClassRate{1'000'000, 2'000'000};  // 8 / 16 Mbit
  ASSERT_TRUE(shaper_.set_class_rates(rates).has_value());
  std::string classes = net_->tc_node("class show dev up0");
  // The background class (inner) and each of its model slots (a quarter of its rate).
  EXPECT_NE(classes.find("7468:12 parent 7468:1 rate 8Mbit ceil 16Mbit"), std::string::npos)
      << classes;
  EXPECT_NE(classes.find("7468:120 parent 7468:12 prio 2 rate 2Mbit ceil 16Mbit"),
            std::string::npos)
      << classes;
  rates[THAW_CLASS_INFERENCE].rate_bytes_per_s = kShaped;  // guaranteed sum above the link
  auto bad = shaper_.set_class_rates(rates);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ShapingErrc::invalid_settings);
  EXPECT_NE(bad.error().message.find("add up to more than the link rate"), std::string::npos)
      << bad.error().message;
  EXPECT_EQ(net_->tc_node("class show dev up0"), classes) << "a refused change must change nothing";
}

TEST_F(ShaperNetns, MapCountersEqualBytesSent) {
  start();
  ASSERT_TRUE(shaper_.add_model(5).has_value());
  // Upload: UDP datagrams from a marked socket, paced below the link so nothing is dropped.
  int rx = socket_in(net_->peer, SOCK_DGRAM);
  sockaddr_in to = addr("10.77.0.2", 9999);
  ASSERT_EQ(bind(rx, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  set_timeout(rx, 500);
  std::atomic<std::uint64_t> received{0};
  std::thread receiver([&] {
    char buf[2048];
    while (recv(rx, buf, sizeof buf, 0) > 0) ++received;
  });
  int tx = socket_in(net_->node, SOCK_DGRAM);
  std::uint32_t mark = socket_mark(TrafficClass::critical_fetch, 5);
  setsockopt(tx, SOL_SOCKET, SO_MARK, &mark, sizeof mark);
  auto before = shaper_.counters();
  ASSERT_TRUE(before.has_value());
  constexpr int kDatagrams = 3000;
  constexpr std::size_t kPayload = 1000;
  std::vector<char> payload(kPayload, 'x');
  for (int i = 0; i < kDatagrams; ++i) {
    ASSERT_EQ(sendto(tx, payload.data(), kPayload, 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(kPayload));
    if (i % 10 == 9) std::this_thread::sleep_for(1ms);  // about 10 MB/s, below the link
  }
  receiver.join();
  close(tx);
  close(rx);
  auto after = shaper_.counters();
  ASSERT_TRUE(after.has_value());
  const auto& c = after->classes[THAW_DIR_EGRESS][THAW_CLASS_CRITICAL_FETCH];
  const auto& c0 = before->classes[THAW_DIR_EGRESS][THAW_CLASS_CRITICAL_FETCH];
  std::uint64_t sent_wire = received * (kPayload + 8 + 20 + 14);  // UDP + IPv4 + Ethernet
  fmt::print(
      "upload: {} datagrams received, map counts {} packets / {} bytes, wire bytes of the "
      "received datagrams {}; model 5: {} bytes\n",
      received.load(), c.packets - c0.packets, c.bytes - c0.bytes, sent_wire,
      after->model_bytes[5]);
  EXPECT_EQ(received.load(), static_cast<std::uint64_t>(kDatagrams)) << "datagrams were lost";
  EXPECT_NEAR(static_cast<double>(c.bytes - c0.bytes), static_cast<double>(sent_wire),
              0.01 * sent_wire);
  EXPECT_NEAR(static_cast<double>(after->model_bytes[5]), static_cast<double>(sent_wire),
              0.01 * sent_wire);

  // Download: a critical fetch's ingress bytes against what the uplink received.
  std::uint64_t rx0 = rx_bytes("up0");
  auto in0 = shaper_.counters()->classes[THAW_DIR_INGRESS];
  std::uint64_t payload_bytes;
  {
    Fetch f(*net_, 9031, socket_mark(TrafficClass::critical_fetch, 5));
    ASSERT_TRUE(f.connected());
    std::this_thread::sleep_for(2000ms);
    payload_bytes = f.bytes();
  }
  std::this_thread::sleep_for(100ms);
  std::uint64_t dev = rx_bytes("up0") - rx0;
  auto in1 = shaper_.counters()->classes[THAW_DIR_INGRESS];
  std::uint64_t counted = 0;
  for (std::size_t k = 0; k < kTrafficClassCount; ++k) counted += in1[k].bytes - in0[k].bytes;
  std::uint64_t crit_in =
      in1[THAW_CLASS_CRITICAL_FETCH].bytes - in0[THAW_CLASS_CRITICAL_FETCH].bytes;
  fmt::print(
      "download: payload {} bytes, up0 received {} bytes, map ingress critical {} bytes, "
      "all classes {} bytes\n",
      payload_bytes, dev, crit_in, counted);
  EXPECT_NEAR(static_cast<double>(counted), static_cast<double>(dev), 0.01 * dev);
  EXPECT_NEAR(static_cast<double>(crit_in), static_cast<double>(dev), 0.01 * dev);
  EXPECT_GE(crit_in, payload_bytes);
}

TEST_F(ShaperNetns, TwoModelsFetchedAtOnceAreCountedApart) {
  // thawd gives each fetched model an id in its sockets' marks and registers it with the
  // classifier (NodeService::model_id_locked, NodeShaping::register_model): two models
  // downloading at once on one link, each model's counter against its own payload.
  start();
  ASSERT_TRUE(shaper_.add_model(41).has_value());
  ASSERT_TRUE(shaper_.add_model(42).has_value());
  FetchWindows windows(window_rates(settings_));
  auto k0 = shaper_.counters();
  ASSERT_TRUE(k0.has_value());
  std::uint64_t pa = 0, pb = 0;
  {
    Fetch a(*net_, 9051, socket_mark(TrafficClass::critical_fetch, 41), &windows);
    Fetch b(*net_, 9052, socket_mark(TrafficClass::background_fetch, 42), &windows);
    ASSERT_TRUE(a.connected() && b.connected()) << a.window_error() << b.window_error();
    std::this_thread::sleep_for(2000ms);
    b.pause(true);  // unequal payloads: the counters must follow each model, not split evenly
    std::this_thread::sleep_for(500ms);
    a.pause(true);
    std::this_thread::sleep_for(300ms);  // what was in flight arrives; then nothing moves
    pa = a.bytes();
    pb = b.bytes();
  }
  std::this_thread::sleep_for(100ms);
  auto k1 = shaper_.counters();
  ASSERT_TRUE(k1.has_value());
  auto model = [&](std::uint16_t id) { return k1->model_bytes[id] - k0->model_bytes[id]; };
  std::uint64_t fetch_classes = 0;
  for (int dir = 0; dir < 2; ++dir)
    for (int c : {THAW_CLASS_CRITICAL_FETCH, THAW_CLASS_BACKGROUND_FETCH})
      fetch_classes += k1->classes[dir][c].bytes - k0->classes[dir][c].bytes;
  fmt::print(
      "two models at once: model 41 payload {} B, counted {} B; model 42 payload {} B, counted "
      "{} B; fetch classes {} B\n",
      pa, model(41), pb, model(42), fetch_classes);
  // A model's counter holds its payload plus TCP/IP/Ethernet headers of its segments and
  // ACKs (about 5 % at a 1448-byte MSS) and the closing handshake.
  for (auto [id, payload] : {std::pair<std::uint16_t, std::uint64_t>{41, pa}, {42, pb}}) {
    EXPECT_GE(model(id), payload) << "model " << id;
    EXPECT_LE(model(id), payload * 1.10 + 10'000) << "model " << id;
  }
  EXPECT_NEAR(static_cast<double>(model(41) + model(42)), static_cast<double>(fetch_classes),
              0.01 * fetch_classes)
      << "every fetch byte belongs to one of the two models";
}

TEST_F(ShaperNetns, StopKeepsOtherFiltersAndRemovesOwnObjects) {
  // Someone else's filter on the uplink's clsact before thawd starts.
  ASSERT_EQ(sh(fmt::format("ip netns exec {} tc qdisc add dev up0 clsact", net_->node)), 0);
  ASSERT_EQ(sh(fmt::format("ip netns exec {} tc filter add dev up0 egress prio 1 u32 match u32 "
                           "0 0 classid 1:1",
                           net_->node)),
            0);
  start();
  std::string during = net_->tc_node("filter show dev up0 egress");
  EXPECT_NE(during.find("u32"), std::string::npos) << during;
  EXPECT_NE(during.find("thaw_egress"), std::string::npos) << during;
  EXPECT_NE(net_->tc_node("qdisc show").find("htb 7468:"), std::string::npos);
  shaper_.stop();
  std::string after = net_->tc_node("filter show dev up0 egress");
  EXPECT_NE(after.find("u32"), std::string::npos) << "the other filter must stay: " << after;
  EXPECT_EQ(after.find("thaw_egress"), std::string::npos) << after;
  std::string qd = net_->tc_node("qdisc show");
  EXPECT_EQ(qd.find("htb"), std::string::npos) << qd;
  EXPECT_NE(qd.find("clsact"), std::string::npos) << "the clsact was not ours to remove: " << qd;
  EXPECT_EQ(capture(fmt::format("ip -n {} link show", net_->node)).find("thifb"),
            std::string::npos);
}

TEST_F(ShaperNetns, StartAfterCrashRemovesLeftovers) {
  pid_t child = fork();
  if (child == 0) {
    auto* leaked = new TrafficShaper;  // never stopped: what a SIGKILLed thawd leaves
    _exit(leaked->start(settings_).has_value() ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::string left = net_->tc_node("qdisc show") + net_->tc_node("filter show dev up0 ingress");
  EXPECT_NE(left.find("htb 7468:"), std::string::npos) << left;
  EXPECT_NE(left.find("thaw_ingress"), std::string::npos) << left;
  start();
  std::string filters = net_->tc_node("filter show dev up0 ingress");
  // Exactly one thaw filter (the new one), not the dead thawd's next to it.
  EXPECT_EQ(filters.find("handle 0x7468"), filters.rfind("handle 0x7468")) << filters;
  EXPECT_NE(filters.find("handle 0x7468"), std::string::npos) << filters;
  shaper_.stop();
  std::string qd = net_->tc_node("qdisc show");
  EXPECT_EQ(qd.find("htb"), std::string::npos) << qd;
  EXPECT_EQ(qd.find("clsact"), std::string::npos) << "thaw made this clsact: " << qd;
  EXPECT_EQ(capture(fmt::format("ip -n {} link show", net_->node)).find("thifb"),
            std::string::npos);
}

TEST_F(ShaperNetns, WithoutPerfmonTheClassifierIsNotLoadedAndSaysWhy) {
  // CAP_BPF and CAP_NET_ADMIN alone: the verifier would refuse the packet-pointer arithmetic.
  pid_t child = fork();
  if (child == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    syscall(SYS_capget, &hdr, data);
    data[38 / 32].effective &= ~(1u << (38 % 32));  // CAP_PERFMON
    data[CAP_SYS_ADMIN / 32].effective &= ~(1u << (CAP_SYS_ADMIN % 32));
    if (syscall(SYS_capset, &hdr, data) != 0) _exit(3);
    TrafficShaper s;
    auto r = s.start(settings_);
    if (r) _exit(4);
    fmt::print("without CAP_PERFMON: {}\n", r.error().message);
    _exit(r.error().code == ShapingErrc::no_permission &&
                  r.error().message.find("CAP_PERFMON") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(net_->tc_node("qdisc show").find("htb"), std::string::npos);
}

TEST_F(ShaperNetns, WithoutCapabilitiesShapingIsOffAndSaysWhy) {
  pid_t child = fork();
  if (child == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    syscall(SYS_capget, &hdr, data);
    data[CAP_NET_ADMIN / 32].effective &= ~(1u << (CAP_NET_ADMIN % 32));
    data[39 / 32].effective &= ~(1u << (39 % 32));  // CAP_BPF
    if (syscall(SYS_capset, &hdr, data) != 0) _exit(3);
    TrafficShaper s;
    auto r = s.start(settings_);
    if (r || r.error().code != ShapingErrc::no_permission) _exit(1);
    fmt::print("without capabilities: {}\n", r.error().message);
    _exit(r.error().message.find("CAP_NET_ADMIN") != std::string::npos ? 0 : 2);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(net_->tc_node("qdisc show").find("htb"), std::string::npos);
}

}  // namespace
}  // namespace thaw::network::test
