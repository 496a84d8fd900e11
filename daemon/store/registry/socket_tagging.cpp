#include "daemon/store/registry/socket_tagging.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "bpf/traffic_class.h"
#include "daemon/network/fetch_window.hpp"

namespace thaw::store {

std::expected<void, std::string> apply_socket_tags(int fd, const SocketTags& tags) {
  if (tags.so_mark) {
    unsigned int mark = *tags.so_mark;
    if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0) {
      int err = errno;
      return std::unexpected(fmt::format("setsockopt(SO_MARK={:#x}): {}{}", mark,
                                         std::strerror(err),
                                         err == EPERM ? " (needs CAP_NET_ADMIN)" : ""));
    }
  }
  if (tags.so_priority) {
    int priority = *tags.so_priority;
    if (setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &priority, sizeof priority) != 0) {
      int err = errno;
      return std::unexpected(fmt::format("setsockopt(SO_PRIORITY={}): {}{}", priority,
                                         std::strerror(err),
                                         err == EPERM ? " (above 6 needs CAP_NET_ADMIN)" : ""));
    }
  }
  return {};
}

std::expected<void, std::string> apply_fetch_window(int fd, const SocketTags& tags) {
  if (tags.window_rate == 0) return {};
  if (auto w = network::clamp_fetch_window(fd, tags.window_rate); !w)
    return std::unexpected(w.error());
  return {};
}

std::array<SocketTags, kFetchClassCount> shaper_socket_tags(std::uint32_t model_id,
                                                            std::uint64_t window_rate) {
  std::array<SocketTags, kFetchClassCount> tags{};
  tags[static_cast<std::size_t>(FetchClass::critical)].so_mark =
      thaw_mark_make(THAW_CLASS_CRITICAL_FETCH, model_id);
  tags[static_cast<std::size_t>(FetchClass::background)].so_mark =
      thaw_mark_make(THAW_CLASS_BACKGROUND_FETCH, model_id);
  for (auto& t : tags) t.window_rate = window_rate;
  return tags;
}

}  // namespace thaw::store
