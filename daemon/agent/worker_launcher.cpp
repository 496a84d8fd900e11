#include "daemon/agent/worker_launcher.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

extern char** environ;

namespace thaw::daemon {
namespace {

// Runs argv, waits; returns its exit status and output.
std::pair<int, std::string> run_and_wait(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return {-1, "pipe failed"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  std::string output;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) output.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  if (rc != 0) return {-1, fmt::format("cannot run {}: {}", argv[0], std::strerror(rc))};
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace

std::vector<std::string> expand_worker_command(const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& values) {
  std::vector<std::string> out;
  for (std::string arg : argv) {
    for (const auto& [name, value] : values) {
      const std::string placeholder = "{" + name + "}";
      for (std::size_t at = arg.find(placeholder); at != std::string::npos;
           at = arg.find(placeholder, at + value.size())) {
        arg.replace(at, placeholder.size(), value);
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

std::string WorkerLauncher::unit_name(const std::string& plan, std::uint32_t stage) {
  std::string unit = fmt::format("thaw-worker-{}-{}", plan, stage);
  for (char& c : unit) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) c = '_';
  }
  return unit;
}

WorkerLauncher::WorkerLauncher(std::filesystem::path log_dir, bool use_systemd)
    : log_dir_(std::move(log_dir)), use_systemd_(use_systemd) {}

WorkerLauncher::~WorkerLauncher() {
  std::vector<std::string> units;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [unit, child] : children_) {
      if (child.status.state == WorkerState::running) units.push_back(unit);
    }
  }
  if (use_systemd_) return;  // transient units outlive thawd on purpose
  for (const std::string& unit : units) (void)stop(unit);
}

std::expected<void, std::string> WorkerLauncher::launch(const WorkerSpec& spec) {
  if (spec.argv.empty()) return std::unexpected("no worker command");
  std::lock_guard lock(mutex_);
  reap_locked();
  if (auto it = children_.find(spec.unit);
      it != children_.end() && it->second.status.state == WorkerState::running) {
    return {};  // already running: a repeated task is not a second engine
  }
  if (use_systemd_) {
    std::vector<std::string> argv = {"systemd-run", "--quiet", "--collect", "--unit=" + spec.unit};
    for (const std::string& e : spec.env) argv.push_back("--setenv=" + e);
    argv.push_back("--");
    argv.insert(argv.end(), spec.argv.begin(), spec.argv.end());
    auto [rc, output] = run_and_wait(argv);
    if (rc != 0) return std::unexpected(fmt::format("systemd-run: {}", output));
    children_[spec.unit] = Child{-1, spec.gpu, {WorkerState::running, "unit started"}};
    return {};
  }
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  const std::filesystem::path log = log_dir_ / (spec.unit + ".log");
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (log_fd < 0) {
    return std::unexpected(fmt::format("{}: {}", log.string(), std::strerror(errno)));
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& add : spec.env) {
    const auto equals = add.find('=');
    if (equals == std::string::npos || equals == 0) continue;  // not NAME=VALUE
    const std::string name = add.substr(0, equals + 1);
    std::erase_if(env_strings, [&](const std::string& e) { return e.starts_with(name); });
    env_strings.push_back(add);
  }
  std::vector<char*> env, args;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  for (const std::string& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group (stop signals the whole engine), default signal mask and
  // dispositions (thawd blocks SIGTERM/SIGINT/SIGHUP for its event loop).
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (rc != 0) {
    return std::unexpected(fmt::format("cannot start {}: {}", spec.argv[0], std::strerror(rc)));
  }
  children_[spec.unit] = Child{pid, spec.gpu, {WorkerState::running, fmt::format("pid {}", pid)}};
  return {};
}

void WorkerLauncher::reap_locked() {
  for (auto& [unit, child] : children_) {
    if (child.pid <= 0 || child.status.state != WorkerState::running) continue;
    if (child.kill_at && std::chrono::steady_clock::now() >= *child.kill_at) {
      ::kill(-child.pid, SIGKILL);
      child.kill_at.reset();
    }
    int status = 0;
    if (::waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
    if (WIFEXITED(status)) {
      child.status = {WEXITSTATUS(status) == 0 ? WorkerState::exited : WorkerState::failed,
                      fmt::format("exit {}", WEXITSTATUS(status))};
    } else {
      child.status = {
          child.stopping ? WorkerState::exited : WorkerState::failed,
          fmt::format("{}signal {}", child.stopping ? "stopped by " : "", WTERMSIG(status))};
    }
  }
}

std::expected<void, std::string> WorkerLauncher::stop(const std::string& unit) {
  if (auto ok = request_stop(unit); !ok) return ok;
  // request_stop's SIGKILL comes 10 s after the SIGTERM, from status(); a little longer here.
  for (int i = 0; i < 120; ++i) {
    if (status(unit).state != WorkerState::running) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::unexpected(fmt::format("worker {} did not exit within 12 s", unit));
}

std::expected<void, std::string> WorkerLauncher::request_stop(const std::string& unit) {
  std::lock_guard lock(mutex_);
  reap_locked();
  auto it = children_.find(unit);
  if (it == children_.end()) return std::unexpected(fmt::format("no worker {}", unit));
  if (it->second.status.state != WorkerState::running) return {};
  if (use_systemd_) {
    // --no-block: systemd stops it (its own KillMode and timeouts) while we go on.
    auto [rc, output] = run_and_wait({"systemctl", "stop", "--no-block", unit + ".service"});
    if (rc != 0) return std::unexpected(fmt::format("systemctl stop {}: {}", unit, output));
    return {};
  }
  it->second.stopping = true;
  ::kill(-it->second.pid, SIGTERM);
  it->second.kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  return {};
}

WorkerStatus WorkerLauncher::status(const std::string& unit) {
  std::lock_guard lock(mutex_);
  reap_locked();
  auto it = children_.find(unit);
  if (it == children_.end()) return {};
  if (use_systemd_ && it->second.status.state == WorkerState::running) {
    auto [rc, output] = run_and_wait({"systemctl", "is-active", "--quiet", unit + ".service"});
    if (rc != 0) it->second.status = {WorkerState::exited, "unit inactive"};
  }
  return it->second.status;
}

std::vector<std::uint32_t> WorkerLauncher::busy_gpus() {
  std::lock_guard lock(mutex_);
  reap_locked();
  std::vector<std::uint32_t> out;
  for (const auto& [unit, child] : children_) {
    if (child.status.state == WorkerState::running) out.push_back(child.gpu);
  }
  return out;
}

}  // namespace thaw::daemon
