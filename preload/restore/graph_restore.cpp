#include "preload/restore/graph_restore.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace thaw::preload::restore {

using graphs::NodeType;
using graphs::RecordedGraph;
using graphs::RecordedNode;

std::string_view to_string(GraphStatus status) {
  switch (status) {
    case GraphStatus::ok:
      return "ok";
    case GraphStatus::none:
      return "none";
    case GraphStatus::stale:
      return "stale";
    case GraphStatus::corrupt:
      return "corrupt";
    case GraphStatus::unavailable:
      return "unavailable";
    case GraphStatus::invalid_argument:
      return "invalid argument";
    case GraphStatus::mismatch:
      return "mismatch";
  }
  return "invalid";
}

namespace {

GraphRestoreResult refuse(GraphStatus status, std::string why) {
  GraphRestoreResult r;
  r.status = status;
  r.why = std::move(why);
  return r;
}

std::string error(CUresult r) {
  return fmt::format("CUresult {}", static_cast<int>(r));
}

bool device_memory(std::uint32_t type) {
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED;
}

}  // namespace

void GraphRestore::module_loaded(CUmodule module, const std::string& digest) {
  std::lock_guard lock(mutex_);
  modules_[digest].push_back(module);
}

void GraphRestore::library_loaded(CUlibrary library, const std::string& digest) {
  std::lock_guard lock(mutex_);
  libraries_[digest].push_back(library);
}

const GraphRestore::Fetched& GraphRestore::fetch_locked() {
  if (fetched_) return *fetched_;
  Fetched f;
  auto id = env_.identity();
  if (!id) {
    // Not remembered: the identity is complete later (the model opened, the layout reserved).
    unavailable_ = Fetched{GraphStatus::unavailable, id.error(), std::nullopt};
    return unavailable_;
  }
  std::optional<std::string> text = env_.fetch(*id);
  if (!text) {
    f.status = GraphStatus::none;
    f.why = "thawd holds no graphs record for this engine, model, GPU and driver";
  } else if (auto record = graphs::graph_record_from_json(*text); !record) {
    f.status = GraphStatus::corrupt;
    f.why = "thawd's graphs record is refused: " + record.error();
  } else if (record->identity != *id) {
    f.status = GraphStatus::corrupt;
    f.why = "thawd's graphs record is another run's (its identity differs)";
  } else {
    f.status = GraphStatus::ok;
    f.record = std::move(*record);
  }
  fetched_ = std::move(f);
  return *fetched_;
}

std::expected<CUfunction, std::string> GraphRestore::function(GraphBuildDriver& driver,
                                                              const std::string& digest,
                                                              const std::string& name) {
  CUresult last = CUDA_ERROR_NOT_FOUND;
  // The latest load of the image first: an earlier handle may have been unloaded since.
  if (auto it = libraries_.find(digest); it != libraries_.end()) {
    for (auto l = it->second.rbegin(); l != it->second.rend(); ++l) {
      CUfunction f = nullptr;
      last = driver.library_function(*l, name.c_str(), f);
      if (last == CUDA_SUCCESS && f != nullptr) return f;
    }
  }
  if (auto it = modules_.find(digest); it != modules_.end()) {
    for (auto m = it->second.rbegin(); m != it->second.rend(); ++m) {
      CUfunction f = nullptr;
      last = driver.module_function(*m, name.c_str(), f);
      if (last == CUDA_SUCCESS && f != nullptr) return f;
    }
  }
  if (!libraries_.contains(digest) && !modules_.contains(digest)) {
    return std::unexpected(fmt::format(
        "kernel {} is of a module image (sha256 {}) this run has not loaded", name, digest));
  }
  return std::unexpected(fmt::format("kernel {} is not in the loaded module image (sha256 {}): {}",
                                     name, digest, error(last)));
}

