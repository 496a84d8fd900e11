// The runner's side of KV transfer (kv_transfer_server.cpp): block copies between the paged
// KV cache ([num_blocks, n_head, kBlockSize, head_dim] fp32 per layer, kernels.h) and the host.
#include <fmt/format.h>

#include <stdexcept>

#include "kernels.h"
#include "model_runner.hpp"

namespace refengine {

std::uint64_t ModelRunner::kv_block_layer_bytes() const {
  return std::uint64_t(config_.n_head) * kBlockSize * head_dim_ * sizeof(float);
}

namespace {

void check_blocks(const std::vector<int>& blocks, int num_blocks, int layer, int layers) {
  if (layer < 0 || layer >= layers)
    throw std::out_of_range(fmt::format("local layer {} is not in 0..{}", layer, layers - 1));
  for (int b : blocks)
    if (b < 0 || b >= num_blocks)
      throw std::out_of_range(fmt::format("KV block {} is not in 0..{}", b, num_blocks - 1));
}

}  // namespace

void ModelRunner::read_kv(int layer, const std::vector<int>& blocks, std::byte* out) {
  check_blocks(blocks, num_blocks_, layer, int(k_cache_.size()));
  const std::uint64_t bb = kv_block_layer_bytes();
  for (int which = 0; which < 2; ++which) {
    const CUdeviceptr base = which == 0 ? k_cache_[layer] : v_cache_[layer];
    for (std::size_t i = 0; i < blocks.size(); ++i, out += bb)
      d_.check(d_.memcpy_dtoh_async(out, base + CUdeviceptr(blocks[i]) * bb, bb, compute_),
               "cuMemcpyDtoHAsync(KV export)");
  }
  d_.check(d_.stream_synchronize(compute_), "cuStreamSynchronize(KV export)");
}

void ModelRunner::write_kv(int layer, const std::vector<int>& blocks, const std::byte* in) {
  check_blocks(blocks, num_blocks_, layer, int(k_cache_.size()));
  const std::uint64_t bb = kv_block_layer_bytes();
  for (int which = 0; which < 2; ++which) {
    const CUdeviceptr base = which == 0 ? k_cache_[layer] : v_cache_[layer];
    for (std::size_t i = 0; i < blocks.size(); ++i, in += bb)
      d_.check(d_.memcpy_htod_async(base + CUdeviceptr(blocks[i]) * bb, in, bb, compute_),
               "cuMemcpyHtoDAsync(KV import)");
  }
  // The host buffer is the caller's: the copies must be done before it may be freed.
  d_.check(d_.stream_synchronize(compute_), "cuStreamSynchronize(KV import)");
}

}  // namespace refengine
