// Thawd: the node daemon's composition root and event loop (libsystemd sd-event).
//
// start() loads the configuration, opens the host cache, loads the CUDA driver and takes
// each GPU's memory pool (a node without a driver still runs, store only), installs the
// signal handlers, and only then tells systemd READY=1. run() serves until SIGTERM or
// SIGINT: STOPPING=1, then a clean drain (every GPU page and slot released before exit).
// SIGHUP re-reads the configuration: settings that can change live are applied, the others
// are logged as needing a restart, and the running configuration stays as it was on error.
//
// READY=1 comes once the D-Bus name org.thaw.Node1 is owned (the Manager object exported).
// Still to come (issue 7): the shim socket (READY=1 will then also wait for it), metrics.
#pragma once

#include <systemd/sd-event.h>

#include <expected>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/driver.hpp"
#include "daemon/api/manager_dbus.hpp"
#include "daemon/config/thawd_config.hpp"
#include "daemon/core/service_notifier.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "vmm/gpu_memory.hpp"

namespace thaw::daemon {

class Thawd {
 public:
  static std::expected<std::unique_ptr<Thawd>, std::string> start(std::filesystem::path config_path,
                                                                  ServiceNotifier& notifier);
  ~Thawd();
  Thawd(const Thawd&) = delete;
  Thawd& operator=(const Thawd&) = delete;

  // Runs the event loop; returns the process exit code.
  int run();

  const ThawdConfig& config() const { return config_; }
  std::size_t gpu_count() const { return gpus_.size(); }

 private:
  Thawd(std::filesystem::path config_path, ServiceNotifier& notifier, ThawdConfig config);
  std::string status_line() const;
  ManagerModel manager_model();
  void reload();
  static int on_signal(sd_event_source* source, const struct signalfd_siginfo* info, void* self);

  std::filesystem::path config_path_;
  ServiceNotifier& notifier_;
  ThawdConfig config_;
  std::optional<store::HostCache> cache_;
  std::shared_ptr<const cuda::Driver> driver_;
  std::vector<std::unique_ptr<vmm::GpuMemory>> gpus_;
  std::string state_ = "starting";
  sd_event* event_ = nullptr;
  std::unique_ptr<ManagerBus> bus_;  // before event_ in destruction order: it is attached
  std::vector<sd_event_source*> sources_;
};

}  // namespace thaw::daemon
