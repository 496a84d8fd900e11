#include "engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "kernels.h"
#include "thaw_restore_client.hpp"

namespace refengine {

std::vector<int> default_graph_sizes(int max_num_seqs) {
  std::vector<int> sizes;
  for (int s : {1, 2, 4})
    if (s <= max_num_seqs) sizes.push_back(s);
  for (int s = 8; s <= max_num_seqs; s += 8) sizes.push_back(s);
  return sizes;
}

namespace {

// Which layers stage `rank` of `size` loads: a contiguous, even split (vLLM's
// get_pp_indices: the first stages take the remainder... here the later ones do).
StageSpec stage_of(const GPT2Config& c, int rank, int size) {
  if (size > c.n_layer)
    throw std::runtime_error(
        fmt::format("--pp-size {} exceeds the model's {} layers", size, c.n_layer));
  StageSpec s;
  s.layer_begin = int(c.n_layer * rank / size);
  s.layer_end = int(c.n_layer * (rank + 1) / size);
  s.first_stage = rank == 0;
  s.last_stage = rank == size - 1;
  return s;
}

std::string gib(std::uint64_t b) {
  return fmt::format("{:.2f} GiB", double(b) / (1 << 30));
}

// --thaw-restore's configuration key: everything besides the device and the model that decides
// how large the profiling pass makes the KV cache — the memory fraction, the limits that size
// the persistent buffers the pass runs over, the block size, the stage and the model's shape
// (which set the block's bytes), the allocator mode (which rounds what is in use).
std::string kv_config_key(const EngineOptions& o, const GPT2Config& c, const StageSpec& s) {
  return fmt::format(
      "refengine-kv/1 gpu_memory_utilization={} max_model_len={} max_num_seqs={} "
      "max_num_batched_tokens={} all_positions_logits={} block_size={} layers={}-{} of {} "
      "n_embd={} n_head={} vocab={} dtype={} expandable_segments={} pp={}/{}",
      o.gpu_memory_utilization, o.limits.max_model_len, o.limits.max_num_seqs,
      o.limits.max_num_batched_tokens, int(o.limits.all_positions_logits), kBlockSize,
      s.layer_begin, s.layer_end, c.n_layer, c.n_embd, c.n_head, c.vocab_size,
      c.has_dtype ? dtype_name(c.dtype) : "auto", int(o.expandable_segments), o.pipeline.rank,
      o.pipeline.size);
}

}  // namespace

Engine::Engine(const EngineOptions& options, Timeline& timeline)
    : options_(options), timeline_(timeline) {
  auto ckpt = Checkpoint::open(options_.model);
  if (!ckpt) throw std::runtime_error(ckpt.error());
  checkpoint_.emplace(std::move(*ckpt));
  const GPT2Config& cfg = checkpoint_->config();
  const auto& pp = options_.pipeline;
  const StageSpec stage = stage_of(cfg, pp.rank, pp.size);

  driver_ = std::make_unique<Driver>();
  Driver& d = *driver_;
  d.check(d.init(0), "cuInit");
  int count = 0;
  d.check(d.device_get_count(&count), "cuDeviceGetCount");
  if (options_.device < 0 || options_.device >= count)
    throw std::runtime_error(
        fmt::format("--device {}: the driver reports {} device(s)", options_.device, count));
  d.check(d.device_get(&device_, options_.device), "cuDeviceGet");
  d.check(d.primary_ctx_retain(&context_, device_), "cuDevicePrimaryCtxRetain");
  d.check(d.ctx_set_current(context_), "cuCtxSetCurrent");
  char name[256] = {};
  (void)d.device_get_name(name, sizeof name, device_);
  timeline_.mark("driver_init", {{"device", name}, {"driver", d.source()}});

  runner_ = std::make_unique<ModelRunner>(d, device_,
                                          options_.expandable_segments
                                              ? CachingAllocator::Mode::kExpandableSegments
                                              : CachingAllocator::Mode::kDefault,
                                          options_.module_api, *checkpoint_, stage);
  timeline_.mark(
      "allocator_ready",
      {{"expandable_segments", options_.expandable_segments},
       {"module_api", options_.module_api == KernelModule::Api::kLibrary ? "library" : "module"}});

  if (pp.size > 1) {
    link_ = std::make_unique<PipelineLink>(pp);
    timeline_.mark("pipeline_connected", {{"rank", pp.rank}, {"size", pp.size}});
  }

  runner_->load_weights([&](const FileLoaded& f) {
    timeline_.mark(
        "weights_file_loaded",
        {{"file", f.path}, {"tensors", f.tensors}, {"bytes", f.bytes}, {"file_size", f.file_size}});
  });
  timeline_.mark("weights_loaded", {{"bytes", runner_->weight_bytes()},
                                    {"layers", {stage.layer_begin, stage.layer_end}}});

  runner_->allocate_buffers(options_.limits);
  // KV-cache sizing: the profiling pass, or with --thaw-restore the record of an earlier run.
  const auto kv_t0 = Timeline::now_ns();
  const std::uint64_t block_bytes = runner_->kv_block_bytes();
  const int per_seq = runner_->max_blocks_per_seq();
  std::optional<ThawRestore> thaw;
  std::string kv_key;
  int blocks = 0;
  bool restored = false;
  if (options_.thaw_restore && options_.num_gpu_blocks_override <= 0) {
    auto say = [](const std::string& why) {
      fmt::print(stderr, "refengine: --thaw-restore: {}; running the profiling pass\n", why);
    };
    if (auto found = ThawRestore::find(); !found) {
      say(found.error());
    } else {
      thaw = *found;
      kv_key = kv_config_key(options_, cfg, stage);
      const ThawRestore::Lookup l = thaw->lookup_kv(kv_key);
      if (l.status != ThawRestore::kOk) {
        say(fmt::format("no usable KV record ({}: {})", ThawRestore::status_name(l.status), l.why));
      } else if (l.kv.block_bytes != block_bytes) {
        say(fmt::format("the KV record's blocks are of {} bytes, this engine's of {}",
                        l.kv.block_bytes, block_bytes));
      } else if (l.kv.num_blocks < std::uint64_t(per_seq) || l.kv.num_blocks > 1000000000) {
        say(fmt::format("the KV record's {} blocks are not between one sequence's {} and 1e9",
                        l.kv.num_blocks, per_seq));
      } else {
        blocks = int(l.kv.num_blocks);
        restored = true;
      }
    }
  }

  if (!restored) {
    const auto t0 = Timeline::now_ns();
    const MemoryProfile prof = runner_->profile();
    const std::uint64_t used = prof.total - prof.free;
    const double budget = double(prof.total) * options_.gpu_memory_utilization - double(used);
    timeline_.mark("profile_done", {{"total", prof.total},
                                    {"free", prof.free},
                                    {"weights", prof.weights},
                                    {"activations", prof.activations},
                                    {"ms", double(Timeline::now_ns() - t0) / 1e6}});
    if (options_.num_gpu_blocks_override > 0) {
      blocks = options_.num_gpu_blocks_override;
    } else {
      if (budget < double(prof.kv_block_bytes) * per_seq)
        throw std::runtime_error(fmt::format(
            "not enough device memory for the KV cache: --gpu-memory-utilization {} of {} is {}, "
            "{} is in use after loading the model (weights {}, buffers {}), and one sequence of "
            "--max-model-len {} needs {} more; raise --gpu-memory-utilization or lower "
            "--max-model-len / --max-num-batched-tokens",
            options_.gpu_memory_utilization, gib(prof.total),
            gib(std::uint64_t(double(prof.total) * options_.gpu_memory_utilization)), gib(used),
            gib(prof.weights), gib(prof.activations), options_.limits.max_model_len,
            gib(prof.kv_block_bytes * per_seq)));
      blocks = int(std::min(budget / double(prof.kv_block_bytes), 1e9));
    }
  }
  const int own_blocks = blocks;  // this stage's own answer, before the stages agree
  if (link_)
    blocks = link_->agree_num_blocks(
        blocks, fmt::format("{} layers={} embd={} max_model_len={} max_num_seqs={} eager={}",
                            options_.model.filename().string(), cfg.n_layer, cfg.n_embd,
                            options_.limits.max_model_len, options_.limits.max_num_seqs,
                            options_.enforce_eager));
  num_blocks_ = blocks;
  runner_->init_kv_cache(blocks);
  const double kv_init_ms = double(Timeline::now_ns() - kv_t0) / 1e6;
  if (restored) {
    timeline_.mark("kv_restored", {{"num_blocks", blocks},
                                   {"bytes", std::uint64_t(blocks) * block_bytes},
                                   {"ms", kv_init_ms}});
  }
  timeline_.mark("kv_cache_ready", {{"num_blocks", blocks},
                                    {"block_size", kBlockSize},
                                    {"bytes", std::uint64_t(blocks) * block_bytes},
                                    {"restored", restored},
                                    {"kv_init_ms", kv_init_ms}});
  // First run of this configuration: what the pass decided, for the next one.
  if (thaw && !restored) {
    ThawRestoreKv kv;
    kv.num_blocks = std::uint64_t(own_blocks);
    kv.block_bytes = block_bytes;
    kv.kv_bytes = kv.num_blocks * block_bytes;
    if (auto why = thaw->record_kv(kv_key, kv))
      fmt::print(stderr, "refengine: --thaw-restore: the KV size was not recorded ({})\n", *why);
  }

  if (!options_.enforce_eager) {
    std::vector<int> sizes = options_.graph_sizes.empty()
                                 ? default_graph_sizes(options_.limits.max_num_seqs)
                                 : options_.graph_sizes;
    const auto t0 = Timeline::now_ns();
    // --thaw-restore: each size's graph from thaw's record of an earlier run where it has a
    // valid one (no warm-ups, no capture); the others captured as usual and labelled, so that
    // the next run finds them.
    std::optional<ThawRestore> graphs_abi;
    if (options_.thaw_restore) {
      if (auto found = ThawRestore::find(); !found) {
        fmt::print(stderr, "refengine: --thaw-restore: {}; capturing every CUDA graph\n",
                   found.error());
      } else if (auto why = found->graphs_unsupported()) {
        fmt::print(stderr, "refengine: --thaw-restore: {}; capturing every CUDA graph\n", *why);
      } else {
        graphs_abi = *found;
      }
    }
    ModelRunner::GraphSource source;
    if (graphs_abi) {
      auto label = [&](int size) {
        return fmt::format("refengine-decode/1 batch={} pp={}/{}", size, pp.rank, pp.size);
      };
      source.restored = [&, label](int size, unsigned long long flags) -> CUgraphExec {
        const ThawRestore::Graph g = graphs_abi->graph(label(size), flags);
        if (g.status == ThawRestore::kOk) return g.exec;
        fmt::print(stderr,
                   "refengine: --thaw-restore: no restored graph for batch size {} ({}: {}); "
                   "capturing it\n",
                   size, ThawRestore::status_name(g.status), g.why);
        return nullptr;
      };
      source.before_capture = [&, label](int size) {
        if (auto why = graphs_abi->label_graph(label(size)))
          fmt::print(stderr,
                     "refengine: --thaw-restore: the graph of batch size {} is not recorded "
                     "({})\n",
                     size, *why);
      };
    }
    const auto outcomes =
        runner_->capture_graphs(sizes, options_.num_warmups, graphs_abi ? &source : nullptr);
    nlohmann::json per_size = nlohmann::json::array();
    int restored_graphs = 0;
    for (const auto& o : outcomes) {
      per_size.push_back(
          {{"size", o.size}, {"how", o.restored ? "restored" : "captured"}, {"ms", o.ms}});
      restored_graphs += o.restored ? 1 : 0;
    }
    timeline_.mark("graphs_captured", {{"sizes", runner_->graph_sizes()},
                                       {"restored", restored_graphs},
                                       {"captured", int(outcomes.size()) - restored_graphs},
                                       {"per_size", per_size},
                                       {"ms", double(Timeline::now_ns() - t0) / 1e6}});
  }
  const AllocatorStats st = runner_->allocator_stats();
  timeline_.mark("ready", {{"reserved_bytes", st.reserved_bytes},
                           {"allocated_bytes", st.allocated_bytes},
                           {"segments", st.segments}});
}

Engine::~Engine() {
  if (link_ && is_first_stage() && !shut_down_) {
    try {
      link_->send_shutdown();
    } catch (...) {
    }
  }
  runner_.reset();
  if (driver_ && context_ != nullptr) (void)driver_->primary_ctx_release(device_);
}

void Engine::bind_thread() {
  driver_->check(driver_->ctx_set_current(context_), "cuCtxSetCurrent");
}

StepResult Engine::step(const StepBatch& batch) {
  std::lock_guard lock(step_mu_);
  if (!link_) return runner_->execute(batch, nullptr, nullptr);
  std::vector<float> hidden;
  runner_->execute(batch, nullptr, &hidden);
  link_->send_step(batch, hidden);
  StepBatch unused;
  std::vector<float> unused_hidden;
  StepResult result;
  const auto kind = link_->receive(&unused, &unused_hidden, &result);
  if (kind != PipelineLink::Kind::kResult)
    throw std::runtime_error("pipeline: expected the last stage's result");
  return result;
}

void Engine::run_worker() {
  const bool last = options_.pipeline.rank == options_.pipeline.size - 1;
  for (;;) {
    StepBatch b;
    std::vector<float> hidden, out;
    StepResult unused;
    const auto kind = link_->receive(&b, &hidden, &unused);
    if (kind == PipelineLink::Kind::kShutdown) {
      if (!last) link_->send_shutdown();
      return;
    }
    if (kind != PipelineLink::Kind::kStep)
      throw std::runtime_error("pipeline: unexpected message in a worker stage");
    std::lock_guard lock(step_mu_);
    StepResult r = runner_->execute(b, hidden.data(), &out);
    if (last) {
      link_->send_result(r);
    } else {
      link_->send_step(b, out);
    }
  }
}

void Engine::shutdown_pipeline() {
  if (link_ && !shut_down_) link_->send_shutdown();
  shut_down_ = true;
}

}  // namespace refengine
