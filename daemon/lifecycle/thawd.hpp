// Thawd: the node daemon's composition root and event loop (libsystemd sd-event).
//
// start() loads the configuration, opens the host cache, loads the CUDA driver and takes
// each GPU's memory pool (a node without a driver still runs, store only), installs the
// signal handlers, and only then tells systemd READY=1. run() serves until SIGTERM or
// SIGINT: STOPPING=1, then a clean drain (every GPU page and slot released before exit).
// SIGHUP re-reads the configuration: settings that can change live are applied, the others
// are logged as needing a restart, and the running configuration stays as it was on error.
//
// READY=1 comes once the shim socket listens and the D-Bus name org.thaw.Node1 is owned (the
// name is taken last, so a client that sees it finds everything else in place).
#pragma once

#include <systemd/sd-event.h>

#include <expected>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/driver.hpp"
#include "daemon/agent/cluster_agent.hpp"
#include "daemon/agent/task_runner.hpp"
#include "daemon/agent/worker_launcher.hpp"
#include "daemon/api/node_bus.hpp"
#include "daemon/config/thawd_config.hpp"
#include "daemon/lifecycle/node_shaping.hpp"
#include "daemon/lifecycle/service_notifier.hpp"
#include "daemon/metrics/metrics_server.hpp"
#include "daemon/network/inference_activity.hpp"
#include "daemon/service/access_policy.hpp"
#include "daemon/service/node_service.hpp"
#include "daemon/shim_socket/shim_server.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "vmm/gpu_memory.hpp"

namespace thaw::daemon {

class Thawd {
 public:
  // `need`: whether config_path must exist (given with -c) or may be missing (the default).
  static std::expected<std::unique_ptr<Thawd>, std::string> start(std::filesystem::path config_path,
                                                                  ConfigFile need,
                                                                  ServiceNotifier& notifier);
  ~Thawd();
  Thawd(const Thawd&) = delete;
  Thawd& operator=(const Thawd&) = delete;

  // Runs the event loop; returns the process exit code.
  int run();

  const ThawdConfig& config() const { return config_; }
  std::size_t gpu_count() const { return gpus_.size(); }

 private:
  Thawd(std::filesystem::path config_path, ConfigFile need, ServiceNotifier& notifier,
        ThawdConfig config);
  std::string status_line() const;
  NetStatus network_status() const;  // the shaper's, with the fetch windows' state
  NodeServiceConfig service_config() const;
  ManagerInfo manager_info();
  std::expected<void, std::string> start_agent(const std::string& node_id);
  void reload();
  static int on_status_timer(sd_event_source* source, uint64_t usec, void* self);
  // Samples the classifier's inference counter; fetch windows clamp while inference runs.
  static int on_inference_sample(sd_event_source* source, uint64_t usec, void* self);
  static int on_signal(sd_event_source* source, const struct signalfd_siginfo* info, void* self);

  std::filesystem::path config_path_;
  ConfigFile config_need_;  // a SIGHUP re-reads under the same rule as the start
  ServiceNotifier& notifier_;
  ThawdConfig config_;
  std::optional<store::HostCache> cache_;
  std::shared_ptr<const cuda::Driver> driver_;
  std::vector<std::unique_ptr<vmm::GpuMemory>> gpus_;
  std::unique_ptr<AccessPolicy> access_;
  // Traffic shaping of the uplink ([network]); stopped last, after the fetches.
  std::unique_ptr<NodeShaping> shaping_;
  // With shaping: live fetch sockets, their windows at their class's share (null without).
  std::shared_ptr<network::FetchWindows> fetch_windows_;
  network::InferenceActivity inference_activity_;
  std::unique_ptr<NodeService> service_;  // uses cache_ and gpus_
  std::unique_ptr<ArtifactStore> artifacts_;
  // The cluster agent (coordinator.endpoint set): stopped before service_ goes.
  std::unique_ptr<WorkerLauncher> workers_;
  std::unique_ptr<TaskRunner> tasks_;
  std::unique_ptr<ClusterAgent> agent_;
  std::string state_ = "starting";
  std::string last_status_;
  sd_event* event_ = nullptr;
  std::unique_ptr<MetricsServer> metrics_;  // its thread reads service_: stopped first
  std::unique_ptr<ShimServer> shim_;        // destroyed before event_ and service_
  std::unique_ptr<NodeBus> bus_;            // destroyed before event_: it is attached to it
  std::vector<sd_event_source*> sources_;
};

}  // namespace thaw::daemon
