// init_probe: cuInit twice and cuDeviceGetCount, each result on one stdout line, for
// init_self_lookup_test (which runs it under a dlsym interposer). Links the emulator directly.
#include <cuda.h>

#include <cstdio>

int main() {
  const CUresult first = cuInit(0);
  const CUresult second = cuInit(0);  // a refusal is not remembered as success, nor vice versa
  int count = 0;
  const CUresult counted = cuDeviceGetCount(&count);
  std::printf("cuInit=%d\ncuInit=%d\ncuDeviceGetCount=%d\n", first, second, counted);
  return 0;
}
