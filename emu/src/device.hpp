// What an emulated GPU reports about itself: a coherent Hopper (H100 SXM) attribute set.
#pragma once

#include <cuda.h>

#include <optional>

namespace emu {

// The value of `attr` for device `ordinal`; nullopt if `attr` is not a valid attribute.
// Valid attributes the emulator does not model report 0, as a real device does for
// a feature it lacks.
std::optional<int> device_attribute(int attr, int ordinal);

}  // namespace emu