std::optional<std::string> GraphRestore::check_pointers(const RecordedGraph& g) const {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const RecordedNode& n = g.nodes[i];
    if (n.kernel) {
      for (std::size_t p = 0; p < n.kernel->params.size(); ++p) {
        const graphs::ParamSlot& slot = n.kernel->params[p];
        if (slot.size != sizeof(std::uint64_t)) continue;
        std::uint64_t value = 0;
        std::memcpy(&value, n.kernel->param_bytes.data() + slot.offset, sizeof value);
        if (env_.in_region(value) && !env_.live(value, 1)) {
          return fmt::format(
              "node {} ({}): parameter {} is {:#x}, in the layout's region but in no allocation "
              "live now",
              i, n.kernel->kernel.name, p, value);
        }
      }
    } else if (n.memset) {
      const auto& m = *n.memset;
      const std::uint64_t rows = m.height == 0 ? 0 : m.height - 1;
      const std::uint64_t extent = rows * m.pitch + m.width * m.element_size;
      if (extent > 0 && !env_.live(m.dst, extent)) {
        return fmt::format("node {} (memset): {} bytes at {:#x} are not in one live allocation", i,
                           extent, m.dst);
      }
    } else if (n.memcpy) {
      const auto& c = *n.memcpy;
      if (!device_memory(c.src_memory_type) || !device_memory(c.dst_memory_type)) {
        return fmt::format("node {} (memcpy): copies host or array memory of the recording process",
                           i);
      }
      for (const std::uint64_t address : {c.src, c.dst}) {
        if (c.bytes > 0 && !env_.live(address, c.bytes)) {
          return fmt::format("node {} (memcpy): {} bytes at {:#x} are not in one live allocation",
                             i, c.bytes, address);
        }
      }
    } else if (n.type != NodeType::empty) {
      return fmt::format("node {} is a {} node, which a restore does not rebuild", i,
                         graphs::to_string(n.type));
    }
  }
  return std::nullopt;
}

GraphRestoreResult GraphRestore::build_locked(GraphBuildDriver& driver, std::string_view label,
                                              const RecordedGraph*& which) {
  const Fetched& fetched = fetch_locked();
  if (fetched.status != GraphStatus::ok) return refuse(fetched.status, fetched.why);
  const graphs::GraphRecord& record = *fetched.record;
  const auto found = std::find_if(record.graphs.rbegin(), record.graphs.rend(),
                                  [&](const RecordedGraph& g) { return g.label == label; });
  if (found == record.graphs.rend()) {
    return refuse(GraphStatus::none,
                  fmt::format("thawd's graphs record has no graph labelled \"{}\"", label));
  }
  const RecordedGraph& g = *found;
  which = &g;
  if (auto why = env_.not_following()) {
    return refuse(GraphStatus::stale, "this run does not follow its layout record: " + *why);
  }
  if (const std::uint64_t now = env_.allocations(); now != g.allocation_index) {
    return refuse(GraphStatus::mismatch,
                  fmt::format("the graph was captured after {} allocations, this run has made {}",
                              g.allocation_index, now));
  }
  if (auto why = check_pointers(g)) return refuse(GraphStatus::mismatch, *why);

  // Every kernel's function, before anything is built.
  std::vector<CUfunction> functions(g.nodes.size(), nullptr);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (!g.nodes[i].kernel) continue;
    const auto& k = g.nodes[i].kernel->kernel;
    auto f = function(driver, k.module_digest, k.name);
    if (!f) return refuse(GraphStatus::mismatch, fmt::format("node {}: {}", i, f.error()));
    functions[i] = *f;
  }
  CUcontext ctx = nullptr;
  if (CUresult r = driver.current_context(ctx); r != CUDA_SUCCESS || ctx == nullptr) {
    return refuse(GraphStatus::unavailable, "the calling thread has no current CUDA context");
  }

  CUgraph graph = nullptr;
  if (CUresult r = driver.graph_create(graph); r != CUDA_SUCCESS) {
    return refuse(GraphStatus::mismatch, "cuGraphCreate failed: " + error(r));
  }
  auto fail = [&](std::string why) {
    (void)driver.graph_destroy(graph);
    return refuse(GraphStatus::mismatch, std::move(why));
  };
  std::vector<CUgraphNode> nodes(g.nodes.size(), nullptr);
  std::vector<void*> params;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const RecordedNode& n = g.nodes[i];
    CUresult r = CUDA_SUCCESS;
    if (n.kernel) {
      const graphs::KernelNode& k = *n.kernel;
      // Each parameter points at its bytes in the record (the driver copies them).
      params.clear();
      for (const graphs::ParamSlot& slot : k.params) {
        params.push_back(const_cast<std::uint8_t*>(k.param_bytes.data()) + slot.offset);
      }
      CUDA_KERNEL_NODE_PARAMS p{};
      p.func = functions[i];
      p.gridDimX = k.grid[0];
      p.gridDimY = k.grid[1];
      p.gridDimZ = k.grid[2];
      p.blockDimX = k.block[0];
      p.blockDimY = k.block[1];
      p.blockDimZ = k.block[2];
      p.sharedMemBytes = k.shared_bytes;
      p.kernelParams = params.empty() ? nullptr : params.data();
      p.ctx = ctx;
      r = driver.add_kernel_node(graph, p, nodes[i]);
      if (r == CUDA_SUCCESS && k.cooperative != 0) {
        CUkernelNodeAttrValue v{};
        v.cooperative = static_cast<int>(k.cooperative);
        r = driver.set_kernel_attribute(nodes[i], CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE, v);
      }
      if (r == CUDA_SUCCESS && k.priority != 0) {
        CUkernelNodeAttrValue v{};
        v.priority = static_cast<int>(k.priority);
        r = driver.set_kernel_attribute(nodes[i], CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, v);
      }
    } else if (n.memset) {
      const graphs::MemsetNode& m = *n.memset;
      CUDA_MEMSET_NODE_PARAMS p{};
      p.dst = m.dst;
      p.pitch = m.pitch;
      p.value = m.value;
      p.elementSize = m.element_size;
      p.width = m.width;
      p.height = m.height;
      r = driver.add_memset_node(graph, p, ctx, nodes[i]);
    } else if (n.memcpy) {
      const graphs::MemcpyNode& c = *n.memcpy;
      CUDA_MEMCPY3D p{};
      p.srcMemoryType = static_cast<CUmemorytype>(c.src_memory_type);
      p.srcDevice = c.src;
      p.dstMemoryType = static_cast<CUmemorytype>(c.dst_memory_type);
      p.dstDevice = c.dst;
      p.WidthInBytes = c.bytes;
      p.Height = 1;
      p.Depth = 1;
      r = driver.add_memcpy_node(graph, p, ctx, nodes[i]);
    } else {
      r = driver.add_empty_node(graph, nodes[i]);
    }
    if (r != CUDA_SUCCESS) {
      return fail(fmt::format("node {} ({}) could not be added: {}", i,
                              n.kernel ? n.kernel->kernel.name : std::string(to_string(n.type)),
                              error(r)));
    }
  }
  for (const graphs::RecordedEdge& e : g.edges) {
    if (CUresult r = driver.add_dependency(graph, nodes[e.from], nodes[e.to]); r != CUDA_SUCCESS) {
      return fail(fmt::format("edge {} -> {} could not be added: {}", e.from, e.to, error(r)));
    }
  }
  GraphRestoreResult out;
  out.status = GraphStatus::ok;
  out.graph = graph;
  out.nodes = g.nodes.size();
  out.edges = g.edges.size();
  return out;
}

