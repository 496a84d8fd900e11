// Shorthands for the api_*.cpp files that define the exported entry points.
#pragma once

#include "driver.hpp"

#define EMU_EXPORT extern "C"

#define EMU_REQUIRE_INIT()                                        \
  do {                                                            \
    if (!::emu::driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

namespace emu {

inline bool valid_device(CUdevice d) { return d >= 0 && d < driver().device_count(); }

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace emu
