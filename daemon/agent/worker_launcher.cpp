#include "daemon/agent/worker_launcher.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon/log/log.hpp"

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

// clone3's arguments as <linux/sched.h> (5.7+) lays them out; that header clashes with
// glibc's <sched.h>, and glibc has no clone3 wrapper.
struct CloneArgs {
  std::uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;

struct SpawnFailure {
  bool in_clone = false;  // clone3 itself failed (old kernel, no permission on the cgroup)
  int error = 0;
};

// Starts argv (a path, as posix_spawn) as a child that is in the cgroup `cgroup_fd` from its
// first instruction, in its own process group, with default signal mask and dispositions,
// stdin /dev/null and stdout/stderr on log_fd. Between clone and exec the child makes only
// async-signal-safe calls (thawd has threads); an exec failure comes back over a CLOEXEC
// pipe, so the caller learns it as posix_spawn's callers do.
std::expected<pid_t, SpawnFailure> spawn_into_cgroup(int cgroup_fd, char* const* argv,
                                                     char* const* envp, int log_fd) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return std::unexpected(SpawnFailure{false, errno});
  CloneArgs args{};
  args.flags = kCloneIntoCgroup;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<std::uint64_t>(cgroup_fd);
  const long pid = ::syscall(SYS_clone3, &args, sizeof(args));
  if (pid == 0) {
    ::close(report[0]);
    ::setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);  // KILL/STOP: EINVAL
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(log_fd, STDOUT_FILENO) < 0 ||
        ::dup2(log_fd, STDERR_FILENO) < 0) {
      const int e = errno;
      (void)!::write(report[1], &e, sizeof(e));
      ::_exit(127);
    }
    ::execve(argv[0], argv, envp);
    const int e = errno;
    (void)!::write(report[1], &e, sizeof(e));
    ::_exit(127);
  }
  const int clone_errno = errno;
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    return std::unexpected(SpawnFailure{true, clone_errno});
  }
  int exec_errno = 0;
  ssize_t n;
  while ((n = ::read(report[0], &exec_errno, sizeof(exec_errno))) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (n == sizeof(exec_errno)) {
    int status = 0;
    while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
    }
    return std::unexpected(SpawnFailure{false, exec_errno});
  }
  return static_cast<pid_t>(pid);
}

}  // namespace

std::expected<std::filesystem::path, std::string> cgroup_v2_mount() {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER-OPTIONS"
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, dev, root, mount_point;
    fields >> id >> parent >> dev >> root >> mount_point;
    if (!mount_point.empty()) return std::filesystem::path(mount_point);
  }
  return std::unexpected("no cgroup v2 hierarchy is mounted");
}

std::expected<std::filesystem::path, std::string> own_cgroup_v2_dir() {
  auto mount = cgroup_v2_mount();
  if (!mount) return mount;
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (line.starts_with("0::")) {
      return *mount / std::filesystem::path(line.substr(3)).relative_path();
    }
  }
  return std::unexpected("/proc/self/cgroup has no cgroup v2 (\"0::\") line");
}

std::expected<std::uint64_t, std::string> cgroup_id_of(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return std::unexpected(fmt::format("{}: {}", dir.string(), std::strerror(errno)));
  }
  return static_cast<std::uint64_t>(st.st_ino);
}

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
    write_spec_locked(spec);
    Child& child = children_[spec.unit] =
        Child{-1, spec.gpu, {WorkerState::running, "unit started"}};
    registered_locked(spec.unit, child, spec.ports);
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
  int rc = -1;
  std::filesystem::path cgroup_dir;
  if (const int cgroup_fd = make_child_cgroup_locked(spec.unit, cgroup_dir); cgroup_fd >= 0) {
    auto spawned = spawn_into_cgroup(cgroup_fd, args.data(), env.data(), log_fd);
    ::close(cgroup_fd);
    if (spawned) {
      pid = *spawned;
      rc = 0;
    } else if (!spawned.error().in_clone) {
      rc = spawned.error().error;  // the exec failed: as posix_spawn would say
    } else {
      cgroup_unavailable_locked(fmt::format("clone3 into {}: {}", cgroup_dir.string(),
                                            std::strerror(spawned.error().error)));
    }
    if (rc != 0) {
      std::error_code ec;
      std::filesystem::remove(cgroup_dir, ec);
      cgroup_dir.clear();
    }
  }
  if (rc < 0) rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(log_fd);
  if (rc != 0) {
    return std::unexpected(fmt::format("cannot start {}: {}", spec.argv[0], std::strerror(rc)));
  }
  Child& child = children_[spec.unit] =
      Child{pid, spec.gpu, {WorkerState::running, fmt::format("pid {}", pid)}};
  child.cgroup_dir = cgroup_dir;
  registered_locked(spec.unit, child, spec.ports);
  return {};
}

int WorkerLauncher::make_child_cgroup_locked(const std::string& unit, std::filesystem::path& dir) {
  if (!cgroup_parent_) {
    auto own = own_cgroup_v2_dir();
    cgroup_parent_ = own ? *own : std::filesystem::path();
    if (!own) cgroup_unavailable_locked(own.error());
    // Workers' cgroups left by a thawd that was killed: rmdir removes only empty ones, so a
    // worker still running (it outlived that thawd) keeps its cgroup.
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(*cgroup_parent_, ec)) {
      if (entry.path().filename().string().starts_with("thaw-worker-")) {
        ::rmdir(entry.path().c_str());
      }
    }
  }
  if (cgroup_parent_->empty()) return -1;
  dir = *cgroup_parent_ / unit;
  // Left by a thawd that died (empty once its worker is gone): made afresh, for a new id.
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    cgroup_unavailable_locked(
        fmt::format("{} is still in use: {}", dir.string(), std::strerror(errno)));
    return -1;
  }
  if (::mkdir(dir.c_str(), 0755) != 0) {
    cgroup_unavailable_locked(
        fmt::format("cannot create {}: {}", dir.string(), std::strerror(errno)));
    return -1;
  }
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    cgroup_unavailable_locked(fmt::format("{}: {}", dir.string(), std::strerror(errno)));
    ::rmdir(dir.c_str());
  }
  return fd;
}

