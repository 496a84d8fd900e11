// WorkerLauncher: starts and stops inference engines ("workers") for launch-worker tasks,
// with the preload shim set, and says how each is doing.
//
// When systemd is PID 1 (sd_booted) a worker is a transient service unit
// (`systemd-run --unit=thaw-worker-<plan>-<stage>`, LD_PRELOAD and THAW_* in its
// environment), so it is logged, accounted and stopped like any service and outlives a
// thawd restart. Otherwise it is a supervised child of thawd in its own process group,
// output appended to <state_dir>/workers/<unit>.log, stopped with SIGTERM (then SIGKILL
// after 10 s) and reaped; thawd's exit stops it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <expected>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace thaw::daemon {

struct WorkerSpec {
  std::string unit;               // "thaw-worker-<plan>-<stage>" (sanitised)
  std::vector<std::string> argv;  // placeholders already replaced
  std::vector<std::string> env;   // "K=V", added to thawd's environment
  std::uint32_t gpu = 0;
};

enum class WorkerState { running, exited, failed, unknown };

struct WorkerStatus {
  WorkerState state = WorkerState::unknown;
  std::string detail;  // "exit 0", "signal 9", "unit inactive"...
};

class WorkerLauncher {
 public:
  // `use_systemd`: transient units (sd_booted() decides in thawd; tests pass false).
  WorkerLauncher(std::filesystem::path log_dir, bool use_systemd);
  ~WorkerLauncher();  // stops supervised children
  WorkerLauncher(const WorkerLauncher&) = delete;
  WorkerLauncher& operator=(const WorkerLauncher&) = delete;

  std::expected<void, std::string> launch(const WorkerSpec& spec);
  // Stops it and waits (SIGTERM to its process group, SIGKILL after 10 s).
  std::expected<void, std::string> stop(const std::string& unit);
  // Starts stopping it and returns at once: SIGTERM now, SIGKILL from the first status()
  // call 10 s later (the agent's thread must not block on an engine's shutdown).
  std::expected<void, std::string> request_stop(const std::string& unit);
  WorkerStatus status(const std::string& unit);
  // GPUs with a running worker (for the coordinator's "shares a GPU").
  std::vector<std::uint32_t> busy_gpus();

  // "thaw-worker-" + the plan id and stage with anything but [A-Za-z0-9_-] replaced by '_'.
  static std::string unit_name(const std::string& plan, std::uint32_t stage);

 private:
  struct Child {
    pid_t pid = -1;
    std::uint32_t gpu = 0;
    WorkerStatus status;
    std::optional<std::chrono::steady_clock::time_point> kill_at;  // after request_stop
    bool stopping = false;  // asked to stop: dying of the signal is a clean end
  };
  void reap_locked();

  std::filesystem::path log_dir_;
  bool use_systemd_;
  std::mutex mutex_;
  std::map<std::string, Child> children_;  // by unit
};

// Replaces {model} {key} {stage} {stages} {gpu} {plan} in every argument.
std::vector<std::string> expand_worker_command(const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& values);

}  // namespace thaw::daemon
