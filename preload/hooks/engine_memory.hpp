// What the engine holds on the device through the hooked allocators (cuMemAlloc — the
// layout's allocations and the driver's alike — and cuMemCreate of device memory), and the
// budget thawd granted it when it runs attached to a prewarm slot: the two numbers
// cuMemGetInfo answers from then, and the limit every allocation is checked against.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

namespace thaw::preload {

// Counts `bytes` as the engine's if they fit the budget (always, when there is none);
// false: they do not, and nothing was counted — the caller answers OUT_OF_MEMORY without
// asking the driver.
bool charge_engine_bytes(std::uint64_t bytes);
// Takes back a charge whose allocation failed, or the part of one not used.
void refund_engine_bytes(std::uint64_t bytes);

// A successful allocation: `charged` bytes were charged for it, `bytes` is what it really
// holds (a layout allocation is rounded up to the granularity): the difference is counted
// too, even past the budget (the memory is taken already).
void note_engine_alloc(CUdeviceptr ptr, std::uint64_t charged, std::uint64_t bytes);
void note_engine_free(CUdeviceptr ptr);
void note_engine_create(CUmemGenericAllocationHandle handle, std::uint64_t charged,
                        std::uint64_t bytes);
void note_engine_release(CUmemGenericAllocationHandle handle);
std::uint64_t engine_bytes();

// thawd's grant: the engine may allocate `bytes` beyond what it held when it got its first
// grant (memory allocated before from the driver's own share stays its own). A later grant
// (attaching after a lease) replaces the earlier one.
void grant_memory_budget(std::uint64_t bytes);
std::optional<std::uint64_t> memory_budget();

}  // namespace thaw::preload
