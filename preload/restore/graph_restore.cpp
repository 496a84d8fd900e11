#include "preload/restore/graph_restore.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
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
  {
    std::lock_guard lock(mutex_);
    modules_[digest].push_back(module);
    ++loads_;
    if (env_.current_context) engine_ctx_ = env_.current_context();
  }
  poke();
}

void GraphRestore::library_loaded(CUlibrary library, const std::string& digest) {
  {
    std::lock_guard lock(mutex_);
    libraries_[digest].push_back(library);
    ++loads_;
    if (env_.current_context) engine_ctx_ = env_.current_context();
  }
  poke();
}

GraphRestore::Fetched GraphRestore::fetch_record(const graphs::GraphIdentity& id) const {
  Fetched f;
  std::optional<std::string> text = env_.fetch(id);
  if (!text) {
    f.status = GraphStatus::none;
    f.why = "thawd holds no graphs record for this engine, model, GPU and driver";
  } else if (auto record = graphs::graph_record_from_json(*text); !record) {
    f.status = GraphStatus::corrupt;
    f.why = "thawd's graphs record is refused: " + record.error();
  } else if (record->identity != id) {
    f.status = GraphStatus::corrupt;
    f.why = "thawd's graphs record is another run's (its identity differs)";
  } else {
    f.status = GraphStatus::ok;
    f.record = std::move(*record);
  }
  return f;
}

const GraphRestore::Fetched& GraphRestore::fetch_locked(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [&] { return !fetching_; });  // the worker's fetch, under way
  if (fetched_) return *fetched_;
  auto id = env_.identity();
  if (!id) {
    // Not remembered: the identity is complete later (the model opened, the layout reserved).
    unavailable_ = Fetched{GraphStatus::unavailable, id.error(), std::nullopt};
    return unavailable_;
  }
  fetched_ = fetch_record(*id);
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

std::expected<GraphRestore::Plan, GraphRestoreResult> GraphRestore::plan_locked(
    GraphBuildDriver& driver, std::string_view label) {
  if (!fetched_ || fetched_->status != GraphStatus::ok) {
    return std::unexpected(refuse(GraphStatus::unavailable, "no graphs record fetched"));
  }
  const graphs::GraphRecord& record = *fetched_->record;
  const auto found = std::find_if(record.graphs.rbegin(), record.graphs.rend(),
                                  [&](const RecordedGraph& g) { return g.label == label; });
  if (found == record.graphs.rend()) {
    return std::unexpected(
        refuse(GraphStatus::none,
               fmt::format("thawd's graphs record has no graph labelled \"{}\"", label)));
  }
  return plan_graph_locked(driver, *found);
}

std::expected<GraphRestore::Plan, GraphRestoreResult> GraphRestore::plan_graph_locked(
    GraphBuildDriver& driver, const RecordedGraph& g, const std::vector<CUfunction>* functions) {
  if (auto why = env_.not_following()) {
    return std::unexpected(
        refuse(GraphStatus::stale, "this run does not follow its layout record: " + *why));
  }
  if (const std::uint64_t now = env_.allocations(); now != g.allocation_index) {
    return std::unexpected(
        refuse(GraphStatus::mismatch,
               fmt::format("the graph was captured after {} allocations, this run has made {}",
                           g.allocation_index, now)));
  }
  if (auto why = check_pointers(g)) return std::unexpected(refuse(GraphStatus::mismatch, *why));
  // Every kernel's function, before anything is built.
  Plan plan;
  plan.graph = &g;
  if (functions != nullptr && functions->size() == g.nodes.size()) {
    plan.functions = *functions;
    if (auto why = check_attribute_defaults(driver, g, plan.functions))
      return std::unexpected(refuse(GraphStatus::mismatch, *why));
    return plan;
  }
  plan.functions.assign(g.nodes.size(), nullptr);
  // A graph names few distinct kernels many times: each is looked up once.
  std::map<std::pair<std::string_view, std::string_view>, CUfunction> seen;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (!g.nodes[i].kernel) continue;
    const auto& k = g.nodes[i].kernel->kernel;
    if (auto it = seen.find({k.module_digest, k.name}); it != seen.end()) {
      plan.functions[i] = it->second;
      continue;
    }
    auto f = function(driver, k.module_digest, k.name);
    if (!f) {
      return std::unexpected(
          refuse(GraphStatus::mismatch, fmt::format("node {}: {}", i, f.error())));
    }
    plan.functions[i] = *f;
    seen.emplace(std::pair<std::string_view, std::string_view>{k.module_digest, k.name}, *f);
  }
  if (auto why = check_attribute_defaults(driver, g, plan.functions))
    return std::unexpected(refuse(GraphStatus::mismatch, *why));
  return plan;
}

