// TaskRunner: carries out the coordinator's tasks on this node through NodeService (and the
// WorkerLauncher) and keeps each one's status, which the agent reports as progress and, in
// every registration, as the tasks the node holds (a restarted coordinator rebuilds its
// plans from them).
//
//   fetch          NodeService::fetch(model, stage k of s, consolidate); running while the
//                  fetch runs, done when it ends with the stage's bytes in the cache
//   prewarm        NodeService::prewarm(model, gpu, layers); done when the slot is prewarmed
//   evict          every slot of the model on this node
//   activate       the model's prewarmed slot on the GPU becomes its active one (no copy)
//   launch-worker  the configured worker command with the preload shim (WorkerLauncher);
//                  running while it runs, done on exit 0. Under the shim (a preload is
//                  configured) it starts at once, while its stage's fetch still runs: that
//                  overlap of the engine's start with the fetch is the point of a cold start
//                  here (the shim makes the engine's stat/open of a file the fetch has not
//                  created yet wait for it, and its reads wait for bytes not yet in:
//                  preload/files). A worker without the shim could read holes of a file
//                  still arriving, so it waits until a fetch of the same plan stage running
//                  here has ended. The command's placeholders wire it
//                  into its pipeline group: {pp_rank} {pp_size} {peers} (host:port,...),
//                  {port} (where it serves), {layer_begin} {layer_end}, {timeline} (a file
//                  for the engine's start-up timeline). A worker with a port is polled at
//                  http://127.0.0.1:{port}/health until it answers: then `worker_ready`, and
//                  its start-up phases go into the StartupMeter
//   (standalone)   a launch-worker with `standalone`: the whole model alone (pp size 1) —
//                  the consolidated worker; its own unit next to the stage's pipeline worker
//   stop-worker    stops the plan stage's worker
//
// A task already held (same id) is not started again: the coordinator may resend after a
// restart or a lost reply.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/proto/cluster/cluster.pb.h"
#include "daemon/agent/startup_meter.hpp"
#include "daemon/agent/worker_launcher.hpp"
#include "daemon/service/node_service.hpp"

namespace thaw::daemon {

namespace v1 = thaw::cluster::v1;

struct WorkerSettings {
  std::vector<std::string> command;    // "" = launch-worker tasks fail saying to configure it
  std::string preload;                 // LD_PRELOAD for workers
  std::string thawd_socket;            // THAW_SOCKET for the shim
  std::filesystem::path timeline_dir;  // {timeline} files ("": the system's temp directory)
  // Whether a worker serving on `port` (loopback) is ready; "": GET /health answers 200.
  std::function<bool(std::uint16_t port)> health_probe;
};

// GET http://127.0.0.1:<port>/health with short timeouts: true on a 200.
bool http_health_ok(std::uint16_t port);

class TaskRunner {
 public:
  TaskRunner(NodeService& service, WorkerLauncher& workers, WorkerSettings settings);

  // Starts the task; its first status is returned (failed at once when it cannot start).
  v1::TaskStatus start(const v1::Task& task);
  // Refreshes every running task's status; returns those that changed since the last call.
  std::vector<v1::TaskStatus> poll();
  std::vector<v1::TaskStatus> held() const;
  // Start-up phases of the workers that became ready here (running averages).
  v1::StartupCosts startup_costs() const { return meter_.averages(); }
  // The unit a launch-worker task's engine runs as.
  static std::string unit_for(const v1::Task& task);

 private:
  struct Held {
    v1::TaskStatus status;
    std::string model_key;          // fetch, prewarm
    std::string slot;               // prewarm
    std::string unit;               // launch-worker
    std::uint64_t launched_ns = 0;  // launch-worker: when it was started
    std::filesystem::path timeline;
    std::string waiting_for;  // launch-worker without the shim: the fetch task whose stage
                              // must be in first
    bool changed = true;
  };
  void refresh_locked(Held& task);
  void run_locked(Held& task);
  void launch_locked(Held& task);

  NodeService& service_;
  WorkerLauncher& workers_;
  WorkerSettings settings_;
  StartupMeter meter_;
  mutable std::mutex mutex_;
  std::map<std::string, Held> tasks_;  // by task id
};

}  // namespace thaw::daemon
