// Driver error-log callbacks (cuda.h, "Error Log Management", CUDA 12.9). PyTorch looks up
// cuLogsRegisterCallback/cuLogsUnregisterCallback (c10/cuda/driver_api.h, optional, 12090) to
// forward the driver's error messages. The emulator keeps no error log (its few diagnostics go to
// stderr), so a registered callback is never called; registering and unregistering follow the
// documented rules. They need no cuInit: a log is most useful for what fails before it.
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "api_common.hpp"

using namespace emu;

// The handle type is an opaque pointer to this (cuda.h leaves the struct incomplete).
struct CUlogsCallbackEntry_st {
  CUlogsCallback fn = nullptr;
  void* user = nullptr;
};

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<CUlogsCallbackEntry_st>> entries;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: callable during exit
  return *r;
}

}  // namespace

EMU_EXPORT CUresult cuLogsRegisterCallback(CUlogsCallback callbackFunc, void* userData,
                                           CUlogsCallbackHandle* callback_out) {
  return api("cuLogsRegisterCallback", [&](Call&) {
    if (callbackFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto entry = std::make_unique<CUlogsCallbackEntry_st>(callbackFunc, userData);
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    if (callback_out != nullptr) *callback_out = entry.get();  // "Optional"
    r.entries.push_back(std::move(entry));
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle callback) {
  return api("cuLogsUnregisterCallback", [&](Call&) {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = std::find_if(r.entries.begin(), r.entries.end(),
                           [&](const auto& e) { return e.get() == callback; });
    if (it == r.entries.end()) return CUDA_ERROR_INVALID_VALUE;
    r.entries.erase(it);
    return CUDA_SUCCESS;
  });
}
