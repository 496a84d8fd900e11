#include "common/cuda/error.hpp"

#include <fmt/format.h>

namespace thaw::cuda {
namespace {

// Names of the few codes the loader itself reports (before any driver can name them).
std::string loader_code_name(CUresult code) {
  switch (code) {
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED:
      return "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    default:
      return unnamed_result(code);
  }
}

constexpr std::string_view kPointAtDriver =
    "install NVIDIA's driver, or set THAW_LIBCUDA to the driver library to use: thaw's "
    "emulator is /usr/lib/x86_64-linux-gnu/thaw-emulator/libcuda.so.1 from the thaw-emulator "
    "package (its thawd drop-in: /usr/share/thaw-emulator/thawd-emulator.conf), "
    "build/default/emu/libcuda.so.1 in a source build";

}  // namespace

std::string CudaError::what() const {
  if (message.empty()) return fmt::format("{}: {}", call, name);
  return fmt::format("{}: {} ({})", call, name, message);
}

std::string unnamed_result(CUresult code) {
  return fmt::format("CUresult {}", static_cast<int>(code));
}

CudaError library_not_loaded(std::string_view path, std::string_view reason) {
  return CudaError{
      .code = CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
      .call = "dlopen",
      .name = loader_code_name(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED),
      .message = fmt::format("cannot load the CUDA driver from \"{}\": {}; {}", path, reason,
                             kPointAtDriver),
  };
}

CudaError proc_address_missing(std::string_view path) {
  return CudaError{
      .code = CUDA_ERROR_NOT_FOUND,
      .call = "dlsym",
      .name = loader_code_name(CUDA_ERROR_NOT_FOUND),
      .message =
          fmt::format("\"{}\" exports no cuGetProcAddress_v2, so it is not a CUDA 12+ driver; {}",
                      path, kPointAtDriver),
  };
}

CudaError symbol_missing(std::string_view symbol, int cuda_version, std::string_view detail,
                         CUresult code) {
  return CudaError{
      .code = code,
      .call = "cuGetProcAddress",
      .name = loader_code_name(code),
      .message = fmt::format("{} (CUDA version {}): {}", symbol, cuda_version, detail),
  };
}

}  // namespace thaw::cuda
