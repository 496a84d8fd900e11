// StartupMeter: how long this node's workers take to start, phase by phase, as running
// averages the agent reports to the coordinator (Alg. 1's t_cc, t_cu, t_l and Eq. 1's t_c come
// from them instead of fixed guesses; HydraServe §4.1 measures them on earlier runs).
//
//   process_start  launch → the engine process exists (fork/exec, a container's creation)
//   cuda_init      → the CUDA driver is initialised (context)
//   weights        → the stage's weights are on the GPU (fetch wait + H2D)
//   engine_init    → the engine says it is ready (KV cache, graphs)
//   ready          launch → its health endpoint answers (what a client waits for)
//
// Every start gives `ready` (the agent times it); the other phases need the engine's own
// timeline (the reference engine's --timeline JSON lines: process_start, driver_init,
// weights_loaded, ready), so an engine without one is counted in `samples` only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>

#include "common/proto/cluster/cluster.pb.h"

namespace thaw::daemon {

namespace v1 = thaw::cluster::v1;

struct StartupPhases {
  double ready_s = 0;
  std::optional<double> process_start_s, cuda_init_s, weights_s, engine_init_s;
};

// Reads an engine timeline (JSON lines with "event" and "t_ns", CLOCK_MONOTONIC) written by a
// worker launched at `launched_ns`; phases it does not find stay empty. `ready_s` is the
// caller's. A missing or unreadable file gives no phases.
StartupPhases phases_from_timeline(const std::filesystem::path& timeline, std::uint64_t launched_ns,
                                   double ready_s);

class StartupMeter {
 public:
  void record(const StartupPhases& phases);
  v1::StartupCosts averages() const;

 private:
  mutable std::mutex mutex_;
  v1::StartupCosts costs_;
};

// CLOCK_MONOTONIC now, in ns (the engines' timelines use the same clock).
std::uint64_t monotonic_ns();

}  // namespace thaw::daemon
