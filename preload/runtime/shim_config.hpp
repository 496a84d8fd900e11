// The shim's configuration: every THAW_* environment variable libthaw-preload.so reads,
// parsed once (read_shim_config, called when the ShimRuntime is built) and never again —
// the environment an engine changes after it started does not change the shim.
//
//   THAW_PRELOAD_LOG=1|stderr|PATH   diagnostics (default: only "once" notices, to stderr)
//   THAW_PRELOAD_DISABLE=1           pass every call through untouched
//   THAW_PRELOAD_DETERMINISTIC=0     serve allocations from the driver as usual
//   THAW_PRELOAD_VA_BASE=0x...       base of the deterministic region (default 0x200000000000)
//   THAW_PRELOAD_ATTACH=1            run attached to a prewarmed slot of the model the engine
//                                    opens: cuMemGetInfo answers thawd's budget and the
//                                    weights come from the slot (preload/inject)
//   THAW_PRELOAD_LEASE=0             do not ask thawd for pool memory at the first
//                                    allocation (ShimRuntime::lease_pool_memory_once)
//   THAW_PRELOAD_TRANSPARENT_GRAPHS=0 capture CUDA graphs live even when a graphs record exists
//                                    (no transparent restore; the restore ABI still answers)
//   THAW_PRELOAD_READ_TIMEOUT=S      how long a read of a streamed file waits (default 600)
//   THAW_ENGINE_ID=name              part of the engine's fingerprint (layout records)
//   THAW_SOCKET=path                 thawd's shim socket (default /run/thaw/thawd.sock)
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace thaw::preload {

struct ShimConfig {
  bool disabled = false;
  bool deterministic = true;
  bool verbose = false;
  int log_fd = 2;
  std::uint64_t va_base = 0x200000000000ull;
  bool attach = false;
  bool lease = true;
  // Transparent CUDA-graph restore (preload/restore/transparent_capture.hpp), on when a graphs
  // record exists; THAW_PRELOAD_TRANSPARENT_GRAPHS=0 turns it off.
  bool transparent_graphs = true;
  std::chrono::nanoseconds read_timeout = std::chrono::seconds(600);
  std::string engine_id;  // empty: not set
  std::string socket_path = "/run/thaw/thawd.sock";
};

// From the process environment. Opens the THAW_PRELOAD_LOG file when it names one.
ShimConfig read_shim_config();

// The process's configuration (the ShimRuntime's), read on first use.
const ShimConfig& config();

}  // namespace thaw::preload
