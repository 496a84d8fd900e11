// WorkerLauncher: starts and stops inference engines ("workers") for launch-worker tasks,
// with the preload shim set, and says how each is doing.
//
// When systemd is PID 1 (sd_booted) a worker is a transient service unit
// (`systemd-run --unit=thaw-worker-<plan>-<stage>`, LD_PRELOAD and THAW_* in its
// environment), so it is logged, accounted and stopped like any service and outlives a
// thawd restart. Otherwise it is a supervised child of thawd in its own process group,
// output appended to <state_dir>/workers/<unit>.log, stopped with SIGTERM (then SIGKILL
// after 10 s) and reaped; thawd's exit stops it.
//
// Each worker runs in a cgroup v2 of its own, so the traffic shaper can class its packets as
// inference by cgroup id whatever ports it uses (bpf/thaw_tc.bpf.c, cgroup_class): a
// transient unit has one already (systemd's; thawd.service needs no Delegate= for that: it
// only reads the unit's ControlGroup and stats the directory); a child is started straight
// into a new child cgroup of thawd's own (clone3 CLONE_INTO_CGROUP, so not one of its
// sockets is made outside it), removed when it has been reaped. The hooks hear each id, with
// the ports the worker serves on, as it comes and goes. Without a writable cgroup v2 hierarchy the
// worker runs in thawd's cgroup, the reason is logged once, and the shaper knows the engine by its
// ports only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
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
  // Local ports it serves on (HTTP, its pipeline link): its inference traffic on ingress,
  // where the classifier cannot see cgroups.
  std::vector<std::uint16_t> ports;
};

enum class WorkerState { running, exited, failed, unknown };

struct WorkerStatus {
  WorkerState state = WorkerState::unknown;
  std::string detail;  // "exit 0", "signal 9", "unit inactive"...
};

// How the traffic shaper recognises a worker's packets: its own cgroup v2 (egress; 0 when it
// has none) and the ports it serves on (ingress).
struct WorkerTraffic {
  std::uint64_t cgroup_id = 0;
  std::vector<std::uint16_t> ports;
  bool operator==(const WorkerTraffic&) const = default;
};

// Told of each worker's traffic when it starts and when it is gone (from the thread that
// launches or polls workers, with the launcher's lock held: keep them short).
struct WorkerTrafficHooks {
  std::function<void(const std::string& unit, const WorkerTraffic& traffic)> started;
  std::function<void(const std::string& unit, const WorkerTraffic& traffic)> ended;
};

// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
// hybrid system).
std::expected<std::filesystem::path, std::string> cgroup_v2_mount();
// The cgroup v2 directory this process runs in (the cgroup2 mount in /proc/self/mountinfo
// joined with the "0::" line of /proc/self/cgroup); an error that says why there is none.
std::expected<std::filesystem::path, std::string> own_cgroup_v2_dir();
// The id the kernel (bpf_skb_cgroup_id) gives the cgroup at `dir`: its inode number.
std::expected<std::uint64_t, std::string> cgroup_id_of(const std::filesystem::path& dir);

class WorkerLauncher {
 public:
  // `use_systemd`: transient units (sd_booted() decides in thawd; tests pass false).
  WorkerLauncher(std::filesystem::path log_dir, bool use_systemd);
  ~WorkerLauncher();  // stops supervised children
  WorkerLauncher(const WorkerLauncher&) = delete;
  WorkerLauncher& operator=(const WorkerLauncher&) = delete;

  std::expected<void, std::string> launch(const WorkerSpec& spec);
  // Transient units: the thaw-worker-* units systemd runs that this launcher did not start
  // (a thawd before a restart did) become its workers again, with the GPU and ports recorded
  // at their launch (<log_dir>/<unit>.spec): status, stop, busy_gpus and the traffic hooks
  // work on them as on its own. Call after set_traffic_hooks. The units adopted; none
  // without systemd (children end with the thawd that started them).
  std::vector<std::string> adopt_running_units();
  // Stops it and waits (SIGTERM to its process group, SIGKILL after 10 s).
  std::expected<void, std::string> stop(const std::string& unit);
  // Starts stopping it and returns at once: SIGTERM now, SIGKILL from the first status()
  // call 10 s later (the agent's thread must not block on an engine's shutdown).
  std::expected<void, std::string> request_stop(const std::string& unit);
  WorkerStatus status(const std::string& unit);
  // GPUs with a running worker (for the coordinator's "shares a GPU").
  std::vector<std::uint32_t> busy_gpus();
  // Registers where each worker's traffic goes (the traffic shaper); set before launching.
  void set_traffic_hooks(WorkerTrafficHooks hooks);
  // The cgroup id a running worker's traffic carries; 0 when it has none of its own.
  std::uint64_t cgroup_id(const std::string& unit);

  // "thaw-worker-" + the plan id and stage with anything but [A-Za-z0-9_-] replaced by '_'.
  static std::string unit_name(const std::string& plan, std::uint32_t stage);

 private:
  struct Child {
    pid_t pid = -1;
    std::uint32_t gpu = 0;
    WorkerStatus status;
    std::optional<std::chrono::steady_clock::time_point> kill_at;  // after request_stop
    bool stopping = false;             // asked to stop: dying of the signal is a clean end
    WorkerTraffic traffic;             // told to the hooks (started), until it ends
    std::filesystem::path cgroup_dir;  // a child's, removed once reaped ("" for units)
  };
  void reap_locked();
  // A new cgroup for a child worker, opened for CLONE_INTO_CGROUP; -1 (said once) when none.
  int make_child_cgroup_locked(const std::string& unit, std::filesystem::path& dir);
  // Finds a unit's cgroup (child.cgroup_dir, else systemd's) and tells the hooks.
  void registered_locked(const std::string& unit, Child& child, std::vector<std::uint16_t> ports);
  void release_cgroup_locked(const std::string& unit, Child& child);
  void cgroup_unavailable_locked(const std::string& why);
  // What adopt_running_units needs to know of a unit, written at its launch.
  void write_spec_locked(const WorkerSpec& spec) const;

  std::filesystem::path log_dir_;
  bool use_systemd_;
  std::mutex mutex_;
  std::map<std::string, Child> children_;  // by unit
  WorkerTrafficHooks hooks_;
  std::optional<std::filesystem::path> cgroup_parent_;  // resolved at the first launch
  bool cgroup_warned_ = false;
};

// Replaces {model} {key} {stage} {stages} {gpu} {plan} in every argument.
std::vector<std::string> expand_worker_command(const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& values);

}  // namespace thaw::daemon
