// Sample kernels for the emulator's module tests, written as ordinary CUDA. nvcc compiles
// this file to an sm_90 cubin (cmake/ThawCuda.cmake); samples_twins.cpp holds their host
// twins, which have the same names and signatures so that they mangle identically.

// c[i] = a[i] + b[i]. extern "C": the cubin names it plainly "vec_add".
extern "C" __global__ void vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// c = a * b for row-major n x n matrices, in TILE x TILE shared-memory tiles. Launch with
// blockDim (TILE, TILE) and gridDim (ceil(n / TILE), ceil(n / TILE)). C++ linkage: the cubin
// names the instantiation _Z12matmul_tiledILi16EEvPKfS1_Pfi.
template <int TILE>
__global__ void matmul_tiled(const float* a, const float* b, float* c, int n) {
  __shared__ float ta[TILE][TILE];
  __shared__ float tb[TILE][TILE];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * TILE + ty;
  const int col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
    const int ac = t * TILE + tx;
    const int br = t * TILE + ty;
    ta[ty][tx] = (row < n && ac < n) ? a[row * n + ac] : 0.0f;
    tb[ty][tx] = (br < n && col < n) ? b[br * n + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += ta[ty][k] * tb[k][tx];
    __syncthreads();
  }
  if (row < n && col < n) c[row * n + col] = acc;
}
template __global__ void matmul_tiled<16>(const float*, const float*, float*, int);

// *sum += x[0] + ... + x[n-1]: each block reduces blockDim.x * 2 elements in dynamic shared
// memory (blockDim.x floats, blockDim.x a power of two) and adds its partial sum atomically.
__global__ void block_reduce_sum(const float* x, float* sum, int n) {
  extern __shared__ float s[];
  const unsigned tid = threadIdx.x;
  const unsigned i = blockIdx.x * blockDim.x * 2 + tid;
  float v = 0.0f;
  if (i < n) v += x[i];
  if (i + blockDim.x < n) v += x[i + blockDim.x];
  s[tid] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) atomicAdd(sum, s[0]);
}

// Deliberately has no host twin: launching it on the emulator must fail, naming the kernel.
extern "C" __global__ void no_twin_fill(int* x, int value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}
