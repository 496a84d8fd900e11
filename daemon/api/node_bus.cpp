// NodeBus: connection, object export, snapshot refresh and change signals. The methods are
// in node_bus_methods.cpp.
#include "daemon/api/node_bus.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace thaw::daemon {

namespace {

std::string bus_error(std::string_view what, int r) {
  return fmt::format("D-Bus: {}: {}", what, std::strerror(-r));
}

// "system", "user", or an address such as "unix:path=/run/thaw/bus".
int open_bus(const std::string& which, sd_bus** out) {
  if (which == "system") return sd_bus_open_system(out);
  if (which == "user") return sd_bus_open_user(out);
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r < 0) return r;
  if ((r = sd_bus_set_address(bus, which.c_str())) < 0 || (r = sd_bus_set_bus_client(bus, 1)) < 0 ||
      (r = sd_bus_start(bus)) < 0) {
    sd_bus_unref(bus);
    return r;
  }
  *out = bus;
  return 0;
}

constexpr std::uint64_t kEmitsChange = SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE;
constexpr std::uint64_t kConst = SD_BUS_VTABLE_PROPERTY_CONST;
#define THAW_PROPERTY(name, sig, flags) SD_BUS_PROPERTY(name, sig, &NodeBus::get_property, 0, flags)

}  // namespace

