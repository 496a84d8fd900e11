#include "daemon/api/bus_snapshot.hpp"

#include <fmt/format.h>
#include <systemd/sd-bus.h>

#include <cstdlib>

#include "common/layout/layout_kind.hpp"

namespace thaw::daemon {

std::string gpu_path(std::uint32_t index) {
  return fmt::format("{}/{}", kGpuPrefix, index);
}

std::string slot_path(const std::string& id) {
  char* path = nullptr;
  if (sd_bus_path_encode(kSlotPrefix, id.c_str(), &path) < 0) return kSlotPrefix;
  std::string out(path);
  std::free(path);
  return out;
}

std::string model_path(const std::string& key) {
  char* path = nullptr;
  if (sd_bus_path_encode(kModelPrefix, key.c_str(), &path) < 0) return kModelPrefix;
  std::string out(path);
  std::free(path);
  return out;
}

BusSnapshot take_snapshot(const ManagerInfo& manager, const NodeService& service) {
  BusSnapshot s;
  const std::vector<GpuStatus> gpus = service.gpus();
  s[kManagerPath] = BusObject{kManagerInterface,
                              {{"NodeId", manager.node_id},
                               {"Version", manager.version},
                               {"State", manager.state()},
                               {"CacheBytesUsed", manager.cache_bytes_used()},
                               {"CacheBudgetBytes", manager.cache_budget_bytes},
                               {"GpuCount", static_cast<std::uint32_t>(gpus.size())},
                               {"PrewarmHits", service.counters().prewarm_hits.load()},
                               {"PrewarmMisses", service.counters().prewarm_misses.load()},
                               {"EngineLayoutHits", service.counters().engine_layout_hits.load()},
                               {"Handbacks", service.counters().handbacks.load()}}};
  for (const GpuStatus& g : gpus) {
    s[gpu_path(g.index)] = BusObject{kGpuInterface,
                                     {{"Index", g.index},
                                      {"PoolBytes", g.pool_bytes},
                                      {"FreeBytes", g.free_bytes},
                                      {"SlotCount", g.slots},
                                      {"ActiveSlot", g.active_slot}}};
  }
  for (const SlotStatus& slot : service.slots()) {
    // D-Bus properties are text: the kind's name, "" until its prewarm chose one.
    const std::string layout_name =
        slot.layout ? std::string(layout::to_string(*slot.layout)) : std::string();
    s[slot_path(slot.id)] = BusObject{kSlotInterface,
                                      {{"Id", slot.id},
                                       {"Gpu", slot.gpu},
                                       {"Model", slot.model},
                                       {"State", slot.state},
                                       {"ResidentBytes", slot.resident_bytes},
                                       {"TotalBytes", slot.total_bytes},
                                       {"Owner", slot.owner},
                                       {"Layout", layout_name},
                                       {"Error", slot.error}}};
  }
  for (const ModelStatus& m : service.models()) {
    s[model_path(m.key)] =
        BusObject{kModelInterface,
                  {{"Key", m.key},
                   {"Name", m.name},
                   {"State", std::string(to_string(m.state))},
                   {"FetchedBytes", m.fetched_bytes},
                   {"TotalBytes", m.total_bytes},
                   {"Rate", m.rate_bytes_per_s},
                   {"Files", m.files},
                   {"Error", m.error},
                   {"Integrity", std::string(m.unverified ? "unverified" : "verified")}}};
  }
  return s;
}

SnapshotDiff diff(const BusSnapshot& before, const BusSnapshot& after) {
  SnapshotDiff d;
  for (const auto& [path, object] : before) {
    if (!after.contains(path)) {
      d.removed.push_back(path);
      d.removed_interface[path] = object.interface;
    }
  }
  for (const auto& [path, object] : after) {
    auto old = before.find(path);
    if (old == before.end()) {
      d.added.push_back(path);
      continue;
    }
    std::vector<std::string> names;
    for (const auto& [name, value] : object.properties) {
      auto was = old->second.properties.find(name);
      if (was == old->second.properties.end() || was->second != value) names.push_back(name);
    }
    if (!names.empty()) d.changed.emplace_back(path, std::move(names));
  }
  return d;
}

}  // namespace thaw::daemon
