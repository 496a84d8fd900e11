#include "common/proto/seqpacket.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace thaw::proto {

std::expected<void, std::string> send_packet(int socket, std::span<const std::byte> bytes,
                                             const std::vector<int>& fds) {
  if (fds.size() > kMaxFdsPerMessage) {
    return std::unexpected(
        fmt::format("{} descriptors in one message; at most {}", fds.size(), kMaxFdsPerMessage));
  }
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL) >= 0) return {};
    if (errno != EINTR) return std::unexpected(fmt::format("send: {}", std::strerror(errno)));
  }
}

std::expected<Packet, ReceiveError> receive_packet(int socket) {
  // One byte more than the limit, so an oversized packet shows as MSG_TRUNC.
  Packet out;
  out.bytes.resize(kMaxMessageBytes + 1);
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage));
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return std::unexpected(ReceiveError{ReceiveErrc::io, std::strerror(errno)});
  // Every descriptor the kernel installed is owned before anything is decided about the
  // packet, so each early return below closes them. (An empty packet is one such case:
  // SOCK_SEQPACKET delivers a zero-length message with descriptors attached, and it reads
  // as 0 bytes just like the peer's close — returning before this loop leaked them.)
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0 && out.fds.empty() && (msg.msg_flags & MSG_CTRUNC) == 0) {
    // A close, or an empty message without descriptors: both end the conversation.
    return std::unexpected(ReceiveError{ReceiveErrc::closed, "peer closed"});
  }
  if (n == 0) {
    return std::unexpected(ReceiveError{ReceiveErrc::malformed,
                                        "an empty message carrying descriptors (closed unread)"});
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return std::unexpected(
        ReceiveError{ReceiveErrc::too_many_fds,
                     fmt::format("more than {} descriptors in one message", kMaxFdsPerMessage)});
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    return std::unexpected(ReceiveError{ReceiveErrc::malformed,
                                        fmt::format("message over {} bytes", kMaxMessageBytes)});
  }
  out.bytes.resize(static_cast<std::size_t>(n));
  return out;
}

std::expected<void, std::string> send(int socket, std::uint32_t request_id,
                                      const ShimMessage& message) {
  std::vector<std::byte> bytes;
  std::vector<int> fds;
  if (auto e = encode_message(request_id, message, bytes, fds); !e.empty()) {
    return std::unexpected(std::move(e));
  }
  return send_packet(socket, bytes, fds);
}

std::expected<Envelope, ReceiveError> receive(int socket) {
  auto packet = receive_packet(socket);
  if (!packet) return std::unexpected(std::move(packet.error()));
  Envelope out;
  if (auto e = decode_message(packet->bytes, std::move(packet->fds), out); !e.empty()) {
    FrameHeader header;
    FrameErrc code;
    (void)read_frame_header(packet->bytes, header, code);
    return std::unexpected(ReceiveError{ReceiveErrc::malformed, std::move(e), header.version});
  }
  return out;
}

std::expected<void, std::string> send_message(int socket, const Message& message,
                                              const std::vector<int>& fds) {
  auto bytes = encode(message);
  if (!bytes) return std::unexpected(bytes.error());
  return send_packet(socket, *bytes, fds);
}

std::expected<Received, ReceiveError> receive_message(int socket) {
  auto packet = receive_packet(socket);
  if (!packet) return std::unexpected(std::move(packet.error()));
  auto decoded = decode(packet->bytes);
  if (!decoded) {
    return std::unexpected(
        ReceiveError{ReceiveErrc::malformed, decoded.error().message, decoded.error().version});
  }
  return Received{std::move(*decoded), std::move(packet->fds)};
}

std::expected<UniqueFd, std::string> connect_seqpacket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return std::unexpected(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return std::unexpected(fmt::format("socket path {} is too long", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return std::unexpected(
        fmt::format("connecting to {}: {} (is thawd running?)", path, std::strerror(errno)));
  }
  return fd;
}

}  // namespace thaw::proto
