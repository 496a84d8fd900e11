#include "daemon/network/fetch_window.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "bpf/traffic_class.h"

namespace thaw::network {
namespace {

std::uint64_t rmem_max() {
  std::ifstream in("/proc/sys/net/core/rmem_max");
  std::uint64_t v = 0;
  in >> v;
  return v;  // 0 when unreadable: SO_RCVBUF is then not set
}

// net.ipv4.tcp_rmem's maximum: the receive buffer autotuning may grow a socket to.
std::uint64_t tcp_rmem_max() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_rmem");
  std::uint64_t low = 0, initial = 0, high = 0;
  in >> low >> initial >> high;
  return high != 0 ? high : 6u << 20;  // the kernel's default when unreadable
}

// The peer's address without its port ("" if unknown): fetch sockets to one address share
// one path, whatever port each uses.
std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const void* where =
      a.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&a)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr);
  if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return "";
  return inet_ntop(a.ss_family, where, text, sizeof text) != nullptr ? text : "";
}

std::string errno_text(const char* what, std::uint64_t value) {
  int err = errno;
  return fmt::format("setsockopt({}={}) on a fetch socket: {}", what, value, std::strerror(err));
}

}  // namespace

std::expected<FetchWindow, std::string> clamp_fetch_window(int fd, std::uint64_t rate_bytes_per_s,
                                                           std::uint64_t floor_bytes,
                                                           std::uint32_t rtt_us,
                                                           std::uint32_t min_segments) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
    int err = errno;
    return std::unexpected(
        fmt::format("getsockopt(TCP_INFO) on a fetch socket: {}", std::strerror(err)));
  }
  FetchWindow w;
  w.rtt_us = rtt_us != 0 ? rtt_us : info.tcpi_rtt;
  w.rtt_us = std::max(w.rtt_us, kFetchWindowMinRttUs);
  // Never below three segments, whatever the floor: a window under one segment stalls the
  // sender on its persist timer (loopback's 64 KB segments did, 300 KB took 10 s).
  std::uint64_t floor =
      std::max<std::uint64_t>(floor_bytes, std::uint64_t{min_segments} * info.tcpi_advmss);
  w.bytes = thaw_fetch_window_bytes(rate_bytes_per_s, w.rtt_us, floor);
  int value = static_cast<int>(std::min<std::uint64_t>(w.bytes, std::numeric_limits<int>::max()));
  if (setsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &value, sizeof value) != 0)
    return std::unexpected(errno_text("TCP_WINDOW_CLAMP", w.bytes));
  // The kernel doubles SO_RCVBUF (room for skb overhead) and advertises most of it: asking
  // for 8 KB gave a 15 KB window (netns test). Half the window makes the advertised one it.
  int half = value / 2;
  if (w.bytes <= rmem_max()) {
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &half, sizeof half) != 0)
      return std::unexpected(errno_text("SO_RCVBUF", w.bytes));
    w.receive_buffer = true;
  }
  return w;
}

std::expected<void, std::string> release_fetch_window(int fd) {
  const std::uint64_t buffer = std::min<std::uint64_t>(tcp_rmem_max(), 1u << 30);
  // The kernel doubles what it is given (as autotuning's limit is the doubled size).
  int half = static_cast<int>(buffer / 2);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &half, sizeof half) != 0) {
    if (errno != EPERM) return std::unexpected(errno_text("SO_RCVBUFFORCE", buffer));
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &half, sizeof half) != 0)
      return std::unexpected(errno_text("SO_RCVBUF", buffer));
  }
  int clamp = static_cast<int>(buffer);
  if (setsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &clamp, sizeof clamp) != 0)
    return std::unexpected(errno_text("TCP_WINDOW_CLAMP", buffer));
  return {};
}

std::uint64_t fetch_window_rate(int traffic_class, std::uint32_t live_critical,
                                std::uint32_t live_background, const FetchWindowRates& rates) {
  if (traffic_class == kWindowClassCritical) {
    return live_critical == 0 ? rates.critical : rates.critical / live_critical;
  }
  if (traffic_class == kWindowClassBackground) {
    // While a cold start waits, background gets what HTB guarantees it and no more: a window
    // sized to its ceiling would keep queueing upstream, where HTB's priority cannot act.
    std::uint64_t rate = live_critical > 0 ? rates.background_yield : rates.background;
    return live_background == 0 ? rate : rate / live_background;
  }
  return 0;
}

FetchWindows::Registration& FetchWindows::Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    id_ = o.id_;
    o.owner_ = nullptr;
  }
  return *this;
}

void FetchWindows::Registration::reset() {
  if (owner_ != nullptr) owner_->remove(id_);
  owner_ = nullptr;
}

std::uint32_t FetchWindows::path_rtt_locked(const Entry& e) const {
  std::uint32_t rtt = e.connect_rtt_us;
  for (const auto& [id, other] : entries_) {
    if (other.peer != e.peer || e.peer.empty() || other.connect_rtt_us == 0) continue;
    if (rtt == 0 || other.connect_rtt_us < rtt) rtt = other.connect_rtt_us;
  }
  return rtt;  // 0: none known (clamp_fetch_window reads TCP_INFO)
}

