// The receive window a TCP peer advertised, as the sending socket sees it (tcpi_snd_wnd,
// Linux 6.2+). Its own file: <linux/tcp.h>'s tcp_info, which has the field, clashes with
// glibc's <netinet/tcp.h>, which does not.
#pragma once

#include <cstdint>
#include <optional>

namespace thaw::network::test {

// nullopt when the kernel does not report it.
std::optional<std::uint32_t> peer_advertised_window(int fd);

}  // namespace thaw::network::test
