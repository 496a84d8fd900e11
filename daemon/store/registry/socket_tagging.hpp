// Writing a fetch class's SO_MARK / SO_PRIORITY on a socket.
#pragma once

#include <expected>
#include <string>

#include "daemon/store/registry/fetcher_config.hpp"

namespace thaw::store {

// Sets the tags `tags` holds on `fd`; an error names the option, value and errno text
// (e.g. "setsockopt(SO_MARK=0x10): Operation not permitted (needs CAP_NET_ADMIN)").
std::expected<void, std::string> apply_socket_tags(int fd, const SocketTags& tags);

}  // namespace thaw::store
