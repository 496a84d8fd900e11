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

[[maybe_unused]] bool is_driver_name(const char* name) {
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
  // A lookup in the global scope (dlsym(RTLD_DEFAULT, …)) finds the shim's own export first:
  // that is the hook, never the driver's function — kept as "real", the hook would call itself.
  if (found == entry->hook) return found;
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

namespace {

// Whether `caller` (a return address) lies in the library that defines `symbol`: a library
// looking itself up — the driver resolving its own entry points, before the shim knows
// which library the driver is (a program linked against libcuda.so.1 calls cuInit before
// any lookup has named it) — gets its own function, never a hook.
bool same_object(const void* caller, const void* symbol) {
  Dl_info c{}, s{};
  return ::dladdr(caller, &c) != 0 && ::dladdr(symbol, &s) != 0 && c.dli_fbase == s.dli_fbase;
}

}  // namespace

// dlsym itself is a few instructions of assembly (x86-64): any name that is not "cu" + an
// upper-case letter is a tail jump to glibc's dlsym, so glibc sees the original caller's
// return address — RTLD_NEXT lookups (a sanitizer runtime's, another interposer's) resolve
// relative to *their* library, not the shim's — and nothing instrumented runs before a
// sanitizer runtime is ready. Driver names go to thaw_dlsym_driver_name below.
extern "C" void* thaw_real_dlsym_ptr;
extern "C" void* thaw_resolve_real_dlsym();

extern "C" __attribute__((visibility("hidden"))) void* thaw_dlsym_driver_name(void* handle,
                                                                              const char* name) {
  void* found = real_dlsym()(handle, name);
  void* caller = __builtin_return_address(0);
  if (found == nullptr || config().disabled || ReentryGuard::inside() || inside_driver(caller) ||
      same_object(caller, found)) {
    return found;
  }
  ReentryGuard guard;
  note_driver_symbol(handle, found);
  return substitute(found);
}

#if defined(__x86_64__)
asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    test %rsi, %rsi
    jz 1f
    cmpb $0x63, (%rsi)          # 'c'
    jne 1f
    cmpb $0x75, 1(%rsi)         # 'u'
    jne 1f
    movzbl 2(%rsi), %eax
    sub $0x41, %eax             # 'A'..'Z'
    cmp $25, %eax
    ja 1f
    jmp thaw_dlsym_driver_name
1:  mov thaw_real_dlsym_ptr(%rip), %rax
    test %rax, %rax
    jz 2f
    jmp *%rax
2:  push %rdi
    push %rsi
    sub $8, %rsp
    call thaw_resolve_real_dlsym
    add $8, %rsp
    pop %rsi
    pop %rdi
    jmp *%rax
    .size dlsym, .-dlsym
)");
#else
// Elsewhere a C++ forwarder: correct for every name but RTLD_NEXT lookups of non-driver
// names, which then resolve relative to the shim.
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  if (is_driver_name(name)) return thaw_dlsym_driver_name(handle, name);
  return real_dlsym()(handle, name);
}
#endif

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
