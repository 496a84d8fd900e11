#include "daemon/api/manager_dbus.hpp"

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

}  // namespace

std::expected<std::unique_ptr<ManagerBus>, std::string> ManagerBus::start(const std::string& bus,
                                                                          ManagerModel model,
                                                                          sd_event* event) {
  // Const properties never change; State and CacheBytesUsed are read on every Get and do
  // not signal changes yet (EmitsChangedSignal=false) — PropertiesChanged comes with the
  // per-object work.
  static const sd_bus_vtable vtable[] = {
      SD_BUS_VTABLE_START(0),
      SD_BUS_PROPERTY("NodeId", "s", &ManagerBus::get_property, 0, SD_BUS_VTABLE_PROPERTY_CONST),
      SD_BUS_PROPERTY("Version", "s", &ManagerBus::get_property, 0, SD_BUS_VTABLE_PROPERTY_CONST),
      SD_BUS_PROPERTY("State", "s", &ManagerBus::get_property, 0, 0),
      SD_BUS_PROPERTY("CacheBytesUsed", "t", &ManagerBus::get_property, 0, 0),
      SD_BUS_PROPERTY("CacheBudgetBytes", "t", &ManagerBus::get_property, 0,
                      SD_BUS_VTABLE_PROPERTY_CONST),
      SD_BUS_PROPERTY("GpuCount", "u", &ManagerBus::get_property, 0, SD_BUS_VTABLE_PROPERTY_CONST),
      SD_BUS_METHOD_WITH_ARGS("ListGpus", SD_BUS_NO_ARGS, SD_BUS_RESULT("a(uttu)", gpus),
                              &ManagerBus::list_gpus, SD_BUS_VTABLE_UNPRIVILEGED),
      SD_BUS_VTABLE_END,
  };
  std::unique_ptr<ManagerBus> m(new ManagerBus());
  m->model_ = std::move(model);
  if (int r = open_bus(bus, &m->bus_); r < 0) {
    return std::unexpected(
        bus_error(fmt::format("connecting to the {} bus (dbus.bus in thawd.toml)", bus), r));
  }
  if (int r = sd_bus_add_object_vtable(m->bus_, &m->slot_, kManagerPath, kManagerInterface, vtable,
                                       m.get());
      r < 0) {
    return std::unexpected(bus_error("exporting the Manager", r));
  }
  if (int r = sd_bus_attach_event(m->bus_, event, SD_EVENT_PRIORITY_NORMAL); r < 0) {
    return std::unexpected(bus_error("attaching to the event loop", r));
  }
  if (int r = sd_bus_request_name(m->bus_, kBusName, 0); r < 0) {
    return std::unexpected(bus_error(
        fmt::format("taking the name {} (is another thawd running, or does the bus policy "
                    "not allow root to own it?)",
                    kBusName),
        r));
  }
  return m;
}

ManagerBus::~ManagerBus() {
  if (slot_ != nullptr) sd_bus_slot_unref(slot_);
  if (bus_ != nullptr) sd_bus_flush_close_unref(bus_);
}

int ManagerBus::get_property(sd_bus*, const char*, const char*, const char* property,
                             sd_bus_message* reply, void* self, sd_bus_error*) {
  const ManagerModel& m = static_cast<ManagerBus*>(self)->model_;
  const std::string_view p(property);
  if (p == "NodeId") return sd_bus_message_append(reply, "s", m.node_id.c_str());
  if (p == "Version") return sd_bus_message_append(reply, "s", m.version.c_str());
  if (p == "State") return sd_bus_message_append(reply, "s", m.state().c_str());
  if (p == "CacheBytesUsed") {
    return sd_bus_message_append(reply, "t", static_cast<uint64_t>(m.cache_bytes_used()));
  }
  if (p == "CacheBudgetBytes") {
    return sd_bus_message_append(reply, "t", static_cast<uint64_t>(m.cache_budget_bytes));
  }
  if (p == "GpuCount") {
    return sd_bus_message_append(reply, "u", static_cast<uint32_t>(m.gpus().size()));
  }
  return -ENOENT;
}

int ManagerBus::list_gpus(sd_bus_message* message, void* self, sd_bus_error*) {
  const ManagerModel& m = static_cast<ManagerBus*>(self)->model_;
  sd_bus_message* reply = nullptr;
  int r = sd_bus_message_new_method_return(message, &reply);
  if (r < 0) return r;
  if ((r = sd_bus_message_open_container(reply, 'a', "(uttu)")) >= 0) {
    for (const GpuSummary& g : m.gpus()) {
      r = sd_bus_message_append(reply, "(uttu)", g.index, static_cast<uint64_t>(g.pool_bytes),
                                static_cast<uint64_t>(g.free_bytes), g.slots);
      if (r < 0) break;
    }
    if (r >= 0) r = sd_bus_message_close_container(reply);
  }
  if (r >= 0) r = sd_bus_send(nullptr, reply, nullptr);
  sd_bus_message_unref(reply);
  return r;
}

}  // namespace thaw::daemon
