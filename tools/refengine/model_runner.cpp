#include "model_runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "kernels.h"

namespace refengine {
namespace {

constexpr std::size_t kF = sizeof(float);
constexpr std::size_t kI = sizeof(std::int32_t);

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Where each array lives in the pinned staging buffer.
struct StagingLayout {
  std::size_t tokens, positions, slots, query_seq, context_lens, block_tables, hidden, next_tokens,
      logits, total;
  StagingLayout(int max_tokens, int max_seqs, int max_blocks, int C, int logits_rows, int vocab) {
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t here = at;
      at += (bytes + 255) / 256 * 256;
      return here;
    };
    tokens = take(max_tokens * kI);
    positions = take(max_tokens * kI);
    slots = take(max_tokens * kI);
    query_seq = take(max_tokens * kI);
    context_lens = take(max_seqs * kI);
    block_tables = take(std::size_t(max_seqs) * max_blocks * kI);
    hidden = take(std::size_t(max_tokens) * C * kF);
    next_tokens = take(std::max(max_seqs, logits_rows) * kI);
    logits = take(std::size_t(logits_rows) * vocab * kF);
    total = at;
  }
};

}  // namespace

ModelRunner::ModelRunner(Driver& d, CUdevice device, CachingAllocator::Mode alloc_mode,
                         KernelModule::Api api, const Checkpoint& checkpoint,
                         const StageSpec& stage)
    : d_(d), checkpoint_(checkpoint), config_(checkpoint.config()), stage_(stage), api_(api) {
  if (stage_.layer_end < 0) stage_.layer_end = int(config_.n_layer);
  if (config_.n_embd % config_.n_head != 0)
    throw std::runtime_error(fmt::format("{}: n_embd {} is not a multiple of n_head {}",
                                         (checkpoint.dir() / "config.json").string(),
                                         config_.n_embd, config_.n_head));
  head_dim_ = int(config_.n_embd / config_.n_head);
  if (head_dim_ > kMaxHeadDim)
    throw std::runtime_error(
        fmt::format("head_dim {} exceeds this engine's limit of {}", head_dim_, kMaxHeadDim));
  allocator_ = std::make_unique<CachingAllocator>(d_, device, alloc_mode);
  kernels_ =
      std::make_unique<KernelModule>(d_, config_.has_dtype ? config_.dtype : DType::F32, api);
  d_.check(d_.stream_create(&load_stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate(load)");
  d_.check(d_.stream_create(&compute_, CU_STREAM_NON_BLOCKING), "cuStreamCreate(compute)");
}

ModelRunner::~ModelRunner() {
  if (compute_ != nullptr) (void)d_.stream_synchronize(compute_);
  for (auto& [size, exec] : graphs_) (void)d_.graph_exec_destroy(exec);
  if (staging_ != nullptr) (void)d_.mem_free_host(staging_);
  if (load_stream_ != nullptr) (void)d_.stream_destroy(load_stream_);
  if (compute_ != nullptr) (void)d_.stream_destroy(compute_);
  // kernels_ (module) and allocator_ (all device memory) go with their unique_ptrs.
}

CUdeviceptr ModelRunner::alloc(std::size_t bytes) {
  return allocator_->allocate(bytes, nullptr);
}

void ModelRunner::load_weights(const Checkpoint::FileCallback& on_file) {
  std::map<std::string, CUdeviceptr> by_name;
  std::optional<DType> dtype;
  auto r = checkpoint_.load(
      stage_,
      [&](const TensorView& t) -> std::expected<void, std::string> {
        if (dtype && *dtype != t.dtype)
          return std::unexpected(fmt::format(
              "tensor '{}' is {} but earlier tensors are {}: the engine needs one weight dtype "
              "(set torch_dtype in config.json)",
              t.name, dtype_name(t.dtype), dtype_name(*dtype)));
        dtype = t.dtype;
        const CUdeviceptr p = alloc(t.bytes);
        d_.check(d_.memcpy_htod_async(p, t.data, t.bytes, load_stream_),
                 fmt::format("cuMemcpyHtoDAsync({})", t.name));
        by_name.emplace(std::string(t.name), p);
        weight_bytes_ += t.bytes;
        return {};
      },
      [&](const FileLoaded& f) {
        // The mapping the copies read from is unmapped when load() moves on.
        d_.check(d_.stream_synchronize(load_stream_), "cuStreamSynchronize(load)");
        if (on_file) on_file(f);
      });
  if (!r) throw std::runtime_error(r.error());
  if (dtype && !config_.has_dtype && *dtype != DType::F32) {
    // The kernels were chosen for F32 (no torch_dtype): reload them for the stored dtype.
    kernels_.reset();
    kernels_ = std::make_unique<KernelModule>(d_, *dtype, api_);
  }
  bind_weights(by_name);
}

void ModelRunner::bind_weights(const std::map<std::string, CUdeviceptr>& w) {
  auto get = [&](const std::string& name) {
    auto it = w.find(name);
    if (it == w.end()) throw std::logic_error("weight not loaded: " + name);
    return it->second;
  };
  if (stage_.first_stage || stage_.last_stage) wte_ = get("wte.weight");
  if (stage_.first_stage) wpe_ = get("wpe.weight");
  if (stage_.last_stage) {
    ln_f_w_ = get("ln_f.weight");
    ln_f_b_ = get("ln_f.bias");
  }
  for (int l = stage_.layer_begin; l < stage_.layer_end; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    layers_.push_back(Layer{
        get(p + "ln_1.weight"), get(p + "ln_1.bias"), get(p + "attn.c_attn.weight"),
        get(p + "attn.c_attn.bias"), get(p + "attn.c_proj.weight"), get(p + "attn.c_proj.bias"),
        get(p + "ln_2.weight"), get(p + "ln_2.bias"), get(p + "mlp.c_fc.weight"),
        get(p + "mlp.c_fc.bias"), get(p + "mlp.c_proj.weight"), get(p + "mlp.c_proj.bias")});
  }
}

void ModelRunner::allocate_buffers(const RunnerLimits& limits) {
  limits_ = limits;
  if (limits_.max_model_len > kMaxContext)
    throw std::runtime_error(fmt::format("--max-model-len {} exceeds this engine's limit of {}",
                                         limits_.max_model_len, kMaxContext));
  if (limits_.max_model_len > config_.n_positions)
    throw std::runtime_error(fmt::format("--max-model-len {} exceeds the model's n_positions {}",
                                         limits_.max_model_len, config_.n_positions));
  const int T = limits_.max_num_batched_tokens, S = limits_.max_num_seqs;
  const int C = int(config_.n_embd), I = int(config_.n_inner), V = int(config_.vocab_size);
  max_blocks_per_seq_ = ceil_div(limits_.max_model_len, kBlockSize);
  logits_rows_cap_ = limits_.all_positions_logits ? std::max(T, S) : S;
  const std::uint64_t before = allocator_->stats().allocated_bytes;
  buf_.tokens = alloc(T * kI);
  buf_.positions = alloc(T * kI);
  buf_.slots = alloc(T * kI);
  buf_.query_seq = alloc(T * kI);
  buf_.context_lens = alloc(S * kI);
  buf_.block_tables = alloc(std::size_t(S) * max_blocks_per_seq_ * kI);
  buf_.h = alloc(std::size_t(T) * C * kF);
  buf_.x = alloc(std::size_t(std::max(T, logits_rows_cap_)) * C * kF);
  buf_.qkv = alloc(std::size_t(T) * 3 * C * kF);
  buf_.attn = alloc(std::size_t(T) * C * kF);
  buf_.tmp = alloc(std::size_t(T) * C * kF);
  buf_.fc = alloc(std::size_t(T) * I * kF);
  buf_.last_h = alloc(std::size_t(S) * C * kF);
  if (stage_.last_stage) {
    buf_.logits = alloc(std::size_t(logits_rows_cap_) * V * kF);
    buf_.next_tokens = alloc(std::size_t(logits_rows_cap_) * kI);
  }
  buffer_bytes_ = allocator_->stats().allocated_bytes - before;
  StagingLayout layout(T, S, max_blocks_per_seq_, C, stage_.last_stage ? logits_rows_cap_ : 0, V);
  staging_bytes_ = layout.total;
  d_.check(d_.mem_host_alloc(&staging_, staging_bytes_, 0), "cuMemHostAlloc(staging)");
}

StepBatch ModelRunner::dummy_batch(int num_tokens, int num_seqs) const {
  StepBatch b;
  b.num_tokens = num_tokens;
  b.num_seqs = num_seqs;
  b.tokens.assign(num_tokens, 0);
  b.positions.assign(num_tokens, 0);
  b.slots.assign(num_tokens, -1);  // no KV writes
  b.query_seq.resize(num_tokens);
  for (int t = 0; t < num_tokens; ++t) b.query_seq[t] = t % num_seqs;
  b.context_lens.assign(num_seqs, 0);  // attention over nothing: zeros
  b.block_tables.assign(std::size_t(num_seqs) * max_blocks_per_seq_, 0);
  b.last_rows.resize(num_seqs);
  for (int s = 0; s < num_seqs; ++s) b.last_rows[s] = num_tokens - num_seqs + s;
  return b;
}

MemoryProfile ModelRunner::profile() {
  const int T = limits_.max_num_batched_tokens;
  const int S = std::min(limits_.max_num_seqs, T);
  StepBatch b = dummy_batch(T, S);
  std::vector<float> hidden(stage_.first_stage ? 0 : std::size_t(T) * config_.n_embd, 0.0f);
  std::vector<float> out;
  execute(b, stage_.first_stage ? nullptr : hidden.data(), &out);
  MemoryProfile p;
  std::size_t free_bytes = 0, total_bytes = 0;
  d_.check(d_.mem_get_info(&free_bytes, &total_bytes), "cuMemGetInfo");
  p.free = free_bytes;
  p.total = total_bytes;
  p.weights = weight_bytes_;
  p.activations = buffer_bytes_;
  p.kv_block_bytes = kv_block_bytes();
  return p;
}

std::uint64_t ModelRunner::kv_block_bytes() const {
  return 2ull * layers_.size() * config_.n_head * kBlockSize * head_dim_ * kF;
}

void ModelRunner::init_kv_cache(int num_blocks) {
  num_blocks_ = num_blocks;
  const std::size_t bytes = std::size_t(num_blocks) * config_.n_head * kBlockSize * head_dim_ * kF;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    k_cache_.push_back(alloc(bytes));
    v_cache_.push_back(alloc(bytes));
  }
}

void ModelRunner::upload(const StepBatch& b, const float* hidden_in) {
  const int C = int(config_.n_embd);
  StagingLayout L(limits_.max_num_batched_tokens, limits_.max_num_seqs, max_blocks_per_seq_, C,
                  stage_.last_stage ? logits_rows_cap_ : 0, int(config_.vocab_size));
  auto* base = static_cast<std::byte*>(staging_);
  auto put = [&](std::size_t off, const void* src, std::size_t bytes, CUdeviceptr dst,
                 const char* what) {
    if (bytes == 0) return;
    std::memcpy(base + off, src, bytes);
    d_.check(d_.memcpy_htod_async(dst, base + off, bytes, compute_), what);
  };
  put(L.tokens, b.tokens.data(), b.tokens.size() * kI, buf_.tokens, "cuMemcpyHtoDAsync(tokens)");
  put(L.positions, b.positions.data(), b.positions.size() * kI, buf_.positions,
      "cuMemcpyHtoDAsync(positions)");
  put(L.slots, b.slots.data(), b.slots.size() * kI, buf_.slots, "cuMemcpyHtoDAsync(slots)");
  put(L.query_seq, b.query_seq.data(), b.query_seq.size() * kI, buf_.query_seq,
      "cuMemcpyHtoDAsync(query_seq)");
  put(L.context_lens, b.context_lens.data(), b.context_lens.size() * kI, buf_.context_lens,
      "cuMemcpyHtoDAsync(context_lens)");
  put(L.block_tables, b.block_tables.data(), b.block_tables.size() * kI, buf_.block_tables,
      "cuMemcpyHtoDAsync(block_tables)");
  if (!stage_.first_stage && hidden_in != nullptr)
    put(L.hidden, hidden_in, std::size_t(b.num_tokens) * C * kF, buf_.h,
        "cuMemcpyHtoDAsync(hidden states)");
}

void ModelRunner::forward(int T, int S, int logits_rows, bool gather,
                          const std::vector<std::int32_t>& last_rows) {
  (void)S;
  const int C = int(config_.n_embd), I = int(config_.n_inner), H = int(config_.n_head);
  const int D = head_dim_;
  const float eps = float(config_.layer_norm_epsilon);
  const float scale = 1.0f / std::sqrt(float(D));
  auto& k = *kernels_;
  if (stage_.first_stage)
    k.embedding(compute_, buf_.tokens, buf_.positions, wte_, wpe_, buf_.h, T, C);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    const CUdeviceptr kc = num_blocks_ > 0 ? k_cache_[l] : 0;
    const CUdeviceptr vc = num_blocks_ > 0 ? v_cache_[l] : 0;
    k.layernorm(compute_, buf_.h, w.ln_1_w, w.ln_1_b, buf_.x, T, C, eps);
    k.matmul_bias(compute_, buf_.x, w.c_attn_w, w.c_attn_b, buf_.qkv, T, 3 * C, C);
    if (num_blocks_ > 0)
      k.reshape_and_cache(compute_, buf_.qkv + C * kF, buf_.qkv + 2 * C * kF, 3 * C, kc, vc,
                          buf_.slots, T, H, D);
    k.paged_attention(compute_, buf_.attn, buf_.qkv, 3 * C, kc, vc, buf_.block_tables,
                      max_blocks_per_seq_, buf_.context_lens, buf_.query_seq, buf_.positions, T, H,
                      D, scale);
    k.matmul_bias(compute_, buf_.attn, w.attn_proj_w, w.attn_proj_b, buf_.tmp, T, C, C);
    k.residual_add(compute_, buf_.h, buf_.tmp, T * C);
    k.layernorm(compute_, buf_.h, w.ln_2_w, w.ln_2_b, buf_.x, T, C, eps);
    k.matmul_bias(compute_, buf_.x, w.c_fc_w, w.c_fc_b, buf_.fc, T, I, C);
    k.gelu_new(compute_, buf_.fc, T * I);
    k.matmul_bias(compute_, buf_.fc, w.mlp_proj_w, w.mlp_proj_b, buf_.tmp, T, C, I);
    k.residual_add(compute_, buf_.h, buf_.tmp, T * C);
  }
  if (!stage_.last_stage) return;
  CUdeviceptr src = buf_.h;
  if (gather) {  // each sequence's last row into last_h (vLLM's logits index_select)
    for (int s = 0; s < logits_rows; ++s)
      d_.check(d_.memcpy_dtod_async(buf_.last_h + std::size_t(s) * C * kF,
                                    buf_.h + std::size_t(last_rows[s]) * C * kF, C * kF, compute_),
               "cuMemcpyDtoDAsync(last rows)");
    src = buf_.last_h;
  }
  k.layernorm(compute_, src, ln_f_w_, ln_f_b_, buf_.x, logits_rows, C, eps);
  k.matmul_nt(compute_, buf_.x, wte_, buf_.logits, logits_rows, int(config_.vocab_size), C);
  k.argmax(compute_, buf_.logits, buf_.next_tokens, logits_rows, int(config_.vocab_size));
}

