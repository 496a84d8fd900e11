#include "preload/artifact/graph_recorder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <unordered_map>

namespace thaw::preload {

using graphs::KernelIdentity;
using graphs::KernelNode;
using graphs::NodeType;
using graphs::RecordedGraph;
using graphs::RecordedNode;

namespace {

NodeType node_type_of(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return NodeType::kernel;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      return NodeType::memset;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return NodeType::memcpy;
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return NodeType::empty;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return NodeType::event_record;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return NodeType::event_wait;
    case CU_GRAPH_NODE_TYPE_HOST:
      return NodeType::host;
    default:
      return NodeType::other;
  }
}

// A 1-D copy as stream capture records cuMemcpy*Async; nullopt for anything else.
std::optional<graphs::MemcpyNode> one_dimensional(const CUDA_MEMCPY3D& p) {
  if (p.Height > 1 || p.Depth > 1 || p.srcXInBytes != 0 || p.srcY != 0 || p.srcZ != 0 ||
      p.dstXInBytes != 0 || p.dstY != 0 || p.dstZ != 0 || p.srcArray != nullptr ||
      p.dstArray != nullptr) {
    return std::nullopt;
  }
  auto address = [](CUmemorytype type, CUdeviceptr device, const void* host) -> std::uint64_t {
    return type == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(host) : device;
  };
  graphs::MemcpyNode m;
  m.src = address(p.srcMemoryType, p.srcDevice, p.srcHost);
  m.dst = address(p.dstMemoryType, p.dstDevice, p.dstHost);
  m.bytes = p.WidthInBytes;
  m.src_memory_type = static_cast<std::uint32_t>(p.srcMemoryType);
  m.dst_memory_type = static_cast<std::uint32_t>(p.dstMemoryType);
  if (m.src_memory_type < 1 || m.src_memory_type > 4 || m.dst_memory_type < 1 ||
      m.dst_memory_type > 4) {
    return std::nullopt;
  }
  return m;
}

// The buffer of a launch's `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE), or nullopt.
std::optional<std::pair<const std::uint8_t*, std::size_t>> extra_buffer(void** extra) {
  const std::uint8_t* buffer = nullptr;
  std::optional<std::size_t> size;
  for (std::size_t i = 0; extra != nullptr && extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = static_cast<const std::uint8_t*>(extra[i + 1]);
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != nullptr) {
      size = *static_cast<const std::size_t*>(extra[i + 1]);
    }
  }
  if (buffer == nullptr || !size) return std::nullopt;
  return std::make_pair(buffer, *size);
}

}  // namespace

void GraphRecorder::module_loaded(CUmodule module, const graphs::RecordedModule& image) {
  std::lock_guard lock(mutex_);
  images_.try_emplace(image.digest, image);
  module_digests_[module] = image.digest;
  ++stats_.modules_loaded;
  stats_.image_bytes += image.bytes;
}

void GraphRecorder::library_loaded(CUlibrary library, const graphs::RecordedModule& image) {
  std::lock_guard lock(mutex_);
  images_.try_emplace(image.digest, image);
  library_digests_[library] = image.digest;
  library_names_.erase(library);  // a handle the driver reuses names a new library
  ++stats_.modules_loaded;
  stats_.image_bytes += image.bytes;
}

void GraphRecorder::label_next_capture(std::string label) {
  std::lock_guard lock(mutex_);
  next_label_ = std::move(label);
}

void GraphRecorder::capture_began(std::uint64_t capture, std::uint64_t allocations) {
  std::lock_guard lock(mutex_);
  began_[capture] = Began{allocations, std::exchange(next_label_, std::string())};
}

