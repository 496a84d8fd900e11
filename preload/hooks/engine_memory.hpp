// What the engine holds on the device through the hooked allocator (layout and driver
// allocations alike), and the budget thawd granted it when it runs attached to a prewarm
// slot — the two numbers cuMemGetInfo answers from then.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>

namespace thaw::preload {

void note_engine_alloc(CUdeviceptr ptr, std::uint64_t bytes);
void note_engine_free(CUdeviceptr ptr);
std::uint64_t engine_bytes();

void set_memory_budget(std::uint64_t bytes);
std::optional<std::uint64_t> memory_budget();

}  // namespace thaw::preload