StepResult ModelRunner::execute(const StepBatch& b, const float* hidden_in,
                                std::vector<float>* hidden_out) {
  const int C = int(config_.n_embd), V = int(config_.vocab_size);
  if (b.num_tokens > limits_.max_num_batched_tokens || b.num_seqs > limits_.max_num_seqs)
    throw std::logic_error(fmt::format("step of {} tokens / {} sequences exceeds the buffers",
                                       b.num_tokens, b.num_seqs));
  upload(b, hidden_in);
  const int rows = b.logits_rows_mode == 1 ? b.num_tokens : b.num_seqs;
  if (b.graph_size > 0) {
    auto it = graphs_.find(b.graph_size);
    if (it == graphs_.end())
      throw std::logic_error(fmt::format("no graph captured for batch size {}", b.graph_size));
    d_.check(d_.graph_launch(it->second, compute_), "cuGraphLaunch");
  } else {
    bool identity = b.logits_rows_mode == 1;
    if (!identity) {
      identity = true;
      for (int s = 0; s < b.num_seqs; ++s) identity = identity && b.last_rows[s] == s;
    }
    forward(b.num_tokens, b.num_seqs, rows, !identity, b.last_rows);
  }
  StagingLayout L(limits_.max_num_batched_tokens, limits_.max_num_seqs, max_blocks_per_seq_, C,
                  stage_.last_stage ? logits_rows_cap_ : 0, V);
  auto* base = static_cast<std::byte*>(staging_);
  StepResult result;
  if (stage_.last_stage) {
    d_.check(d_.memcpy_dtoh_async(base + L.next_tokens, buf_.next_tokens, rows * kI, compute_),
             "cuMemcpyDtoHAsync(next tokens)");
    if (b.want_logits)
      d_.check(
          d_.memcpy_dtoh_async(base + L.logits, buf_.logits, std::size_t(rows) * V * kF, compute_),
          "cuMemcpyDtoHAsync(logits)");
  } else {
    d_.check(
        d_.memcpy_dtoh_async(base + L.hidden, buf_.h, std::size_t(b.num_tokens) * C * kF, compute_),
        "cuMemcpyDtoHAsync(hidden states)");
  }
  d_.check(d_.stream_synchronize(compute_), "cuStreamSynchronize(compute)");
  if (stage_.last_stage) {
    result.next_tokens.resize(rows);
    std::memcpy(result.next_tokens.data(), base + L.next_tokens, rows * kI);
    if (b.want_logits) {
      result.logits_rows = rows;
      result.logits.resize(std::size_t(rows) * V);
      std::memcpy(result.logits.data(), base + L.logits, result.logits.size() * kF);
    }
  } else if (hidden_out != nullptr) {
    hidden_out->resize(std::size_t(b.num_tokens) * C);
    std::memcpy(hidden_out->data(), base + L.hidden, hidden_out->size() * kF);
  }
  return result;
}

