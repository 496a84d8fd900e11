#include "kernel_module.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "kernels.h"
#include "refengine_kernels_cubins.h"

namespace refengine {
namespace {

unsigned ceil_div(long a, long b) {
  return unsigned((a + b - 1) / b);
}

std::string dtype_suffix(DType t) {
  switch (t) {
    case DType::F32:
      return "_f32";
    case DType::F16:
      return "_f16";
    case DType::BF16:
      return "_bf16";
    default:
      throw std::invalid_argument(
          fmt::format("weights of dtype {} are not supported (F32, F16 or BF16)", dtype_name(t)));
  }
}

// Threads per block of the reductions (a power of two, kernels.h).
constexpr unsigned kReduceThreads = 128;
constexpr unsigned kElementwiseThreads = 256;

}  // namespace

KernelModule::KernelModule(Driver& d, DType weight_dtype, Api api) : d_(d), api_(api) {
  const ThawCubin image = thaw_cubin_kernels();
  if (api_ == Api::kLibrary) {
    d_.check(d_.library_load_data(&library_, image.data, nullptr, nullptr, 0, nullptr, nullptr, 0),
             "cuLibraryLoadData(kernels)");
  } else {
    d_.check(d_.module_load_data(&module_, image.data), "cuModuleLoadData(kernels)");
  }
  try {
    const std::string w = dtype_suffix(weight_dtype);
    embedding_ = function("embedding" + w);
    layernorm_ = function("layernorm" + w);
    matmul_bias_ = function("matmul_bias" + w);
    matmul_nt_ = function("matmul_nt" + w);
    gelu_ = function("gelu_new_f32");
    residual_ = function("residual_add_f32");
    cache_ = function("reshape_and_cache_f32");
    attention_ = function("paged_attention_f32");
    argmax_ = function("argmax_f32");
  } catch (...) {
    unload();  // the destructor does not run for a constructor that throws
    throw;
  }
}

KernelModule::~KernelModule() {
  unload();
}

void KernelModule::unload() {
  if (library_ != nullptr) (void)d_.library_unload(library_);
  if (module_ != nullptr) (void)d_.module_unload(module_);
  library_ = nullptr;
  module_ = nullptr;
}

CUfunction KernelModule::function(const std::string& name) {
  CUfunction f = nullptr;
  if (api_ == Api::kLibrary) {
    CUkernel k = nullptr;
    d_.check(d_.library_get_kernel(&k, library_, name.c_str()), "cuLibraryGetKernel(" + name + ")");
    d_.check(d_.kernel_get_function(&f, k), "cuKernelGetFunction(" + name + ")");
  } else {
    d_.check(d_.module_get_function(&f, module_, name.c_str()),
             "cuModuleGetFunction(" + name + ")");
  }
  return f;
}

void KernelModule::launch(CUstream s, CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                          unsigned by, void** params, const char* what) {
  if (gx == 0 || gy == 0) return;  // nothing to do (e.g. zero tokens)
  d_.check(d_.launch_kernel(f, gx, gy, 1, bx, by, 1, 0, s, params, nullptr), what);
}

void KernelModule::embedding(CUstream s, CUdeviceptr token, CUdeviceptr pos, CUdeviceptr wte,
                             CUdeviceptr wpe, CUdeviceptr h, int num_tokens, int C) {
  void* p[] = {&token, &pos, &wte, &wpe, &h, &num_tokens, &C};
  launch(s, embedding_, ceil_div(C, kElementwiseThreads), unsigned(num_tokens), kElementwiseThreads,
         1, p, "cuLaunchKernel(embedding)");
}

void KernelModule::layernorm(CUstream s, CUdeviceptr x, CUdeviceptr w, CUdeviceptr b, CUdeviceptr y,
                             int rows, int C, float eps) {
  void* p[] = {&x, &w, &b, &y, &C, &eps};
  launch(s, layernorm_, unsigned(rows), 1, kReduceThreads, 1, p, "cuLaunchKernel(layernorm)");
}

void KernelModule::matmul_bias(CUstream s, CUdeviceptr X, CUdeviceptr W, CUdeviceptr bias,
                               CUdeviceptr Y, int M, int N, int K) {
  void* p[] = {&X, &W, &bias, &Y, &M, &N, &K};
  launch(s, matmul_bias_, ceil_div(N, kTile), ceil_div(M, kTile), kTile, kTile, p,
         "cuLaunchKernel(matmul_bias)");
}

void KernelModule::matmul_nt(CUstream s, CUdeviceptr X, CUdeviceptr W, CUdeviceptr Y, int M, int N,
                             int K) {
  void* p[] = {&X, &W, &Y, &M, &N, &K};
  launch(s, matmul_nt_, ceil_div(N, kTile), ceil_div(M, kTile), kTile, kTile, p,
         "cuLaunchKernel(matmul_nt)");
}

void KernelModule::gelu_new(CUstream s, CUdeviceptr x, int n) {
  void* p[] = {&x, &n};
  launch(s, gelu_, ceil_div(n, kElementwiseThreads), 1, kElementwiseThreads, 1, p,
         "cuLaunchKernel(gelu_new)");
}

void KernelModule::residual_add(CUstream s, CUdeviceptr x, CUdeviceptr y, int n) {
  void* p[] = {&x, &y, &n};
  launch(s, residual_, ceil_div(n, kElementwiseThreads), 1, kElementwiseThreads, 1, p,
         "cuLaunchKernel(residual_add)");
}

void KernelModule::reshape_and_cache(CUstream s, CUdeviceptr k, CUdeviceptr v, int stride,
                                     CUdeviceptr k_cache, CUdeviceptr v_cache,
                                     CUdeviceptr slot_mapping, int num_tokens, int n_head,
                                     int head_dim) {
  void* p[] = {&k, &v, &stride, &k_cache, &v_cache, &slot_mapping, &num_tokens, &n_head, &head_dim};
  launch(s, cache_, unsigned(num_tokens), 1, kReduceThreads, 1, p,
         "cuLaunchKernel(reshape_and_cache)");
}

void KernelModule::paged_attention(CUstream s, CUdeviceptr out, CUdeviceptr q, int q_stride,
                                   CUdeviceptr k_cache, CUdeviceptr v_cache,
                                   CUdeviceptr block_tables, int max_blocks,
                                   CUdeviceptr context_lens, CUdeviceptr query_seq,
                                   CUdeviceptr query_pos, int num_tokens, int n_head, int head_dim,
                                   float scale) {
  void* p[] = {&out,          &q,          &q_stride,     &k_cache,   &v_cache,
               &block_tables, &max_blocks, &context_lens, &query_seq, &query_pos,
               &n_head,       &head_dim,   &scale};
  launch(s, attention_, unsigned(n_head), unsigned(num_tokens), kReduceThreads, 1, p,
         "cuLaunchKernel(paged_attention)");
}

void KernelModule::argmax(CUstream s, CUdeviceptr logits, CUdeviceptr out, int rows, int n) {
  void* p[] = {&logits, &out, &n};
  launch(s, argmax_, unsigned(rows), 1, kElementwiseThreads, 1, p, "cuLaunchKernel(argmax)");
}

}  // namespace refengine