void GraphRecorder::capture_ended(std::uint64_t capture, CUgraph graph, bool layout_active,
                                  const RecordedGraph* known) {
  RecordedGraph g;
  std::optional<Began> began;
  {
    std::lock_guard lock(mutex_);
    g.index = next_index_++;
    ++stats_.captured;
    if (!layout_active) outside_layout_ = true;
    if (auto it = began_.find(capture); it != began_.end()) {
      began = std::move(it->second);
      began_.erase(it);
    }
  }
  if (!began) return omit("the beginning of its capture was not seen");
  g.allocation_index = began->allocations;
  g.label = std::move(began->label);
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::string> incomplete;
  if (known != nullptr) {  // rebuilt from a record this run: its nodes are the record's
    g.nodes = known->nodes;
    g.edges = known->edges;
  } else {
    incomplete = walk(graph, g);
  }
  const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now() - start);
  {
    std::lock_guard lock(mutex_);
    stats_.walk_ns += static_cast<std::uint64_t>(took.count());
  }
  if (incomplete) return omit(*incomplete);
  std::lock_guard lock(mutex_);
  ++stats_.recorded;
  stats_.nodes += g.nodes.size();
  for (const RecordedNode& n : g.nodes) {
    if (n.kernel) stats_.param_bytes += n.kernel->param_bytes.size();
  }
  graphs_.push_back(std::move(g));
}

std::optional<std::string> GraphRecorder::walk(CUgraph graph, RecordedGraph& out) {
  std::vector<CUgraphNode> nodes;
  if (CUresult r = driver_.graph_nodes(graph, nodes); r != CUDA_SUCCESS) {
    return fmt::format("cuGraphGetNodes failed ({})", static_cast<int>(r));
  }
  if (nodes.size() > graphs::kMaxNodesPerGraph) {
    return fmt::format("more than {} nodes", graphs::kMaxNodesPerGraph);
  }
  std::unordered_map<CUgraphNode, std::uint32_t> index;
  out.nodes.reserve(nodes.size());
  for (CUgraphNode node : nodes) {
    index.emplace(node, static_cast<std::uint32_t>(out.nodes.size()));
    CUgraphNodeType type{};
    if (CUresult r = driver_.node_type(node, type); r != CUDA_SUCCESS) {
      return fmt::format("cuGraphNodeGetType failed ({})", static_cast<int>(r));
    }
    RecordedNode n;
    n.type = node_type_of(type);
    switch (n.type) {
      case NodeType::kernel: {
        KernelNode k;
        CUfunction f = nullptr;
        if (auto why = describe_kernel(node, k, f)) return why;
        if (auto why = kernel_attributes(node, f, k)) {
          // Recorded, but as a node no restore rebuilds (the whole graph then is not restored).
          n.type = NodeType::other;
          unrestorable(fmt::format("kernel {}: {}", k.kernel.name, *why));
          break;
        }
        n.kernel = std::move(k);
        break;
      }
      case NodeType::memset: {
        CUDA_MEMSET_NODE_PARAMS p{};
        if (CUresult r = driver_.memset_params(node, p); r != CUDA_SUCCESS) {
          return fmt::format("the driver gives no memset node parameters ({})",
                             static_cast<int>(r));
        }
        n.memset = graphs::MemsetNode{p.dst, p.pitch, p.value, p.elementSize, p.width, p.height};
        break;
      }
      case NodeType::memcpy: {
        CUDA_MEMCPY3D p{};
        if (CUresult r = driver_.memcpy_params(node, p); r != CUDA_SUCCESS) {
          return fmt::format("the driver gives no memcpy node parameters ({})",
                             static_cast<int>(r));
        }
        n.memcpy = one_dimensional(p);
        if (!n.memcpy) n.type = NodeType::other;  // no restore replays it
        break;
      }
      default:
        break;
    }
    out.nodes.push_back(std::move(n));
  }
  std::vector<std::pair<CUgraphNode, CUgraphNode>> edges;
  if (CUresult r = driver_.graph_edges(graph, edges); r != CUDA_SUCCESS) {
    return fmt::format("cuGraphGetEdges failed ({})", static_cast<int>(r));
  }
  // Edges of different ports between the same two nodes are one dependency here.
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
  for (auto [from, to] : edges) {
    auto f = index.find(from), t = index.find(to);
    if (f == index.end() || t == index.end()) return std::string("an edge names an unknown node");
    if (seen.emplace(f->second, t->second).second) out.edges.push_back({f->second, t->second});
  }
  if (out.edges.size() > graphs::kMaxEdgesPerGraph) {
    return fmt::format("more than {} edges", graphs::kMaxEdgesPerGraph);
  }
  return std::nullopt;
}

