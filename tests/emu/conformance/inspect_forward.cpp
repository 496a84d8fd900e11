// The emulator's inspection calls (thaw/emu_inspect.h), defined in the conformance program so it
// loads against any libcuda.so.1: the suites call them directly, and a real driver has no such
// symbols. Each forwards to the loaded libcuda's own function when it has one (the emulator);
// otherwise it answers CUDA_ERROR_NOT_SUPPORTED, so a check that forgot to skip on a real driver
// fails by name instead of ending the process.
#include <cuda.h>
#include <dlfcn.h>

#include "thaw/emu_inspect.h"

namespace {

template <class Fn>
Fn from_libcuda(const char* name) {
  void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (libcuda == nullptr) return nullptr;
  return reinterpret_cast<Fn>(dlsym(libcuda, name));  // the handle stays open: libcuda stays
}

}  // namespace

extern "C" int thawEmuGetDeviceStats(int device, ThawEmuDeviceStats* out) {
  static const auto fn = from_libcuda<int (*)(int, ThawEmuDeviceStats*)>("thawEmuGetDeviceStats");
  return fn != nullptr ? fn(device, out) : CUDA_ERROR_NOT_SUPPORTED;
}

extern "C" int thawEmuGetProcessStats(ThawEmuProcessStats* out) {
  static const auto fn = from_libcuda<int (*)(ThawEmuProcessStats*)>("thawEmuGetProcessStats");
  return fn != nullptr ? fn(out) : CUDA_ERROR_NOT_SUPPORTED;
}
