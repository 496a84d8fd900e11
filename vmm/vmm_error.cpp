#include "vmm/vmm_error.hpp"

#include <fmt/format.h>

namespace thaw::vmm {

std::string_view to_string(VmmErrc code) {
  switch (code) {
    case VmmErrc::driver:
      return "driver";
    case VmmErrc::invalid_argument:
      return "invalid_argument";
    case VmmErrc::pool_exhausted:
      return "pool_exhausted";
    case VmmErrc::unknown_slot:
      return "unknown_slot";
    case VmmErrc::bad_state:
      return "bad_state";
    case VmmErrc::source:
      return "source";
    case VmmErrc::unknown_export:
      return "unknown_export";
  }
  return "unknown";
}

VmmError driver_error(const cuda::CudaError& error, std::string_view what) {
  return VmmError{VmmErrc::driver, fmt::format("{}: {}", what, error.what()), error.code,
                  error.name};
}

std::unexpected<VmmError> vmm_failure(VmmErrc code, std::string message) {
  return std::unexpected(VmmError{code, std::move(message), CUDA_SUCCESS, {}});
}

}  // namespace thaw::vmm