// The recorded attributes hold only values that differ from the recording driver's defaults;
// a driver that answers other defaults would run the nodes left "not set" differently (or the
// record's idea of "set" is not this driver's): a mismatch. The cluster is not compared: it is
// the one default that is the function's own (a kernel compiled with __cluster_dims__ answers
// its compile-time cluster), so two runs may probe it with different functions; a node keeps
// its cluster whenever it differs from its own function's default.
std::optional<std::string> GraphRestore::check_attribute_defaults(
    GraphBuildDriver& driver, const RecordedGraph& g, const std::vector<CUfunction>& functions) {
  if (!run_defaults_) {
    std::size_t first = g.nodes.size();
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      if (g.nodes[i].kernel && i < functions.size() && functions[i] != nullptr) {
        first = i;
        break;
      }
    }
    if (first == g.nodes.size()) return std::nullopt;  // no kernel: no attribute to set
    graphs::AttributeDefaults probed;
    const CUresult r =
        driver.attribute_defaults(functions[first], g.nodes[first].kernel->params, probed);
    if (r != CUDA_SUCCESS) {
      probed = {};  // as the recorder does when it cannot probe: CUDA's documented defaults
      say(
          fmt::format("graph restore: this driver's kernel attribute defaults could not be "
                      "probed ({}); assuming CUDA's documented ones",
                      error(r)));
    }
    run_defaults_ = probed;
  }
  graphs::AttributeDefaults recorded = fetched_->record->attribute_defaults;
  graphs::AttributeDefaults now = *run_defaults_;
  recorded.cluster = now.cluster = {0, 0, 0};  // see above
  if (recorded == now) return std::nullopt;
  auto show = [](const graphs::AttributeDefaults& d) {
    return fmt::format(
        "cooperative {}, priority {}, cluster scheduling {}, memory sync domain {}, map [{}, {}], "
        "carveout {}",
        d.cooperative, static_cast<int>(d.priority), d.cluster_scheduling, d.mem_sync_domain,
        d.mem_sync_domain_map[0], d.mem_sync_domain_map[1], static_cast<int>(d.carveout));
  };
  return fmt::format(
      "this run's driver answers other kernel attribute defaults than the recording run's (a "
      "different driver behaves differently; record the graphs again with it): recorded {}; "
      "now {}",
      show(recorded), show(now));
}

