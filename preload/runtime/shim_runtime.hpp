// ShimRuntime: the one owner of libthaw-preload.so's process-wide state — its configuration,
// counters, deterministic layout, layout recorder, weight injector, open model files and
// their mappings, engine memory and CUDA IPC tables — and the place where the steps of an
// engine's life under the shim are decided, each in one function:
//
//   on_library_loaded      the loader mapped the shim (constructor): fork handlers, exit step
//   on_model_file_opened   the engine opened a file of a managed model: its readiness map is
//                          opened, the recorder learns the model, and — THAW_PRELOAD_ATTACH —
//                          the engine attaches to a prewarmed slot: memory budget, injector
//   on_driver_reached      the engine allocates on a loaded driver: what needs the driver is
//                          built (the layout; the injector, as the layout's page backing)
//   on_exit                the run is over: its records (layout, graphs), the slot and the
//                          counters go to thawd
//   fork (shim_runtime_fork.cpp): every lock held across fork(); the child's tables reset
//
// The exported C entry points (preload/hooks, preload/files/file_hooks.cpp) are thin: they
// call the runtime, which calls files / layout / inject / artifact and the thawd client.
//
// One per process, built on first use and never destroyed: hooks run before the shim's
// constructors and during exit, after static destructors.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "preload/artifact/graph_recorder.hpp"
#include "preload/artifact/layout_recorder.hpp"
#include "preload/files/file_mappings.hpp"
#include "preload/files/managed_files.hpp"
#include "preload/inject/weight_injector.hpp"
#include "preload/layout/deterministic_layout.hpp"
#include "preload/restore/graph_restore.hpp"
#include "preload/restore/kv_restore.hpp"
#include "preload/runtime/engine_memory.hpp"
#include "preload/runtime/ipc_tables.hpp"
#include "preload/runtime/shim_config.hpp"
#include "preload/runtime/stream_captures.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

class ShimRuntime {
 public:
  ShimRuntime();  // reads the configuration (the environment), nothing else
  ShimRuntime(const ShimRuntime&) = delete;
  ShimRuntime& operator=(const ShimRuntime&) = delete;

  // --- The steps of an engine's life, in the order they happen ---

  void on_library_loaded();
  // An open() of `fd` that classify() found in a thaw cache.
  void on_model_file_opened(int fd, const ModelFilePath& where);
  void on_driver_reached();
  // With thawd there, an engine allocates out of thawd's pool: at its first allocation or
  // memory query (a context is current by then) the shim asks thawd for the pool's free
  // pages of this GPU, which thawd gives to the driver for this process until it exits.
  // Without that, an engine not attached to a slot would have only what the pool leaves
  // the driver (a tenth of the GPU at the default pool_share). THAW_PRELOAD_LEASE=0 opts out.
  void lease_pool_memory_once();
  void on_exit();
  // pthread_atfork's three (shim_runtime_fork.cpp).
  void before_fork();
  void after_fork_in_parent();
  void after_fork_in_child();

  // --- What the hooks work with ---

  const ShimConfig& config() const { return config_; }
  ShimCounters& counters() { return counters_; }
  // Built on first use once a driver is loaded; nullptr before, or with the layout off.
  DeterministicLayout* layout();
  // nullptr with the layout off (it records the layout).
  LayoutRecorder* recorder();
  // nullptr when not attached to a slot (or the driver lacks what injection needs).
  WeightInjector* injector();
  // Records the engine's CUDA graphs while the layout is on (their pointers mean something
  // only then); built on first use once the driver is loaded. nullptr otherwise.
  GraphRecorder* graph_recorder();
  EngineMemory& engine_memory() { return engine_memory_; }
  ManagedFileTable& files() { return files_; }
  FileMappings& file_mappings() { return file_mappings_; }
  IpcTables& ipc() { return ipc_; }
  StreamCaptures& captures() { return captures_; }
  // The restore ABI's KV calls (preload/restore, thaw_restore.h).
  restore::KvRestore& kv_restore() { return kv_restore_; }
  // The restore ABI's graph calls: the graphs record of an earlier run, rebuilt on request.
  restore::GraphRestore& graph_restore() { return graph_restore_; }

  // The engine's fingerprint: the program file (path, size, modification time) and
  // $THAW_ENGINE_ID when set (to tell apart engines one interpreter runs, e.g. "vllm-0.11").
  std::string engine_fingerprint() const;

 private:
  // The model-file step's decisions.
  void attach_to_slot(const std::string& model);
  // Under build_mutex_: each builds its object once (and what it depends on).
  LayoutRecorder* build_recorder_locked();
  DeterministicLayout* build_layout_locked();
  WeightInjector* build_injector_locked();
  GraphRecorder* build_graph_recorder_locked();
  void finish_injection();
  // At exit: the graphs record goes to thawd, when the run followed a deterministic layout.
  void store_graphs();
  // What GraphRestore sees of the run: the layout and its recorder, thawd's "graphs" records.
  restore::GraphRestoreEnvironment graph_restore_environment();

  const ShimConfig config_;
  const bool layout_on_;  // deterministic and not disabled
  ShimCounters counters_;

  // Serialises building the layout, recorder and injector; the pointers are then read
  // without it (hot paths).
  std::mutex build_mutex_;
  std::atomic<LayoutRecorder*> recorder_{nullptr};
  std::atomic<DeterministicLayout*> layout_{nullptr};
  std::atomic<WeightInjector*> injector_{nullptr};
  std::atomic<GraphRecorder*> graph_recorder_{nullptr};
  std::atomic<bool> graph_recorder_tried_{false};
  // What attach granted, until the injector is built from it (attach usually happens
  // before CUDA starts; the injector needs the driver).
  std::unique_ptr<SlotGrant> pending_grant_;  // under build_mutex_
  std::atomic<bool> grant_pending_{false};

  std::atomic<bool> attach_tried_{false};
  std::atomic<bool> lease_tried_{false};

  EngineMemory engine_memory_;
  ManagedFileTable files_;
  FileMappings file_mappings_;
  IpcTables ipc_;
  StreamCaptures captures_;
  restore::KvRestore kv_restore_;
  restore::GraphRestore graph_restore_;
};

// The process's runtime.
ShimRuntime& runtime();

}  // namespace thaw::preload
