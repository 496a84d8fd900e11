// Shorthands for the api_*.cpp files that define the exported entry points.
#pragma once

#include <cstring>

#include "driver.hpp"

#define EMU_EXPORT extern "C"

#define EMU_REQUIRE_INIT()                                                 \
  do {                                                                     \
    if (!::emu::driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

namespace emu {

// The bits of an enum argument. Programs pass any int where cuda.h says enum (the
// driver is a C API): reading such a value as the enum type would be undefined, so
// every enum input is read through this.
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline bool valid_device(CUdevice d) {
  return d >= 0 && d < driver().device_count();
}

// cuMemAlloc's allocation and release, for other parts of the driver (module globals).
CUresult legacy_alloc(CUdeviceptr* dptr, std::uint64_t size, Context& ctx, Call& c);
void legacy_free(CUdeviceptr dptr);

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace emu