// The recorded launch attributes on a rebuilt kernel node (the engine-assisted and transparent
// restores both build here): those that differ from a new node's defaults. Without its cluster
// a CUTLASS 3 GEMM runs another configuration or fails to launch. The failure: which attribute,
// and the driver's answer.
static std::optional<std::pair<std::string_view, CUresult>> set_recorded_attributes(
    GraphBuildDriver& driver, CUgraphNode node, const graphs::KernelNode& k) {
  auto set = [&](CUlaunchAttributeID id, const CUkernelNodeAttrValue& v) {
    return driver.set_kernel_attribute(node, id, v);
  };
  using Refused = std::optional<std::pair<std::string_view, CUresult>>;
  CUkernelNodeAttrValue v{};
  if (k.cluster != std::array<std::uint32_t, 3>{0, 0, 0}) {
    v = {};
    v.clusterDim.x = k.cluster[0];
    v.clusterDim.y = k.cluster[1];
    v.clusterDim.z = k.cluster[2];
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, v); r != CUDA_SUCCESS)
      return Refused{{"cluster dimension", r}};
  }
  if (k.cluster_scheduling != 0) {
    v = {};
    v.clusterSchedulingPolicyPreference =
        static_cast<CUclusterSchedulingPolicy>(k.cluster_scheduling);
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, v);
        r != CUDA_SUCCESS)
      return Refused{{"cluster scheduling policy", r}};
  }
  if (k.cooperative != 0) {
    v = {};
    v.cooperative = static_cast<int>(k.cooperative);
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_COOPERATIVE, v); r != CUDA_SUCCESS)
      return Refused{{"cooperative", r}};
  }
  if (k.priority != 0) {
    v = {};
    v.priority = static_cast<int>(k.priority);
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_PRIORITY, v); r != CUDA_SUCCESS)
      return Refused{{"priority", r}};
  }
  if (k.mem_sync_domain != 0) {
    v = {};
    v.memSyncDomain = static_cast<CUlaunchMemSyncDomain>(k.mem_sync_domain);
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, v); r != CUDA_SUCCESS)
      return Refused{{"memory sync domain", r}};
  }
  if (k.mem_sync_domain_map != std::array<std::uint32_t, 2>{0, 0}) {
    v = {};
    v.memSyncDomainMap.default_ = static_cast<unsigned char>(k.mem_sync_domain_map[0]);
    v.memSyncDomainMap.remote = static_cast<unsigned char>(k.mem_sync_domain_map[1]);
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP, v); r != CUDA_SUCCESS)
      return Refused{{"memory sync domain map", r}};
  }
  if (k.carveout != graphs::kCarveoutDefault) {
    v = {};
    v.sharedMemCarveout = k.carveout;
    if (CUresult r = set(CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, v);
        r != CUDA_SUCCESS)
      return Refused{{"shared memory carveout", r}};
  }
  return std::nullopt;
}

