// GpuMemory's private parts shared by its source files (gpu_memory*.cpp): the per-slot
// record and the page arithmetic. Not for use outside vmm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vmm/gpu_memory.hpp"

namespace thaw::vmm {

struct GpuMemory::Slot {
  std::unique_ptr<PrewarmSlot> va;
  std::string model;
  SlotState state = SlotState::empty;
  std::uint64_t weight_bytes = 0;
  std::uint64_t loaded_bytes = 0;
  int layers_resident = -1;
  std::uint64_t prewarmed_at = 0;
  // Active slot: KV pages are mapped from kv_first_page() up to kv_next.
  std::uint64_t kv_target_bytes = 0;
  std::size_t kv_next = 0;
  bool kv_done = true;
  std::optional<VmmError> kv_error;
  // Pages lent to this slot by the active one and not mapped yet.
  std::vector<PageId> lent_unused;
  // A prewarm is copying into the slot (also while it is active): its pages must stay.
  bool prewarming = false;
};

namespace detail {

// Largest prewarm copy, in pages: big enough that a copy's launch cost is noise, small
// enough that mapping the next copy's pages overlaps this copy's transfer.
inline constexpr std::uint64_t kCopyPages = 8;
// Staging buffers of kCopyPages pages: enough that the host fills one while others are in
// flight.
inline constexpr std::size_t kStagingBuffers = 4;

inline std::size_t pages_for(std::uint64_t bytes, std::size_t page) {
  // Not (bytes + page - 1) / page: a size near 2^64 (Activate's kv_bytes) would wrap to 0.
  return static_cast<std::size_t>(bytes / page + (bytes % page != 0 ? 1 : 0));
}

}  // namespace detail

}  // namespace thaw::vmm
