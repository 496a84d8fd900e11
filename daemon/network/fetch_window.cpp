#include "daemon/network/fetch_window.hpp"

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

std::string errno_text(const char* what, std::uint64_t value) {
  int err = errno;
  return fmt::format("setsockopt({}={}) on a fetch socket: {}", what, value, std::strerror(err));
}

}  // namespace

std::expected<FetchWindow, std::string> clamp_fetch_window(int fd, std::uint64_t rate_bytes_per_s,
                                                           std::uint64_t floor_bytes) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) {
    int err = errno;
    return std::unexpected(
        fmt::format("getsockopt(TCP_INFO) on a fetch socket: {}", std::strerror(err)));
  }
  FetchWindow w;
  w.rtt_us = info.tcpi_rtt;
  // Never below three segments, whatever the floor: a window under one segment stalls the
  // sender on its persist timer (loopback's 64 KB segments did, 300 KB took 10 s).
  std::uint64_t floor = std::max<std::uint64_t>(floor_bytes, 3ull * info.tcpi_advmss);
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

}  // namespace thaw::network