void WorkerLauncher::write_spec_locked(const WorkerSpec& spec) const {
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  std::ofstream out(log_dir_ / (spec.unit + ".spec"));
  out << "gpu " << spec.gpu << "\nports";
  for (std::uint16_t port : spec.ports) out << ' ' << port;
  out << '\n';
  if (!out) {
    log(LogLevel::warning, fmt::format("worker {}: cannot record its GPU and ports in {}: after a "
                                       "thawd restart it is adopted without them",
                                       spec.unit, log_dir_.string()));
  }
}

std::vector<std::string> WorkerLauncher::adopt_running_units() {
  if (!use_systemd_) return {};
  auto [rc, output] =
      run_and_wait({"systemctl", "list-units", "--type=service", "--state=active,activating",
                    "--plain", "--no-legend", "--no-pager", "--full", "thaw-worker-*"});
  if (rc != 0) {
    log(LogLevel::warning,
        fmt::format("cannot list the workers still running from before this start (systemctl "
                    "list-units: {}); they stay unmanaged until they end",
                    output));
    return {};
  }
  std::lock_guard lock(mutex_);
  std::vector<std::string> adopted;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    if (!name.starts_with("thaw-worker-") || !name.ends_with(".service")) continue;
    const std::string unit = name.substr(0, name.size() - std::string_view(".service").size());
    if (children_.contains(unit)) continue;
    std::uint32_t gpu = 0;
    std::vector<std::uint16_t> ports;
    std::ifstream spec(log_dir_ / (unit + ".spec"));
    for (std::string key; spec >> key;) {
      if (key == "gpu") {
        spec >> gpu;
      } else if (key == "ports") {
        std::string rest;
        std::getline(spec, rest);
        std::istringstream list(rest);
        for (unsigned port = 0; list >> port;) {
          if (port > 0 && port <= 65535) ports.push_back(static_cast<std::uint16_t>(port));
        }
      }
    }
    Child& child = children_[unit] =
        Child{-1, gpu, {WorkerState::running, "running since before this thawd started (adopted)"}};
    registered_locked(unit, child, std::move(ports));
    adopted.push_back(unit);
  }
  return adopted;
}

void WorkerLauncher::cgroup_unavailable_locked(const std::string& why) {
  if (cgroup_warned_) return;
  cgroup_warned_ = true;
  log(LogLevel::notice,
      fmt::format("workers run in thawd's own cgroup ({}): the traffic shaper knows their "
                  "traffic by port only (network.inference_ports and the workers' ports)",
                  why));
}

void WorkerLauncher::registered_locked(const std::string& unit, Child& child,
                                       std::vector<std::uint16_t> ports) {
  child.traffic = {0, std::move(ports)};
  std::filesystem::path dir = child.cgroup_dir;
  if (dir.empty() && use_systemd_) {
    // A transient unit: systemd made its cgroup; ask where (relative to the v2 mount).
    auto [rc, output] = run_and_wait(
        {"systemctl", "show", "--property=ControlGroup", "--value", unit + ".service"});
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    auto mount = cgroup_v2_mount();
    if (rc == 0 && !output.empty() && mount) {
      dir = *mount / std::filesystem::path(output).relative_path();
    } else {
      cgroup_unavailable_locked(fmt::format("the cgroup of {}.service is unknown: {}", unit,
                                            mount ? output : mount.error()));
    }
  }
  if (!dir.empty()) {
    if (auto id = cgroup_id_of(dir); id) {
      child.traffic.cgroup_id = *id;
    } else {
      cgroup_unavailable_locked(id.error());
    }
  }
  const bool known = child.traffic.cgroup_id != 0 || !child.traffic.ports.empty();
  if (known && hooks_.started) hooks_.started(unit, child.traffic);
}

void WorkerLauncher::release_cgroup_locked(const std::string& unit, Child& child) {
  const bool known = child.traffic.cgroup_id != 0 || !child.traffic.ports.empty();
  if (known && hooks_.ended) hooks_.ended(unit, child.traffic);
  child.traffic = {};
  if (!child.cgroup_dir.empty()) {
    // Empty once the worker and everything it forked are gone; a straggler keeps it (and it
    // is retried at the unit's next launch).
    if (::rmdir(child.cgroup_dir.c_str()) != 0 && errno != ENOENT) {
      log(LogLevel::warning, fmt::format("worker {}: cannot remove its cgroup {}: {}", unit,
                                         child.cgroup_dir.string(), std::strerror(errno)));
    }
    child.cgroup_dir.clear();
  }
}

void WorkerLauncher::set_traffic_hooks(WorkerTrafficHooks hooks) {
  std::lock_guard lock(mutex_);
  hooks_ = std::move(hooks);
}

std::uint64_t WorkerLauncher::cgroup_id(const std::string& unit) {
  std::lock_guard lock(mutex_);
  auto it = children_.find(unit);
  return it == children_.end() ? 0 : it->second.traffic.cgroup_id;
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
    release_cgroup_locked(unit, child);
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
    if (rc != 0) {
      it->second.status = {WorkerState::exited, "unit inactive"};
      release_cgroup_locked(unit, it->second);
    }
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
