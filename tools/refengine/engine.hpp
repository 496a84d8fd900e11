// The engine: vLLM-like start-up of one pipeline stage (driver, allocator, weights, profile
// run and KV-cache sizing, CUDA graphs) and the step loop that stage 0 drives.
#pragma once

#include <cuda.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "driver.hpp"
#include "model_runner.hpp"
#include "pipeline.hpp"
#include "timeline.hpp"

namespace refengine {

struct EngineOptions {
  std::filesystem::path model;
  int device = 0;
  double gpu_memory_utilization = 0.9;
  int num_gpu_blocks_override = 0;  // > 0: use this many KV blocks instead of the profile's
  RunnerLimits limits;
  bool enforce_eager = false;
  std::vector<int> graph_sizes;  // empty: 1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs
  int num_warmups = 1;
  bool expandable_segments = false;
  KernelModule::Api module_api = KernelModule::Api::kLibrary;
  // Size the KV cache from the record thaw's restore ABI holds for this configuration instead
  // of running the profiling pass (and record the pass's decision when there is none); the
  // engine profiles as usual when the ABI is absent or the record missing or stale.
  bool thaw_restore = false;
  PipelineConfig pipeline;
};

// vLLM's default capture sizes: 1, 2, 4, then multiples of 8, up to max_num_seqs.
std::vector<int> default_graph_sizes(int max_num_seqs);

class Engine {
 public:
  // Runs the whole start-up, marking the timeline. Throws std::runtime_error (or DriverError,
  // OutOfMemory) with a one-line message on any failure.
  Engine(const EngineOptions& options, Timeline& timeline);
  ~Engine();

  // Makes the engine's context current on the calling thread (every thread that steps).
  void bind_thread();
  // Stage 0: runs a step on every stage and returns the sampled tokens.
  StepResult step(const StepBatch& batch);
  // Stages > 0: serve steps from the previous stage until stage 0 shuts the pipeline down.
  void run_worker();
  // Stage 0: tells the other stages to exit.
  void shutdown_pipeline();

  const GPT2Config& config() const { return checkpoint_->config(); }
  const EngineOptions& options() const { return options_; }
  int num_blocks() const { return num_blocks_; }
  int max_blocks_per_seq() const { return runner_->max_blocks_per_seq(); }
  std::vector<int> graph_sizes() const { return runner_->graph_sizes(); }
  const std::map<int, CUgraphExec>& graph_execs() const { return runner_->graph_execs(); }
  const Driver& driver() const { return *driver_; }
  bool is_first_stage() const { return options_.pipeline.rank == 0; }
  Timeline& timeline() { return timeline_; }
  // KV transfer (kv_transfer_server.cpp): the stage's runner, and the lock every step holds on
  // this stage, so that block copies never overlap a step.
  ModelRunner& runner() { return *runner_; }
  std::mutex& step_mutex() { return step_mu_; }

 private:
  EngineOptions options_;
  Timeline& timeline_;
  std::unique_ptr<Driver> driver_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::optional<Checkpoint> checkpoint_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<PipelineLink> link_;
  int num_blocks_ = 0;
  bool shut_down_ = false;
  std::mutex step_mu_;
};

}  // namespace refengine
