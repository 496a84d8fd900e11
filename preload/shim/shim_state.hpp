// The shim's process-wide state: its configuration (from the environment), its log, its
// counters, and the per-thread guard that keeps the shim from intercepting itself.
//
// This is the one place where thaw keeps global mutable state (ARCHITECTURE.md): an
// LD_PRELOAD library is entered through exported C symbols, from any thread, possibly
// before its own static constructors ran, so everything here is constant-initialised or
// built on first use.
//
// Environment:
//   THAW_PRELOAD_LOG=1|stderr|PATH   diagnostics (default: only "once" notices, to stderr)
//   THAW_PRELOAD_DISABLE=1           pass every call through untouched
//   THAW_PRELOAD_DETERMINISTIC=0     serve allocations from the driver as usual
//   THAW_PRELOAD_VA_BASE=0x...       base of the deterministic region (default 0x200000000000)
//   THAW_PRELOAD_ATTACH=1            run attached to a prewarmed slot of the model the engine
//                                    opens: cuMemGetInfo answers thawd's budget and the
//                                    weights come from the slot (preload/inject)
//   THAW_PRELOAD_LEASE=0             do not ask thawd for pool memory at the first
//                                    allocation (memory_hooks.cpp: lease_pool_memory_once)
//   THAW_PRELOAD_READ_TIMEOUT=S      how long a read of a streamed file waits (default 600)
//   THAW_ENGINE_ID=name              part of the engine's fingerprint (layout records)
//   THAW_SOCKET=path                 thawd's shim socket (default /run/thaw/thawd.sock)
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "fmt/format.h"

namespace thaw::preload {

struct ShimConfig {
  bool disabled = false;
  bool deterministic = true;
  bool verbose = false;
  std::uint64_t va_base = 0x200000000000ull;
  int log_fd = 2;
};

// Read once, on first use.
const ShimConfig& config();

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
};
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

// Called in a forked child (pthread_atfork): the parent's driver state does not carry
// over, so the shim's memory layout starts afresh there.
void register_fork_handler();

}  // namespace thaw::preload
