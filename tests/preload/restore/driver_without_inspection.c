/* A CUDA driver without thaw's emulator's inspection calls, as NVIDIA's driver is: every entry
 * point is the emulator's (found through its cuGetProcAddress_v2, loaded RTLD_LOCAL so that its
 * thawEmu* symbols stay out of sight), and this library exports nothing else. The parity test
 * runs refengine --dump-graphs on it to check the error a real driver would give. */
#include <dlfcn.h>
#include <stddef.h>

typedef int (*GetProcAddress)(const char*, void**, int, unsigned long long, int*);

int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                        int* status) {
  static GetProcAddress real = NULL;
  if (real == NULL) {
    void* emu = dlopen(THAW_EMU_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
    if (emu == NULL) return 34; /* CUDA_ERROR_STUB_LIBRARY: no driver behind this one */
    real = (GetProcAddress)dlsym(emu, "cuGetProcAddress_v2");
    if (real == NULL) return 34;
  }
  return real(symbol, pfn, version, flags, status);
}
