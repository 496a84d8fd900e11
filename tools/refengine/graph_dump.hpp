// --dump-graphs: the canonical description of every decode graph the engine will launch, read
// from thaw's CUDA driver emulator (thawEmuDescribeGraphExec, emu/include/thaw/emu_inspect.h),
// for node-by-node comparisons of a live capture with a restore. The driver API cannot list an
// executable graph's nodes, so this works only on the emulator.
#pragma once

#include <cuda.h>

#include <expected>
#include <filesystem>
#include <map>
#include <string>

#include "driver.hpp"

namespace refengine {

// Writes {"<size>": <description>, ...} to `file` (every size of `graphs`, ascending). The
// error says why not: the driver is not the emulator, a description failed, the write failed.
std::expected<void, std::string> dump_graphs(const Driver& driver,
                                             const std::map<int, CUgraphExec>& graphs,
                                             const std::filesystem::path& file);

}  // namespace refengine
