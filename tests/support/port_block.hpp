// A block of consecutive loopback TCP ports below the ephemeral range, leased to this test
// process alone for its lifetime.
//
// Why: a test whose coordinator hands out worker ports from a range (`--worker-ports BASE
// --worker-port-count N`) needs a range no other test process uses at the same time. Ports
// from bind(0) are not consecutive, and a range derived from the pid collides when two
// processes' pids agree modulo the number of blocks (CI ran two such tests at once, their
// stages wired to each other's peers). Each block has a lock file under /tmp; a process holds
// an flock on it, so concurrent test processes (ctest -j) never share a block, and the lock
// goes with the process, however it ends. The ports are below 32768 so that a stage
// connecting to a peer that is not listening yet is never given that port as its own source
// (TCP self-connect).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace thaw::testing {

class PortBlock {
 public:
  static constexpr int kFirst = 20000;
  static constexpr int kEnd = 32768;  // the default ip_local_port_range begins here

  explicit PortBlock(int count = 16) : count_(count) {
    const std::filesystem::path dir = "/tmp/thaw-test-ports";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ::chmod(dir.c_str(), 01777);
    const int blocks = (kEnd - kFirst) / count_;
    // Start at a pid-derived block so that processes rarely contend for the same lock, and
    // one further on for each block this process has leased before: a test's ports are not
    // the ones the previous test's engines were using a moment ago.
    static int leased_before = 0;
    const int start = (static_cast<int>(::getpid()) + leased_before++) % blocks;
    for (int i = 0; i < blocks; ++i) {
      const int base = kFirst + ((start + i) % blocks) * count_;
      const std::string lock =
          (dir / (std::to_string(base) + "-" + std::to_string(count_))).string();
      const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && all_free(base)) {
        fd_ = fd;
        base_ = base;
        return;
      }
      ::close(fd);
    }
    throw std::runtime_error("no free block of " + std::to_string(count_) +
                             " loopback ports in 20000..32767 (see /tmp/thaw-test-ports)");
  }
  ~PortBlock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  PortBlock(const PortBlock&) = delete;
  PortBlock& operator=(const PortBlock&) = delete;

  int base() const { return base_; }
  int count() const { return count_; }

 private:
  // Every port of the block can be bound now (not held by something outside this scheme).
  bool all_free(int base) const {
    for (int port = base; port < base + count_; ++port) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return false;
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<std::uint16_t>(port));
      const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      ::close(fd);
      if (!ok) return false;
    }
    return true;
  }

  int count_;
  int base_ = -1;
  int fd_ = -1;
};

}  // namespace thaw::testing
