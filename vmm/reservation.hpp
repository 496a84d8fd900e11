// WarmServe's reservation target (§4.1, Eq. 1): how much of a grace-period instance's KV
// cache to keep when lending the rest to prewarm other models.
//
//   target = max(M * R / C, K + M / C)
//
// M: the instance's total KV cache bytes; R: requests still running; C: its maximum batch
// size; K: KV bytes in use now. The first term is the expected use of R requests at
// M / C each, the second the current use plus one more request's worth of headroom.
#pragma once

#include <algorithm>
#include <cstdint>

namespace thaw::vmm {

struct KvUsage {
  std::uint64_t capacity_bytes = 0;  // M
  std::uint64_t used_bytes = 0;      // K
  std::uint32_t running = 0;         // R
  std::uint32_t max_batch = 1;       // C (treated as 1 if 0)
};

// Bytes of KV to keep (never more than M).
constexpr std::uint64_t reservation_target(const KvUsage& u) {
  const std::uint64_t c = std::max<std::uint32_t>(u.max_batch, 1);
  // M * R / C without overflow for any realistic M (R <= C in practice, but not trusted).
  const std::uint64_t expected =
      u.capacity_bytes / c * u.running + u.capacity_bytes % c * u.running / c;
  const std::uint64_t headroom = u.used_bytes + u.capacity_bytes / c;
  return std::min(u.capacity_bytes, std::max(expected, headroom));
}

}  // namespace thaw::vmm