GraphRestoreResult GraphRestore::build_planned(GraphBuildDriver& driver, const Plan& plan,
                                               CUcontext ctx) {
  const RecordedGraph& g = *plan.graph;
  const std::vector<CUfunction>& functions = plan.functions;
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
      if (r == CUDA_SUCCESS) {
        if (auto refused = set_recorded_attributes(driver, nodes[i], k)) {
          return fail(fmt::format("node {} ({}): the driver refused its {}: {}", i, k.kernel.name,
                                  refused->first, error(refused->second)));
        }
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

GraphRestoreResult GraphRestore::instantiate_planned(GraphBuildDriver& driver, const Plan& plan,
                                                     CUcontext ctx, unsigned long long flags) {
  GraphRestoreResult r = build_planned(driver, plan, ctx);
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
  return r;
}

GraphRestoreResult GraphRestore::build_locked(GraphBuildDriver& driver, std::string_view label) {
  auto plan = plan_locked(driver, label);
  if (!plan) return plan.error();
  CUcontext ctx = nullptr;
  if (CUresult r = driver.current_context(ctx); r != CUDA_SUCCESS || ctx == nullptr) {
    return refuse(GraphStatus::unavailable, "the calling thread has no current CUDA context");
  }
  return build_planned(driver, *plan, ctx);
}

GraphRestoreResult GraphRestore::build(GraphBuildDriver& driver, std::string_view label) {
  std::unique_lock lock(mutex_);
  const Fetched& fetched = fetch_locked(lock);
  if (fetched.status != GraphStatus::ok) return refuse(fetched.status, fetched.why);
  return build_locked(driver, label);
}

GraphRestoreResult GraphRestore::restore(GraphBuildDriver& driver, std::string_view label,
                                         unsigned long long flags) {
  std::unique_lock lock(mutex_);
  flags_guess_ = flags;  // the worker instantiates the next ones so
  asked_.emplace(label);
  const Fetched& fetched = fetch_locked(lock);
  if (fetched.status != GraphStatus::ok) return refuse(fetched.status, fetched.why);
  // A pre-build under way is waited for; one done is checked again, now.
  changed_.wait(lock, [&] {
    const auto it = prebuilt_.find(label);
    return it == prebuilt_.end() || !it->second.building;
  });
  std::optional<Prebuilt> ready;
  if (const auto it = prebuilt_.find(label); it != prebuilt_.end()) {
    ready = std::move(it->second);
    prebuilt_.erase(it);
  }
  auto plan = plan_locked(driver, label);
  CUcontext ctx = nullptr;
  const bool has_ctx = driver.current_context(ctx) == CUDA_SUCCESS && ctx != nullptr;
  if (ready) {
    std::string why;
    if (!plan) {
      why = plan.error().why;
    } else if (plan->graph != ready->plan.graph || plan->functions != ready->plan.functions) {
      why = "its kernels are not the functions they resolve to now";
    } else if (!has_ctx || ctx != ready->ctx) {
      why = "it was built in another context than the calling thread's";
    } else if (flags != ready->flags) {
      why = fmt::format("it was instantiated with flags {:#x}, the request's are {:#x}",
                        ready->flags, flags);
    }
    if (why.empty()) {
      restored_labels_.emplace_back(label);
      GraphRestoreResult r;
      r.status = GraphStatus::ok;
      r.exec = ready->exec;
      r.nodes = plan->graph->nodes.size();
      r.edges = plan->graph->edges.size();
      r.prebuilt = true;
      return r;
    }
    (void)driver.exec_destroy(ready->exec);
    say(fmt::format("restore: graph \"{}\" pre-built in the background discarded: {}", label, why));
  }
  if (!plan) return plan.error();
  if (!has_ctx) {
    return refuse(GraphStatus::unavailable, "the calling thread has no current CUDA context");
  }
  // Built without the lock: the worker pre-builds other graphs meanwhile.
  lock.unlock();
  GraphRestoreResult r = instantiate_planned(driver, *plan, ctx, flags);
  if (r.status == GraphStatus::ok) {
    lock.lock();
    restored_labels_.emplace_back(label);
  }
  return r;
}

// --- The worker ---

void GraphRestore::poke() {
  std::lock_guard w(wake_mutex_);
  poked_ = true;
  wake_.notify_one();
}

void GraphRestore::identity_known() {
  {
    std::lock_guard w(wake_mutex_);
    if (!worker_.joinable() && !stopping_ && env_.worker_driver) {
      worker_driver_ = env_.worker_driver();
      if (worker_driver_ != nullptr) worker_ = std::thread([this] { worker_main(); });
    }
  }
  poke();
}

void GraphRestore::engine_uses_abi() {
  {
    std::lock_guard lock(mutex_);
    if (uses_abi_) return;
    uses_abi_ = true;
  }
  poke();
}

void GraphRestore::shutdown() {
  std::thread worker;
  {
    std::lock_guard w(wake_mutex_);
    stopping_ = true;
    wake_.notify_one();
    worker = std::move(worker_);
  }
  if (worker.joinable()) worker.join();
  std::vector<std::pair<std::string, CUgraphExec>> unclaimed;
  {
    std::lock_guard lock(mutex_);
    for (auto& [label, p] : prebuilt_) {
      if (!p.building && p.exec != nullptr) unclaimed.emplace_back(label, p.exec);
    }
    prebuilt_.clear();
    for (auto& [position, p] : transparent_prebuilt_) {
      if (p.building || worker_driver_ == nullptr) continue;
      if (p.exec != nullptr) (void)worker_driver_->exec_destroy(p.exec);
      if (p.graph != nullptr) (void)worker_driver_->graph_destroy(p.graph);
    }
    transparent_prebuilt_.clear();
  }
  for (const auto& [label, exec] : unclaimed) {
    if (worker_driver_ != nullptr) (void)worker_driver_->exec_destroy(exec);
    say(
        fmt::format("restore: graph \"{}\" pre-built in the background, never asked for: "
                    "destroyed",
                    label));
  }
}

std::vector<std::string> GraphRestore::prebuilt_labels() const {
  std::lock_guard lock(mutex_);
  return prebuilt_labels_;
}

void GraphRestore::worker_main() {
  auto body = [this] {
    // Never restricted by a capture of another thread: its calls are no stream operations.
    (void)worker_driver_->relax_capture_mode();
    bool ahead = false;
    while (true) {
      {
        std::unique_lock w(wake_mutex_);
        if (!poked_ && !stopping_) {
          if (ahead) {
            wake_.wait_for(w, env_.poll);
          } else {
            wake_.wait(w, [&] { return poked_ || stopping_; });
          }
        }
        if (stopping_) return;
        poked_ = false;
      }
      fetch_in_background();
      ahead = prebuild();
      ahead = prebuild_transparent() || ahead;
    }
  };
  if (env_.worker_scope) {
    env_.worker_scope(body);
  } else {
    body();
  }
}

void GraphRestore::fetch_in_background() {
  graphs::GraphIdentity id;
  {
    std::lock_guard lock(mutex_);
    if (fetched_ || fetching_) return;
    auto got = env_.identity();
    if (!got) return;  // at the next poke
    id = std::move(*got);
    fetching_ = true;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Fetched f = fetch_record(id);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string line =
      f.status == GraphStatus::ok
          ? fmt::format("restore: graphs record fetched in the background: {} graphs, {:.3f} ms",
                        f.record->graphs.size(), ms)
          : fmt::format("restore: graphs record fetched in the background: {} ({})",
                        to_string(f.status), f.why);
  {
    std::lock_guard lock(mutex_);
    fetched_ = std::move(f);
    fetching_ = false;
  }
  changed_.notify_all();
  say(line);
}

bool GraphRestore::prebuild() {
  GraphBuildDriver& driver = *worker_driver_;
  bool ahead = false;
  std::unique_lock lock(mutex_);
  while (true) {
    if (!uses_abi_ || engine_ctx_ == nullptr || !fetched_ || fetched_->status != GraphStatus::ok) {
      return false;  // at the next poke
    }
    if (env_.not_following()) return false;  // for good
    const std::uint64_t now = env_.allocations();
    const std::vector<RecordedGraph>& graphs = fetched_->record->graphs;
    // The last captured first (the engine asks in capture order), the last of each label.
    std::set<std::string_view> seen;
    const RecordedGraph* next = nullptr;
    for (auto it = graphs.rbegin(); it != graphs.rend(); ++it) {
      const RecordedGraph& g = *it;
      if (g.label.empty() || !seen.insert(g.label).second) continue;
      if (asked_.contains(g.label) || prebuilt_.contains(g.label)) continue;
      if (g.allocation_index > now) {
        ahead = true;
        continue;
      }
      if (g.allocation_index < now) continue;  // passed: never again
      if (const auto t = tried_.find(g.label);
          t != tried_.end() && t->second == std::pair{now, loads_}) {
        continue;
      }
      next = &g;
      break;
    }
    if (next == nullptr) return ahead;
    const std::string label = next->label;
    // The engine's context, current on this thread: the kernels' functions are looked up in it.
    if (engine_ctx_ != worker_ctx_) {
      if (driver.set_current_context(engine_ctx_) != CUDA_SUCCESS) {
        const std::string line = "restore: nothing pre-built: cuCtxSetCurrent failed on the worker";
        lock.unlock();
        say(line);
        return false;
      }
      worker_ctx_ = engine_ctx_;
    }
    auto plan = plan_locked(driver, label);
    if (!plan) {
      tried_[label] = {now, loads_};
      const std::string line = fmt::format("restore: graph \"{}\" not pre-built ({}): {}", label,
                                           to_string(plan.error().status), plan.error().why);
      lock.unlock();
      say(line);
      lock.lock();
      continue;
    }
    const CUcontext ctx = engine_ctx_;
    const unsigned long long flags = flags_guess_;
    prebuilt_[label] = Prebuilt{};  // building: a request waits for it
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    const GraphRestoreResult r = instantiate_planned(driver, *plan, ctx, flags);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Said before a request can take it (the log shows it pre-built before it is handed out).
    say(r.status == GraphStatus::ok
            ? fmt::format("restore: graph \"{}\" pre-built in the background: {} nodes, {} "
                          "edges, {:.3f} ms",
                          label, r.nodes, r.edges, ms)
            : fmt::format("restore: graph \"{}\" not pre-built: {}", label, r.why));
    lock.lock();
    if (r.status == GraphStatus::ok) {
      Prebuilt& p = prebuilt_[label];
      p.building = false;
      p.exec = r.exec;
      p.plan = std::move(*plan);
      p.ctx = ctx;
      p.flags = flags;
      prebuilt_labels_.push_back(label);
    } else {
      prebuilt_.erase(label);
      tried_[label] = {now, loads_};
    }
    changed_.notify_all();
  }
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
  // The forking thread held both locks; the worker is not in the child.
  new (&mutex_) std::mutex();
  new (&wake_mutex_) std::mutex();
  new (&changed_) std::condition_variable();
  new (&wake_) std::condition_variable();
  new (&worker_) std::thread();  // the parent's thread handle, dropped
  worker_driver_.reset();
  poked_ = stopping_ = false;
  modules_.clear();
  libraries_.clear();
  fetched_.reset();
  fetching_ = false;
  restored_labels_.clear();
  run_defaults_.reset();  // the child's driver is probed again
  uses_abi_ = false;
  engine_ctx_ = worker_ctx_ = nullptr;
  loads_ = 0;
  prebuilt_.clear();  // the parent's executable graphs, not the child's
  asked_.clear();
  tried_.clear();
  prebuilt_labels_.clear();
  transparent_used_.clear();
  transparent_prebuilt_.clear();  // the parent's graphs, not the child's
  transparent_tried_.clear();
}

// --- Transparent restore ---

void GraphRestore::enable_transparent(bool on) {
  {
    std::lock_guard lock(mutex_);
    transparent_on_ = on;
  }
  poke();
}

std::optional<std::vector<std::uint32_t>> GraphRestore::chain_of(const RecordedGraph& g) {
  const std::size_t n = g.nodes.size();
  if (n == 0 || g.edges.size() != n - 1) return std::nullopt;
  std::vector<int> next(n, -1), in(n, 0);
  for (const graphs::RecordedEdge& e : g.edges) {
    if (next[e.from] != -1 || in[e.to] != 0) return std::nullopt;
    next[e.from] = static_cast<int>(e.to);
    in[e.to] = 1;
  }
  const auto root = std::find(in.begin(), in.end(), 0);
  if (root == in.end() || std::count(in.begin(), in.end(), 0) != 1) return std::nullopt;
  std::vector<std::uint32_t> chain;
  for (int at = static_cast<int>(root - in.begin()); at != -1; at = next[at]) {
    chain.push_back(static_cast<std::uint32_t>(at));
  }
  if (chain.size() != n) return std::nullopt;  // the codec refuses cycles; kept for safety
  return chain;
}

namespace {

// What the elision compares calls with: kernel launches, memsets (cuMemsetD8/16/32Async) and
// device-to-device copies (cuMemcpyDtoDAsync).
std::optional<std::string> not_elidable(const RecordedGraph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const RecordedNode& n = g.nodes[i];
    if (n.kernel) continue;
    if (n.memset && n.memset->height == 1) continue;
    if (n.memcpy && n.memcpy->src_memory_type == CU_MEMORYTYPE_DEVICE &&
        n.memcpy->dst_memory_type == CU_MEMORYTYPE_DEVICE) {
      continue;
    }
    return fmt::format(
        "node {} is a {} node the shim does not elide (kernel launches, 1-D memsets and "
        "device-to-device copies are)",
        i, graphs::to_string(n.type));
  }
  return std::nullopt;
}

}  // namespace

std::expected<GraphRestore::TransparentMatch, GraphRestore::TransparentRefusal>
GraphRestore::transparent_candidate(GraphBuildDriver& driver) {
  std::unique_lock lock(mutex_);
  if (!transparent_on_) return std::unexpected(TransparentRefusal{"off", "switched off", false});
  const Fetched& fetched = fetch_locked(lock);
  if (fetched.status != GraphStatus::ok) {
    return std::unexpected(TransparentRefusal{std::string(to_string(fetched.status)), fetched.why,
                                              fetched.status == GraphStatus::corrupt});
  }
  auto refuse_t = [](std::string reason, std::string why) {
    return std::unexpected(TransparentRefusal{std::move(reason), std::move(why), true});
  };
  const std::vector<RecordedGraph>& graphs = fetched_->record->graphs;
  const std::uint64_t now = env_.allocations();
  std::optional<TransparentRefusal> first_refusal;
  for (std::size_t pos = 0; pos < graphs.size(); ++pos) {
    const RecordedGraph& g = graphs[pos];
    if (transparent_used_.contains(pos) || g.allocation_index != now) continue;
    // A graph the engine was handed by the ABI is never captured.
    if (!g.label.empty() && std::find(restored_labels_.begin(), restored_labels_.end(), g.label) !=
                                restored_labels_.end()) {
      continue;
    }
    auto chain = chain_of(g);
    if (!chain) {
      if (!first_refusal) {
        first_refusal = TransparentRefusal{
            "not a chain",
            fmt::format("recorded graph {} is not a single chain (a multi-stream capture)",
                        g.index),
            true};
      }
      continue;
    }
    if (auto why = not_elidable(g)) {
      if (!first_refusal) {
        first_refusal = TransparentRefusal{
            "node kind", fmt::format("recorded graph {}: {}", g.index, *why), true};
      }
      continue;
    }
    transparent_used_.insert(pos);  // taken, whatever follows
    auto plan = plan_graph_locked(driver, g);
    if (!plan) {
      return refuse_t(std::string(to_string(plan.error().status)),
                      fmt::format("recorded graph {}: {}", g.index, plan.error().why));
    }
    TransparentMatch m;
    m.position = pos;
    m.graph = &g;
    m.defaults = fetched_->record->attribute_defaults;
    m.functions = std::move(plan->functions);
    m.chain = std::move(*chain);
    return m;
  }
  if (first_refusal) return std::unexpected(*first_refusal);
  if (auto why = env_.not_following()) {
    return refuse_t("stale", "this run does not follow its layout record: " + *why);
  }
  return refuse_t("allocation index",
                  fmt::format("no unused recorded graph was captured after {} allocations", now));
}

std::expected<GraphRestore::TransparentGraph, std::string> GraphRestore::transparent_take(
    GraphBuildDriver& driver, const TransparentMatch& match) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    const auto it = transparent_prebuilt_.find(match.position);
    return it == transparent_prebuilt_.end() || !it->second.building;
  });
  std::optional<TransparentPrebuilt> ready;
  if (auto it = transparent_prebuilt_.find(match.position); it != transparent_prebuilt_.end()) {
    ready = std::move(it->second);
    transparent_prebuilt_.erase(it);
  }
  auto discard = [&] {
    if (!ready) return;
    if (ready->exec != nullptr) (void)driver.exec_destroy(ready->exec);
    if (ready->graph != nullptr) (void)driver.graph_destroy(ready->graph);
    ready.reset();
  };
  // Every check again, now: the layout followed, the allocation index, the pointers live (the
  // functions are those the capture's launches used, matched one by one).
  auto plan = plan_graph_locked(driver, *match.graph, &match.functions);
  if (!plan) {
    discard();
    return std::unexpected(plan.error().why);
  }
  CUcontext ctx = nullptr;
  if (driver.current_context(ctx) != CUDA_SUCCESS || ctx == nullptr) {
    discard();
    return std::unexpected("the calling thread has no current CUDA context");
  }
  if (ready && (ready->ctx != ctx || ready->plan.functions != plan->functions)) discard();
  if (ready) {
    return TransparentGraph{ready->graph, ready->exec, ready->flags, true};
  }
  lock.unlock();
  GraphRestoreResult built = build_planned(driver, *plan, ctx);
  if (built.status != GraphStatus::ok) return std::unexpected(built.why);
  return TransparentGraph{built.graph, nullptr, 0, false};
}

