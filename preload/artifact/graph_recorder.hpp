// GraphRecorder: records the CUDA graphs an engine captures under the shim (common/graphs:
// GraphRecord), so that thawd can keep them as an artifact of kind "graphs" next to the layout
// record and a later run can restore them instead of capturing (MEDUSA, Foundry).
//
// - Module images: the module hooks tell it every image the driver loaded (module_loaded,
//   library_loaded) with its digest (module_image.hpp), per CUmodule / CUlibrary handle.
// - Captures: capture_began() notes how many allocations the deterministic layout had served
//   when a stream capture began; capture_ended() walks the graph the driver returned with the
//   driver's own queries — nodes and their types, kernel parameters (function, launch
//   dimensions, dynamic shared memory, each parameter's bytes as cuFuncGetParamInfo lays them
//   out), memset and memcpy parameters, edges — right then, because engines destroy the
//   CUgraph as soon as it is instantiated (PyTorch does).
// - Kernel identity is asked of the driver at that moment: cuFuncGetName, and cuFuncGetModule
//   to find the module the function lives in. A module the engine loaded itself is known by
//   handle; a library's module (cuLibraryLoadData: the driver makes one per context) is the
//   library whose kernels have exactly the module's function names — compared by name with
//   enumeration queries only, which load nothing — confirmed with cuLibraryGetModule when
//   several libraries qualify.
// - A graph the recorder cannot describe completely (a kernel of a module it never saw
//   loaded, node parameters the driver will not give) is no use to a restore: it is kept out
//   of the record, and the reason is counted and said (the record's codec accepts only
//   complete graphs).
//
// The driver comes in through GraphDriver, so the logic is testable with a fake.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/graphs/graph_record.hpp"

namespace thaw::preload {

// The driver queries the recorder makes (each answers as the CUDA driver API call named).
class GraphDriver {
 public:
  virtual ~GraphDriver() = default;
  // cuGraphGetNodes (count, then the nodes).
  virtual CUresult graph_nodes(CUgraph graph, std::vector<CUgraphNode>& out) = 0;
  // cuGraphGetEdges_v2 or cuGraphGetEdges: (from, to) pairs.
  virtual CUresult graph_edges(CUgraph graph,
                               std::vector<std::pair<CUgraphNode, CUgraphNode>>& out) = 0;
  virtual CUresult node_type(CUgraphNode node, CUgraphNodeType& out) = 0;
  // cuGraphKernelNodeGetParams_v2 (or v1, with kern and ctx null).
  virtual CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS& out) = 0;
  virtual CUresult kernel_attribute(CUgraphNode node, CUkernelNodeAttrID id,
                                    CUkernelNodeAttrValue& out) = 0;
  // CUDA_ERROR_NOT_SUPPORTED when the driver lacks the query.
  virtual CUresult memset_params(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS& out) = 0;
  virtual CUresult memcpy_params(CUgraphNode node, CUDA_MEMCPY3D& out) = 0;
  // cuFuncGetParamInfo: CUDA_ERROR_INVALID_VALUE past the last parameter.
  virtual CUresult param_info(CUfunction f, std::size_t index, std::size_t& offset,
                              std::size_t& size) = 0;
  virtual CUresult function_name(CUfunction f, std::string& out) = 0;
  virtual CUresult function_module(CUfunction f, CUmodule& out) = 0;
  // cuModuleGetFunctionCount + cuModuleEnumerateFunctions.
  virtual CUresult module_functions(CUmodule m, std::vector<CUfunction>& out) = 0;
  // cuLibraryGetKernelCount + cuLibraryEnumerateKernels.
  virtual CUresult library_kernels(CUlibrary l, std::vector<CUkernel>& out) = 0;
  virtual CUresult kernel_name(CUkernel k, std::string& out) = 0;
  // cuLibraryGetModule (the library's module in the current context).
  virtual CUresult library_module(CUlibrary l, CUmodule& out) = 0;
  // cuKernelGetFunction (the kernel's function in the current context).
  virtual CUresult kernel_function(CUkernel k, CUfunction& out) = 0;
  // The driver's attribute defaults for `f` (probe_kernel_node_defaults below, on the real
  // driver); CUDA_ERROR_NOT_SUPPORTED when this driver cannot be asked (the recorder then
  // assumes CUDA's documented defaults and says so).
  virtual CUresult attribute_defaults(CUfunction /*f*/,
                                      const std::vector<graphs::ParamSlot>& /*params*/,
                                      graphs::AttributeDefaults& /*out*/) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
};

// A kernel node's launch attributes as the driver answers cuGraphKernelNodeGetAttribute (`get`),
// raw: not compared with any default. A query the driver refuses (older drivers lack some) is
// left at CUDA's documented default.
graphs::AttributeDefaults read_kernel_node_attributes(
    const std::function<CUresult(CUkernelNodeAttrID, CUkernelNodeAttrValue&)>& get);

// The driver's defaults for function `f`: a graph with one node of `f` added without
// attributes (grid and block 1, every parameter of `params` zero bytes; it is never
// instantiated), its attributes read, the graph destroyed. Probed per function because a kernel
// compiled with __cluster_dims__ reports its compile-time cluster on a node that set none.
struct KernelNodeProbe {
  std::function<CUresult(CUgraph&)> graph_create;
  std::function<CUresult(CUgraph, const CUDA_KERNEL_NODE_PARAMS&, CUgraphNode&)> add_kernel_node;
  std::function<CUresult(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue&)> get_attribute;
  std::function<CUresult(CUgraph)> graph_destroy;
};
CUresult probe_kernel_node_defaults(const KernelNodeProbe& driver, CUfunction f,
                                    const std::vector<graphs::ParamSlot>& params,
                                    graphs::AttributeDefaults& out);

