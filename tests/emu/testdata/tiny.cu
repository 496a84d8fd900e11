// The smallest useful cubin: a small seed for the fuzz target (tests/fuzz).
extern "C" __global__ void tiny(int* p, int v) { p[threadIdx.x] = v; }
