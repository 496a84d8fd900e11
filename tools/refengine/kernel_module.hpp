// The engine's kernels on the device: the embedded sm_90 cubin loaded the way the CUDA runtime
// loads a fatbinary's kernels (cuLibraryLoadData, then cuLibraryGetKernel + cuKernelGetFunction
// per kernel), or with the older cuModuleLoadData + cuModuleGetFunction (--module-api module),
// and one launch helper per kernel with the geometry kernels.h prescribes.
#pragma once

#include <cuda.h>

#include <string>

#include "driver.hpp"
#include "safetensors.hpp"

namespace refengine {

class KernelModule {
 public:
  enum class Api { kLibrary, kModule };

  // Loads the kernels for weights of `weight_dtype` (F32, F16 or BF16). The context must be
  // current.
  KernelModule(Driver& d, DType weight_dtype, Api api);
  ~KernelModule();
  KernelModule(const KernelModule&) = delete;
  KernelModule& operator=(const KernelModule&) = delete;

  // Launchers: enqueue on `s`. Pointers are device pointers (CUdeviceptr); the weight
  // arguments (w*) hold weights of the module's dtype.
  void embedding(CUstream s, CUdeviceptr token, CUdeviceptr pos, CUdeviceptr wte, CUdeviceptr wpe,
                 CUdeviceptr h, int num_tokens, int C);
  void layernorm(CUstream s, CUdeviceptr x, CUdeviceptr w, CUdeviceptr b, CUdeviceptr y, int rows,
                 int C, float eps);
  void matmul_bias(CUstream s, CUdeviceptr X, CUdeviceptr W, CUdeviceptr bias, CUdeviceptr Y, int M,
                   int N, int K);
  void matmul_nt(CUstream s, CUdeviceptr X, CUdeviceptr W, CUdeviceptr Y, int M, int N, int K);
  void gelu_new(CUstream s, CUdeviceptr x, int n);
  void residual_add(CUstream s, CUdeviceptr x, CUdeviceptr y, int n);
  void reshape_and_cache(CUstream s, CUdeviceptr k, CUdeviceptr v, int stride, CUdeviceptr k_cache,
                         CUdeviceptr v_cache, CUdeviceptr slot_mapping, int num_tokens, int n_head,
                         int head_dim);
  void paged_attention(CUstream s, CUdeviceptr out, CUdeviceptr q, int q_stride,
                       CUdeviceptr k_cache, CUdeviceptr v_cache, CUdeviceptr block_tables,
                       int max_blocks, CUdeviceptr context_lens, CUdeviceptr query_seq,
                       CUdeviceptr query_pos, int num_tokens, int n_head, int head_dim,
                       float scale);
  void argmax(CUstream s, CUdeviceptr logits, CUdeviceptr out, int rows, int n);

 private:
  CUfunction function(const std::string& name);
  void unload();
  void launch(CUstream s, CUfunction f, unsigned gx, unsigned gy, unsigned bx, unsigned by,
              void** params, const char* what);

  Driver& d_;
  Api api_;
  CUlibrary library_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction embedding_, layernorm_, matmul_bias_, matmul_nt_, gelu_, residual_, cache_, attention_,
      argmax_;
};

}  // namespace refengine
