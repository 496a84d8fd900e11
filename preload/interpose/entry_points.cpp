// The shim's two doors into the engine's driver lookups: an overriding dlsym, and wrapped
// cuGetProcAddress (v2 and v1). Both ask the real thing first and only then, for a name in
// the hooked set, swap in the hook; anything else — unknown names, other libraries'
// symbols (cudnn*, cublas*: only "cu" + upper case is the driver's), cuGetExportTable, the
// driver's own lookups, lookups made while the shim itself is running — is returned as the
// real answer, untouched.
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>

#include "preload/interpose/hook_table.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/shim/shim_state.hpp"

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the shim exports both ABIs.
#undef cuGetProcAddress

// The shim's exports of the lookup functions (defined below), handed out in place of the
// driver's so that dladdr and friends see the driver's names.
extern "C" CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult*);
extern "C" CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);

namespace thaw::preload {
namespace {

bool is_driver_name(const char* name) {
  return name != nullptr && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

CUresult wrapped_get_proc_address_v2(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult* status);
CUresult wrapped_get_proc_address_v1(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags);

// `found` is the driver's answer for some lookup; returns what the engine gets instead.
void* substitute(void* found) {
  if (found == nullptr || config().disabled) return found;
  if (found == reinterpret_cast<void*>(real_get_proc_address_v2())) {
    return reinterpret_cast<void*>(&::cuGetProcAddress_v2);
  }
  if (found == reinterpret_cast<void*>(real_get_proc_address_v1())) {
    return reinterpret_cast<void*>(&::cuGetProcAddress);
  }
  // The driver answered with some variant; hook it only if it is exactly a hooked one.
  Dl_info info{};
  if (::dladdr(found, &info) == 0 || info.dli_sname == nullptr) return found;
  HookEntry* entry = find_hook(info.dli_sname);
  if (entry == nullptr) return found;
  void* expected = nullptr;
  entry->real.compare_exchange_strong(expected, found);
  counters().hooks_handed_out.fetch_add(1, std::memory_order_relaxed);
  return entry->hook;
}

CUresult wrapped_get_proc_address_v2(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  auto real = real_get_proc_address_v2();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, cuda_version, flags, status);
  if (r != CUDA_SUCCESS || pfn == nullptr || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  counters().proc_address_lookups.fetch_add(1, std::memory_order_relaxed);
  // The driver resolved base name + version + flags to a variant (or to nothing, with
  // status SYMBOL_NOT_FOUND / VERSION_NOT_SUFFICIENT, which is passed on as is).
  *pfn = substitute(*pfn);
  return r;
}

CUresult wrapped_get_proc_address_v1(const char* symbol, void** pfn, int cuda_version,
                                     cuuint64_t flags) {
  auto real = real_get_proc_address_v1();
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult r = real(symbol, pfn, cuda_version, flags);
  if (r != CUDA_SUCCESS || pfn == nullptr || ReentryGuard::inside()) return r;
  ReentryGuard guard;
  counters().proc_address_lookups.fetch_add(1, std::memory_order_relaxed);
  *pfn = substitute(*pfn);
  return r;
}

}  // namespace
}  // namespace thaw::preload

using namespace thaw::preload;

extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  const DlsymFn real = real_dlsym();
  void* found = real(handle, name);
  if (found == nullptr || !is_driver_name(name) || config().disabled || ReentryGuard::inside() ||
      inside_driver(__builtin_return_address(0))) {
    return found;
  }
  ReentryGuard guard;
  note_driver_symbol(handle, found);
  return substitute(found);
}

// Programs linked against libcuda.so.1 call these by name; the shim's exports come first.
extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
    CUdriverProcAddressQueryResult* status) {
  return wrapped_get_proc_address_v2(symbol, pfn, cuda_version, flags, status);
}

extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress(const char* symbol,
                                                                            void** pfn,
                                                                            int cuda_version,
                                                                            cuuint64_t flags) {
  return wrapped_get_proc_address_v1(symbol, pfn, cuda_version, flags);
}
