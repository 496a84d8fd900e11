#include "tests/network/tcp_peer_window.hpp"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace thaw::network::test {

std::optional<std::uint32_t> peer_advertised_window(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  // A kernel older than the field returns a shorter struct.
  if (len < offsetof(tcp_info, tcpi_snd_wnd) + sizeof info.tcpi_snd_wnd) return std::nullopt;
  return info.tcpi_snd_wnd;
}

}  // namespace thaw::network::test
