#include "coordinator/policy/hydraserve_scaling.hpp"

#include <algorithm>

namespace thaw::coordinator::policy {

std::uint32_t new_workers_needed(const ScalingInput& in) {
  if (in.waiting <= in.starting_capacity || in.batch_per_worker == 0) return 0;
  const std::uint64_t demand =
      static_cast<std::uint64_t>(in.waiting - in.starting_capacity) + in.arrivals_last_window;
  return static_cast<std::uint32_t>((demand + in.batch_per_worker - 1) / in.batch_per_worker);
}

std::vector<std::uint32_t> pipeline_groups(std::uint32_t workers, std::uint32_t max_stages) {
  std::vector<std::uint32_t> groups;
  if (max_stages == 0) return groups;
  for (; workers > 0; workers -= std::min(workers, max_stages)) {
    groups.push_back(std::min(workers, max_stages));
  }
  return groups;
}

Consolidation consolidate(std::uint32_t stages, std::uint32_t wanted) {
  if (stages == 0) return {false, 0, 0};
  const std::uint32_t keep = std::clamp<std::uint32_t>(wanted, 1, stages);
  return {keep > 1, keep, stages - keep};
}

}  // namespace thaw::coordinator::policy
