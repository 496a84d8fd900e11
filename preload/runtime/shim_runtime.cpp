#include "preload/runtime/shim_runtime.hpp"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "common/graphs/graph_record.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/restore/shim_kv_environment.hpp"
#include "preload/restore/transparent_capture.hpp"
#include "preload/runtime/driver_graph_queries.hpp"
#include "preload/thawd_client/thawd_client.hpp"

namespace thaw::preload {

namespace {

template <typename Fn>
void resolve(Fn& out, const char* name) {
  out = reinterpret_cast<Fn>(driver_symbol(name));
}

std::optional<std::string> device_name(CUdevice device) {
  auto fn = reinterpret_cast<CUresult (*)(char*, int, CUdevice)>(driver_symbol("cuDeviceGetName"));
  char name[256] = {};
  if (fn == nullptr || fn(name, sizeof name, device) != CUDA_SUCCESS) return std::nullopt;
  return std::string(name);
}

std::optional<std::string> driver_version() {
  auto fn = reinterpret_cast<CUresult (*)(int*)>(driver_symbol("cuDriverGetVersion"));
  int v = 0;
  if (fn == nullptr || fn(&v) != CUDA_SUCCESS) return std::nullopt;
  return std::to_string(v);
}

// A layout record's identity is the key thawd stores it under: the same four strings.
proto::ArtifactIdentity artifact_identity(const LayoutIdentity& id) {
  return {id.engine, id.model, id.gpu, id.driver};
}

std::optional<InjectorDriver> injector_driver() {
  InjectorDriver d;
  resolve(d.mem_import, "cuMemImportFromShareableHandle");
  resolve(d.mem_address_reserve, "cuMemAddressReserve");
  resolve(d.mem_address_free, "cuMemAddressFree");
  resolve(d.mem_map, "cuMemMap");
  resolve(d.mem_unmap, "cuMemUnmap");
  resolve(d.mem_release, "cuMemRelease");
  resolve(d.mem_set_access, "cuMemSetAccess");
  resolve(d.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
  resolve(d.stream_synchronize, "cuStreamSynchronize");
  resolve(d.event_create, "cuEventCreate");
  resolve(d.event_record, "cuEventRecord");
  resolve(d.event_query, "cuEventQuery");
  resolve(d.event_synchronize, "cuEventSynchronize");
  resolve(d.event_destroy, "cuEventDestroy_v2");
  resolve(d.ctx_get_device, "cuCtxGetDevice");
  if (!d.complete()) return std::nullopt;
  return d;
}

void exiting() {
  runtime().on_exit();
}

void fork_prepare() {
  runtime().before_fork();
}
void fork_parent() {
  runtime().after_fork_in_parent();
}
void fork_child() {
  runtime().after_fork_in_child();
}

// The stream-capture table's own fork steps: its lock is a leaf (nothing is called under it,
// no other lock is waited for while holding it), so it needs no place in the runtime's lock
// order and is registered apart.
void captures_fork_prepare() {
  runtime().captures().before_fork();
}
void captures_fork_parent() {
  runtime().captures().after_fork_in_parent();
}
void captures_fork_child() {
  runtime().captures().after_fork_in_child();
}

}  // namespace

ShimRuntime& runtime() {
  static auto* r = new ShimRuntime();  // never destroyed: hooks run during exit
  return *r;
}

const ShimConfig& config() {
  return runtime().config();
}

ShimCounters& counters() {
  return runtime().counters();
}

ShimRuntime::ShimRuntime()
    : config_(read_shim_config()),
      layout_on_(config_.deterministic && !config_.disabled),
      kv_restore_(shim_kv_environment()),
      graph_restore_(graph_restore_environment()) {
  graph_restore_.enable_transparent(config_.transparent_graphs && !config_.disabled);
}

// Reads the layout and its recorder as built (never builds them: GraphRestore calls this under
// its lock, which is taken before theirs and never after build_mutex_).
restore::GraphRestoreEnvironment ShimRuntime::graph_restore_environment() {
  restore::GraphRestoreEnvironment env;
  env.identity = [this]() -> std::expected<graphs::GraphIdentity, std::string> {
    LayoutRecorder* r = recorder_.load(std::memory_order_acquire);
    if (r == nullptr) return std::unexpected("the deterministic layout is off");
    const LayoutIdentity id = r->snapshot().identity;
    if (!id.complete()) {
      return std::unexpected(
          "the run has no layout identity yet (no model file of a thaw cache opened, or no "
          "allocation made)");
    }
    return graphs::GraphIdentity{id.engine, id.model, id.gpu, id.driver};
  };
  env.not_following = [this]() -> std::optional<std::string> {
    LayoutRecorder* r = recorder_.load(std::memory_order_acquire);
    DeterministicLayout* l = layout_.load(std::memory_order_acquire);
    if (r == nullptr || l == nullptr) return "the deterministic layout is off";
    if (!l->active()) return "the layout stopped: " + l->stop_reason().value_or("?");
    if (r->diverged()) return "the allocation sequence left it";
    if (!r->record_fingerprint()) return "thawd held no layout record for this run";
    return std::nullopt;
  };
  env.allocations = [this]() -> std::uint64_t {
    DeterministicLayout* l = layout_.load(std::memory_order_acquire);
    return l != nullptr ? l->allocations() : 0;
  };
  env.in_region = [this](std::uint64_t address) {
    DeterministicLayout* l = layout_.load(std::memory_order_acquire);
    return l != nullptr && l->in_region(address);
  };
  env.live = [this](std::uint64_t address, std::uint64_t bytes) {
    DeterministicLayout* l = layout_.load(std::memory_order_acquire);
    if (l == nullptr) return false;
    const auto a = l->find(address);
    return a && address - a->base <= a->size && bytes <= a->size - (address - a->base);
  };
  env.fetch = [](const graphs::GraphIdentity& id) -> std::optional<std::string> {
    ReentryGuard guard;  // the thawd client's reads and closes are the shim's own
    return daemon_get_artifact(proto::ArtifactKind::graphs,
                               {id.engine, id.model, id.gpu, id.driver});
  };
  // The background worker (fetch and pre-build: graph_restore.hpp).
  env.worker_driver = shim_graph_build_driver;
  env.current_context = []() -> CUcontext {
    auto get = reinterpret_cast<CUresult (*)(CUcontext*)>(driver_symbol("cuCtxGetCurrent"));
    CUcontext ctx = nullptr;
    if (get == nullptr || get(&ctx) != CUDA_SUCCESS) return nullptr;
    return ctx;
  };
  env.worker_scope = [](const std::function<void()>& body) {
    ReentryGuard guard;  // every call the worker makes is the shim's own
    body();
  };
  env.log = [](const std::string& line) { debug("{}", line); };
  return env;
}

// --- Library loaded ---

void ShimRuntime::on_library_loaded() {
  ::pthread_atfork(&fork_prepare, &fork_parent, &fork_child);
  ::pthread_atfork(&captures_fork_prepare, &captures_fork_parent, &captures_fork_child);
  // Runs after the engine's own exit handlers (registered later): the run is over then.
  std::atexit(&exiting);
  if (config_.disabled) {
    notice_once("disabled", "THAW_PRELOAD_DISABLE is set: every call passes through");
  }
  debug("loaded (deterministic layout {}, VA base {:#x})", config_.deterministic ? "on" : "off",
        config_.va_base);
}

// --- Model file opened: record / attach / budget / inject ---

void ShimRuntime::on_model_file_opened(int fd, const ModelFilePath& where) {
  auto file =
      open_managed_file(where, daemon_readiness_fd(where.model, where.relative, where.full));
  if (file == nullptr) return;  // no usable readiness map: reads pass through
  // Record: the first model the engine opens names the layout record this run follows.
  if (LayoutRecorder* r = recorder()) r->model_opened(file->model);
  // ... and the KV record the engine may ask for (the restore ABI).
  kv_restore_.model_opened(file->model);
  // Attach: the first managed model opened, with THAW_PRELOAD_ATTACH=1.
  if (config_.attach && !attach_tried_.exchange(true)) attach_to_slot(file->model);
  if (!file->complete) counters_.files_streamed.fetch_add(1, std::memory_order_relaxed);
  files_.track(fd, std::move(file));
}

// The engine runs attached to a prewarmed slot of `model` (if thawd has one): cuMemGetInfo
// answers the budget thawd grants, and the weights come from the slot's pages through the
// injector, built once the driver is reached.
void ShimRuntime::attach_to_slot(const std::string& model) {
  auto slot = daemon_attach_slot(model);
  if (!slot) {
    notice_once("attach", "THAW_PRELOAD_ATTACH: no prewarmed slot of " + model +
                              " to attach to; cuMemGetInfo answers the driver's numbers");
    return;
  }
  engine_memory_.grant_budget(slot->budget_bytes);
  debug("attached to slot {} of {}: cuMemGetInfo answers a budget of {} bytes", slot->slot, model,
        slot->budget_bytes);
  debug("slot {} holds {} of its layout's bytes in a {} layout ({} pages)", slot->slot,
        slot->grant.resident_bytes, layout::to_string(slot->grant.layout_kind),
        slot->grant.pages.size());
  std::lock_guard lock(build_mutex_);
  if (pending_grant_ != nullptr || injector_.load() != nullptr) return;  // one slot per process
  pending_grant_ = std::make_unique<SlotGrant>(std::move(slot->grant));
  grant_pending_.store(true, std::memory_order_release);
}

// --- Driver reached ---

void ShimRuntime::on_driver_reached() {
  // An attached engine's injector becomes the layout's page backing here, before the
  // weights' allocations.
  (void)injector();
}

void ShimRuntime::lease_pool_memory_once() {
  if (lease_tried_.load(std::memory_order_acquire) || engine_memory_.budget()) return;
  if (!config_.lease) return;
  auto ctx_get_device = reinterpret_cast<CUresult (*)(CUdevice*)>(driver_symbol("cuCtxGetDevice"));
  auto get_uuid =
      reinterpret_cast<CUresult (*)(CUuuid*, CUdevice)>(driver_symbol("cuDeviceGetUuid_v2"));
  if (get_uuid == nullptr) {
    get_uuid = reinterpret_cast<CUresult (*)(CUuuid*, CUdevice)>(driver_symbol("cuDeviceGetUuid"));
  }
  CUdevice device = 0;
  CUuuid uuid{};
  if (ctx_get_device == nullptr || get_uuid == nullptr || ctx_get_device(&device) != CUDA_SUCCESS ||
      get_uuid(&uuid, device) != CUDA_SUCCESS) {
    return;  // no context yet: at the next call
  }
  if (lease_tried_.exchange(true)) return;
  std::string hex;
  for (char b : uuid.bytes) hex += fmt::format("{:02x}", static_cast<unsigned char>(b));
  // Nothing lent (another engine holds the pool's free pages): the driver's own answers.
  if (auto bytes = daemon_lease_memory(hex); bytes && *bytes != 0) {
    engine_memory_.grant_budget(*bytes);
    debug(
        "thawd lent this engine {} bytes of its pool (GPU {}); cuMemGetInfo answers from "
        "that budget",
        *bytes, hex);
  }
}

LayoutRecorder* ShimRuntime::recorder() {
  if (!layout_on_) return nullptr;
  if (LayoutRecorder* r = recorder_.load(std::memory_order_acquire)) return r;
  std::lock_guard lock(build_mutex_);
  return build_recorder_locked();
}

DeterministicLayout* ShimRuntime::layout() {
  if (!layout_on_) return nullptr;
  if (DeterministicLayout* l = layout_.load(std::memory_order_acquire)) return l;
  std::lock_guard lock(build_mutex_);
  return build_layout_locked();
}

WeightInjector* ShimRuntime::injector() {
  if (WeightInjector* i = injector_.load(std::memory_order_acquire)) return i;
  if (!grant_pending_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(build_mutex_);
  return build_injector_locked();
}

LayoutRecorder* ShimRuntime::build_recorder_locked() {
  if (!layout_on_) return nullptr;
  if (LayoutRecorder* r = recorder_.load()) return r;
  RecorderEnvironment env;
  env.engine = engine_fingerprint();
  env.gpu_name = device_name;
  env.driver_version = driver_version;
  env.fetch = [this](const LayoutIdentity& id) -> std::optional<std::string> {
    auto text = daemon_get_artifact(proto::ArtifactKind::layout, artifact_identity(id));
    if (text) debug("thawd has a layout record for {} on {}: comparing", id.model, id.gpu);
    // The identity is complete: the graphs record is fetched in the background now.
    graph_restore_.identity_known();
    return text;
  };
  env.store = [](const LayoutIdentity& id, const std::string& json) {
    return daemon_report_artifact(proto::ArtifactKind::layout, artifact_identity(id), json);
  };
  env.stop_layout = [this](const std::string& why) {
    if (DeterministicLayout* l = layout()) l->stop(why);
  };
  env.notice = [](const std::string& message) { notice_once(message, message); };
  env.diverged = [this] { counters_.layout_divergences.fetch_add(1, std::memory_order_relaxed); };
  auto* r = new LayoutRecorder(std::move(env));  // lives for the whole process
  recorder_.store(r, std::memory_order_release);
  return r;
}

DeterministicLayout* ShimRuntime::build_layout_locked() {
  if (!layout_on_) return nullptr;
  if (DeterministicLayout* l = layout_.load()) return l;
  LayoutDriver d;
  resolve(d.ctx_get_device, "cuCtxGetDevice");
  resolve(d.ctx_get_current, "cuCtxGetCurrent");
  resolve(d.device_total_mem, "cuDeviceTotalMem_v2");
  resolve(d.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
  resolve(d.mem_address_reserve, "cuMemAddressReserve");
  resolve(d.mem_address_free, "cuMemAddressFree");
  resolve(d.mem_create, "cuMemCreate");
  resolve(d.mem_release, "cuMemRelease");
  resolve(d.mem_map, "cuMemMap");
  resolve(d.mem_unmap, "cuMemUnmap");
  resolve(d.mem_set_access, "cuMemSetAccess");
  if (d.ctx_get_device == nullptr) return nullptr;  // no driver loaded yet
  // Lives for the whole process: hooks may run during exit, after static destructors.
  auto* l = new DeterministicLayout(d, config_.va_base, build_recorder_locked());
  layout_.store(l, std::memory_order_release);
  return l;
}

WeightInjector* ShimRuntime::build_injector_locked() {
  if (WeightInjector* i = injector_.load()) return i;
  if (pending_grant_ == nullptr) return nullptr;
  auto driver = injector_driver();
  if (!driver) return nullptr;  // the driver is not loaded yet: later
  InjectorEnvironment env;
  // Only looks: a recorder built now would have no record to follow anyway.
  env.record_fingerprint = [this]() -> std::optional<std::string> {
    LayoutRecorder* r = recorder_.load(std::memory_order_acquire);
    return r != nullptr ? r->record_fingerprint() : std::nullopt;
  };
  env.free_pages = [slot = pending_grant_->slot](const std::vector<std::uint64_t>& offsets) {
    daemon_free_pages(slot, offsets);
  };
  env.notice = [](const std::string& message) { notice_once("inject", message); };
  // Lives for the whole process: hooks may run during exit, after static destructors.
  auto* injector = new WeightInjector(*driver, std::move(env), std::move(*pending_grant_));
  pending_grant_.reset();
  if (injector->grant().layout_kind == layout::LayoutKind::engine) {
    if (DeterministicLayout* l = build_layout_locked()) l->set_backing(injector);
  }
  injector->start_import();
  injector_.store(injector, std::memory_order_release);
  return injector;
}

GraphRecorder* ShimRuntime::graph_recorder() {
  if (!layout_on_) return nullptr;
  if (GraphRecorder* g = graph_recorder_.load(std::memory_order_acquire)) return g;
  if (graph_recorder_tried_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(build_mutex_);
  return build_graph_recorder_locked();
}

GraphRecorder* ShimRuntime::build_graph_recorder_locked() {
  if (GraphRecorder* g = graph_recorder_.load()) return g;
  if (graph_recorder_tried_.load()) return nullptr;
  GraphDriver* driver = driver_graph_queries();
  if (driver == nullptr) return nullptr;  // no driver loaded yet: later
  graph_recorder_tried_.store(true, std::memory_order_release);
  // Each reason a graph is left out is said once, in the log.
  auto* g = new GraphRecorder(*driver, [](const std::string& message) { debug("{}", message); });
  graph_recorder_.store(g, std::memory_order_release);  // lives for the whole process
  return g;
}

// --- Exit ---

void ShimRuntime::on_exit() {
  if (config_.disabled) return;
  ReentryGuard guard;
  // The graph restore's worker stops first; what it pre-built and nobody took is destroyed.
  graph_restore_.shutdown();
  transparent_summary_at_exit();
  if (LayoutRecorder* r = recorder_.load()) {
    switch (r->finish()) {
      case LayoutRecorder::Outcome::stored:
        debug("stored this run's layout record in thawd");
        break;
      case LayoutRecorder::Outcome::store_failed:
        debug("this run's layout record was not stored (no thawd?)");
        break;
      default:
        break;
    }
  }
  store_graphs();
  finish_injection();
  proto::EngineCounters reported;
  reported.calls_intercepted = counters_.calls_intercepted.load();
  reported.deterministic_allocations = counters_.deterministic_allocations.load();
  reported.layout_divergences = counters_.layout_divergences.load();
  reported.files_streamed = counters_.files_streamed.load();
  reported.reads_waited = counters_.reads_waited.load();
  reported.bytes_streamed = counters_.bytes_streamed.load();
  reported.graph_records_stored = counters_.graph_records_stored.load();
  reported.graphs_restored = counters_.graphs_restored.load();
  reported.graph_restore_fallbacks = counters_.graph_restore_fallbacks.load();
  reported.kv_restores = counters_.kv_restores.load();
  reported.kv_restore_fallbacks = counters_.kv_restore_fallbacks.load();
  daemon_report_counters(reported);
}

// The graphs are stored under the layout record's identity, and only when their pointers
// mean something in a later run: the run followed (or recorded) a deterministic layout from
// start to end, and every graph was captured while the layout served allocations.
void ShimRuntime::store_graphs() {
  GraphRecorder* g = graph_recorder_.load();
  if (g == nullptr) return;
  const GraphRecorderStats s = g->stats();
  if (s.captured == 0) return;  // nothing new (restored graphs are in thawd's record already)
  for (const std::string& why : g->omissions()) debug("CUDA graphs left out: {}", why);
  graphs::GraphRecord record = g->record();
  // Graphs this run was handed by a restore and did not capture again stay in the record
  // (the pointers are the same: the run followed the layout they were recorded in).
  std::vector<graphs::RecordedGraph> kept = graph_restore_.restored_graphs();
  std::erase_if(kept, [&](const graphs::RecordedGraph& old) {
    return std::any_of(record.graphs.begin(), record.graphs.end(),
                       [&](const graphs::RecordedGraph& now) { return now.label == old.label; });
  });
  if (!kept.empty() && !record.graphs.empty()) {
    for (const graphs::RecordedModule& m : graph_restore_.restored_modules()) {
      if (std::none_of(record.modules.begin(), record.modules.end(),
                       [&](const graphs::RecordedModule& have) { return have.digest == m.digest; }))
        record.modules.push_back(m);
    }
    record.graphs.insert(record.graphs.begin(), kept.begin(), kept.end());
    std::uint32_t index = 0;  // capture order: the restored ones first
    for (graphs::RecordedGraph& graph : record.graphs) graph.index = index++;
    debug("CUDA graphs: {} restored this run kept in the record", kept.size());
  }
  LayoutRecorder* layout_recorder = recorder_.load();
  const LayoutIdentity id =
      layout_recorder != nullptr ? layout_recorder->snapshot().identity : LayoutIdentity{};
  std::string why_not;
  if (layout_recorder == nullptr || layout_recorder->diverged()) {
    why_not = "this run left its recorded layout, so their pointers mean nothing to a later run";
  } else if (g->captured_outside_layout()) {
    why_not = "some were captured while the deterministic layout was off";
  } else if (!id.complete()) {
    why_not = "the run has no layout identity (it opened no model file of a thaw cache)";
  } else if (record.graphs.empty()) {
    why_not = "none could be recorded completely";
  }
  if (!why_not.empty()) {
    debug("{} CUDA graphs captured, none stored: {}", s.captured, why_not);
    return;
  }
  record.identity = {id.engine, id.model, id.gpu, id.driver};
  const std::string text = graphs::graph_record_to_json(record);
  if (text.size() > graphs::kMaxGraphRecordBytes) {
    debug("CUDA graphs not stored: a record of {} bytes (at most {})", text.size(),
          graphs::kMaxGraphRecordBytes);
    return;
  }
  const bool stored =
      daemon_report_artifact(proto::ArtifactKind::graphs, artifact_identity(id), text);
  if (stored) counters_.graph_records_stored.fetch_add(record.graphs.size());
  debug(
      "CUDA graphs: {} captured, {} recorded ({} nodes, {} parameter bytes, {} module images); "
      "record of {} bytes {}; walking them took {:.3f} ms, digesting {} module images of {} "
      "bytes at load",
      s.captured, s.recorded, s.nodes, s.param_bytes, record.modules.size(), text.size(),
      stored ? "stored in thawd" : "not stored (no thawd?)", s.walk_ns / 1e6, s.modules_loaded,
      s.image_bytes);
}

// Outstanding copies finish, and the slot goes back to thawd — handed back prewarmed when
// its pages still hold the model (or were never used).
void ShimRuntime::finish_injection() {
  WeightInjector* injector = injector_.load();
  std::string unused_slot;
  {
    std::lock_guard lock(build_mutex_);
    if (injector == nullptr && pending_grant_ != nullptr) unused_slot = pending_grant_->slot;
  }
  if (injector != nullptr) {
    const bool handback = injector->finish();
    const InjectorStats s = injector->stats();
    debug(
        "slot {}: {} bytes injected, {} skipped (zero-copy {}), {} copied from files, {} pages "
        "mapped, {} freed; {}",
        injector->grant().slot, s.bytes_injected, s.bytes_skipped, s.zero_copy ? "on" : "off",
        s.bytes_copied, s.pages_mapped, s.pages_freed,
        handback ? "handing it back prewarmed" : "it cannot be handed back");
    daemon_release_slot(injector->grant().slot, handback);
  } else if (!unused_slot.empty()) {
    daemon_release_slot(unused_slot, true);
  }
}

std::string ShimRuntime::engine_fingerprint() const {
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string out = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : "?";
  struct stat st {};
  if (::stat("/proc/self/exe", &st) == 0) {
    out += fmt::format(" {} {}.{:09}", st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  if (!config_.engine_id.empty()) out += fmt::format(" {}", config_.engine_id);
  return out;
}

}  // namespace thaw::preload
