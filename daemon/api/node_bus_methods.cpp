// The Manager's methods: argument parsing, the caller check, the service call, and turning
// a ServiceError into a named D-Bus error.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>

#include "daemon/api/bus_caller.hpp"
#include "daemon/api/node_bus.hpp"

namespace thaw::daemon {

namespace {

int fail(sd_bus_error* error, const ServiceError& e) {
  return sd_bus_error_set(error, e.name.c_str(), e.message.c_str());
}

NodeBus* self_of(void* p) {
  return static_cast<NodeBus*>(p);
}

}  // namespace

int NodeBus::authorize(sd_bus_message* m, const char* action, sd_bus_error* error) {
  // The bus's record of the caller, never credentials read from /proc (bus_caller.hpp).
  auto caller = query_bus_caller(m);
  if (!caller) {
    return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                             "%s refused: thawd cannot tell who is calling (%s)", action,
                             caller.error().c_str());
  }
  if (access_->allows(caller->peer)) return 0;
  return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
                           "%s needs %s (caller uid %u%s); reading properties is open to everyone",
                           action, access_->describe().c_str(),
                           static_cast<unsigned>(caller->peer.uid),
                           caller->groups_known ? "" : ", whose groups the bus did not report");
}

int NodeBus::method_fetch(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* model = nullptr;
  if (int r = sd_bus_message_read(m, "s", &model); r < 0) return r;
  if (int r = b->authorize(m, "Fetch", error); r < 0) return r;
  auto key = b->service_.fetch(model);
  if (!key) return fail(error, key.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "o", model_path(*key).c_str());
}

int NodeBus::method_prewarm(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* model = nullptr;
  int32_t gpu = -1;
  if (int r = sd_bus_message_read(m, "si", &model, &gpu); r < 0) return r;
  if (int r = b->authorize(m, "Prewarm", error); r < 0) return r;
  std::optional<std::uint32_t> which;
  if (gpu >= 0) which = static_cast<std::uint32_t>(gpu);
  auto slot = b->service_.prewarm(model, which);
  if (!slot) return fail(error, slot.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "o", slot_path(*slot).c_str());
}

int NodeBus::method_prewarm_layers(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* model = nullptr;
  int32_t gpu = -1;
  int32_t layers = -1;
  if (int r = sd_bus_message_read(m, "sii", &model, &gpu, &layers); r < 0) return r;
  if (int r = b->authorize(m, "PrewarmLayers", error); r < 0) return r;
  std::optional<std::uint32_t> which;
  if (gpu >= 0) which = static_cast<std::uint32_t>(gpu);
  auto slot = b->service_.prewarm(model, which, layers);
  if (!slot) return fail(error, slot.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "o", slot_path(*slot).c_str());
}

int NodeBus::method_activate(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* slot = nullptr;
  uint64_t kv_bytes = 0;
  if (int r = sd_bus_message_read(m, "st", &slot, &kv_bytes); r < 0) return r;
  if (int r = b->authorize(m, "Activate", error); r < 0) return r;
  if (auto ok = b->service_.activate(slot, kv_bytes); !ok) return fail(error, ok.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "");
}

int NodeBus::method_deactivate(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* slot = nullptr;
  if (int r = sd_bus_message_read(m, "s", &slot); r < 0) return r;
  if (int r = b->authorize(m, "Deactivate", error); r < 0) return r;
  if (auto ok = b->service_.deactivate(slot); !ok) return fail(error, ok.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "");
}

int NodeBus::method_evict(sd_bus_message* m, void* self, sd_bus_error* error) {
  NodeBus* b = self_of(self);
  const char* slot = nullptr;
  if (int r = sd_bus_message_read(m, "s", &slot); r < 0) return r;
  if (int r = b->authorize(m, "Evict", error); r < 0) return r;
  if (auto ok = b->service_.evict(slot); !ok) return fail(error, ok.error());
  b->refresh();
  return sd_bus_reply_method_return(m, "");
}

namespace {

// Builds a reply holding one array, filled by `append` for each element.
template <typename Items, typename Append>
int reply_array(sd_bus_message* m, const char* element, const Items& items, Append append) {
  sd_bus_message* reply = nullptr;
  int r = sd_bus_message_new_method_return(m, &reply);
  if (r < 0) return r;
  if ((r = sd_bus_message_open_container(reply, 'a', element)) >= 0) {
    for (const auto& item : items) {
      if ((r = append(reply, item)) < 0) break;
    }
    if (r >= 0) r = sd_bus_message_close_container(reply);
  }
  if (r >= 0) r = sd_bus_send(nullptr, reply, nullptr);
  sd_bus_message_unref(reply);
  return r;
}

}  // namespace