std::optional<std::string> GraphRecorder::describe_kernel(CUgraphNode node, KernelNode& out,
                                                          CUfunction& function) {
  CUDA_KERNEL_NODE_PARAMS p{};
  if (CUresult r = driver_.kernel_params(node, p); r != CUDA_SUCCESS) {
    return fmt::format("cuGraphKernelNodeGetParams failed ({})", static_cast<int>(r));
  }
  CUfunction f = p.func;
  if (f == nullptr && p.kern != nullptr) {
    if (CUresult r = driver_.kernel_function(p.kern, f); r != CUDA_SUCCESS) {
      return fmt::format("cuKernelGetFunction failed ({})", static_cast<int>(r));
    }
  }
  if (f == nullptr) return std::string("a kernel node names no function");
  function = f;
  if (auto why = kernel_identity(f, out.kernel)) return why;
  out.grid = {p.gridDimX, p.gridDimY, p.gridDimZ};
  out.block = {p.blockDimX, p.blockDimY, p.blockDimZ};
  out.shared_bytes = p.sharedMemBytes;

  // The parameter layout, as cuFuncGetParamInfo gives it: parameter i at its offset.
  std::size_t end = 0;
  for (std::size_t i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    const CUresult r = driver_.param_info(f, i, offset, size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
    if (r != CUDA_SUCCESS) {
      return fmt::format("kernel {}: cuFuncGetParamInfo failed ({})", out.kernel.name,
                         static_cast<int>(r));
    }
    if (i >= graphs::kMaxParamsPerKernel || size == 0 || offset < end ||
        offset + size > graphs::kMaxParamBytes) {
      return fmt::format("kernel {}: parameter {} at {} of {} bytes is not one a record can hold",
                         out.kernel.name, i, offset, size);
    }
    out.params.push_back({static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size)});
    end = offset + size;
  }
  out.param_bytes.assign(end, 0);
  if (p.kernelParams != nullptr) {
    for (std::size_t i = 0; i < out.params.size(); ++i) {
      if (p.kernelParams[i] == nullptr) {
        return fmt::format("kernel {}: parameter {} has no value", out.kernel.name, i);
      }
      std::memcpy(out.param_bytes.data() + out.params[i].offset, p.kernelParams[i],
                  out.params[i].size);
    }
  } else if (auto buffer = extra_buffer(p.extra)) {
    if (buffer->second < end) {
      return fmt::format("kernel {}: its parameter buffer holds {} of {} bytes", out.kernel.name,
                         buffer->second, end);
    }
    if (end != 0) std::memcpy(out.param_bytes.data(), buffer->first, end);
  } else if (!out.params.empty()) {
    return fmt::format("kernel {}: the node holds no parameter values", out.kernel.name);
  }

  return std::nullopt;
}

graphs::AttributeDefaults read_kernel_node_attributes(
    const std::function<CUresult(CUkernelNodeAttrID, CUkernelNodeAttrValue&)>& get) {
  graphs::AttributeDefaults out;
  auto read = [&](CUlaunchAttributeID id, CUkernelNodeAttrValue& v) {
    v = {};
    return get(id, v) == CUDA_SUCCESS;
  };
  CUkernelNodeAttrValue v{};
  if (read(CU_LAUNCH_ATTRIBUTE_COOPERATIVE, v)) out.cooperative = v.cooperative != 0 ? 1 : 0;
  if (read(CU_LAUNCH_ATTRIBUTE_PRIORITY, v)) out.priority = static_cast<std::uint32_t>(v.priority);
  if (read(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, v))
    out.cluster = {v.clusterDim.x, v.clusterDim.y, v.clusterDim.z};
  if (read(CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, v))
    out.cluster_scheduling = static_cast<std::uint32_t>(v.clusterSchedulingPolicyPreference);
  if (read(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, v))
    out.mem_sync_domain = static_cast<std::uint32_t>(v.memSyncDomain);
  if (read(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, v))
    out.mem_sync_domain_map = {v.memSyncDomainMap.default_, v.memSyncDomainMap.remote};
  if (read(CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, v))
    out.carveout = v.sharedMemCarveout;
  return out;
}

