// Writing a fetch class's SO_MARK / SO_PRIORITY on a socket.
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <string>

#include "daemon/store/registry/fetcher_config.hpp"

namespace thaw::store {

// Sets the tags `tags` holds on `fd`; an error names the option, value and errno text
// (e.g. "setsockopt(SO_MARK=0x10): Operation not permitted (needs CAP_NET_ADMIN)").
std::expected<void, std::string> apply_socket_tags(int fd, const SocketTags& tags);

// The SO_MARK of each fetch class as thaw's tc classifier reads it (bpf/traffic_class.h):
// critical fetch for FetchClass::critical, background fetch for FetchClass::background,
// `model_id` (0: none) in the mark's model bits for the classifier's per-model counters.
// Only for a thawd that shapes: setting SO_MARK needs CAP_NET_ADMIN, and a fetch fails
// (FetchErrc::socket_tag) where it cannot. `window_rate` (bytes/s, 0: none): each class's
// fetch sockets get their receive window clamped to it × RTT (SocketTags::window_rate).
std::array<SocketTags, kFetchClassCount> shaper_socket_tags(std::uint32_t model_id = 0,
                                                            std::uint64_t window_rate = 0);

// Clamps a connected fetch socket's receive window for `tags` (nothing when its window_rate is
// 0); an error names the option and errno text.
std::expected<void, std::string> apply_fetch_window(int fd, const SocketTags& tags);

}  // namespace thaw::store
