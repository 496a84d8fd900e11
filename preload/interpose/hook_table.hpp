// The hooked set: the exact driver entry points (ABI variants, e.g. "cuMemAlloc_v2") the shim
// intercepts, each with its hook and the real function it forwards to.
//
// Engines reach a variant three ways, and all three end here:
//   - linking libcuda.so.1: the shim exports a symbol of the same name (the hook itself);
//   - dlsym(handle, "cuMemAlloc_v2"): the shim's dlsym returns the hook;
//   - cuGetProcAddress("cuMemAlloc", ..., cudaVersion, flags): the wrapped lookup asks the
//     driver first, then swaps in the hook only if the driver's answer is this variant.
// Everything not in this table is the driver's own pointer, untouched.
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>

namespace thaw::preload {

enum class Hook : std::size_t {
  mem_alloc,
  mem_free,
  mem_get_address_range,
  pointer_get_attribute,
  pointer_get_attributes,
  memcpy_htod,
  memcpy_htod_ptds,
  memcpy_htod_async,
  memcpy_htod_async_ptsz,
  mem_get_info,
  ipc_get_mem_handle,
  ipc_open_mem_handle,
  ipc_close_mem_handle,
  mem_address_reserve,
  mem_address_free,
  mem_create,
  mem_release,
  mem_map,
  mem_unmap,
  mem_set_access,
  mem_get_access,
  mem_retain_allocation_handle,
  ctx_destroy,
  primary_ctx_release,
  primary_ctx_release_v2,
  primary_ctx_reset,
  primary_ctx_reset_v2,
  stream_begin_capture,
  stream_begin_capture_ptsz,
  stream_begin_capture_v2,
  stream_begin_capture_v2_ptsz,
  stream_begin_capture_to_graph,
  stream_begin_capture_to_graph_ptsz,
  stream_end_capture,
  stream_end_capture_ptsz,
  module_load,
  module_load_data,
  module_load_data_ex,
  module_load_fat_binary,
  library_load_data,
  library_load_from_file,
  launch_kernel,
  launch_kernel_ptsz,
  launch_kernel_ex,
  launch_kernel_ex_ptsz,
  event_record,
  event_record_ptsz,
  event_record_with_flags,
  event_record_with_flags_ptsz,
  stream_wait_event,
  stream_wait_event_ptsz,
  launch_host_func,
  launch_host_func_ptsz,
  graph_launch,
  graph_launch_ptsz,
  graph_instantiate_with_flags,
  stream_get_capture_info_v2,
  stream_get_capture_info_v2_ptsz,
  stream_get_capture_info_v3,
  stream_get_capture_info_v3_ptsz,
  graph_instantiate_with_params,
  graph_instantiate_with_params_ptsz,
  memset_d8_async,
  memset_d8_async_ptsz,
  memset_d16_async,
  memset_d16_async_ptsz,
  memset_d32_async,
  memset_d32_async_ptsz,
  memcpy_dtod_async,
  memcpy_dtod_async_ptsz,
  count
};

struct HookEntry {
  const char* variant;  // the exported name of the ABI variant hooked
  void* hook;
  std::atomic<void*> real{nullptr};  // the driver's function, once known
};

// The table; entries are in Hook order.
HookEntry& hook_entry(Hook h);
// The entry for an exported variant name, or nullptr when it is not hooked.
HookEntry* find_hook(std::string_view variant);
// The entry whose hook is `hook`, or nullptr.
HookEntry* find_hook_by_pointer(const void* hook);

// The real function of a hooked variant: as handed over by the driver, else looked up in
// the driver library. nullptr when no driver is loaded.
void* real_function(Hook h);
template <typename Fn>
Fn real(Hook h) {
  return reinterpret_cast<Fn>(real_function(h));
}

}  // namespace thaw::preload
