// Host twins of the kernels in chain.cu (see thaw/emu_twin.h). The library's table is
// exported by samples_twins.cpp. Where nvcc contracts `x * y + z` into one fused multiply-add
// (its default), the twin calls std::fma, so it rounds as the H100 does.
#include <cmath>

#include "thaw/emu_twin.h"

using thaw::emu::blockDim;
using thaw::emu::blockIdx;
using thaw::emu::threadIdx;

extern "C" void axpb(float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = std::fma(a, x[i], b);  // nvcc contracts a * x[i] + b into an FFMA
}
THAW_EMU_TWIN_PER_THREAD(axpb);

extern "C" void add_into(float* dst, const float* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
THAW_EMU_TWIN_PER_THREAD(add_into);
