// IpcExports: CUDA IPC of deterministic-layout memory, carried by thawd. The shim turns
// cuIpcGetMemHandle of VMM memory into a POSIX-fd export, hands the descriptor to thawd
// and puts the token thawd answers into the 64-byte IPC handle; the process that opens
// the handle asks thawd for the descriptor by that token (a descriptor cannot travel
// inside the handle's bytes, which engines pass around as plain data).
//
// An export lives until the connection that made it closes (the exporting process exits
// or frees the memory: CUDA IPC handles are not valid past the exporter's allocation
// either). Tokens are random, so a handle cannot be guessed from another.
//
// What thawd holds for a client must end when the client does, so only descriptors that
// can be a VMM export are taken: a regular file (the emulator exports a memfd) or a
// character device (NVIDIA's driver exports a descriptor of /dev/nvidia*). A socket is
// refused above all — the client's own connection passed here would keep itself open
// forever, and with it every slot and page the client held — and so are pipes, FIFOs,
// directories and anonymous inodes (eventfd, epoll...), which no driver returns. How many
// descriptors are held is bounded per connection and in all.
#pragma once

#include <cstdint>
#include <map>

#include "common/fd/unique_fd.hpp"
#include "daemon/service/service_error.hpp"

namespace thaw::daemon {

class IpcExports {
 public:
  static constexpr std::size_t kMaxPerConnection = 4096;
  // Far below the RLIMIT_NOFILE thawd runs with (thawd.service: 1048576), so exports can
  // never starve thawd of the descriptors its cache and slots need.
  static constexpr std::size_t kMaxTotal = 16384;

  ServiceResult<std::uint64_t> add(std::uint64_t connection, UniqueFd fd, std::uint64_t bytes);

  struct Export {
    int fd;  // owned by the registry
    std::uint64_t bytes;
  };
  ServiceResult<Export> find(std::uint64_t token) const;

  // Drops every export `connection` made; returns how many.
  std::size_t drop_connection(std::uint64_t connection);
  std::size_t size() const { return exports_.size(); }

 private:
  struct Entry {
    std::uint64_t connection;
    UniqueFd fd;
    std::uint64_t bytes;
  };
  std::map<std::uint64_t, Entry> exports_;               // by token
  std::map<std::uint64_t, std::size_t> per_connection_;  // exports held, by connection
};

}  // namespace thaw::daemon
