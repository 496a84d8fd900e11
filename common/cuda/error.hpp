// Errors of the CUDA driver table.
//
// A CudaError carries the CUresult, the entry point that returned it and the name and
// description that the loaded driver itself gives the code (cuGetErrorName /
// cuGetErrorString), so a message reads the same on NVIDIA's driver and on the
// emulator. Failures to load the driver at all are CudaErrors too, so that every
// caller handles one error type.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>

namespace thaw::cuda {

struct CudaError {
  CUresult code = CUDA_SUCCESS;
  std::string call;     // entry point (base name) or loader step, e.g. "cuMemMap", "dlopen"
  std::string name;     // e.g. "CUDA_ERROR_INVALID_VALUE"
  std::string message;  // e.g. "invalid argument"

  // "cuMemMap: CUDA_ERROR_INVALID_VALUE (invalid argument)"
  std::string what() const;
};

// Fallback name for a code the driver could not name: "CUresult <n>".
std::string unnamed_result(CUresult code);

// Loader failures. They cannot ask the driver for names (there is none yet), so they
// use the codes' names as cuda.h spells them.

// dlopen() of `path` failed; `reason` is dlerror()'s text.
CudaError library_not_loaded(std::string_view path, std::string_view reason);
// The library loaded but exports no cuGetProcAddress_v2: not a CUDA 12+ driver.
CudaError proc_address_missing(std::string_view path);
// cuGetProcAddress_v2 did not give `symbol` at `cuda_version`; `detail` says why. `code`
// is the driver's own result when it returned one, else CUDA_ERROR_NOT_FOUND.
CudaError symbol_missing(std::string_view symbol, int cuda_version, std::string_view detail,
                         CUresult code = CUDA_ERROR_NOT_FOUND);

}  // namespace thaw::cuda
