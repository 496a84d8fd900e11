// Small elementwise kernels for graph tests: chains of launches whose result depends on
// their order. Host twins in chain_twins.cpp.

// x[i] = a * x[i] + b
extern "C" __global__ void axpb(float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

// dst[i] += src[i]
extern "C" __global__ void add_into(float* dst, const float* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
