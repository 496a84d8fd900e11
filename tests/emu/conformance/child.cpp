#include "child.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace thaw::conformance {

namespace {

using Clock = std::chrono::steady_clock;

// Output beyond this is cut from the middle: a failing test's first and last lines matter.
constexpr std::size_t kMaxOutput = 1 << 20;
// How long helpers left behind by an exited program may keep writing before they are killed.
constexpr auto kGrace = std::chrono::seconds(2);

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

void append_capped(std::string& out, const char* data, std::size_t n) {
  out.append(data, n);
  if (out.size() > kMaxOutput) {
    const std::string marker = "\n[... output cut ...]\n";
    const std::size_t keep = kMaxOutput / 2;
    out = out.substr(0, keep) + marker + out.substr(out.size() - keep);
  }
}

// Reads what is available; false at end of file.
bool drain_once(int fd, std::string& out, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  if (r <= 0) return true;  // timeout (or EINTR): come back later
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0) {
    append_capped(out, buf, static_cast<std::size_t>(n));
    return true;
  }
  return n < 0 && (errno == EINTR || errno == EAGAIN);
}

int ms_until(Clock::time_point t) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left, 100)));
}

}  // namespace

std::expected<ChildResult, std::string> run_child(const std::vector<std::string>& argv,
                                                  std::chrono::seconds timeout) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(std::string("pipe: ") + strerror(errno));
  Fd read_end(fds[0]);
  Fd write_end(fds[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const auto start = Clock::now();
  int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return std::unexpected("cannot run " + argv[0] + ": " + strerror(rc));
  write_end.reset();

  ChildResult result;
  const auto deadline = start + timeout;
  int status = 0;
  bool open = true;
  while (true) {
    if (open) {
      open = drain_once(read_end.get(), result.output, ms_until(deadline));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (Clock::now() >= deadline) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
  }
  result.elapsed = Clock::now() - start;
  const auto grace_end = Clock::now() + kGrace;
  while (open && Clock::now() < grace_end) open = drain_once(read_end.get(), result.output, 100);
  kill(-pid, SIGKILL);  // helpers that outlived it (the group is gone if none did)
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (result.timed_out) result.signal = SIGKILL;
  return result;
}

}  // namespace thaw::conformance
