// thawd's D-Bus API, laid out like systemd-machined (sd-bus vtables, one object per thing):
//
//   org.thaw.Node1  /org/thaw/Node1             org.thaw.Node1.Manager   (+ ObjectManager)
//                   /org/thaw/Node1/gpu/<n>     org.thaw.Node1.Gpu
//                   /org/thaw/Node1/slot/<id>   org.thaw.Node1.Slot
//                   /org/thaw/Node1/model/<key> org.thaw.Node1.Model     (key path-escaped)
//
// The interfaces are in packaging/org.thaw.Node1.*.xml. Properties are served from a
// snapshot (bus_snapshot.hpp) refreshed every `tick` and after every mutating call; the
// difference between snapshots goes out as PropertiesChanged / InterfacesAdded /
// InterfacesRemoved, so progress signals come at most once per tick per object.
//
// Mutating methods (Fetch, Prewarm, PrewarmLayers, Activate, Deactivate, Evict) check the
// caller: the bus policy (packaging/org.thaw.Node1.conf) already limits them to root and
// group thaw, and thawd asks the bus for the credentials it recorded when the sender
// connected (bus_caller.hpp; never /proc, which is racy) and checks them against its own
// AccessPolicy, answering org.freedesktop.DBus.Error.AccessDenied. Errors of the service
// are org.thaw.Error.* with the service's message. tests/daemon/api checks both layers for
// every method thawd exports.
//
// ListArtifacts(model) reads the engines' recorded artifacts (ArtifactStore::list; "" lists
// every model's): a method rather than per-Model properties, because properties come from
// snapshots taken every tick and a listing reads the state directory.
#pragma once

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include <chrono>
#include <expected>
#include <memory>
#include <string>
#include <vector>

#include "daemon/api/bus_snapshot.hpp"
#include "daemon/artifacts/artifact_store.hpp"
#include "daemon/service/access_policy.hpp"
#include "daemon/service/node_service.hpp"

namespace thaw::daemon {

class NodeBus {
 public:
  // Connects to `bus` ("system", "user" or an address), exports every object, attaches to
  // `event`, and takes the bus name (failing if another thawd owns it). `artifacts` may be
  // null (ListArtifacts then lists nothing).
  static std::expected<std::unique_ptr<NodeBus>, std::string> start(
      const std::string& bus, ManagerInfo manager, NodeService& service, const AccessPolicy& access,
      sd_event* event, const ArtifactStore* artifacts = nullptr,
      std::chrono::milliseconds tick = std::chrono::milliseconds(250));
  ~NodeBus();
  NodeBus(const NodeBus&) = delete;
  NodeBus& operator=(const NodeBus&) = delete;

  // Takes a new snapshot and emits what changed. The timer calls it; so do methods.
  void refresh();
  void set_access(const AccessPolicy& access) { access_ = &access; }

 private:
  NodeBus(ManagerInfo manager, NodeService& service, const AccessPolicy& access)
      : manager_(std::move(manager)), service_(service), access_(&access) {}

  static int get_property(sd_bus* bus, const char* path, const char* interface,
                          const char* property, sd_bus_message* reply, void* self,
                          sd_bus_error* error);
  static int find_object(sd_bus* bus, const char* path, const char* interface, void* self,
                         void** found, sd_bus_error* error);
  static int enumerate(sd_bus* bus, const char* prefix, void* self, char*** nodes,
                       sd_bus_error* error);
  static int on_tick(sd_event_source* source, uint64_t usec, void* self);

  // Methods (node_bus_methods.cpp).
  static int method_fetch(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_prewarm(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_prewarm_layers(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_activate(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_deactivate(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_evict(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_list_gpus(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_list_slots(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_list_models(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_list_artifacts(sd_bus_message* m, void* self, sd_bus_error* error);
  static int method_get_network(sd_bus_message* m, void* self, sd_bus_error* error);
  // Checks the sender against the access policy; < 0 (error set) when refused.
  int authorize(sd_bus_message* m, const char* action, sd_bus_error* error);

  ManagerInfo manager_;
  NodeService& service_;
  const AccessPolicy* access_;
  const ArtifactStore* artifacts_ = nullptr;
  BusSnapshot snapshot_;
  std::chrono::milliseconds tick_{250};
  sd_bus* bus_ = nullptr;
  sd_event_source* timer_ = nullptr;
  std::vector<sd_bus_slot*> slots_;
};

}  // namespace thaw::daemon
