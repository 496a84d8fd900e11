// The shim's diagnostics (log lines, "once" notices), its counters and the per-thread guard
// that keeps the shim from intercepting itself — what every part of the shim uses. The
// process-wide state behind them is the ShimRuntime's (preload/runtime/shim_runtime.hpp),
// and so is the configuration (preload/runtime/shim_config.hpp: every THAW_* variable).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "fmt/format.h"
#include "preload/runtime/shim_config.hpp"

namespace thaw::preload {

struct ShimCounters {
  std::atomic<std::uint64_t> calls_intercepted{0};
  std::atomic<std::uint64_t> proc_address_lookups{0};
  std::atomic<std::uint64_t> hooks_handed_out{0};
  std::atomic<std::uint64_t> deterministic_allocations{0};
  std::atomic<std::uint64_t> passthrough_allocations{0};
  std::atomic<std::uint64_t> layout_divergences{0};  // 0 or 1: the run left its record
  std::atomic<std::uint64_t> files_streamed{0};      // opened while still arriving
  std::atomic<std::uint64_t> reads_waited{0};        // reads and faults that had to wait
  std::atomic<std::uint64_t> mappings_streamed{0};   // private mappings served by userfaultfd
  std::atomic<std::uint64_t> bytes_streamed{0};      // installed into them
  // Restores (preload/restore): the engine-assisted ABI's answers, and graph records stored.
  std::atomic<std::uint64_t> graph_records_stored{0};  // graphs in the record stored at exit
  std::atomic<std::uint64_t> graphs_restored{0};
  std::atomic<std::uint64_t> graph_restore_fallbacks{0};  // asked, not restored (live capture)
  std::atomic<std::uint64_t> kv_restores{0};
  std::atomic<std::uint64_t> kv_restore_fallbacks{0};  // asked, not restored (profiling pass)
};
// The runtime's counters.
ShimCounters& counters();

// Diagnostics: written only with THAW_PRELOAD_LOG.
void log_line(std::string_view message);
template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (config().verbose) log_line(fmt::format(format, std::forward<Args>(args)...));
}
// Said once per process whatever THAW_PRELOAD_LOG is (e.g. "thawd not reachable: passing
// calls through"), keyed by `key`.
void notice_once(std::string_view key, std::string_view message);
// The runtime's fork steps hold the notices' lock across fork() (the child finds the set of
// notices said whole, and its lock free).
void notices_before_fork();
void notices_after_fork_in_parent();
void notices_after_fork_in_child();

// True while this thread runs shim code: a driver that calls back into exported cu*
// symbols or dlsym from inside a hook gets the real thing, never the hook again.
class ReentryGuard {
 public:
  ReentryGuard() : outermost_(depth_++ == 0) {}
  ~ReentryGuard() { --depth_; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  bool outermost() const { return outermost_; }
  static bool inside() { return depth_ > 0; }

 private:
  static thread_local int depth_;
  bool outermost_;
};

}  // namespace thaw::preload
