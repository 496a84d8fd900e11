// The restore ABI's C entry points (preload/include/thaw/thaw_restore.h), exported by
// libthaw-preload.so (exports.map: thaw_restore_*), the environment that connects the
// runtime's KvRestore to the driver, the engine's memory and thawd, and the driver a graph
// restore builds with. Thin: the decisions are KvRestore's (kv_restore.cpp), KvRecord's
// (kv_record.cpp) and GraphRestore's (graph_restore.cpp).
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "preload/interpose/real_driver.hpp"
#include "preload/restore/shim_kv_environment.hpp"
#include "preload/runtime/shim_runtime.hpp"
#include "preload/shim/shim_state.hpp"
#include "preload/thawd_client/thawd_client.hpp"
#include "thaw/thaw_restore.h"

namespace thaw::preload {

namespace {

using restore::KvConditions;
using restore::KvIdentity;
using restore::KvStatus;

static_assert(static_cast<int>(KvStatus::ok) == THAW_RESTORE_OK);
static_assert(static_cast<int>(KvStatus::none) == THAW_RESTORE_NONE);
static_assert(static_cast<int>(KvStatus::stale) == THAW_RESTORE_STALE);
static_assert(static_cast<int>(KvStatus::corrupt) == THAW_RESTORE_CORRUPT);
static_assert(static_cast<int>(KvStatus::unavailable) == THAW_RESTORE_UNAVAILABLE);
static_assert(static_cast<int>(KvStatus::invalid_argument) == THAW_RESTORE_INVALID_ARGUMENT);
static_assert(static_cast<int>(KvStatus::no_lookup) == THAW_RESTORE_NO_LOOKUP);
static_assert(restore::KvRecord::kMaxKeyBytes == THAW_RESTORE_MAX_KEY_BYTES);

// The size of version 1's struct: what every caller has at least.
constexpr std::size_t kKvStructV1 = offsetof(thaw_restore_kv, block_bytes) + sizeof(uint64_t);

template <typename Fn>
Fn driver_fn(const char* name) {
  return reinterpret_cast<Fn>(driver_symbol(name));
}

// The device of the calling thread's current context, or why there is none.
std::expected<CUdevice, std::string> current_device() {
  auto get = driver_fn<CUresult (*)(CUdevice*)>("cuCtxGetDevice");
  if (get == nullptr) return std::unexpected("the engine has not reached a CUDA driver yet");
  CUdevice device = 0;
  if (get(&device) != CUDA_SUCCESS) {
    return std::unexpected("the calling thread has no current CUDA context");
  }
  return device;
}

proto::ArtifactIdentity artifact_identity(const KvIdentity& id) {
  return {id.engine, id.model, id.gpu, id.driver};
}

std::expected<KvIdentity, std::string> identity() {
  auto device = current_device();
  if (!device) return std::unexpected(device.error());
  auto name_fn = driver_fn<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetName");
  auto version_fn = driver_fn<CUresult (*)(int*)>("cuDriverGetVersion");
  char name[256] = {};
  int version = 0;
  if (name_fn == nullptr || name_fn(name, sizeof name, *device) != CUDA_SUCCESS ||
      version_fn == nullptr || version_fn(&version) != CUDA_SUCCESS) {
    return std::unexpected("the driver did not say the GPU's name or its version");
  }
  KvIdentity id;
  id.engine = runtime().engine_fingerprint();
  id.gpu = name;
  id.driver = std::to_string(version);
  return id;
}

std::expected<KvConditions, std::string> conditions() {
  auto device = current_device();
  if (!device) return std::unexpected(device.error());
  auto total_fn = driver_fn<CUresult (*)(size_t*, CUdevice)>("cuDeviceTotalMem_v2");
  KvConditions c;
  size_t device_total = 0;
  if (total_fn == nullptr || total_fn(&device_total, *device) != CUDA_SUCCESS) {
    return std::unexpected("the driver did not say the device's total memory");
  }
  c.device_total = device_total;
  // The shim's own cuMemGetInfo (memory_hooks.cpp), called as the engine would call it: the
  // answer is the one the engine sizes from (a budget from thawd included).
  size_t free = 0, total = 0;
  if (cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS) {
    return std::unexpected("cuMemGetInfo failed");
  }
  c.mem_total = total;
  c.mem_free = free;
  c.engine_bytes = runtime().engine_memory().bytes();
  return c;
}

template <typename Status>
int answer(Status status, const std::string& message, char* why, size_t why_size) {
  if (why != nullptr && why_size > 0) {
    const std::size_t n = std::min(message.size(), why_size - 1);
    std::memcpy(why, message.data(), n);
    why[n] = '\0';
  }
  return static_cast<int>(status);
}

using restore::GraphStatus;
static_assert(static_cast<int>(GraphStatus::ok) == THAW_RESTORE_OK);
static_assert(static_cast<int>(GraphStatus::none) == THAW_RESTORE_NONE);
static_assert(static_cast<int>(GraphStatus::stale) == THAW_RESTORE_STALE);
static_assert(static_cast<int>(GraphStatus::corrupt) == THAW_RESTORE_CORRUPT);
static_assert(static_cast<int>(GraphStatus::unavailable) == THAW_RESTORE_UNAVAILABLE);
static_assert(static_cast<int>(GraphStatus::invalid_argument) == THAW_RESTORE_INVALID_ARGUMENT);
static_assert(static_cast<int>(GraphStatus::mismatch) == THAW_RESTORE_MISMATCH);

// A label the ABI accepts: 1 to THAW_RESTORE_MAX_KEY_BYTES printable ASCII bytes; else why not.
std::optional<std::string> bad_label(const char* label) {
  if (label == nullptr) return "label must not be NULL";
  const std::size_t n = ::strnlen(label, THAW_RESTORE_MAX_KEY_BYTES + 1);
  if (n == 0 || n > THAW_RESTORE_MAX_KEY_BYTES) {
    return "a label is 1 to " + std::to_string(THAW_RESTORE_MAX_KEY_BYTES) + " bytes";
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (label[i] < 0x20 || label[i] > 0x7e) return "a label is printable ASCII";
  }
  return std::nullopt;
}

// The driver a restore builds graphs with: the driver library's own entry points, looked up by
// name (the shim hooks none of them).
class ShimGraphBuildDriver final : public restore::GraphBuildDriver {
 public:
  bool complete() const {
    return ctx_get_current_ && graph_create_ && graph_destroy_ && add_kernel_ && add_memset_ &&
           add_memcpy_ && add_empty_ && add_dependencies_ && instantiate_ &&
           (module_get_function_ || (library_get_kernel_ && kernel_get_function_));
  }
  CUresult current_context(CUcontext& out) override { return ctx_get_current_(&out); }
  CUresult module_function(CUmodule m, const char* name, CUfunction& out) override {
    if (module_get_function_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return module_get_function_(&out, m, name);
  }
  CUresult library_function(CUlibrary l, const char* name, CUfunction& out) override {
    if (library_get_kernel_ == nullptr || kernel_get_function_ == nullptr)
      return CUDA_ERROR_NOT_SUPPORTED;
    CUkernel k = nullptr;
    if (CUresult r = library_get_kernel_(&k, l, name); r != CUDA_SUCCESS) return r;
    return kernel_get_function_(&out, k);
  }
  CUresult graph_create(CUgraph& out) override { return graph_create_(&out, 0); }
  CUresult graph_destroy(CUgraph graph) override { return graph_destroy_(graph); }
  CUresult add_kernel_node(CUgraph graph, const CUDA_KERNEL_NODE_PARAMS& params,
                           CUgraphNode& out) override {
    return add_kernel_(&out, graph, nullptr, 0, &params);
  }
  CUresult set_kernel_attribute(CUgraphNode node, CUkernelNodeAttrID id,
                                const CUkernelNodeAttrValue& value) override {
    if (set_attribute_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return set_attribute_(node, id, &value);
  }
  CUresult attribute_defaults(CUfunction f, const std::vector<graphs::ParamSlot>& params,
                              graphs::AttributeDefaults& out) override {
    if (get_attribute_ == nullptr || graph_create_ == nullptr || add_kernel_ == nullptr ||
        graph_destroy_ == nullptr) {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    KernelNodeProbe probe;
    probe.graph_create = [this](CUgraph& g) { return graph_create_(&g, 0); };
    probe.add_kernel_node = [this](CUgraph g, const CUDA_KERNEL_NODE_PARAMS& p, CUgraphNode& n) {
      return add_kernel_(&n, g, nullptr, 0, &p);
    };
    probe.get_attribute = [this](CUgraphNode n, CUkernelNodeAttrID id, CUkernelNodeAttrValue& v) {
      return get_attribute_(n, id, &v);
    };
    probe.graph_destroy = [this](CUgraph g) { return graph_destroy_(g); };
    return probe_kernel_node_defaults(probe, f, params, out);
  }
  CUresult add_memset_node(CUgraph graph, const CUDA_MEMSET_NODE_PARAMS& params, CUcontext ctx,
                           CUgraphNode& out) override {
    return add_memset_(&out, graph, nullptr, 0, &params, ctx);
  }
  CUresult add_memcpy_node(CUgraph graph, const CUDA_MEMCPY3D& params, CUcontext ctx,
                           CUgraphNode& out) override {
    return add_memcpy_(&out, graph, nullptr, 0, &params, ctx);
  }
  CUresult add_empty_node(CUgraph graph, CUgraphNode& out) override {
    return add_empty_(&out, graph, nullptr, 0);
  }
  CUresult add_dependency(CUgraph graph, CUgraphNode from, CUgraphNode to) override {
    return add_dependencies_(graph, &from, &to, 1);
  }
  CUresult instantiate(CUgraph graph, unsigned long long flags, CUgraphExec& out) override {
    return instantiate_(&out, graph, flags);
  }
  CUresult exec_destroy(CUgraphExec exec) override {
    if (exec_destroy_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return exec_destroy_(exec);
  }
  CUresult set_current_context(CUcontext ctx) override {
    if (ctx_set_current_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return ctx_set_current_(ctx);
  }
  CUresult relax_capture_mode() override {
    if (exchange_capture_mode_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    return exchange_capture_mode_(&mode);
  }

  CUresult (*ctx_get_current_)(CUcontext*) =
      driver_fn<decltype(ctx_get_current_)>("cuCtxGetCurrent");
  CUresult (*module_get_function_)(CUfunction*, CUmodule, const char*) =
      driver_fn<decltype(module_get_function_)>("cuModuleGetFunction");
  CUresult (*library_get_kernel_)(CUkernel*, CUlibrary, const char*) =
      driver_fn<decltype(library_get_kernel_)>("cuLibraryGetKernel");
  CUresult (*kernel_get_function_)(CUfunction*, CUkernel) =
      driver_fn<decltype(kernel_get_function_)>("cuKernelGetFunction");
  CUresult (*graph_create_)(CUgraph*,
                            unsigned) = driver_fn<decltype(graph_create_)>("cuGraphCreate");
  CUresult (*graph_destroy_)(CUgraph) = driver_fn<decltype(graph_destroy_)>("cuGraphDestroy");
  // _v2 takes CUDA_KERNEL_NODE_PARAMS_v2; v1's struct is its prefix.
  CUresult (*add_kernel_)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                          const CUDA_KERNEL_NODE_PARAMS*) = kernel_node_adder();
  CUresult (*set_attribute_)(CUgraphNode, CUkernelNodeAttrID, const CUkernelNodeAttrValue*) =
      driver_fn<decltype(set_attribute_)>("cuGraphKernelNodeSetAttribute");
  CUresult (*get_attribute_)(CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue*) =
      driver_fn<decltype(get_attribute_)>("cuGraphKernelNodeGetAttribute");
  CUresult (*add_memset_)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                          const CUDA_MEMSET_NODE_PARAMS*,
                          CUcontext) = driver_fn<decltype(add_memset_)>("cuGraphAddMemsetNode");
  CUresult (*add_memcpy_)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_MEMCPY3D*,
                          CUcontext) = driver_fn<decltype(add_memcpy_)>("cuGraphAddMemcpyNode");
  CUresult (*add_empty_)(CUgraphNode*, CUgraph, const CUgraphNode*,
                         size_t) = driver_fn<decltype(add_empty_)>("cuGraphAddEmptyNode");
  CUresult (*add_dependencies_)(CUgraph, const CUgraphNode*, const CUgraphNode*, size_t) =
      driver_fn<decltype(add_dependencies_)>("cuGraphAddDependencies");
  CUresult (*instantiate_)(CUgraphExec*, CUgraph, unsigned long long) =
      driver_fn<decltype(instantiate_)>("cuGraphInstantiateWithFlags");
  CUresult (*exec_destroy_)(CUgraphExec) = driver_fn<decltype(exec_destroy_)>("cuGraphExecDestroy");
  CUresult (*ctx_set_current_)(CUcontext) =
      driver_fn<decltype(ctx_set_current_)>("cuCtxSetCurrent");
  CUresult (*exchange_capture_mode_)(CUstreamCaptureMode*) =
      driver_fn<decltype(exchange_capture_mode_)>("cuThreadExchangeStreamCaptureMode");

 private:
  using AddKernel = CUresult (*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                                 const CUDA_KERNEL_NODE_PARAMS*);
  static AddKernel kernel_node_adder() {
    if (auto v2 = driver_fn<AddKernel>("cuGraphAddKernelNode_v2")) return v2;
    return driver_fn<AddKernel>("cuGraphAddKernelNode");
  }
};

}  // namespace

std::unique_ptr<restore::GraphBuildDriver> shim_graph_build_driver() {
  auto d = std::make_unique<ShimGraphBuildDriver>();
  // The worker also needs to enter the engine's context and to destroy what nobody took.
  if (!d->complete() || d->ctx_set_current_ == nullptr || d->exec_destroy_ == nullptr) {
    return nullptr;
  }
  return d;
}

restore::KvRestoreEnvironment shim_kv_environment() {
  restore::KvRestoreEnvironment env;
  env.identity = identity;
  env.conditions = conditions;
  env.fetch = [](const KvIdentity& id) -> std::optional<std::string> {
    ReentryGuard guard;  // the thawd client's reads and closes are the shim's own
    return daemon_get_artifact(proto::ArtifactKind::kvcache, artifact_identity(id));
  };
  env.store = [](const KvIdentity& id, const std::string& document) {
    ReentryGuard guard;
    return daemon_report_artifact(proto::ArtifactKind::kvcache, artifact_identity(id), document);
  };
  return env;
}

}  // namespace thaw::preload

using thaw::preload::answer;
using thaw::preload::bad_label;
using thaw::preload::config;
using thaw::preload::debug;
using thaw::preload::kKvStructV1;
using thaw::preload::runtime;
using thaw::preload::ShimGraphBuildDriver;
using thaw::preload::restore::GraphStatus;
using thaw::preload::restore::KvSize;
using thaw::preload::restore::KvStatus;

extern "C" {

__attribute__((visibility("default"))) uint32_t thaw_restore_abi_version(void) {
  // The engine uses the ABI: the graphs it may ask for can be pre-built in the background.
  if (!config().disabled) runtime().graph_restore().engine_uses_abi();
  return THAW_RESTORE_ABI_VERSION;
}

__attribute__((visibility("default"))) int thaw_restore_kv_lookup(const char* config_key,
                                                                  thaw_restore_kv* out, char* why,
                                                                  size_t why_size) try {
  if (config_key == nullptr || out == nullptr) {
    return answer(KvStatus::invalid_argument, "config_key and out must not be NULL", why, why_size);
  }
  if (out->struct_size < kKvStructV1) {
    return answer(KvStatus::invalid_argument,
                  "out->struct_size is smaller than version 1's thaw_restore_kv", why, why_size);
  }
  if (config().disabled) {
    return answer(KvStatus::unavailable, "THAW_PRELOAD_DISABLE is set", why, why_size);
  }
  const auto r = runtime().kv_restore().lookup(config_key);
  if (r.status == KvStatus::ok) {
    out->kv_bytes = r.size.kv_bytes;
    out->num_blocks = r.size.num_blocks;
    out->block_bytes = r.size.block_bytes;
    debug("restore: KV record found: {} blocks of {} bytes", r.size.num_blocks, r.size.block_bytes);
    thaw::preload::counters().kv_restores.fetch_add(1);
  } else {
    debug("restore: no KV record to use ({}): {}", to_string(r.status), r.why);
    thaw::preload::counters().kv_restore_fallbacks.fetch_add(1);
    if (r.status == KvStatus::corrupt) thaw::preload::notice_once("kv-corrupt", r.why);
  }
  return answer(r.status, r.why, why, why_size);
} catch (const std::exception& e) {
  return answer(KvStatus::unavailable, std::string("internal error: ") + e.what(), why, why_size);
}

__attribute__((visibility("default"))) int thaw_restore_kv_record(const char* config_key,
                                                                  const thaw_restore_kv* kv,
                                                                  char* why, size_t why_size) try {
  if (config_key == nullptr || kv == nullptr) {
    return answer(KvStatus::invalid_argument, "config_key and kv must not be NULL", why, why_size);
  }
  if (kv->struct_size < kKvStructV1) {
    return answer(KvStatus::invalid_argument,
                  "kv->struct_size is smaller than version 1's thaw_restore_kv", why, why_size);
  }
  if (config().disabled) {
    return answer(KvStatus::unavailable, "THAW_PRELOAD_DISABLE is set", why, why_size);
  }
  const auto r = runtime().kv_restore().record(
      config_key, KvSize{kv->kv_bytes, kv->num_blocks, kv->block_bytes});
  if (r.status == KvStatus::ok) {
    debug("restore: stored the KV record: {} blocks of {} bytes", kv->num_blocks, kv->block_bytes);
  } else {
    debug("restore: KV record not stored ({}): {}", to_string(r.status), r.why);
  }
  return answer(r.status, r.why, why, why_size);
} catch (const std::exception& e) {
  return answer(KvStatus::unavailable, std::string("internal error: ") + e.what(), why, why_size);
}

__attribute__((visibility("default"))) int thaw_restore_graph(const char* label,
                                                              unsigned long long flags,
                                                              CUgraphExec* exec, char* why,
                                                              size_t why_size) try {
  if (auto bad = bad_label(label))
    return answer(GraphStatus::invalid_argument, *bad, why, why_size);
  if (exec == nullptr) {
    return answer(GraphStatus::invalid_argument, "exec must not be NULL", why, why_size);
  }
  if (config().disabled) {
    return answer(GraphStatus::unavailable, "THAW_PRELOAD_DISABLE is set", why, why_size);
  }
  thaw::preload::ReentryGuard guard;  // the shim's own driver calls and thawd reads
  ShimGraphBuildDriver driver;
  if (!driver.complete()) {
    return answer(GraphStatus::unavailable, "the driver lacks the graph calls a restore needs", why,
                  why_size);
  }
  const auto t0 = std::chrono::steady_clock::now();
  runtime().graph_restore().engine_uses_abi();
  const auto r = runtime().graph_restore().restore(driver, label, flags);
  if (r.status == GraphStatus::ok) {
    *exec = r.exec;
    debug("restore: graph \"{}\" rebuilt from thawd's record: {} nodes, {} edges, {:.3f} ms{}",
          label, r.nodes, r.edges,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
          r.prebuilt ? " (pre-built in the background)" : "");
    thaw::preload::counters().graphs_restored.fetch_add(1);
  } else {
    debug("restore: graph \"{}\" not restored ({}): {}", label, to_string(r.status), r.why);
    thaw::preload::counters().graph_restore_fallbacks.fetch_add(1);
    if (r.status == GraphStatus::corrupt) thaw::preload::notice_once("graphs-corrupt", r.why);
  }
  return answer(r.status, r.why, why, why_size);
} catch (const std::exception& e) {
  return answer(GraphStatus::unavailable, std::string("internal error: ") + e.what(), why,
                why_size);
}

__attribute__((visibility("default"))) int thaw_restore_graph_label(const char* label, char* why,
                                                                    size_t why_size) try {
  if (auto bad = bad_label(label))
    return answer(GraphStatus::invalid_argument, *bad, why, why_size);
  if (config().disabled) {
    return answer(GraphStatus::unavailable, "THAW_PRELOAD_DISABLE is set", why, why_size);
  }
  thaw::preload::ReentryGuard guard;
  thaw::preload::GraphRecorder* recorder = runtime().graph_recorder();
  if (recorder == nullptr) {
    return answer(GraphStatus::unavailable,
                  "this run's graphs are not recorded (no deterministic layout, or no driver yet)",
                  why, why_size);
  }
  recorder->label_next_capture(label);
  return answer(GraphStatus::ok, "", why, why_size);
} catch (const std::exception& e) {
  return answer(GraphStatus::unavailable, std::string("internal error: ") + e.what(), why,
                why_size);
}

}  // extern "C"
