#include "preload/interpose/real_driver.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "preload/shim/shim_state.hpp"

// glibc's dlsym, found once. Plain C and not sanitizer-instrumented: the shim's dlsym entry
// (entry_points.cpp) may be called by a sanitizer runtime before that runtime is initialised.
extern "C" {
__attribute__((visibility("hidden"))) void* thaw_real_dlsym_ptr = nullptr;
}

extern "C" __attribute__((visibility("hidden"), no_sanitize("address", "undefined"))) void*
thaw_resolve_real_dlsym() {
  // x86-64 glibc exports dlsym at GLIBC_2.2.5 and (since 2.34, libdl merged) GLIBC_2.34;
  // aarch64 at GLIBC_2.17.
  static const char* const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
  for (const char* version : versions) {
    if (void* p = ::dlvsym(RTLD_NEXT, "dlsym", version)) {
      __atomic_store_n(&thaw_real_dlsym_ptr, p, __ATOMIC_RELEASE);
      return p;
    }
  }
  static const char message[] = "thaw-preload: cannot find glibc's dlsym with dlvsym\n";
  ssize_t ignored = ::write(2, message, sizeof(message) - 1);
  (void)ignored;
  std::abort();
}

namespace thaw::preload {

namespace {

std::atomic<void*> g_driver_handle{nullptr};  // from the engine's own dlopen, if it did one
std::atomic<const void*> g_driver_base{nullptr};

const void* base_of(const void* symbol) {
  Dl_info info{};
  if (symbol == nullptr || ::dladdr(symbol, &info) == 0) return nullptr;
  return info.dli_fbase;
}

}  // namespace

DlsymFn real_dlsym() {
  if (void* p = __atomic_load_n(&thaw_real_dlsym_ptr, __ATOMIC_ACQUIRE)) {
    return reinterpret_cast<DlsymFn>(p);
  }
  return reinterpret_cast<DlsymFn>(thaw_resolve_real_dlsym());
}

void note_driver_symbol(void* handle, void* symbol) {
  if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) return;
  void* expected = nullptr;
  if (g_driver_handle.compare_exchange_strong(expected, handle)) {
    g_driver_base.store(base_of(symbol));
    debug("driver library: handle {} at base {}", handle, g_driver_base.load());
  }
}

void* driver_symbol(const char* name) {
  if (void* handle = g_driver_handle.load()) {
    if (void* p = real_dlsym()(handle, name)) return p;
  }
  // A program linked against libcuda.so.1: the next definition after the shim.
  void* p = real_dlsym()(RTLD_NEXT, name);
  if (p != nullptr && g_driver_base.load() == nullptr) g_driver_base.store(base_of(p));
  return p;
}

GetProcAddressV2Fn real_get_proc_address_v2() {
  return reinterpret_cast<GetProcAddressV2Fn>(driver_symbol("cuGetProcAddress_v2"));
}

GetProcAddressV1Fn real_get_proc_address_v1() {
  return reinterpret_cast<GetProcAddressV1Fn>(driver_symbol("cuGetProcAddress"));
}

bool inside_driver(const void* address) {
  const void* base = g_driver_base.load();
  return base != nullptr && base_of(address) == base;
}

}  // namespace thaw::preload