void GraphRestore::transparent_drop(GraphBuildDriver& driver, std::size_t position) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    const auto it = transparent_prebuilt_.find(position);
    return it == transparent_prebuilt_.end() || !it->second.building;
  });
  const auto it = transparent_prebuilt_.find(position);
  if (it == transparent_prebuilt_.end()) return;
  TransparentPrebuilt p = std::move(it->second);
  transparent_prebuilt_.erase(it);
  lock.unlock();
  if (p.exec != nullptr) (void)driver.exec_destroy(p.exec);
  if (p.graph != nullptr) (void)driver.graph_destroy(p.graph);
}

void GraphRestore::transparent_flags_seen(unsigned long long flags) {
  std::lock_guard lock(mutex_);
  flags_guess_ = flags;
}

bool GraphRestore::prebuild_transparent() {
  GraphBuildDriver& driver = *worker_driver_;
  bool ahead = false;
  std::unique_lock lock(mutex_);
  while (true) {
    if (!transparent_on_ || uses_abi_ || engine_ctx_ == nullptr || !fetched_ ||
        fetched_->status != GraphStatus::ok) {
      return false;  // at the next poke
    }
    if (env_.not_following()) return false;  // for good
    const std::uint64_t now = env_.allocations();
    const std::vector<RecordedGraph>& graphs = fetched_->record->graphs;
    std::optional<std::size_t> next;
    for (std::size_t pos = 0; pos < graphs.size(); ++pos) {  // capture order
      const RecordedGraph& g = graphs[pos];
      if (transparent_used_.contains(pos) || transparent_prebuilt_.contains(pos)) continue;
      if (g.allocation_index > now) {
        ahead = true;
        continue;
      }
      if (g.allocation_index < now) continue;
      if (const auto t = transparent_tried_.find(pos);
          t != transparent_tried_.end() && t->second == std::pair{now, loads_}) {
        continue;
      }
      if (!chain_of(g) || not_elidable(g)) continue;
      next = pos;
      break;
    }
    if (!next) return ahead;
    const std::size_t pos = *next;
    if (engine_ctx_ != worker_ctx_) {
      if (driver.set_current_context(engine_ctx_) != CUDA_SUCCESS) return false;
      worker_ctx_ = engine_ctx_;
    }
    auto plan = plan_graph_locked(driver, graphs[pos]);
    if (!plan) {
      transparent_tried_[pos] = {now, loads_};
      continue;
    }
    const CUcontext ctx = engine_ctx_;
    const unsigned long long flags = flags_guess_;
    transparent_prebuilt_[pos] = TransparentPrebuilt{};  // building: a take waits for it
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    GraphRestoreResult r = build_planned(driver, *plan, ctx);
    CUgraphExec exec = nullptr;
    if (r.status == GraphStatus::ok && driver.instantiate(r.graph, flags, exec) != CUDA_SUCCESS) {
      (void)driver.graph_destroy(r.graph);
      r.status = GraphStatus::mismatch;
      r.why = "cuGraphInstantiateWithFlags refused the rebuilt graph";
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    say(r.status == GraphStatus::ok
            ? fmt::format("restore: recorded graph {} pre-built for a transparent restore: {} "
                          "nodes, {:.3f} ms",
                          graphs[pos].index, r.nodes, ms)
            : fmt::format("restore: recorded graph {} not pre-built: {}", graphs[pos].index,
                          r.why));
    lock.lock();
    if (r.status == GraphStatus::ok) {
      TransparentPrebuilt& p = transparent_prebuilt_[pos];
      p.building = false;
      p.graph = r.graph;
      p.exec = exec;
      p.plan = std::move(*plan);
      p.ctx = ctx;
      p.flags = flags;
    } else {
      transparent_prebuilt_.erase(pos);
      transparent_tried_[pos] = {now, loads_};
    }
    changed_.notify_all();
  }
}

}  // namespace thaw::preload::restore
