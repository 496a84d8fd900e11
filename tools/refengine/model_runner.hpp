// The model runner: one pipeline stage of a GPT-2 on one GPU, driven like vLLM's GPU model
// runner. It owns the stage's weights, the persistent input/activation buffers (fixed device
// addresses, so CUDA graphs captured over them can be replayed with new inputs), the paged KV
// cache and the captured decode graphs.
//
// Start-up order (Engine calls these in turn): load_weights, allocate_buffers, profile,
// init_kv_cache, capture_graphs. Then execute() per step.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "allocator.hpp"
#include "checkpoint.hpp"
#include "driver.hpp"
#include "kernel_module.hpp"
#include "step.hpp"

namespace refengine {

struct RunnerLimits {
  int max_num_seqs = 32;              // decode batch capacity; largest graph
  int max_num_batched_tokens = 1024;  // prefill tokens per step
  int max_model_len = 1024;           // longest sequence (prompt + output)
  bool all_positions_logits = false;  // size the logits buffer for every prefill row
};

struct MemoryProfile {
  std::uint64_t total = 0;           // cuMemGetInfo total
  std::uint64_t free = 0;            // cuMemGetInfo free after the profile run
  std::uint64_t weights = 0;         // bytes of weights
  std::uint64_t activations = 0;     // bytes of persistent buffers
  std::uint64_t kv_block_bytes = 0;  // one block, all of the stage's layers, K and V
};

class ModelRunner {
 public:
  // The device's primary context must be current on the calling thread (and on every thread
  // that calls execute()).
  ModelRunner(Driver& d, CUdevice device, CachingAllocator::Mode alloc_mode, KernelModule::Api api,
              const Checkpoint& checkpoint, const StageSpec& stage);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Copies the stage's tensors to the device: one cuMemcpyHtoDAsync per tensor from the
  // file's private mapping, on the load stream, synchronized before the file is unmapped.
  // on_file is called after each file.
  void load_weights(const Checkpoint::FileCallback& on_file);
  void allocate_buffers(const RunnerLimits& limits);
  // One forward pass at the largest prefill batch without a KV cache, then cuMemGetInfo.
  MemoryProfile profile();
  // Bytes of one KV block: all of the stage's layers, K and V (what profile() reports too).
  std::uint64_t kv_block_bytes() const;
  void init_kv_cache(int num_blocks);
  // Where a batch size's graph may come from besides a capture (--thaw-restore: thaw's restore
  // ABI), and what to say before one is captured.
  struct GraphSource {
    // An executable graph for `size`, instantiated with `flags`, or nullptr: capture it.
    std::function<CUgraphExec(int size, unsigned long long flags)> restored;
    // Called after the warm-ups, right before the capture begins.
    std::function<void(int size)> before_capture;
  };
  struct GraphOutcome {
    int size = 0;
    bool restored = false;
    double ms = 0;  // warm-ups and capture, or the restore
  };
  // Captures one graph per batch size (largest first), each after `warmups` eager runs,
  // in global capture mode; instantiates it and destroys the captured graph at once. With a
  // source, a size it restores is neither warmed up nor captured.
  std::vector<GraphOutcome> capture_graphs(std::vector<int> sizes, int warmups,
                                           const GraphSource* source = nullptr);

  StepResult execute(const StepBatch& batch, const float* hidden_in,
                     std::vector<float>* hidden_out);

  // KV transfer (model_runner_kv.cpp): copies the K and V of `blocks` of the stage's local layer
  // `layer` to or from host memory, K of every block then V of every block, each block
  // kv_block_layer_bytes(). No step may run meanwhile (Engine::step_mutex()).
  std::uint64_t kv_block_layer_bytes() const;
  void read_kv(int layer, const std::vector<int>& blocks, std::byte* out);
  void write_kv(int layer, const std::vector<int>& blocks, const std::byte* in);

  const GPT2Config& config() const { return config_; }
  const StageSpec& stage() const { return stage_; }
  int num_blocks() const { return num_blocks_; }
  int max_blocks_per_seq() const { return max_blocks_per_seq_; }
  // Captured decode sizes, ascending.
  std::vector<int> graph_sizes() const;
  // The executable graph each decode size launches (captured or restored).
  const std::map<int, CUgraphExec>& graph_execs() const { return graphs_; }
  AllocatorStats allocator_stats() const { return allocator_->stats(); }
  std::uint64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Layer {
    CUdeviceptr ln_1_w = 0, ln_1_b = 0, c_attn_w = 0, c_attn_b = 0, attn_proj_w = 0,
                attn_proj_b = 0, ln_2_w = 0, ln_2_b = 0, c_fc_w = 0, c_fc_b = 0, mlp_proj_w = 0,
                mlp_proj_b = 0;
  };
  struct Buffers {
    CUdeviceptr tokens = 0, positions = 0, slots = 0, query_seq = 0, context_lens = 0,
                block_tables = 0;
    CUdeviceptr h = 0, x = 0, qkv = 0, attn = 0, tmp = 0, fc = 0, last_h = 0, logits = 0,
                next_tokens = 0;
  };

  CUdeviceptr alloc(std::size_t bytes);
  void bind_weights(const std::map<std::string, CUdeviceptr>& by_name);
  // Enqueues the stage's forward pass over the persistent buffers on compute_.
  void forward(int num_tokens, int num_seqs, int logits_rows, bool gather_last_rows,
               const std::vector<std::int32_t>& last_rows);
  void upload(const StepBatch& batch, const float* hidden_in);
  StepBatch dummy_batch(int num_tokens, int num_seqs) const;

  Driver& d_;
  const Checkpoint& checkpoint_;
  GPT2Config config_;
  StageSpec stage_;
  int head_dim_ = 0;
  std::unique_ptr<CachingAllocator> allocator_;
  KernelModule::Api api_;
  std::unique_ptr<KernelModule> kernels_;
  CUstream load_stream_ = nullptr;
  CUstream compute_ = nullptr;

  CUdeviceptr wte_ = 0, wpe_ = 0, ln_f_w_ = 0, ln_f_b_ = 0;
  std::vector<Layer> layers_;
  std::uint64_t weight_bytes_ = 0;

  RunnerLimits limits_;
  Buffers buf_;
  std::uint64_t buffer_bytes_ = 0;
  int logits_rows_cap_ = 0;
  int max_blocks_per_seq_ = 0;
  // Pinned host staging for step inputs and outputs (async copies from pinned memory).
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;

  int num_blocks_ = 0;
  std::vector<CUdeviceptr> k_cache_, v_cache_;  // per layer of the stage
  std::map<int, CUgraphExec> graphs_;           // decode batch size -> executable graph
};

}  // namespace refengine
