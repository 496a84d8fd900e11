// Kernels whose cubins, fatbins and PTX the module image tests parse (tests/emu/cubin_test.cpp)
// and the fuzz replay starts from (tests/fuzz); big_param.cu and tiny.cu are the others. Each kernel exercises one thing the parser
// reads; cubin_test.cpp asserts the exact names and parameter layouts below, so keep them in
// sync. Built by tests/emu/testdata/CMakeLists.txt with nvcc.
#include <cstdint>

struct Pair {  // 24 bytes, 8-aligned: a struct passed by value
  float a;
  double b;
  int c;
};

__device__ int dev_counter = 42;             // .nv.global.init
__device__ float dev_zero[16];               // .nv.global (no bytes in the file)
__constant__ float const_coeffs[4] = {1.0f, 2.0f, 3.0f, 4.0f};  // .nv.constant3
__managed__ int managed_counter = 7;         // STO_CUDA_MANAGED
namespace thaw_test {
__device__ unsigned long long ns_value = 0x0123456789abcdefULL;  // mangled name
}

// An out-of-line __device__ function: a STT_FUNC symbol that is not a kernel.
__device__ __noinline__ float helper(float x) { return x * const_coeffs[1] + dev_counter; }

extern "C" __global__ void vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i] + dev_zero[i & 15] * const_coeffs[0] + helper(a[0]);
}

template <typename T>
__global__ void scale(T* x, T s, long n) {
  long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
template __global__ void scale<float>(float*, float, long);
template __global__ void scale<double>(double*, double, long);

extern "C" __global__ void __launch_bounds__(256) with_pair(Pair p, char flag, double* out) {
  out[threadIdx.x] = p.a + p.b + p.c + flag + helper(p.a);
}

extern "C" __global__ void tile_sum(const float* in, float* out) {
  __shared__ float tile[128];  // 512 bytes of static shared memory
  tile[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < 128; ++i) s += tile[i];
    out[blockIdx.x] = s + managed_counter + static_cast<float>(thaw_test::ns_value);
  }
}

extern "C" __global__ void no_params() {}
