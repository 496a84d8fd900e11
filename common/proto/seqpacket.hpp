// Sending and receiving shim-protocol messages on a SOCK_SEQPACKET socket, descriptors
// included (SCM_RIGHTS). Used by thawd's shim server and by clients (the preload shim).
#pragma once

#include <expected>
#include <string>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/proto/shim_protocol.hpp"

namespace thaw::proto {

struct Received {
  Message message;
  std::vector<UniqueFd> fds;
};

enum class ReceiveErrc { closed, io, malformed, too_many_fds };
struct ReceiveError {
  ReceiveErrc code;
  std::string message;
  std::uint16_t version = 0;
};

// Sends one message with `fds` (at most kMaxFdsPerMessage; the caller keeps them open).
// Retries on EINTR; MSG_NOSIGNAL, so a vanished peer is an error, not SIGPIPE.
std::expected<void, std::string> send_message(int socket, const Message& message,
                                              const std::vector<int>& fds = {});

// Receives one message (blocking unless the socket is non-blocking: then EAGAIN is `io`
// with errno left EAGAIN). A packet over kMaxMessageBytes, or with more descriptors than
// kMaxFdsPerMessage, is an error; descriptors that came with a bad packet are closed.
std::expected<Received, ReceiveError> receive_message(int socket);

// Connects to thawd's socket at `path`.
std::expected<UniqueFd, std::string> connect_seqpacket(const std::string& path);

}  // namespace thaw::proto