int NodeBus::method_list_gpus(sd_bus_message* m, void* self, sd_bus_error*) {
  return reply_array(
      m, "(uttu)", self_of(self)->service_.gpus(), [](sd_bus_message* reply, const GpuStatus& g) {
        return sd_bus_message_append(reply, "(uttu)", g.index, static_cast<uint64_t>(g.pool_bytes),
                                     static_cast<uint64_t>(g.free_bytes), g.slots);
      });
}

int NodeBus::method_list_slots(sd_bus_message* m, void* self, sd_bus_error*) {
  return reply_array(m, "(susstto)", self_of(self)->service_.slots(),
                     [](sd_bus_message* reply, const SlotStatus& s) {
                       return sd_bus_message_append(
                           reply, "(susstto)", s.id.c_str(), s.gpu, s.model.c_str(),
                           s.state.c_str(), static_cast<uint64_t>(s.resident_bytes),
                           static_cast<uint64_t>(s.total_bytes), slot_path(s.id).c_str());
                     });
}

int NodeBus::method_list_models(sd_bus_message* m, void* self, sd_bus_error*) {
  return reply_array(m, "(ssstto)", self_of(self)->service_.models(),
                     [](sd_bus_message* reply, const ModelStatus& s) {
                       return sd_bus_message_append(
                           reply, "(ssstto)", s.key.c_str(), s.name.c_str(),
                           std::string(to_string(s.state)).c_str(),
                           static_cast<uint64_t>(s.fetched_bytes),
                           static_cast<uint64_t>(s.total_bytes), model_path(s.key).c_str());
                     });
}

int NodeBus::method_list_artifacts(sd_bus_message* m, void* self, sd_bus_error*) {
  NodeBus* b = self_of(self);
  const char* model = nullptr;
  if (int r = sd_bus_message_read(m, "s", &model); r < 0) return r;
  const std::vector<ListedArtifact> listed =
      b->artifacts_ != nullptr ? b->artifacts_->list(model) : std::vector<ListedArtifact>{};
  return reply_array(m, "(ssssssuttbs)", listed,
                     [](sd_bus_message* reply, const ListedArtifact& a) {
                       const ArtifactIdentity& id = a.identity;
                       return sd_bus_message_append(
                           reply, "(ssssssuttbs)", a.key.c_str(), id.kind.c_str(), id.model.c_str(),
                           id.engine.c_str(), id.gpu.c_str(), id.driver.c_str(),
                           static_cast<uint32_t>(a.owner.value_or(static_cast<uid_t>(-1))),
                           static_cast<uint64_t>(a.bytes),
                           static_cast<uint64_t>(std::max<std::int64_t>(a.modified_usec, 0)),
                           static_cast<int>(a.summary.readable), a.summary.text.c_str());
                     });
}

int NodeBus::method_get_network(sd_bus_message* m, void* self, sd_bus_error*) {
  NodeBus* b = self_of(self);
  const NetStatus st = b->manager_.network ? b->manager_.network() : NetStatus{};
  sd_bus_message* reply = nullptr;
  if (int r = sd_bus_message_new_method_return(m, &reply); r < 0) return r;
  struct Unref {
    sd_bus_message* m;
    ~Unref() { sd_bus_message_unref(m); }
  } unref{reply};
  int r = sd_bus_message_append(reply, "bsstsut", static_cast<int>(st.enabled), st.detail.c_str(),
                                st.device.c_str(), st.link_bytes_per_s, st.rates_from.c_str(),
                                st.cold_starts, st.per_cold_start_bytes_per_s);
  if (r < 0) return r;
  if ((r = sd_bus_message_open_container(reply, 'a', "(stttttttt)")) < 0) return r;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    const NetClassStatus& c = st.classes[i];
    // The classifier's names (network::traffic_class_name), as metrics and thawctl show them.
    static constexpr const char* kNames[kNetClassCount] = {"inference", "critical_fetch",
                                                           "background_fetch", "other"};
    r = sd_bus_message_append(reply, "(stttttttt)", kNames[i], c.rate_bytes_per_s,
                              c.ceil_bytes_per_s, c.bytes[0], c.packets[0], c.drops[0], c.bytes[1],
                              c.packets[1], c.drops[1]);
    if (r < 0) return r;
  }
  if ((r = sd_bus_message_close_container(reply)) < 0) return r;
  // Fetched models' bytes as the classifier counted them: socket marks' model id, cache key.
  if ((r = sd_bus_message_open_container(reply, 'a', "(qst)")) < 0) return r;
  for (const NetModelStatus& model : st.models) {
    r = sd_bus_message_append(reply, "(qst)", model.id, model.name.c_str(), model.bytes);
    if (r < 0) return r;
  }
  if ((r = sd_bus_message_close_container(reply)) < 0) return r;
  return sd_bus_send(nullptr, reply, nullptr);
}

}  // namespace thaw::daemon
