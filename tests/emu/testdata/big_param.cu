// A kernel whose parameter space reaches 16 KiB: ptxas then describes every parameter with
// EIATTR_KPARAM_INFO_V2 records instead of EIATTR_KPARAM_INFO (see emu/src/cubin.hpp).
struct Big {
  unsigned char bytes[20000];
};

extern "C" __global__ void big_param(Big b, int* out) { out[0] = b.bytes[19999]; }