bool FetchWindows::clamping_locked() const {
  if (when_ == ClampWhen::always || inference_active_) return true;
  // Fetches of more than one (class, model) share the link: one model's connections alone
  // compete with nothing that needs protecting.
  const Live* first = nullptr;
  for (const auto& [id, e] : entries_) {
    if (first == nullptr) {
      first = &e.live;
    } else if (e.live.traffic_class != first->traffic_class || e.live.model != first->model) {
      return true;
    }
  }
  return false;
}

std::uint64_t FetchWindows::rate_for_locked(int traffic_class) const {
  if (!clamping_locked()) return 0;
  std::uint32_t critical = 0, background = 0;
  for (const auto& [id, e] : entries_) {
    critical += e.live.traffic_class == kWindowClassCritical;
    background += e.live.traffic_class == kWindowClassBackground;
  }
  return fetch_window_rate(traffic_class, critical, background, rates_);
}

std::expected<FetchWindow, std::string> FetchWindows::clamp_locked(int fd, int traffic_class,
                                                                   std::uint64_t rate,
                                                                   std::uint32_t rtt_us) const {
  bool yielding = false;
  if (traffic_class == kWindowClassBackground) {
    for (const auto& [id, e] : entries_)
      yielding = yielding || e.live.traffic_class == kWindowClassCritical;
  }
  if (yielding) return clamp_fetch_window(fd, rate, 0, rtt_us, kYieldWindowSegments);
  return clamp_fetch_window(fd, rate, kFetchWindowFloorBytes, rtt_us);
}

std::expected<void, std::string> FetchWindows::reclamp_locked(std::uint64_t except_id) {
  std::expected<void, std::string> result;
  for (auto& [id, e] : entries_) {
    if (id == except_id) continue;
    const std::uint64_t rate = rate_for_locked(e.live.traffic_class);
    const std::uint32_t rtt = rate == 0 ? 0 : path_rtt_locked(e);
    if (rate == e.rate && rtt == e.rtt_used) continue;
    if (rate == 0) {
      // Nothing to protect any more (or no rate): back to a window as large as the kernel's.
      if (auto ok = release_fetch_window(e.live.fd); !ok) {
        ++reclamp_errors_;
        last_error_ = ok.error();
        if (result) result = std::unexpected(ok.error());
        continue;
      }
      e.live.window.bytes = 0;
      e.live.window.receive_buffer = false;
      e.rate = 0;
      e.rtt_used = 0;
      continue;
    }
    auto w = clamp_locked(e.live.fd, e.live.traffic_class, rate, rtt);
    if (!w) {
      ++reclamp_errors_;
      last_error_ = w.error();
      if (result) result = std::unexpected(w.error());
      continue;
    }
    e.live.window = *w;
    e.rate = rate;
    e.rtt_used = rtt;
  }
  return result;
}

std::expected<FetchWindows::Registration, std::string> FetchWindows::add(int fd, int traffic_class,
                                                                         std::uint32_t model) {
  std::lock_guard lock(mutex_);
  tcp_info info{};
  socklen_t len = sizeof info;
  const bool have_info = getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0;
  const int info_errno = errno;
  const std::uint64_t id = next_id_++;
  Entry e;
  e.live = Live{fd, traffic_class, model, {}};
  e.connect_rtt_us = have_info ? info.tcpi_rtt : 0;
  e.peer = peer_address(fd);
  // Left to the kernel until a clamp: the round trip at connect, which no queue of this
  // fetch's own has inflated yet, is what a later clamp computes its window from.
  e.live.window.rtt_us = e.connect_rtt_us;
  entries_.emplace(id, std::move(e));
  Entry& added = entries_.at(id);
  if (const std::uint64_t rate = rate_for_locked(traffic_class); rate != 0) {
    if (!have_info) {
      entries_.erase(id);
      return std::unexpected(
          fmt::format("getsockopt(TCP_INFO) on a fetch socket: {}", std::strerror(info_errno)));
    }
    const std::uint32_t rtt = path_rtt_locked(added);
    auto w = clamp_locked(fd, traffic_class, rate, rtt);
    if (!w) {
      entries_.erase(id);
      return std::unexpected(w.error());
    }
    added.live.window = *w;
    added.rate = rate;
    added.rtt_used = rtt;
  }
  (void)reclamp_locked(id);  // errors counted; this socket's fetch goes on
  return Registration(this, id);
}

void FetchWindows::remove(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  if (entries_.erase(id) == 0) return;
  (void)reclamp_locked(0);
}

std::expected<void, std::string> FetchWindows::set_rates(const FetchWindowRates& rates) {
  std::lock_guard lock(mutex_);
  if (rates == rates_) return {};
  rates_ = rates;
  return reclamp_locked(0);
}

FetchWindowRates FetchWindows::rates() const {
  std::lock_guard lock(mutex_);
  return rates_;
}

void FetchWindows::set_inference_active(bool active) {
  std::lock_guard lock(mutex_);
  if (active == inference_active_) return;
  inference_active_ = active;
  (void)reclamp_locked(0);  // errors counted (reclamp_errors)
}

bool FetchWindows::clamping() const {
  std::lock_guard lock(mutex_);
  return clamping_locked();
}

std::vector<FetchWindows::Live> FetchWindows::live() const {
  std::lock_guard lock(mutex_);
  std::vector<Live> out;
  for (const auto& [id, e] : entries_) out.push_back(e.live);
  return out;
}

std::uint64_t FetchWindows::reclamp_errors() const {
  std::lock_guard lock(mutex_);
  return reclamp_errors_;
}

std::string FetchWindows::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

}  // namespace thaw::network
