// thawEmu* inspection entry points (emu/include/thaw/emu_inspect.h): exact counts for
// tests' leak checks. Not CUDA API.
#include "api_common.hpp"
#include "thaw/emu_inspect.h"

using namespace emu;

EMU_EXPORT int thawEmuGetDeviceStats(int device, ThawEmuDeviceStats* out) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  ThawEmuDeviceStats s{};
  Device& d = driver().device(device);
  s.capacity_bytes = d.capacity;
  s.device_bytes_in_use = d.ledger.used();
  s.process_bytes_in_use = d.ledger.used_by_self();
  std::shared_lock lock(driver().space_mu);
  auto& space = driver().space;
  for (auto& [h, ref] : driver().vmm_handles) {
    if (ref.refs > 0 && ref.mem->device() == device) {
      s.vmm_handle_refs += static_cast<unsigned>(ref.refs);
    }
  }
  for (auto& [va, res] : space.reservations) {
    for (auto& [mva, m] : res.mappings) {
      if (m.mem->device() == device) ++s.vmm_mappings;
    }
  }
  for (auto& [va, a] : space.legacy) {
    if (a.mem->device() == device) ++s.legacy_allocations;
  }
  for (auto& [va, m] : space.ipc) {
    if (m.mem->device() == device) ++s.ipc_mappings;
  }
  for (auto& [key, weak] : driver().known_memory) {
    if (auto m = weak.lock(); m && m->device() == device) ++s.physical_allocations;
  }
  s.physical_allocations += s.legacy_allocations + s.ipc_mappings;
  *out = s;
  return CUDA_SUCCESS;
}

EMU_EXPORT int thawEmuGetProcessStats(ThawEmuProcessStats* out) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ThawEmuProcessStats s{};
  {
    std::lock_guard lock(driver().mu);
    for (auto& [h, ctx] : driver().contexts.items()) {
      if (!ctx->destroyed && ctx->active) ++s.contexts;
    }
    s.streams = driver().streams.size();
    s.events = driver().events.size();
  }
  {
    std::shared_lock lock(driver().space_mu);
    s.reservations = driver().space.reservations.size();
    for (auto& [va, r] : driver().space.reservations) s.reserved_bytes += r.range.size();
    s.pinned_host_ranges = driver().space.pinned.size();
  }
  s.trace_lines = trace().lines();
  *out = s;
  return CUDA_SUCCESS;
}
