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
// Off the engine's critical path (a worker thread the GraphRestore owns, started by
// identity_known()):
//   - the record is fetched from thawd and parsed as soon as the run's identity is complete
//     (the layout recorder looks its own record up then); a request while that fetch is under
//     way waits for it, a request before it fetches at once, as before;
//   - once the engine has shown it uses the ABI (engine_uses_abi: it asked for the ABI's
//     version), the record is parsed, and a graph's allocation index is reached with every
//     check above passing, the worker builds and instantiates it in the engine's context (the
//     last one that loaded a module image; the worker's capture mode is RELAXED, so a GLOBAL
//     capture on another thread restricts none of its calls), the graphs last captured first:
//     the engine asks in capture order, so a request of a graph nobody has started builds it on
//     the engine's thread while the worker builds the later ones — they meet in the middle;
//   - a request of a graph being pre-built waits for it; a pre-built graph is handed out only
//     after every check is made again at that moment (layout followed, allocation index equal
//     now, pointers live now, the same kernel functions, the same context, the same
//     instantiate flags — the record has none: the worker guesses PyTorch's
//     AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY until the engine asks with its own); otherwise it is
//     destroyed and the request goes on as if there had been none (it builds, or refuses saying
//     why);
//   - what nobody asked for is destroyed at shutdown() (exit), which joins the worker.
// Without identity_known() (the unit tests that do not call it) everything happens at the
// request, as before. Graphs are built with the kernel parameters pointing into the recorded
// bytes and the recorded edges; the CUgraph is destroyed once instantiated.
//
// Transparent restore (no engine change; preload/restore/transparent_capture.hpp elides the
// launches): at cuStreamBeginCapture transparent_candidate() names the first recorded graph not
// yet used whose allocation index is the layout's count now, that is a single chain (one
// stream) of kernel, 1-D memset and device-to-device copy nodes and passes every check above; the
// worker pre-builds such graphs — the CUgraph kept, and an exec instantiated with the flags last
// seen — once their allocation index is reached (only while the engine does not use the ABI, which
// asks by label instead); transparent_take() hands one out at the end of a fully matched capture
// after the checks are made again, building it then if the worker has not.
//
// The driver and the run's layout come in through GraphBuildDriver and
// GraphRestoreEnvironment, so the logic is testable without either.
#pragma once

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
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
  // This driver's attribute defaults for `f` (probe_kernel_node_defaults in
  // preload/artifact/graph_recorder.hpp, on the real driver); CUDA_ERROR_NOT_SUPPORTED: CUDA's
  // documented ones are assumed, as the recorder does.
  virtual CUresult attribute_defaults(CUfunction, const std::vector<graphs::ParamSlot>&,
                                      graphs::AttributeDefaults&) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  virtual CUresult add_memset_node(CUgraph graph, const CUDA_MEMSET_NODE_PARAMS& params,
                                   CUcontext ctx, CUgraphNode& out) = 0;
  virtual CUresult add_memcpy_node(CUgraph graph, const CUDA_MEMCPY3D& params, CUcontext ctx,
                                   CUgraphNode& out) = 0;
  virtual CUresult add_empty_node(CUgraph graph, CUgraphNode& out) = 0;
  virtual CUresult add_dependency(CUgraph graph, CUgraphNode from, CUgraphNode to) = 0;
  virtual CUresult instantiate(CUgraph graph, unsigned long long flags, CUgraphExec& out) = 0;
  // What the background worker needs besides (the defaults: no background pre-build).
  virtual CUresult exec_destroy(CUgraphExec) { return CUDA_ERROR_NOT_SUPPORTED; }
  virtual CUresult set_current_context(CUcontext) {  // cuCtxSetCurrent
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // cuThreadExchangeStreamCaptureMode(RELAXED) for the calling thread.
  virtual CUresult relax_capture_mode() { return CUDA_ERROR_NOT_SUPPORTED; }
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

  // The background worker's (each optional; without worker_driver nothing is pre-built).
  // The driver the worker builds with, and destroys unclaimed graphs with at shutdown.
  std::function<std::unique_ptr<GraphBuildDriver>()> worker_driver;
  // The calling thread's current context (asked on the thread that loads a module image).
  std::function<CUcontext()> current_context;
  // Runs the worker's body (the shim marks the thread as its own around it).
  std::function<void(const std::function<void()>&)> worker_scope;
  // A line for the log (what the worker did).
  std::function<void(const std::string&)> log;
  // How often the worker looks whether the allocation index a graph waits for is reached.
  std::chrono::microseconds poll{200};
};

