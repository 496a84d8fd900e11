// Errors of the GPU memory library: a VmmErrc to branch on and a message a user can act
// on. Driver failures keep the driver's own name for the code (CUDA_ERROR_OUT_OF_MEMORY)
// and the entry point that returned it.
#pragma once

#include <cuda.h>

#include <expected>
#include <string>
#include <string_view>

#include "common/cuda/error.hpp"

namespace thaw::vmm {

enum class VmmErrc {
  driver,            // a CUDA driver call failed (cuda_name says which code)
  invalid_argument,  // a size, offset or layout that cannot work
  pool_exhausted,    // more pages asked for than the pool has free
  unknown_slot,      // no slot with that id
  bad_state,         // the slot is not in a state that allows the operation
  source,            // the weight source could not supply bytes
  unknown_export,    // no pending export with that token
};

std::string_view to_string(VmmErrc code);

struct VmmError {
  VmmErrc code = VmmErrc::driver;
  std::string message;
  CUresult cuda = CUDA_SUCCESS;  // for VmmErrc::driver
  std::string cuda_name;         // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
};

template <typename T>
using VmmResult = std::expected<T, VmmError>;

// "<what>: cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
VmmError driver_error(const cuda::CudaError& error, std::string_view what);
std::unexpected<VmmError> vmm_failure(VmmErrc code, std::string message);

}  // namespace thaw::vmm
