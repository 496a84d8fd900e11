// The Manager object of thawd's D-Bus API: bus name org.thaw.Node1, object /org/thaw/Node1,
// interface org.thaw.Node1.Manager (packaging/org.thaw.Node1.Manager.xml), laid out like
// systemd-machined's manager (one file per object type, sd-bus vtables).
//
// Properties: NodeId, Version, State, CacheBytesUsed, CacheBudgetBytes, GpuCount.
// Methods: ListGpus() -> a(uttu): index, pool bytes, free bytes, prewarm slots.
//
// Still to come (issue 7): per-GPU/slot/model objects, ObjectManager, mutating methods with
// credential checks, PropertiesChanged.
#pragma once

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace thaw::daemon {

inline constexpr const char* kBusName = "org.thaw.Node1";
inline constexpr const char* kManagerPath = "/org/thaw/Node1";
inline constexpr const char* kManagerInterface = "org.thaw.Node1.Manager";

struct GpuSummary {
  std::uint32_t index = 0;
  std::uint64_t pool_bytes = 0;
  std::uint64_t free_bytes = 0;
  std::uint32_t slots = 0;
};

// What the Manager shows; thawd provides it (the API layer holds no state of its own).
struct ManagerModel {
  std::string node_id;
  std::string version;
  std::function<std::string()> state;
  std::function<std::uint64_t()> cache_bytes_used;
  std::uint64_t cache_budget_bytes = 0;
  std::function<std::vector<GpuSummary>()> gpus;
};

class ManagerBus {
 public:
  // Connects to `bus` ("system", "user" or an address), exports the Manager, attaches to
  // `event`, and takes the bus name (failing if another thawd owns it).
  static std::expected<std::unique_ptr<ManagerBus>, std::string> start(const std::string& bus,
                                                                       ManagerModel model,
                                                                       sd_event* event);
  ~ManagerBus();
  ManagerBus(const ManagerBus&) = delete;
  ManagerBus& operator=(const ManagerBus&) = delete;

 private:
  ManagerBus() = default;
  static int get_property(sd_bus* bus, const char* path, const char* interface,
                          const char* property, sd_bus_message* reply, void* self,
                          sd_bus_error* error);
  static int list_gpus(sd_bus_message* message, void* self, sd_bus_error* error);

  ManagerModel model_;
  sd_bus* bus_ = nullptr;
  sd_bus_slot* slot_ = nullptr;
};

}  // namespace thaw::daemon