std::expected<std::unique_ptr<NodeBus>, std::string> NodeBus::start(
    const std::string& bus, ManagerInfo manager, NodeService& service, const AccessPolicy& access,
    sd_event* event, const ArtifactStore* artifacts, std::chrono::milliseconds tick) {
  // Mutating methods are marked UNPRIVILEGED so that sd-bus does not apply its own
  // CAP_SYS_ADMIN rule: authorize() applies thawd's (root or the allowed groups).
  static const sd_bus_vtable manager_vtable[] = {
      SD_BUS_VTABLE_START(0),
      THAW_PROPERTY("NodeId", "s", kConst),
      THAW_PROPERTY("Version", "s", kConst),
      THAW_PROPERTY("State", "s", kEmitsChange),
      THAW_PROPERTY("CacheBytesUsed", "t", kEmitsChange),
      THAW_PROPERTY("CacheBudgetBytes", "t", kConst),
      THAW_PROPERTY("GpuCount", "u", kConst),
      THAW_PROPERTY("PrewarmHits", "t", kEmitsChange),
      THAW_PROPERTY("PrewarmMisses", "t", kEmitsChange),
      THAW_PROPERTY("EngineLayoutHits", "t", kEmitsChange),
      THAW_PROPERTY("Handbacks", "t", kEmitsChange),
      SD_BUS_METHOD_WITH_ARGS("Fetch", SD_BUS_ARGS("s", model), SD_BUS_RESULT("o", path),
                              &NodeBus::method_fetch, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("Prewarm", SD_BUS_ARGS("s", model, "i", gpu),
                              SD_BUS_RESULT("o", slot), &NodeBus::method_prewarm,
                              SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("PrewarmLayers", SD_BUS_ARGS("s", model, "i", gpu, "i", layers),
                              SD_BUS_RESULT("o", slot), &NodeBus::method_prewarm_layers,
                              SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("Activate", SD_BUS_ARGS("s", slot, "t", kv_bytes), SD_BUS_NO_RESULT,
                              &NodeBus::method_activate, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("Deactivate", SD_BUS_ARGS("s", slot), SD_BUS_NO_RESULT,
                              &NodeBus::method_deactivate, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("Evict", SD_BUS_ARGS("s", slot), SD_BUS_NO_RESULT,
                              &NodeBus::method_evict, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("ListGpus", SD_BUS_NO_ARGS, SD_BUS_RESULT("a(uttu)", gpus),
                              &NodeBus::method_list_gpus, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("ListSlots", SD_BUS_NO_ARGS, SD_BUS_RESULT("a(susstto)", slots),
                              &NodeBus::method_list_slots, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_METHOD_WITH_ARGS("ListModels", SD_BUS_NO_ARGS, SD_BUS_RESULT("a(ssstto)", models),
                              &NodeBus::method_list_models, SD_BUS_VTABLE_UNPRIVILEGED),
      // key, kind, model, engine, gpu, driver, owner uid (4294967295: none), bytes, modified
      // (µs since the epoch), readable, summary.
      SD_BUS_METHOD_WITH_ARGS("ListArtifacts", SD_BUS_ARGS("s", model),
                              SD_BUS_RESULT("a(ssssssuttbs)", artifacts),
                              &NodeBus::method_list_artifacts, SD_BUS_VTABLE_UNPRIVILEGED),
      // Traffic shaping: state, rates in force, per-class counters and per-model bytes
      // (model id, cache key, bytes; node_bus.hpp).
      SD_BUS_METHOD_WITH_ARGS(
          "GetNetwork", SD_BUS_NO_ARGS,
          SD_BUS_RESULT("b", enabled, "s", detail, "s", device, "t", link_bytes_per_s, "s",
                        rates_from, "u", cold_starts, "t", per_cold_start_bytes_per_s,
                        "a(stttttttt)", classes, "a(qst)", models),
          &NodeBus::method_get_network, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_VTABLE_END,
  };
  static const sd_bus_vtable gpu_vtable[] = {
      SD_BUS_VTABLE_START(0),
      THAW_PROPERTY("Index", "u", kConst),
      THAW_PROPERTY("PoolBytes", "t", kConst),
      THAW_PROPERTY("FreeBytes", "t", kEmitsChange),
      THAW_PROPERTY("SlotCount", "u", kEmitsChange),
      THAW_PROPERTY("ActiveSlot", "s", kEmitsChange),
      SD_BUS_VTABLE_END,
  };
  static const sd_bus_vtable slot_vtable[] = {
      SD_BUS_VTABLE_START(0),
      THAW_PROPERTY("Id", "s", kConst),
      THAW_PROPERTY("Gpu", "u", kConst),
      THAW_PROPERTY("Model", "s", kConst),
      THAW_PROPERTY("State", "s", kEmitsChange),
      THAW_PROPERTY("ResidentBytes", "t", kEmitsChange),
      THAW_PROPERTY("TotalBytes", "t", kEmitsChange),
      THAW_PROPERTY("Owner", "s", kEmitsChange),
      THAW_PROPERTY("Layout", "s", kEmitsChange),
      THAW_PROPERTY("Error", "s", kEmitsChange),
      SD_BUS_VTABLE_END,
  };
  static const sd_bus_vtable model_vtable[] = {
      SD_BUS_VTABLE_START(0),
      THAW_PROPERTY("Key", "s", kConst),
      THAW_PROPERTY("Name", "s", kEmitsChange),
      THAW_PROPERTY("State", "s", kEmitsChange),
      THAW_PROPERTY("FetchedBytes", "t", kEmitsChange),
      THAW_PROPERTY("TotalBytes", "t", kEmitsChange),
      THAW_PROPERTY("Rate", "d", kEmitsChange),
      THAW_PROPERTY("Files", "u", kEmitsChange),
      THAW_PROPERTY("Error", "s", kEmitsChange),
      // "verified", or "unverified": fetched with nothing to check its bytes against (a model
      // published without thaw-manifest.json, let in by store.allow_unverified).
      THAW_PROPERTY("Integrity", "s", kEmitsChange),
      SD_BUS_VTABLE_END,
  };

  std::unique_ptr<NodeBus> b(new NodeBus(std::move(manager), service, access));
  b->tick_ = tick;
  b->artifacts_ = artifacts;
  b->snapshot_ = take_snapshot(b->manager_, b->service_);
  if (int r = open_bus(bus, &b->bus_); r < 0) {
    return std::unexpected(
        bus_error(fmt::format("connecting to the {} bus (dbus.bus in thawd.toml)", bus), r));
  }
  auto keep = [&](int r, sd_bus_slot* slot,
                  std::string_view what) -> std::expected<void, std::string> {
    if (r < 0) return std::unexpected(bus_error(what, r));
    b->slots_.push_back(slot);
    return {};
  };
  sd_bus_slot* slot = nullptr;
  int r = sd_bus_add_object_vtable(b->bus_, &slot, kManagerPath, kManagerInterface, manager_vtable,
                                   b.get());
  if (auto ok = keep(r, slot, "exporting the Manager"); !ok) return std::unexpected(ok.error());
  r = sd_bus_add_object_manager(b->bus_, &slot, kManagerPath);
  if (auto ok = keep(r, slot, "exporting the ObjectManager"); !ok) {
    return std::unexpected(ok.error());
  }
  struct Kind {
    const char* prefix;
    const char* interface;
    const sd_bus_vtable* vtable;
  };
  for (const Kind& k :
       {Kind{kGpuPrefix, kGpuInterface, gpu_vtable}, Kind{kSlotPrefix, kSlotInterface, slot_vtable},
        Kind{kModelPrefix, kModelInterface, model_vtable}}) {
    r = sd_bus_add_fallback_vtable(b->bus_, &slot, k.prefix, k.interface, k.vtable,
                                   &NodeBus::find_object, b.get());
    if (auto ok = keep(r, slot, fmt::format("exporting {}", k.prefix)); !ok) {
      return std::unexpected(ok.error());
    }
    r = sd_bus_add_node_enumerator(b->bus_, &slot, k.prefix, &NodeBus::enumerate, b.get());
    if (auto ok = keep(r, slot, fmt::format("enumerating {}", k.prefix)); !ok) {
      return std::unexpected(ok.error());
    }
  }
  if (r = sd_bus_attach_event(b->bus_, event, SD_EVENT_PRIORITY_NORMAL); r < 0) {
    return std::unexpected(bus_error("attaching to the event loop", r));
  }
  if (r = sd_event_add_time_relative(event, &b->timer_, CLOCK_MONOTONIC,
                                     static_cast<uint64_t>(tick.count()) * 1000, 0,
                                     &NodeBus::on_tick, b.get());
      r < 0) {
    return std::unexpected(bus_error("adding the refresh timer", r));
  }
  if (r = sd_bus_request_name(b->bus_, kBusName, 0); r < 0) {
    return std::unexpected(bus_error(
        fmt::format("taking the name {} (is another thawd running, or does the bus policy "
                    "not allow root to own it?)",
                    kBusName),
        r));
  }
  return b;
}

NodeBus::~NodeBus() {
  if (timer_ != nullptr) sd_event_source_disable_unref(timer_);
  for (sd_bus_slot* s : slots_) sd_bus_slot_unref(s);
  if (bus_ != nullptr) sd_bus_flush_close_unref(bus_);
}

int NodeBus::on_tick(sd_event_source* source, uint64_t usec, void* self) {
  auto* b = static_cast<NodeBus*>(self);
  b->service_.reap();
  b->refresh();
  // Time sources fire once: re-arm for the next tick.
  const int r =
      sd_event_source_set_time(source, usec + static_cast<uint64_t>(b->tick_.count()) * 1000);
  return r < 0 ? r : sd_event_source_set_enabled(source, SD_EVENT_ON);
}

void NodeBus::refresh() {
  BusSnapshot next = take_snapshot(manager_, service_);
  const SnapshotDiff d = diff(snapshot_, next);
  // Removed objects are announced while the old snapshot still describes them.
  for (const std::string& path : d.removed) {
    (void)sd_bus_emit_interfaces_removed(bus_, path.c_str(), d.removed_interface.at(path).c_str(),
                                         nullptr);
  }
  snapshot_ = std::move(next);
  for (const std::string& path : d.added) (void)sd_bus_emit_object_added(bus_, path.c_str());
  for (const auto& [path, names] : d.changed) {
    std::vector<char*> argv;
    for (const std::string& n : names) argv.push_back(const_cast<char*>(n.c_str()));
    argv.push_back(nullptr);
    (void)sd_bus_emit_properties_changed_strv(bus_, path.c_str(),
                                              snapshot_.at(path).interface.c_str(), argv.data());
  }
}

int NodeBus::find_object(sd_bus*, const char* path, const char* interface, void* self, void** found,
                         sd_bus_error*) {
  auto* b = static_cast<NodeBus*>(self);
  auto it = b->snapshot_.find(path);
  if (it == b->snapshot_.end() || it->second.interface != interface) return 0;
  *found = b;
  return 1;
}

int NodeBus::enumerate(sd_bus*, const char* prefix, void* self, char*** nodes, sd_bus_error*) {
  auto* b = static_cast<NodeBus*>(self);
  const std::string p = std::string(prefix) + "/";
  std::vector<std::string> paths;
  for (const auto& [path, object] : b->snapshot_) {
    if (path.starts_with(p)) paths.push_back(path);
  }
  char** out = static_cast<char**>(std::calloc(paths.size() + 1, sizeof(char*)));
  if (out == nullptr) return -ENOMEM;
  for (std::size_t i = 0; i < paths.size(); ++i) out[i] = ::strdup(paths[i].c_str());
  *nodes = out;
  return 0;
}

int NodeBus::get_property(sd_bus*, const char* path, const char*, const char* property,
                          sd_bus_message* reply, void* self, sd_bus_error* error) {
  auto* b = static_cast<NodeBus*>(self);
  auto object = b->snapshot_.find(path);
  if (object == b->snapshot_.end()) {
    return sd_bus_error_setf(error, SD_BUS_ERROR_UNKNOWN_OBJECT, "%s is gone", path);
  }
  auto value = object->second.properties.find(property);
  if (value == object->second.properties.end()) return -ENOENT;
  return std::visit(
      [&](const auto& v) -> int {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return sd_bus_message_append(reply, "s", v.c_str());
        } else if constexpr (std::is_same_v<T, std::uint64_t>) {
          return sd_bus_message_append(reply, "t", static_cast<uint64_t>(v));
        } else if constexpr (std::is_same_v<T, std::uint32_t>) {
          return sd_bus_message_append(reply, "u", static_cast<uint32_t>(v));
        } else {
          return sd_bus_message_append(reply, "d", v);
        }
      },
      value->second);
}

}  // namespace thaw::daemon
