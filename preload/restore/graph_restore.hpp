// GraphRestore: the shim's side of the restore ABI's graph calls (thaw_restore.h, version 2;
// the C entry points are preload/restore/restore_abi.cpp). One per process, owned by the
// ShimRuntime. An engine that opts in asks for a decode graph by its label instead of warming
// up and capturing it (MEDUSA §5, Foundry), and gets an instantiated CUgraphExec built from the
// "graphs" record an earlier run of the same engine, model, GPU and driver left in thawd
// (preload/artifact/graph_recorder.hpp records it, tagged with the labels the engine gave).
//
// A graph is handed out only when every pointer it holds means what it meant when it was
// recorded — never otherwise (MEDUSA: no restored graph whose pointers fall outside the layout's
// live allocations):
//   - the run follows its layout record (the same allocation sequence so far: the layout
//     recorder says so), and the record's identity is this run's;
//   - the graph was captured when the layout had served exactly as many allocations as it has
//     now (the same point of the sequence);
//   - each kernel's module image (by digest) was loaded by this run, and the function is found
//     in it by name;
//   - every kernel parameter of 8 bytes whose value lies in the layout's region, and every
//     memset / memcpy address, lies in an allocation live now;
//   - every node is of a type a restore can rebuild (kernel, memset, memcpy of device memory,
//     empty).
// Otherwise the answer is a code and one line saying why, and the engine captures as usual.
//
// The record is fetched from thawd once, at the first request (after the engine has loaded
// its model and its kernels, before its first capture), and parsed by the strict codec.
// Graphs are built lazily, at each request (cuGraphCreate, a node per recorded node with the
// kernel parameters pointing into the recorded bytes, the recorded edges,
// cuGraphInstantiateWithFlags); the CUgraph is destroyed once instantiated.
//
// The driver and the run's layout come in through GraphBuildDriver and
// GraphRestoreEnvironment, so the logic is testable without either.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/graphs/graph_record.hpp"

namespace thaw::preload::restore {

// The ABI's codes for the graph calls (THAW_RESTORE_*, same values).
enum class GraphStatus : int {
  ok = 0,
  none = 1,         // no graphs record, or no graph with this label in it
  stale = 2,        // this run does not follow the layout its record was made in
  corrupt = 3,      // the stored record was refused (codec), or is another run's
  unavailable = 4,  // no thawd, no layout, no driver, shim disabled
  invalid_argument = 5,
  mismatch = 7,  // this graph does not fit this run: allocation index, kernels, pointers, nodes
};
std::string_view to_string(GraphStatus status);

// The driver calls a restore makes (each answers as the CUDA driver API call named).
class GraphBuildDriver {
 public:
  virtual ~GraphBuildDriver() = default;
  virtual CUresult current_context(CUcontext& out) = 0;  // cuCtxGetCurrent
  virtual CUresult module_function(CUmodule m, const char* name,
                                   CUfunction& out) = 0;  // cuModuleGetFunction
  // cuLibraryGetKernel + cuKernelGetFunction (the kernel's function in the current context).
  virtual CUresult library_function(CUlibrary l, const char* name, CUfunction& out) = 0;
  virtual CUresult graph_create(CUgraph& out) = 0;
  virtual CUresult graph_destroy(CUgraph graph) = 0;
  virtual CUresult add_kernel_node(CUgraph graph, const CUDA_KERNEL_NODE_PARAMS& params,
                                   CUgraphNode& out) = 0;
  virtual CUresult set_kernel_attribute(CUgraphNode node, CUkernelNodeAttrID id,
                                        const CUkernelNodeAttrValue& value) = 0;
  virtual CUresult add_memset_node(CUgraph graph, const CUDA_MEMSET_NODE_PARAMS& params,
                                   CUcontext ctx, CUgraphNode& out) = 0;
  virtual CUresult add_memcpy_node(CUgraph graph, const CUDA_MEMCPY3D& params, CUcontext ctx,
                                   CUgraphNode& out) = 0;
  virtual CUresult add_empty_node(CUgraph graph, CUgraphNode& out) = 0;
  virtual CUresult add_dependency(CUgraph graph, CUgraphNode from, CUgraphNode to) = 0;
  virtual CUresult instantiate(CUgraph graph, unsigned long long flags, CUgraphExec& out) = 0;
};

// The run as the restore needs to see it.
struct GraphRestoreEnvironment {
  // This run's identity (the layout record's: engine, model, GPU, driver), or why it has none.
  std::function<std::expected<graphs::GraphIdentity, std::string>()> identity;
  // Why this run does not follow its layout record now (none found, diverged, layout stopped);
  // nullopt when it does.
  std::function<std::optional<std::string>()> not_following;
  // Allocations the deterministic layout has served so far.
  std::function<std::uint64_t()> allocations;
  // Whether `address` lies in the layout's region (live or freed).
  std::function<bool(std::uint64_t address)> in_region;
  // Whether [address, address + bytes) lies inside one allocation live now.
  std::function<bool(std::uint64_t address, std::uint64_t bytes)> live;
  // The stored record's text for `identity`, or nullopt (none, or no thawd).
  std::function<std::optional<std::string>(const graphs::GraphIdentity&)> fetch;
};

struct GraphRestoreResult {
  GraphStatus status = GraphStatus::unavailable;
  CUgraphExec exec = nullptr;  // with ok
  CUgraph graph = nullptr;     // with ok from build(): the caller's to destroy
  std::size_t nodes = 0;       // with ok
  std::size_t edges = 0;
  std::string why;  // with anything else
};

class GraphRestore {
 public:
  explicit GraphRestore(GraphRestoreEnvironment env) : env_(std::move(env)) {}
  GraphRestore(const GraphRestore&) = delete;
  GraphRestore& operator=(const GraphRestore&) = delete;