struct GraphRestoreResult {
  GraphStatus status = GraphStatus::unavailable;
  CUgraphExec exec = nullptr;  // with ok
  CUgraph graph = nullptr;     // with ok from build(): the caller's to destroy
  std::size_t nodes = 0;       // with ok
  std::size_t edges = 0;
  bool prebuilt = false;  // with ok from restore(): built by the worker before the request
  std::string why;        // with anything else
};

class GraphRestore {
 public:
  explicit GraphRestore(GraphRestoreEnvironment env) : env_(std::move(env)) {}
  ~GraphRestore() { shutdown(); }
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

  // The run's identity is complete (the layout recorder looked its record up): the worker
  // starts (once, with env.worker_driver) and fetches the record.
  void identity_known();
  // The engine called the restore ABI: it may ask for graphs, which the worker may pre-build.
  void engine_uses_abi();
  // The worker stops and is joined; the pre-built graphs nobody asked for are destroyed.
  // Idempotent; the destructor calls it.
  void shutdown();
  // --- Transparent restore ---
  // A recorded graph a capture may be: its launches are compared with `chain` in order.
  struct TransparentMatch {
    std::size_t position = 0;  // in the record's graphs
    const graphs::RecordedGraph* graph = nullptr;
    std::vector<CUfunction> functions;  // per node (kernels; null otherwise)
    std::vector<std::uint32_t> chain;   // node indices, in launch order
    // The record's attribute defaults (equal to this run's, or plan_graph_locked refused it): a
    // launch attribute equal to one of them is "not set", as the recorder keeps it.
    graphs::AttributeDefaults defaults;
  };
  // Why a capture is not elided: a short reason (the counters' key) and the whole line.
  struct TransparentRefusal {
    std::string reason;
    std::string why;
    bool record = false;  // a graphs record was there (the capture counts in the summary)
  };
  struct TransparentGraph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;  // null when built at the take (nothing instantiated yet)
    unsigned long long flags = 0;
    bool prebuilt = false;
  };
  void enable_transparent(bool on);
  // At the begin of a capture (the calling thread's context current): the graph it may be,
  // marked used, or why none.
  std::expected<TransparentMatch, TransparentRefusal> transparent_candidate(
      GraphBuildDriver& driver);
  // At the end of a capture that matched `match` completely: its graph, checked again now.
  std::expected<TransparentGraph, std::string> transparent_take(GraphBuildDriver& driver,
                                                                const TransparentMatch& match);
  // The capture fell back: what the worker built for it is destroyed.
  void transparent_drop(GraphBuildDriver& driver, std::size_t position);
  // The engine instantiated a graph with `flags`: the worker instantiates the next ones so.
  void transparent_flags_seen(unsigned long long flags);
  // Whether a recorded graph is a single chain (every node at most one edge in and one out,
  // all connected); its node indices in order.
  static std::optional<std::vector<std::uint32_t>> chain_of(const graphs::RecordedGraph& g);

  // The labels the worker has pre-built so far (tests).
  std::vector<std::string> prebuilt_labels() const;

  // In a forked child: nothing fetched, nothing loaded (the parent's handles are not the
  // child's driver state), no worker (the thread is not in the child), nothing pre-built.
  void reset_after_fork();
  // Fork: both locks are held across fork() by the forking thread, this one first.
  std::mutex& fork_mutex() { return mutex_; }
  std::mutex& worker_fork_mutex() { return wake_mutex_; }

 private:
  // The fetched record, or why there is none (under mutex_).
  struct Fetched {
    GraphStatus status = GraphStatus::none;
    std::string why;
    std::optional<graphs::GraphRecord> record;
  };
  // A graph that passed every check, with its kernels' functions.
  struct Plan {
    const graphs::RecordedGraph* graph = nullptr;
    std::vector<CUfunction> functions;
  };
  // A graph the worker builds (building) or has built.
  struct Prebuilt {
    bool building = true;
    CUgraphExec exec = nullptr;
    Plan plan;
    CUcontext ctx = nullptr;
    unsigned long long flags = 0;
  };
  Fetched fetch_record(const graphs::GraphIdentity& id) const;  // without the lock
  const Fetched& fetch_locked(std::unique_lock<std::mutex>& lock);
  // The checks of one recorded graph, under mutex_.
  // `functions`: the kernels' functions already resolved (and launched) this capture, not
  // asked of the driver again.
  std::expected<Plan, GraphRestoreResult> plan_graph_locked(
      GraphBuildDriver& driver, const graphs::RecordedGraph& g,
      const std::vector<CUfunction>* functions = nullptr);
  bool prebuild_transparent();
  // The checks, under mutex_: the graph labelled `label` may be built now, or why not.
  std::expected<Plan, GraphRestoreResult> plan_locked(GraphBuildDriver& driver,
                                                      std::string_view label);
  // Builds a planned graph (without the lock: the record is not changed once fetched).
  GraphRestoreResult build_planned(GraphBuildDriver& driver, const Plan& plan, CUcontext ctx);
  GraphRestoreResult build_locked(GraphBuildDriver& driver, std::string_view label);
  GraphRestoreResult instantiate_planned(GraphBuildDriver& driver, const Plan& plan, CUcontext ctx,
                                         unsigned long long flags);
  // The worker.
  void poke();
  void worker_main();
  void fetch_in_background();
  // Pre-builds what it can; whether an allocation index some graph waits for is still ahead.
  bool prebuild();
  void say(const std::string& line) const {
    if (env_.log) env_.log(line);
  }
  std::optional<std::string> check_pointers(const graphs::RecordedGraph& g) const;
  // Whether this run's driver answers the record's attribute defaults (probed once, with the
  // first kernel of the first graph planned); why not.
  std::optional<std::string> check_attribute_defaults(GraphBuildDriver& driver,
                                                      const graphs::RecordedGraph& g,
                                                      const std::vector<CUfunction>& functions);
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
  bool fetching_ = false;  // the worker fetches the record (without the lock)
  Fetched unavailable_;    // the last answer while the identity was incomplete
  std::vector<std::string> restored_labels_;
  std::optional<graphs::AttributeDefaults> run_defaults_;  // this run's, once probed
  // The worker's state, under mutex_.
  bool uses_abi_ = false;
  CUcontext engine_ctx_ = nullptr;  // the context of the last module image loaded
  std::uint64_t loads_ = 0;         // images loaded (a retry's condition)
  // PyTorch's CUDAGraph::capture_end flags, until the engine instantiates with its own.
  unsigned long long flags_guess_ = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  std::map<std::string, Prebuilt, std::less<>> prebuilt_;
  std::set<std::string, std::less<>> asked_;  // labels requested: the worker leaves them
  // Labels the worker tried and could not build: at (allocations, loads).
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>, std::less<>> tried_;
  std::vector<std::string> prebuilt_labels_;
  // Transparent restore, under mutex_.
  struct TransparentPrebuilt {
    bool building = true;
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    Plan plan;
    CUcontext ctx = nullptr;
    unsigned long long flags = 0;
  };
  bool transparent_on_ = false;
  std::set<std::size_t> transparent_used_;  // record positions a capture took
  std::map<std::size_t, TransparentPrebuilt> transparent_prebuilt_;
  std::map<std::size_t, std::pair<std::uint64_t, std::uint64_t>> transparent_tried_;
  std::condition_variable changed_;  // with mutex_: a fetch or a pre-build finished
  // Waking the worker: a leaf lock (nothing is called under it; taken after mutex_).
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool poked_ = false, stopping_ = false;  // under wake_mutex_
  CUcontext worker_ctx_ = nullptr;         // the worker thread's current context (the worker's)
  std::unique_ptr<GraphBuildDriver> worker_driver_;  // the worker's, then shutdown's
  std::thread worker_;                               // started and joined under wake_mutex_'s
                                                     // flags; joined without a lock
};

}  // namespace thaw::preload::restore