CUresult probe_kernel_node_defaults(const KernelNodeProbe& driver, CUfunction f,
                                    const std::vector<graphs::ParamSlot>& params,
                                    graphs::AttributeDefaults& out) {
  if (!driver.graph_create || !driver.add_kernel_node || !driver.get_attribute ||
      !driver.graph_destroy) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUgraph graph = nullptr;
  if (CUresult r = driver.graph_create(graph); r != CUDA_SUCCESS) return r;
  // Zero parameter values: the node is only asked about, never launched.
  std::size_t end = 0;
  for (const graphs::ParamSlot& slot : params)
    end = std::max<std::size_t>(end, slot.offset + slot.size);
  std::vector<std::uint8_t> bytes(end, 0);
  std::vector<void*> values;
  for (const graphs::ParamSlot& slot : params) values.push_back(bytes.data() + slot.offset);
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = f;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = values.empty() ? nullptr : values.data();
  CUgraphNode node = nullptr;
  CUresult r = driver.add_kernel_node(graph, p, node);
  if (r == CUDA_SUCCESS) {
    out = read_kernel_node_attributes([&](CUkernelNodeAttrID id, CUkernelNodeAttrValue& v) {
      return driver.get_attribute(node, id, v);
    });
  }
  driver.graph_destroy(graph);
  return r;
}

// The node attributes that change how the kernel runs (CUDA 13's CU_KERNEL_NODE_ATTRIBUTE_*),
// kept only where they differ from what this driver answers for a node of `f` that set none
// (defaults_for): a driver may answer a carveout of 0 or a cluster of [1, 1, 1] for "not set",
// and a record that took those for set values would have every restore set them and every
// plain launch fall back. A value a record cannot hold makes the node unrestorable (the caller
// records it as "other"), never silently dropped: a GEMM rebuilt without its cluster runs
// another configuration.
std::optional<std::string> GraphRecorder::kernel_attributes(CUgraphNode node, CUfunction f,
                                                            KernelNode& out) {
  auto get = [&](CUkernelNodeAttrID id, CUkernelNodeAttrValue& v) {
    return driver_.kernel_attribute(node, id, v);
  };
  const graphs::AttributeDefaults raw = read_kernel_node_attributes(get);
  const graphs::AttributeDefaults defaults = defaults_for(f, out.params);
  if (raw.cooperative != defaults.cooperative) out.cooperative = raw.cooperative;
  if (raw.priority != defaults.priority) out.priority = raw.priority;
  if (raw.cluster != defaults.cluster) {
    const bool none = raw.cluster == std::array<std::uint32_t, 3>{0, 0, 0};
    if (!none && (raw.cluster[0] == 0 || raw.cluster[1] == 0 || raw.cluster[2] == 0)) {
      return fmt::format("cluster dimension [{}, {}, {}]", raw.cluster[0], raw.cluster[1],
                         raw.cluster[2]);
    }
    out.cluster = raw.cluster;
  }
  if (raw.cluster_scheduling != defaults.cluster_scheduling) {
    if (raw.cluster_scheduling > graphs::kMaxClusterSchedulingPolicy) {
      return fmt::format("cluster scheduling policy {}", raw.cluster_scheduling);
    }
    out.cluster_scheduling = raw.cluster_scheduling;
  }
  if (raw.mem_sync_domain != defaults.mem_sync_domain) {
    if (raw.mem_sync_domain > graphs::kMaxMemSyncDomain)
      return fmt::format("memory sync domain {}", raw.mem_sync_domain);
    out.mem_sync_domain = raw.mem_sync_domain;
  }
  if (raw.mem_sync_domain_map != defaults.mem_sync_domain_map)
    out.mem_sync_domain_map = raw.mem_sync_domain_map;
  if (raw.carveout != defaults.carveout) {
    if (raw.carveout > 100 && raw.carveout != graphs::kCarveoutDefault) {
      return fmt::format("shared memory carveout {}", raw.carveout);
    }
    out.carveout = raw.carveout;
  }
  // Set, these are not in the record's model: the node is not rebuilt rather than rebuilt
  // wrong (an access policy window names addresses; a preferred cluster and device updates
  // change how the node launches).
  CUkernelNodeAttrValue v{};
  auto read = [&](CUlaunchAttributeID id) {
    v = {};
    return get(id, v) == CUDA_SUCCESS;
  };
  if (read(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) && v.accessPolicyWindow.num_bytes != 0) {
    return std::string("an access policy window");
  }
  if (read(CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION) &&
      (v.preferredClusterDim.x | v.preferredClusterDim.y | v.preferredClusterDim.z) != 0) {
    return std::string("a preferred cluster dimension");
  }
  if (read(CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE) &&
      v.deviceUpdatableKernelNode.deviceUpdatable != 0) {
    return std::string("device-updatable");
  }
  if (read(CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING) &&
      v.nvlinkUtilCentricScheduling != 0) {
    return std::string("NVLink-utilization-centric scheduling");
  }
  return std::nullopt;
}

