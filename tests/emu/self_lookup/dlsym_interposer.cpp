// A dlsym interposer for init_self_lookup_test, preloaded into init_probe. It acts only on
// lookups of "cu" names made by code inside libcuda.so.1 (the emulator), as
// EMU_DLSYM_INTERPOSER says:
//   record  answer truthfully and write "interposer: driver looked up NAME" to stderr
//   decoy   answer with a function of this library, as a careless interposer hands the
//           driver its hooks (HAMi-core's pitfall)
// Every other lookup is forwarded to glibc's dlsym, which then sees this library as the caller:
// RTLD_NEXT lookups resolve from here. Here that is harmless — this library comes last in
// LD_PRELOAD, after any sanitizer runtime that looks its interceptees up this way.
// Nothing here may be instrumented: a sanitizer runtime calls dlsym before it is initialised.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using Dlsym = void* (*)(void*, const char*);

__attribute__((no_sanitize("address", "undefined"))) Dlsym real_dlsym() {
  // Racing threads would store the same value.
  static Dlsym real = nullptr;
  if (real == nullptr) {
    real = reinterpret_cast<Dlsym>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (real == nullptr)
      real = reinterpret_cast<Dlsym>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    if (real == nullptr) real = reinterpret_cast<Dlsym>(::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"));
    if (real == nullptr) std::abort();
  }
  return real;
}

bool called_from_driver(const void* return_address) {
  Dl_info info{};
  return ::dladdr(return_address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libcuda.so") != nullptr;
}

}  // namespace

// What the driver gets in decoy mode; never meant to be called.
extern "C" __attribute__((visibility("default"))) int emu_dlsym_interposer_decoy() {
  return -1;
}

extern "C" __attribute__((visibility("default"), no_sanitize("address", "undefined"))) void* dlsym(
    void* handle, const char* name) {
  void* found = real_dlsym()(handle, name);
  // No library call before this test: the sanitizer's own lookups must stay untouched.
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return found;
  if (!called_from_driver(__builtin_return_address(0))) return found;
  const char* mode = std::getenv("EMU_DLSYM_INTERPOSER");
  if (mode != nullptr && std::strcmp(mode, "decoy") == 0) {
    return reinterpret_cast<void*>(&emu_dlsym_interposer_decoy);
  }
  const std::string line = std::string("interposer: driver looked up ") + name + "\n";
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
  return found;
}
