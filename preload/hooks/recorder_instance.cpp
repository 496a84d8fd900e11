#include "preload/hooks/recorder_instance.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "preload/thawd_client/thawd_client.hpp"
#include "preload/hooks/injector_instance.hpp"
#include "preload/hooks/layout_instance.hpp"
#include "preload/interpose/real_driver.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

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

RecorderEnvironment environment() {
  RecorderEnvironment env;
  env.engine = engine_fingerprint();
  env.gpu_name = device_name;
  env.driver_version = driver_version;
  env.fetch = [](const LayoutIdentity& id) -> std::optional<std::string> {
    auto text = daemon_get_artifact("layout", id.to_json());
    if (text) debug("thawd has a layout record for {} on {}: comparing", id.model, id.gpu);
    return text;
  };
  env.store = [](const LayoutIdentity& id, const std::string& json) {
    return daemon_report_artifact("layout", id.to_json(), json);
  };
  env.stop_layout = [](const std::string& why) {
    if (DeterministicLayout* layout = layout_instance()) layout->stop(why);
  };
  env.notice = [](const std::string& message) { notice_once(message, message); };
  env.diverged = [] { counters().layout_divergences.fetch_add(1, std::memory_order_relaxed); };
  return env;
}

std::atomic<LayoutRecorder*> g_recorder{nullptr};
std::mutex g_recorder_mutex;

}  // namespace

std::string engine_fingerprint() {
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string out = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : "?";
  struct stat st {};
  if (::stat("/proc/self/exe", &st) == 0) {
    out += fmt::format(" {} {}.{:09}", st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  if (const char* id = std::getenv("THAW_ENGINE_ID"); id != nullptr && *id != '\0') {
    out += fmt::format(" {}", id);
  }
  return out;
}

LayoutRecorder* recorder_instance() {
  if (!config().deterministic || config().disabled) return nullptr;
  if (LayoutRecorder* r = g_recorder.load(std::memory_order_acquire)) return r;
  std::lock_guard lock(g_recorder_mutex);
  if (LayoutRecorder* r = g_recorder.load()) return r;
  auto* r = new LayoutRecorder(environment());  // lives for the whole process
  g_recorder.store(r, std::memory_order_release);
  return r;
}

void report_at_exit() {
  if (config().disabled) return;
  ReentryGuard guard;
  if (LayoutRecorder* r = g_recorder.load()) {
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
  finish_injection_at_exit();
  const ShimCounters& c = counters();
  daemon_report_counters({{"calls_intercepted", c.calls_intercepted.load()},
                          {"deterministic_allocations", c.deterministic_allocations.load()},
                          {"layout_divergences", c.layout_divergences.load()},
                          {"files_streamed", c.files_streamed.load()},
                          {"reads_waited", c.reads_waited.load()},
                          {"bytes_streamed", c.bytes_streamed.load()}});
}

void recorder_after_fork_in_child() {
  new (&g_recorder_mutex) std::mutex();
  if (LayoutRecorder* r = g_recorder.load()) r->reset_after_fork();
}

}  // namespace thaw::preload