graphs::AttributeDefaults GraphRecorder::defaults_for(
    CUfunction f, const std::vector<graphs::ParamSlot>& params) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = function_defaults_.find(f); it != function_defaults_.end()) return it->second;
  }
  // Off the lock: the probe is driver calls (a graph built and destroyed), once per function.
  graphs::AttributeDefaults probed;
  const CUresult r = driver_.attribute_defaults(f, params, probed);
  std::lock_guard lock(mutex_);
  if (r != CUDA_SUCCESS) {
    probed = {};  // CUDA's documented defaults
    if (!said_unprobed_ && notice_) {
      said_unprobed_ = true;
      notice_(fmt::format(
          "graph recorder: the driver's kernel attribute defaults could not be probed ({}); "
          "assuming CUDA's documented ones",
          static_cast<int>(r)));
    }
  }
  if (!record_defaults_) record_defaults_ = probed;
  return function_defaults_.try_emplace(f, probed).first->second;
}

std::optional<std::string> GraphRecorder::kernel_identity(CUfunction f, KernelIdentity& out) {
  if (CUresult r = driver_.function_name(f, out.name); r != CUDA_SUCCESS || out.name.empty()) {
    return fmt::format("cuFuncGetName failed ({})", static_cast<int>(r));
  }
  if (out.name.size() > graphs::kMaxNameBytes) {
    return fmt::format("a kernel name of {} bytes", out.name.size());
  }
  CUmodule m = nullptr;
  if (CUresult r = driver_.function_module(f, m); r != CUDA_SUCCESS) {
    return fmt::format("kernel {}: cuFuncGetModule failed ({})", out.name, static_cast<int>(r));
  }
  auto digest = module_digest(m);
  if (!digest) return fmt::format("kernel {}: its module was not seen loaded", out.name);
  out.module_digest = std::move(*digest);
  return std::nullopt;
}

