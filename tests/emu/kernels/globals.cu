// __device__ and __constant__ variables for cuModuleGetGlobal (tests/emu/module_api_test.cpp).
// Host twins (globals_twins.cpp) cannot name a module's device globals, so the kernel that
// the test runs takes the variable's address as a parameter (from cuModuleGetGlobal).

__device__ int counter = 42;                              // .nv.global.init
__device__ float zeros[16];                               // .nv.global (no bytes)
__constant__ float coeffs[4] = {1.5f, 2.5f, 3.5f, 4.5f};  // .nv.constant3

// *target += by, from every thread.
extern "C" __global__ void add_to(int* target, int by) {
  atomicAdd(target, by);
}

// Reads the globals by name (keeps them in the image). Has no twin: it is never launched.
extern "C" __global__ void read_globals(float* out) {
  out[threadIdx.x] = counter + zeros[threadIdx.x & 15] + coeffs[threadIdx.x & 3];
}
