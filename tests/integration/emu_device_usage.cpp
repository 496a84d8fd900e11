// Prints the emulated GPU 0's bytes in use by all live processes sharing
// $THAW_EMU_STATE_DIR (the emulator's inspection API), as {"device_bytes_in_use": N}: what
// the weight-injection tests compare with thawd's pool to prove nothing leaked.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "thaw/emu_inspect.h"

int main() {
  const char* lib = std::getenv("THAW_LIBCUDA");
  void* h = dlopen(lib != nullptr ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "cannot load the emulator: %s\n", dlerror());
    return 1;
  }
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
  auto stats =
      reinterpret_cast<int (*)(int, ThawEmuDeviceStats*)>(dlsym(h, "thawEmuGetDeviceStats"));
  ThawEmuDeviceStats s{};
  if (init == nullptr || stats == nullptr || init(0) != CUDA_SUCCESS || stats(0, &s) != 0) {
    std::fprintf(stderr, "the driver at %s has no emulator inspection\n", lib);
    return 1;
  }
  std::printf("{\"device_bytes_in_use\": %llu}\n", s.device_bytes_in_use);
  return 0;
}