struct GraphRecorderStats {
  std::uint64_t captured = 0;  // graphs seen at the end of a capture
  std::uint64_t recorded = 0;  // of them, described completely
  std::uint64_t nodes = 0;     // in the recorded graphs
  std::uint64_t param_bytes = 0;
  std::uint64_t modules_loaded = 0;  // images digested
  std::uint64_t image_bytes = 0;     // bytes digested
  std::uint64_t walk_ns = 0;         // spent walking graphs at the end of captures
  // Kernel nodes recorded as "other" (no restore rebuilds them): a launch attribute set that
  // the record cannot hold (an access policy window, a preferred cluster, ...).
  std::uint64_t unrestorable_kernels = 0;
};

class GraphRecorder {
 public:
  // `notice`: told once per distinct reason a graph is left out; may be empty.
  GraphRecorder(GraphDriver& driver, std::function<void(const std::string&)> notice = {})
      : driver_(driver), notice_(std::move(notice)) {}

  // The module hooks: the driver loaded `image` as `module` / `library`.
  void module_loaded(CUmodule module, const graphs::RecordedModule& image);
  void library_loaded(CUlibrary library, const graphs::RecordedModule& image);

  // The restore ABI (thaw_restore_graph_label): the next capture to begin, on any thread, is
  // recorded with `label` (printable ASCII, checked by the caller); a later label replaces one
  // no capture took yet.
  void label_next_capture(std::string label);

  // The capture hooks. `capture`: the driver's capture id; `allocations`: allocations the
  // deterministic layout had served when it began. `layout_active`: whether the layout was
  // serving allocations when it ended (a graph captured otherwise points at memory no later
  // run will have at the same address).
  void capture_began(std::uint64_t capture, std::uint64_t allocations);
  // `known`: the graph is a transparent restore's (preload/restore/transparent_capture.hpp),
  // rebuilt from this recorded graph, whose nodes and edges are taken as they are instead of
  // walking it again (the same graph; the walk would cost the capture's end ~3 ms a graph).
  void capture_ended(std::uint64_t capture, CUgraph graph, bool layout_active,
                     const graphs::RecordedGraph* known = nullptr);

  // A graph restored transparently from a record is kept as the record's nodes (`known`),
  // normalized against the record's attribute defaults, which the restore checked are this
  // run's driver's: they become this run's record's defaults unless a walk probed them first
  // (otherwise a run that only restored would store a record claiming CUDA's documented ones).
  void adopt_defaults(const graphs::AttributeDefaults& defaults);

  // What a record of this run would hold: the graphs described completely, in capture order,
  // and the modules their kernels name (the identity is left for the caller).
  graphs::GraphRecord record() const;
  GraphRecorderStats stats() const;
  // Why graphs were left out, one line per distinct reason, with how many.
  std::vector<std::string> omissions() const;
  // Whether some graph was captured while the layout was not serving allocations.
  bool captured_outside_layout() const;

  // In a forked child: a fresh run (the parent's driver state is not the child's).
  void reset_after_fork();
  std::mutex& fork_mutex() const { return mutex_; }

 private:
  // The walk of one graph, outside the lock; the error says why it is incomplete.
  std::optional<std::string> walk(CUgraph graph, graphs::RecordedGraph& out);
  std::optional<std::string> describe_kernel(CUgraphNode node, graphs::KernelNode& out,
                                             CUfunction& function);
  // The launch attributes (cluster, priority, ...) that differ from the driver's defaults for
  // `f`; the error: one a record cannot hold.
  std::optional<std::string> kernel_attributes(CUgraphNode node, CUfunction f,
                                               graphs::KernelNode& out);
  // The driver's defaults for `f`, probed once per function (cached); the first probed are the
  // record's attribute_defaults.
  graphs::AttributeDefaults defaults_for(CUfunction f,
                                         const std::vector<graphs::ParamSlot>& params);
  std::optional<std::string> kernel_identity(CUfunction f, graphs::KernelIdentity& out);
  // The digest of the module `m` (a function's), learnt from the libraries if needed.
  std::optional<std::string> module_digest(CUmodule m);
  void omit(const std::string& why);
  void unrestorable(const std::string& why);  // a kernel node recorded as "other"

  GraphDriver& driver_;
  std::function<void(const std::string&)> notice_;
  mutable std::mutex mutex_;
  std::map<std::string, graphs::RecordedModule> images_;  // by digest
  std::map<CUmodule, std::string> module_digests_;        // module handle -> digest
  std::map<CUlibrary, std::string> library_digests_;      // library handle -> digest
  // Sorted kernel names per library, computed when first needed.
  std::map<CUlibrary, std::vector<std::string>> library_names_;
  struct Began {
    std::uint64_t allocations = 0;
    std::string label;
  };
  std::map<std::uint64_t, Began> began_;  // by capture id
  std::string next_label_;                // for the next capture to begin
  std::vector<graphs::RecordedGraph> graphs_;
  std::uint32_t next_index_ = 0;
  std::map<std::string, std::uint64_t> omissions_;  // reason -> graphs
  std::set<std::string> unrestorable_reasons_;      // said once each
  bool outside_layout_ = false;
  GraphRecorderStats stats_;
  std::map<CUfunction, graphs::AttributeDefaults> function_defaults_;  // under mutex_
  std::optional<graphs::AttributeDefaults> record_defaults_;           // the first probed
  bool said_unprobed_ = false;  // that the defaults could not be probed (said once)
};

}  // namespace thaw::preload
