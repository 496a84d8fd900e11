// HydraServe's worker scaling (§6.1): how many new workers a model needs, how they are cut
// into pipeline groups, and what a group becomes once its cold start is done — one worker
// with the whole model (scale down, the default) or several standalone workers (scale up,
// for load spikes). Pure functions.
//
// The paper gives the shape, not the numbers (docs/design/coordinator-policy-math.md, A.5):
// the window length and batch size are the caller's (the authors' code uses 1 s and 8).
#pragma once

#include <cstdint>
#include <vector>

namespace thaw::coordinator::policy {

struct ScalingInput {
  std::uint32_t waiting = 0;               // requests queued for the model
  std::uint32_t starting_capacity = 0;     // requests workers already starting will take
  std::uint32_t arrivals_last_window = 0;  // the prediction of the next window's maximum
  std::uint32_t batch_per_worker = 8;
};

// Workers to start: none while the workers already starting can take the queue; otherwise
// enough for what they cannot take plus the next window's predicted arrivals.
std::uint32_t new_workers_needed(const ScalingInput& in);

// Pipeline groups of at most `max_stages` workers, each "no smaller than required": full
// groups first, then the remainder (30 → seven groups of 4 and one of 2).
std::vector<std::uint32_t> pipeline_groups(std::uint32_t workers, std::uint32_t max_stages = 4);

struct Consolidation {
  bool scale_up = false;         // several standalone workers rather than one
  std::uint32_t standalone = 1;  // workers that load the rest of the model and serve alone
  std::uint32_t terminated = 0;  // workers that exit after handing over their KV cache
};

// A group of `stages` workers, `wanted` of which the model still needs when the cold start
// ends: scale down to one (wanted ≤ 1), else up to min(wanted, stages).
Consolidation consolidate(std::uint32_t stages, std::uint32_t wanted);

}  // namespace thaw::coordinator::policy
