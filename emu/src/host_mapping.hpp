// What a host pointer given to a copy points into, for the call trace: the /proc/self/maps
// entry that holds it. Tests (and anyone debugging a shim) read from the trace where an
// engine's H2D copies come from, e.g. that weights are copied out of a private mapping of
// the checkpoint file, as safetensors + PyTorch do. Only looked up while tracing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace emu {

struct HostMapping {
  std::string path;          // the mapped file; "" for anonymous memory, "[heap]", "[stack]"...
  bool shared = false;       // MAP_SHARED (p/s column of /proc/self/maps)
  std::uint64_t offset = 0;  // file offset of the pointer itself (mapping offset + distance)
};

std::optional<HostMapping> find_host_mapping(std::uint64_t address);

}  // namespace emu
