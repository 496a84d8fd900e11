// Running a kernel's host twin, shared by launches and graph kernel nodes.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "thaw/emu_twin.h"

namespace emu {

struct KernelInfo;
struct Function;

// Checks grid/block/shared memory as the driver does.
CUresult check_geometry(const unsigned grid[3], const unsigned block[3], unsigned shared,
                        bool cooperative, const Function& f);
// Copies launch arguments (kernelParams or `extra` form) into a parameter bank.
CUresult pack_params(const KernelInfo& k, void** kernelParams, void** extra,
                     std::vector<std::uint8_t>& buffer);
// Runs a twin; a fault inside it (memory without access) becomes
// CUDA_ERROR_ILLEGAL_ADDRESS instead of killing the process.
CUresult run_twin(const ThawEmuTwin* twin, const ThawEmuLaunch& launch);
// Prints, once per kernel, that no twin was found.
void report_missing_twin(const char* name);

}  // namespace emu