std::optional<std::string> GraphRecorder::module_digest(CUmodule m) {
  std::vector<CUlibrary> libraries;
  {
    std::lock_guard lock(mutex_);
    if (auto it = module_digests_.find(m); it != module_digests_.end()) return it->second;
    for (const auto& [library, digest] : library_digests_) libraries.push_back(library);
  }
  if (libraries.empty()) return std::nullopt;
  // A library's module: the library whose kernels have exactly the module's function names.
  std::vector<CUfunction> functions;
  if (driver_.module_functions(m, functions) != CUDA_SUCCESS) return std::nullopt;
  std::vector<std::string> names;
  for (CUfunction f : functions) {
    std::string name;
    if (driver_.function_name(f, name) != CUDA_SUCCESS) return std::nullopt;
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  std::vector<std::pair<CUlibrary, std::string>> candidates;  // (library, digest)
  for (CUlibrary library : libraries) {
    std::optional<std::vector<std::string>> known;
    {
      std::lock_guard lock(mutex_);
      if (auto it = library_names_.find(library); it != library_names_.end()) known = it->second;
    }
    if (!known) {
      std::vector<CUkernel> kernels;
      if (driver_.library_kernels(library, kernels) != CUDA_SUCCESS) continue;  // unloaded
      known.emplace();
      for (CUkernel k : kernels) {
        std::string name;
        if (driver_.kernel_name(k, name) != CUDA_SUCCESS) break;
        known->push_back(std::move(name));
      }
      if (known->size() != kernels.size()) continue;
      std::sort(known->begin(), known->end());
      std::lock_guard lock(mutex_);
      library_names_[library] = *known;
    }
    if (*known != names) continue;
    std::lock_guard lock(mutex_);
    if (auto it = library_digests_.find(library); it != library_digests_.end()) {
      candidates.emplace_back(library, it->second);
    }
  }
  if (candidates.empty()) return std::nullopt;
  std::optional<std::string> found;
  const bool one_image = std::all_of(candidates.begin(), candidates.end(), [&](const auto& c) {
    return c.second == candidates.front().second;
  });
  if (one_image) {
    found = candidates.front().second;
  } else {
    // Different images with the same kernel names: the driver says which library it is.
    for (const auto& [library, digest] : candidates) {
      CUmodule lm = nullptr;
      if (driver_.library_module(library, lm) == CUDA_SUCCESS && lm == m) {
        found = digest;
        break;
      }
    }
  }
  if (found) {
    std::lock_guard lock(mutex_);
    module_digests_[m] = *found;
  }
  return found;
}

void GraphRecorder::unrestorable(const std::string& why) {
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    ++stats_.unrestorable_kernels;
    first = unrestorable_reasons_.insert(why).second;
  }
  if (first && notice_) {
    notice_(
        "a kernel node is recorded as not restorable (launch attribute the record cannot "
        "hold): " +
        why);
  }
}

void GraphRecorder::omit(const std::string& why) {
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    first = omissions_[why]++ == 0;
  }
  if (first && notice_) notice_("a captured CUDA graph is not recorded: " + why);
}

void GraphRecorder::adopt_defaults(const graphs::AttributeDefaults& defaults) {
  std::lock_guard lock(mutex_);
  if (!record_defaults_) record_defaults_ = defaults;
}

graphs::GraphRecord GraphRecorder::record() const {
  std::lock_guard lock(mutex_);
  graphs::GraphRecord out;
  out.attribute_defaults = record_defaults_.value_or(graphs::AttributeDefaults{});
  out.graphs = graphs_;
  std::sort(out.graphs.begin(), out.graphs.end(),
            [](const RecordedGraph& a, const RecordedGraph& b) { return a.index < b.index; });
  std::set<std::string> named;
  for (const RecordedGraph& g : out.graphs) {
    for (const RecordedNode& n : g.nodes) {
      if (n.kernel) named.insert(n.kernel->kernel.module_digest);
    }
  }
  for (const std::string& digest : named) {
    if (auto it = images_.find(digest); it != images_.end()) out.modules.push_back(it->second);
  }
  return out;
}

GraphRecorderStats GraphRecorder::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::vector<std::string> GraphRecorder::omissions() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [why, n] : omissions_) out.push_back(fmt::format("{} ({} graphs)", why, n));
  return out;
}

bool GraphRecorder::captured_outside_layout() const {
  std::lock_guard lock(mutex_);
  return outside_layout_;
}

void GraphRecorder::reset_after_fork() {
  new (&mutex_) std::mutex();
  images_.clear();
  module_digests_.clear();
  library_digests_.clear();
  library_names_.clear();
  began_.clear();
  next_label_.clear();
  graphs_.clear();
  next_index_ = 0;
  omissions_.clear();
  outside_layout_ = false;
  stats_ = {};
  function_defaults_.clear();  // the child's driver is asked again
  record_defaults_.reset();
  said_unprobed_ = false;
}

}  // namespace thaw::preload
