// Sending and receiving shim-protocol packets on a SOCK_SEQPACKET socket, descriptors
// included (SCM_RIGHTS). Used by thawd's shim server and by clients (the preload shim).
//
// Three levels: packets (bytes + descriptors, only the frame's limits checked: what thawd
// reads from a peer before it knows whether to decode anything), typed messages (the codec
// of shim_messages.hpp: what thawd and the shim exchange), and the untyped frame layer of
// shim_protocol.hpp (tests and tools).
#pragma once

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/proto/shim_messages.hpp"
#include "common/proto/shim_protocol.hpp"

namespace thaw::proto {

enum class ReceiveErrc { closed, io, malformed, too_many_fds };
struct ReceiveError {
  ReceiveErrc code;
  std::string message;
  std::uint16_t version = 0;
};

// One packet as it came: at most kMaxMessageBytes, at most kMaxFdsPerMessage descriptors.
struct Packet {
  std::vector<std::byte> bytes;
  std::vector<UniqueFd> fds;
};

// Receives one packet (blocking unless the socket is non-blocking: then EAGAIN is `io` with
// errno left EAGAIN). A packet over kMaxMessageBytes, or with more descriptors than
// kMaxFdsPerMessage, is an error; descriptors that came with a bad packet are closed.
std::expected<Packet, ReceiveError> receive_packet(int socket);
// Sends one packet with `fds` (at most kMaxFdsPerMessage; the caller keeps them open).
// Retries on EINTR; MSG_NOSIGNAL, so a vanished peer is an error, not SIGPIPE.
std::expected<void, std::string> send_packet(int socket, std::span<const std::byte> bytes,
                                             const std::vector<int>& fds);

// Typed: encodes `message` (with the descriptors it carries) and sends it.
std::expected<void, std::string> send(int socket, std::uint32_t request_id,
                                      const ShimMessage& message);
// Typed: receives one packet and decodes it (decode_message). A packet of another version
// is `malformed` with its version in the error.
std::expected<Envelope, ReceiveError> receive(int socket);

// The frame layer: an untyped message and the descriptors that came with it.
struct Received {
  Message message;
  std::vector<UniqueFd> fds;
};
std::expected<void, std::string> send_message(int socket, const Message& message,
                                              const std::vector<int>& fds = {});
std::expected<Received, ReceiveError> receive_message(int socket);

// Connects to thawd's socket at `path`.
std::expected<UniqueFd, std::string> connect_seqpacket(const std::string& path);

}  // namespace thaw::proto
