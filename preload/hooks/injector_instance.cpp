#include "preload/hooks/injector_instance.hpp"

#include <atomic>
#include <mutex>

#include "preload/thawd_client/thawd_client.hpp"
#include "preload/hooks/layout_instance.hpp"
#include "preload/hooks/recorder_instance.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

std::mutex& mutex() {
  static auto* m = new std::mutex();  // never destroyed: hooks run during exit
  return *m;
}
SlotGrant*& pending() {
  static SlotGrant* g = nullptr;
  return g;
}
std::atomic<bool> g_pending{false};
std::atomic<WeightInjector*> g_injector{nullptr};

template <typename Fn>
void resolve(Fn& out, const char* name) {
  out = reinterpret_cast<Fn>(driver_symbol(name));
}

std::optional<InjectorDriver> resolve_driver() {
  InjectorDriver d;
  resolve(d.mem_import, "cuMemImportFromShareableHandle");
  resolve(d.mem_address_reserve, "cuMemAddressReserve");
  resolve(d.mem_address_free, "cuMemAddressFree");
  resolve(d.mem_map, "cuMemMap");
  resolve(d.mem_unmap, "cuMemUnmap");
  resolve(d.mem_release, "cuMemRelease");
  resolve(d.mem_set_access, "cuMemSetAccess");
  resolve(d.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
  resolve(d.stream_synchronize, "cuStreamSynchronize");
  resolve(d.event_create, "cuEventCreate");
  resolve(d.event_record, "cuEventRecord");
  resolve(d.event_query, "cuEventQuery");
  resolve(d.event_synchronize, "cuEventSynchronize");
  resolve(d.event_destroy, "cuEventDestroy_v2");
  resolve(d.ctx_get_device, "cuCtxGetDevice");
  if (!d.complete()) return std::nullopt;
  return d;
}

}  // namespace

void install_injector(SlotGrant grant) {
  std::lock_guard lock(mutex());
  if (pending() != nullptr || g_injector.load() != nullptr) return;  // one slot per process
  pending() = new SlotGrant(std::move(grant));
  g_pending.store(true, std::memory_order_release);
}

WeightInjector* injector_instance() {
  if (WeightInjector* i = g_injector.load(std::memory_order_acquire)) return i;
  if (!g_pending.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mutex());
  if (WeightInjector* i = g_injector.load()) return i;
  if (pending() == nullptr) return nullptr;
  auto driver = resolve_driver();
  if (!driver) return nullptr;  // the driver is not loaded yet: later
  InjectorEnvironment env;
  env.record_fingerprint = []() -> std::optional<std::string> {
    LayoutRecorder* r = recorder_instance();
    return r != nullptr ? r->record_fingerprint() : std::nullopt;
  };
  const std::string slot = pending()->slot;
  env.free_pages = [slot](const std::vector<std::uint64_t>& offsets) {
    daemon_free_pages(slot, offsets);
  };
  env.notice = [](const std::string& message) { notice_once("inject", message); };
  // Lives for the whole process: hooks may run during exit, after static destructors.
  auto* injector = new WeightInjector(*driver, std::move(env), std::move(*pending()));
  delete pending();
  pending() = nullptr;
  if (injector->grant().layout_kind == "engine") {
    if (DeterministicLayout* layout = layout_instance()) layout->set_backing(injector);
  }
  injector->start_import();
  g_injector.store(injector, std::memory_order_release);
  return injector;
}

void finish_injection_at_exit() {
  WeightInjector* injector = g_injector.load();
  std::string slot;
  {
    std::lock_guard lock(mutex());
    if (injector == nullptr && pending() != nullptr) slot = pending()->slot;  // never used
  }
  if (injector != nullptr) {
    const bool handback = injector->finish();
    const InjectorStats s = injector->stats();
    debug(
        "slot {}: {} bytes injected, {} skipped (zero-copy {}), {} copied from files, {} pages "
        "mapped, {} freed; {}",
        injector->grant().slot, s.bytes_injected, s.bytes_skipped, s.zero_copy ? "on" : "off",
        s.bytes_copied, s.pages_mapped, s.pages_freed,
        handback ? "handing it back prewarmed" : "it cannot be handed back");
    daemon_release_slot(injector->grant().slot, handback);
  } else if (!slot.empty()) {
    daemon_release_slot(slot, true);
  }
}

}  // namespace thaw::preload
