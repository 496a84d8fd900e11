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
//                  running while it runs, done on exit 0
//   stop-worker    stops the plan stage's worker
//
// A task already held (same id) is not started again: the coordinator may resend after a
// restart or a lost reply.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/proto/cluster/cluster.pb.h"
#include "daemon/agent/worker_launcher.hpp"
#include "daemon/service/node_service.hpp"

namespace thaw::daemon {

namespace v1 = thaw::cluster::v1;

struct WorkerSettings {
  std::vector<std::string> command;  // "" = launch-worker tasks fail saying to configure it
  std::string preload;               // LD_PRELOAD for workers
  std::string thawd_socket;          // THAW_SOCKET for the shim
};

class TaskRunner {
 public:
  TaskRunner(NodeService& service, WorkerLauncher& workers, WorkerSettings settings);

  // Starts the task; its first status is returned (failed at once when it cannot start).
  v1::TaskStatus start(const v1::Task& task);
  // Refreshes every running task's status; returns those that changed since the last call.
  std::vector<v1::TaskStatus> poll();
  std::vector<v1::TaskStatus> held() const;

 private:
  struct Held {
    v1::TaskStatus status;
    std::string model_key;  // fetch, prewarm
    std::string slot;       // prewarm
    std::string unit;       // launch-worker
    bool changed = true;
  };
  void refresh_locked(Held& task);
  void run_locked(Held& task);

  NodeService& service_;
  WorkerLauncher& workers_;
  WorkerSettings settings_;
  mutable std::mutex mutex_;
  std::map<std::string, Held> tasks_;  // by task id
};

}  // namespace thaw::daemon
