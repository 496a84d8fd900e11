// What thawd's D-Bus objects show, as one snapshot: object path → interface → property
// values. The bus serves every property read from the current snapshot and turns the
// difference between two snapshots into InterfacesAdded/InterfacesRemoved and
// PropertiesChanged, so signals and reads always agree and nothing needs change hooks in
// the layers below. Snapshots are taken on a timer (the rate limit of progress signals)
// and right after every method that changes something.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "daemon/network/network_config.hpp"
#include "daemon/service/node_service.hpp"

namespace thaw::daemon {

inline constexpr const char* kBusName = "org.thaw.Node1";
inline constexpr const char* kManagerPath = "/org/thaw/Node1";
inline constexpr const char* kGpuPrefix = "/org/thaw/Node1/gpu";
inline constexpr const char* kSlotPrefix = "/org/thaw/Node1/slot";
inline constexpr const char* kModelPrefix = "/org/thaw/Node1/model";
inline constexpr const char* kManagerInterface = "org.thaw.Node1.Manager";
inline constexpr const char* kGpuInterface = "org.thaw.Node1.Gpu";
inline constexpr const char* kSlotInterface = "org.thaw.Node1.Slot";
inline constexpr const char* kModelInterface = "org.thaw.Node1.Model";

// The Manager's own values, from thawd.
struct ManagerInfo {
  std::string node_id;
  std::string version;
  std::function<std::string()> state;
  std::function<std::uint64_t()> cache_bytes_used;
  std::uint64_t cache_budget_bytes = 0;
  // Traffic shaping's state and counters (GetNetwork); null: shaping not part of this thawd.
  std::function<NetStatus()> network;
};

// D-Bus types: s, t, u, d.
using BusValue = std::variant<std::string, std::uint64_t, std::uint32_t, double>;

struct BusObject {
  std::string interface;
  std::map<std::string, BusValue> properties;
};

using BusSnapshot = std::map<std::string, BusObject>;  // by object path

// Object paths: gpu/<n>, slot/<id>, model/<key escaped with sd_bus_path_encode>.
std::string gpu_path(std::uint32_t index);
std::string slot_path(const std::string& id);
std::string model_path(const std::string& key);

BusSnapshot take_snapshot(const ManagerInfo& manager, const NodeService& service);

struct SnapshotDiff {
  std::vector<std::string> added;    // paths
  std::vector<std::string> removed;  // paths, with their interface
  std::vector<std::pair<std::string, std::vector<std::string>>> changed;  // path, properties
  std::map<std::string, std::string> removed_interface;
};
SnapshotDiff diff(const BusSnapshot& before, const BusSnapshot& after);

}  // namespace thaw::daemon