GraphRestoreResult GraphRestore::build(GraphBuildDriver& driver, std::string_view label) {
  std::lock_guard lock(mutex_);
  const RecordedGraph* which = nullptr;
  return build_locked(driver, label, which);
}

GraphRestoreResult GraphRestore::restore(GraphBuildDriver& driver, std::string_view label,
                                         unsigned long long flags) {
  std::lock_guard lock(mutex_);
  const RecordedGraph* which = nullptr;
  GraphRestoreResult r = build_locked(driver, label, which);
  if (r.status != GraphStatus::ok) return r;
  CUgraphExec exec = nullptr;
  const CUresult instantiated = driver.instantiate(r.graph, flags, exec);
  (void)driver.graph_destroy(r.graph);  // the executable graph is all that is kept
  r.graph = nullptr;
  if (instantiated != CUDA_SUCCESS || exec == nullptr) {
    return refuse(GraphStatus::mismatch,
                  "cuGraphInstantiateWithFlags refused the rebuilt graph: " + error(instantiated));
  }
  r.exec = exec;
  restored_labels_.emplace_back(label);
  return r;
}

std::vector<RecordedGraph> GraphRestore::restored_graphs() const {
  std::lock_guard lock(mutex_);
  std::vector<RecordedGraph> out;
  if (!fetched_ || !fetched_->record) return out;
  for (const RecordedGraph& g : fetched_->record->graphs) {
    // The last graph of each label handed out, once.
    const bool handed = std::find(restored_labels_.begin(), restored_labels_.end(), g.label) !=
                        restored_labels_.end();
    if (!handed) continue;
    std::erase_if(out, [&](const RecordedGraph& o) { return o.label == g.label; });
    out.push_back(g);
  }
  return out;
}

std::vector<graphs::RecordedModule> GraphRestore::restored_modules() const {
  const std::vector<RecordedGraph> graphs = restored_graphs();
  std::lock_guard lock(mutex_);
  std::vector<graphs::RecordedModule> out;
  if (!fetched_ || !fetched_->record) return out;
  std::set<std::string> named;
  for (const RecordedGraph& g : graphs) {
    for (const RecordedNode& n : g.nodes) {
      if (n.kernel) named.insert(n.kernel->kernel.module_digest);
    }
  }
  for (const auto& m : fetched_->record->modules) {
    if (named.contains(m.digest)) out.push_back(m);
  }
  return out;
}

void GraphRestore::reset_after_fork() {
  new (&mutex_) std::mutex();
  modules_.clear();
  libraries_.clear();
  fetched_.reset();
  restored_labels_.clear();
}

}  // namespace thaw::preload::restore
