#include "preload/hooks/layout_instance.hpp"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include "preload/thawd_client/thawd_client.hpp"
#include "preload/hooks/recorder_instance.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

std::atomic<DeterministicLayout*> g_layout{nullptr};
std::mutex g_layout_mutex;

template <typename Fn>
void resolve(Fn& out, const char* name) {
  out = reinterpret_cast<Fn>(driver_symbol(name));
}

void after_fork_in_child() {
  new (&g_layout_mutex) std::mutex();
  if (DeterministicLayout* layout = g_layout.load()) layout->reset_after_fork();
  recorder_after_fork_in_child();
  daemon_after_fork_in_child();
}

}  // namespace

DeterministicLayout* layout_instance() {
  if (!config().deterministic || config().disabled) return nullptr;
  if (DeterministicLayout* layout = g_layout.load(std::memory_order_acquire)) return layout;
  std::lock_guard lock(g_layout_mutex);
  if (DeterministicLayout* layout = g_layout.load()) return layout;
  LayoutDriver d;
  resolve(d.ctx_get_device, "cuCtxGetDevice");
  resolve(d.device_total_mem, "cuDeviceTotalMem_v2");
  resolve(d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
  resolve(d.mem_address_reserve, "cuMemAddressReserve");
  resolve(d.mem_address_free, "cuMemAddressFree");
  resolve(d.mem_create, "cuMemCreate");
  resolve(d.mem_release, "cuMemRelease");
  resolve(d.mem_map, "cuMemMap");
  resolve(d.mem_unmap, "cuMemUnmap");
  resolve(d.mem_set_access, "cuMemSetAccess");
  if (d.ctx_get_device == nullptr) return nullptr;  // no driver loaded yet
  // Lives for the whole process: hooks may run during exit, after static destructors.
  auto* layout = new DeterministicLayout(d, config().va_base, recorder_instance());
  g_layout.store(layout, std::memory_order_release);
  return layout;
}

void register_fork_handler() {
  ::pthread_atfork(nullptr, nullptr, &after_fork_in_child);
}

}  // namespace thaw::preload