  // The module hooks: the engine loaded an image with this digest as `module` / `library`.
  void module_loaded(CUmodule module, const std::string& digest);
  void library_loaded(CUlibrary library, const std::string& digest);

  // The graph labelled `label` (the last such), built and instantiated with `flags`.
  GraphRestoreResult restore(GraphBuildDriver& driver, std::string_view label,
                             unsigned long long flags);
  // The same graph built, not instantiated (tests compare it with a live capture).
  GraphRestoreResult build(GraphBuildDriver& driver, std::string_view label);

  // The recorded graphs this run was handed (restored), for the record stored at exit: a run
  // that restores some graphs and captures others keeps both in thawd.
  std::vector<graphs::RecordedGraph> restored_graphs() const;
  // The record's modules the restored graphs name.
  std::vector<graphs::RecordedModule> restored_modules() const;

  // In a forked child: nothing fetched, nothing loaded (the parent's handles are not the
  // child's driver state).
  void reset_after_fork();
  std::mutex& fork_mutex() { return mutex_; }

 private:
  // The fetched record, or why there is none (under mutex_).
  struct Fetched {
    GraphStatus status = GraphStatus::none;
    std::string why;
    std::optional<graphs::GraphRecord> record;
  };
  const Fetched& fetch_locked();
  GraphRestoreResult build_locked(GraphBuildDriver& driver, std::string_view label,
                                  const graphs::RecordedGraph*& which);
  std::optional<std::string> check_pointers(const graphs::RecordedGraph& g) const;
  // The function `name` of an image with `digest` this run loaded, or why not.
  std::expected<CUfunction, std::string> function(GraphBuildDriver& driver,
                                                  const std::string& digest,
                                                  const std::string& name);

  GraphRestoreEnvironment env_;
  mutable std::mutex mutex_;
  // Loaded images, by digest: the handles, latest last.
  std::map<std::string, std::vector<CUmodule>> modules_;
  std::map<std::string, std::vector<CUlibrary>> libraries_;
  std::optional<Fetched> fetched_;
  Fetched unavailable_;  // the last answer while the identity was incomplete
  std::vector<std::string> restored_labels_;
};

}  // namespace thaw::preload::restore
