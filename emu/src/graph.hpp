// CUDA graphs: nodes and edges built by the graph API or recorded by stream capture,
// and executable graphs that run on a stream.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "handles.hpp"
#include "stream.hpp"
#include "thaw/emu_twin.h"

namespace emu {

struct Context;
class Call;

// The launch attributes a kernel node keeps besides its priority (cuGraphKernelNodeGet/
// SetAttribute; a cuLaunchKernelEx captured with them). On a GPU they change how the kernel is
// scheduled (a cluster of CTAs, a memory-sync domain), not what the host twin computes; they are
// kept so that a graph's attributes read back as a driver answers them.
struct KernelAttributes {
  unsigned cluster[3] = {0, 0, 0};  // all 0: no cluster
  int cluster_policy = 0;           // CUclusterSchedulingPolicy
  int cooperative = 0;
  int mem_sync_domain = 0;                 // CUlaunchMemSyncDomain
  unsigned char mem_sync_map[2] = {0, 0};  // default, remote
  unsigned carveout = 0xffffffffu;         // CU_SHAREDMEM_CARVEOUT_DEFAULT
};

// The checks the driver makes of a cluster: every dimension at least 1, at most 8 CTAs (the
// portable size; the emulator offers no non-portable sizes), the grid a whole number of clusters.
// CUDA_ERROR_INVALID_CLUSTER_SIZE otherwise, as the driver answers.
CUresult check_cluster(const unsigned cluster[3], const unsigned grid[3]);
// A launch attribute (cuLaunchKernelEx, cuGraphKernelNodeSetAttribute) checked as the driver
// checks it and stored in `a` (PRIORITY: in `priority`); CUDA_ERROR_NOT_SUPPORTED for those the
// emulator does not keep.
CUresult set_launch_attribute(int id, const CUlaunchAttributeValue& v, const unsigned grid[3],
                              KernelAttributes& a, int& priority);

struct KernelNode {
  std::uint64_t function = 0;  // a CUfunction handle of the node's context
  std::uint64_t ctx = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared = 0;
  std::vector<std::uint8_t> params;   // the parameter bank, laid out as the cubin says
  std::vector<unsigned> offsets;      // of each parameter in `params`
  const ThawEmuTwin* twin = nullptr;  // resolved when the node is made
  std::string name;                   // mangled kernel name, for errors
  int priority = 0;
  KernelAttributes attrs;
  bool from_extra = false;  // set through `extra`: GetParams answers in the same form
};

// What cuGraphMemsetNodeGetParams answers is these fields as they were given (cuGraphAddMemsetNode,
// cuGraphMemsetNodeSetParams) or captured (cuMemsetD*Async: one row, pitch 0).
struct MemsetNode {
  CUdeviceptr dst = 0;
  std::size_t pitch = 0;
  unsigned value = 0;
  unsigned element_size = 1;
  std::size_t width = 0;  // elements per row
  std::size_t height = 1;
  std::uint64_t ctx = 0;
};

struct MemcpyNode {  // the one-dimensional subset of CUDA_MEMCPY3D
  std::uint64_t dst = 0;
  std::uint64_t src = 0;
  std::uint64_t bytes = 0;
  bool dst_device = true;
  bool src_device = true;
  int device = 0;  // whose copy engine a host<->device copy uses
  std::uint64_t ctx = 0;
  // What cuGraphMemcpyNodeGetParams answers: the descriptor as given, or for a captured copy the
  // one the call stands for (memory types as the call names its sides, UNIFIED for cuMemcpy and
  // cuMemcpyAsync, whose sides unified addressing decides; Height and Depth 1, the rest 0).
  CUDA_MEMCPY3D desc{};
};

struct HostNode {
  CUhostFn fn = nullptr;
  void* user = nullptr;
};

struct EventNode {
  std::uint64_t event = 0;
};

struct EmptyNode {};

// A stream memory operation (cuStreamWriteValue32/64): one aligned 4- or 8-byte store. Captured,
// it becomes a batch memory-op node, as on the real driver.
struct MemOpNode {
  CUdeviceptr address = 0;
  std::uint64_t value = 0;
  unsigned size = 4;
  unsigned flags = 0;  // CUstreamWriteValue_flags
};

using NodeData =
    std::variant<EmptyNode, KernelNode, MemsetNode, MemcpyNode, HostNode, EventNode, MemOpNode>;

struct GraphNode {
  std::uint64_t handle = 0;
  std::uint64_t graph = 0;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  NodeData data;
  std::vector<std::uint64_t> deps;  // incoming edges, in the order they were added
};

struct Graph {
  std::uint64_t handle = 0;
  std::vector<std::uint64_t> nodes;  // in creation order
  bool capturing = false;            // being built by a stream capture
};

struct ExecNode {
  std::uint64_t node = 0;  // the graph node it was instantiated from
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  NodeData data;
  std::vector<std::size_t> deps;  // indices into the exec's nodes (topological order)
};

struct GraphExec {
  std::uint64_t handle = 0;
  std::uint64_t graph = 0;
  unsigned long long flags = 0;
  std::vector<ExecNode> nodes;  // topological order
  // The previous launch: "each launch is ordered behind ... any previous launches".
  StreamPoint last_launch;
};

// A stream capture in progress (cuStreamBeginCapture .. cuStreamEndCapture).
struct CaptureSession {
  std::uint64_t id = 0;
  std::uint64_t graph = 0;
  std::uint64_t origin = 0;  // the stream that began it (StreamCore id)
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<std::shared_ptr<StreamCore>> streams;  // origin first, then joined ones
};

struct GraphTables {
  HandleTable<Graph> graphs{HandleTag::kGraph};
  HandleTable<GraphNode> nodes{HandleTag::kGraphNode};
  HandleTable<GraphExec> execs{HandleTag::kGraphExec};
  std::vector<std::shared_ptr<CaptureSession>> captures;  // active ones
};
GraphTables& graph_tables();  // guarded by driver().mu

// What an operation becomes when its stream is capturing.
struct NodeSpec {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  NodeData data;
};

// Every stream operation goes through here: recorded as a graph node when `s` is
// capturing, otherwise enqueued (legacy-stream rules applied). Caller holds driver().mu.
// Returns the error that capture rules give (e.g. CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
CUresult submit_locked(Context& ctx, const std::shared_ptr<StreamCore>& s, StreamOp op,
                       NodeSpec spec, std::uint64_t* seq = nullptr);

// For calls the CUDA docs call "potentially unsafe" during capture (allocation,
// synchronisation): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the capture
// that forbids them, or CUDA_SUCCESS. Caller holds driver().mu.
CUresult check_unsafe_during_capture_locked();

// The capture session `s` takes part in, if any.
std::shared_ptr<CaptureSession> capture_of_locked(const StreamCore& s);

// Adds a node to a graph (caller holds driver().mu).
std::uint64_t add_node_locked(Graph& g, NodeSpec spec, const std::vector<std::uint64_t>& deps);

// The stream operation that executes one node (kernels through their twins).
StreamOp op_for_node(const NodeSpec& spec);

}  // namespace emu
