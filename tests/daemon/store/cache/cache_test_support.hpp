// Helpers shared by the host cache suites: temporary directories, child processes
// that report back over a pipe, fd passing over SCM_RIGHTS, and a check that a child
// is asleep in futex().
#pragma once

#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/temp_dir.hpp"

namespace thaw::store::testing {

using thaw::testing::TempDir;  // the suites' shared one (tests/support)

// A forked child running `body`, which talks to the parent through line-based
// messages (and may receive descriptors over a socketpair). The child never returns
// into the test framework: it _exit()s after body.
class Child {
 public:
  using Body = std::function<void(Child&)>;

  explicit Child(Body body) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) {
      ::close(sv[0]);
      sock_ = sv[1];
      body(*this);
      ::_exit(0);
    }
    ::close(sv[1]);
    sock_ = sv[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(sock_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  void send(const std::string& line) {
    const std::string msg = line + "\n";
    size_t done = 0;
    while (done < msg.size()) {
      const ssize_t n = ::write(sock_, msg.data() + done, msg.size() - done);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  // The next line, or nullopt if none arrives within `timeout`.
  std::optional<std::string> receive(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) return std::nullopt;
      pollfd p{sock_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
        continue;
      }
      char chunk[256];
      const ssize_t n = ::read(sock_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Passes descriptors to the other side with SCM_RIGHTS, as the daemon does.
  bool send_fds(const std::vector<int>& fds) {
    char byte = 'F';
    iovec iov{&byte, 1};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    return ::sendmsg(sock_, &msg, 0) == 1;
  }

  std::vector<int> receive_fds(size_t count) {
    char byte = 0;
    iovec iov{&byte, 1};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * count));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    if (::recvmsg(sock_, &msg, MSG_CMSG_CLOEXEC) != 1) return {};
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) return {};
    std::vector<int> fds((cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    std::memcpy(fds.data(), CMSG_DATA(cmsg), sizeof(int) * fds.size());
    return fds;
  }

  // Waits (bounded) until the child is asleep in the futex() system call — the real
  // condition "blocked in wait_ready", read from /proc/<pid>/syscall, not a guess by
  // sleeping. Returns the child's voluntary context-switch count at that moment (for
  // wait_until_slept_again), or -1 if it never got there.
  long wait_until_in_futex(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const long before = voluntary_switches();
      const bool in_futex = current_syscall() == SYS_futex;
      if (in_futex && before >= 0 && voluntary_switches() == before) return before;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return -1;
  }

  // Waits (bounded) until the child, asleep in futex() with switch count `since`, has
  // been woken and gone back to sleep in futex(): proof that it saw a wake-up and did
  // not act on it.
  bool wait_until_slept_again(long since,
                              std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    if (since < 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const long now = wait_until_in_futex(std::chrono::milliseconds(100));
      if (now > since) return true;
    }
    return false;
  }

  // Waits for the child to exit; its exit status (or -1).
  int join() {
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  long current_syscall() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/syscall");
    long nr = -1;
    return in >> nr ? nr : -1;  // "running" when not in a system call
  }
  long voluntary_switches() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
    }
    return -1;
  }

  pid_t pid_ = -1;
  int sock_ = -1;
  std::string buffer_;
};

// Regular files below `dir`, relative to it.
inline std::vector<std::string> files_under(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_directory()) names.push_back(std::filesystem::relative(e.path(), dir).string());
  }
  return names;
}

// Runs `body` in a child with a private mount namespace and a `size` tmpfs at a fresh
// directory; the child reports "ok", "SKIP: why" or the failure. Nothing leaks out:
// the mount lives and dies with the child's namespace.
inline std::string on_tiny_tmpfs(const char* size,
                                 std::function<std::string(const std::filesystem::path&)> body) {
  TempDir mount_point;
  Child child([&](Child& self) {
    if (::unshare(CLONE_NEWNS) != 0) {
      self.send(std::string("SKIP: unshare(CLONE_NEWNS): ") + std::strerror(errno));
      return;
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", mount_point.path().c_str(), "tmpfs", 0,
                (std::string("size=") + size).c_str()) != 0) {
      self.send(std::string("SKIP: cannot mount a tmpfs: ") + std::strerror(errno));
      return;
    }
    self.send(body(mount_point.path()));
    ::umount(mount_point.path().c_str());
  });
  auto line = child.receive(std::chrono::seconds(60));
  child.join();
  return line.value_or("child sent nothing");
}

inline std::vector<std::byte> pattern_bytes(size_t size, uint32_t seed) {
  std::vector<std::byte> bytes(size);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return bytes;
}

}  // namespace thaw::store::testing