std::vector<ModelRunner::GraphOutcome> ModelRunner::capture_graphs(std::vector<int> sizes,
                                                                   int warmups,
                                                                   const GraphSource* source) {
  // PyTorch's CUDAGraph::capture_end flags (vLLM captures through it).
  constexpr unsigned long long kFlags = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  std::sort(sizes.rbegin(), sizes.rend());  // largest first, as vLLM does
  std::vector<GraphOutcome> outcomes;
  for (int size : sizes) {
    if (size > limits_.max_num_seqs || size > limits_.max_num_batched_tokens) continue;
    if (graphs_.contains(size)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&] {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    if (source != nullptr && source->restored) {
      if (CUgraphExec exec = source->restored(size, kFlags)) {
        graphs_.emplace(size, exec);
        outcomes.push_back({size, true, since()});
        continue;
      }
    }
    StepBatch b = dummy_batch(size, size);
    std::vector<float> hidden(stage_.first_stage ? 0 : std::size_t(size) * config_.n_embd, 0.0f);
    std::vector<float> out;
    for (int i = 0; i < warmups; ++i) execute(b, hidden.empty() ? nullptr : hidden.data(), &out);
    upload(b, hidden.empty() ? nullptr : hidden.data());
    d_.check(d_.stream_synchronize(compute_), "cuStreamSynchronize(before capture)");
    if (source != nullptr && source->before_capture) source->before_capture(size);
    d_.check(d_.stream_begin_capture(compute_, CU_STREAM_CAPTURE_MODE_GLOBAL),
             "cuStreamBeginCapture");
    CUgraph graph = nullptr;
    try {
      forward(size, size, size, false, {});
    } catch (...) {
      (void)d_.stream_end_capture(compute_, &graph);
      if (graph != nullptr) (void)d_.graph_destroy(graph);
      throw;
    }
    d_.check(d_.stream_end_capture(compute_, &graph), "cuStreamEndCapture");
    CUgraphExec exec = nullptr;
    const CUresult r = d_.graph_instantiate(&exec, graph, kFlags);
    (void)d_.graph_destroy(graph);  // the executable graph is all that is kept
    d_.check(r, fmt::format("cuGraphInstantiateWithFlags(batch size {})", size));
    graphs_.emplace(size, exec);
    outcomes.push_back({size, false, since()});
  }
  return outcomes;
}

std::vector<int> ModelRunner::graph_sizes() const {
  std::vector<int> out;
  for (auto& [size, exec] : graphs_) out.push_back(size);
  return out;
}

}  // namespace refengine
