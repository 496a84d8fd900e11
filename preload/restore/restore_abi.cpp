// The restore ABI's C entry points (preload/include/thaw/thaw_restore.h), exported by
// libthaw-preload.so (exports.map: thaw_restore_*), and the environment that connects the
// runtime's KvRestore to the driver, the engine's memory and thawd. Thin: the decisions are
// KvRestore's (kv_restore.cpp) and KvRecord's (kv_record.cpp).
#include <cuda.h>

#include <algorithm>
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

int answer(KvStatus status, const std::string& message, char* why, size_t why_size) {
  if (why != nullptr && why_size > 0) {
    const std::size_t n = std::min(message.size(), why_size - 1);
    std::memcpy(why, message.data(), n);
    why[n] = '\0';
  }
  return static_cast<int>(status);
}

}  // namespace

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
using thaw::preload::config;
using thaw::preload::debug;
using thaw::preload::kKvStructV1;
using thaw::preload::runtime;
using thaw::preload::restore::KvSize;
using thaw::preload::restore::KvStatus;

extern "C" {

__attribute__((visibility("default"))) uint32_t thaw_restore_abi_version(void) {
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
  } else {
    debug("restore: no KV record to use ({}): {}", to_string(r.status), r.why);
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

}  // extern "C"
