// Names and messages of every CUresult in CUDA 13's cuda.h (cuGetErrorName/String).
#pragma once
#include <cuda.h>

#include <optional>
#include <string_view>

namespace emu {

struct ErrorText {
  const char* name;
  const char* message;
};

// nullopt for a value that is not a CUresult of cuda.h.
std::optional<ErrorText> error_text(int code);

// CUresult by its name ("CUDA_ERROR_OUT_OF_MEMORY") or decimal value ("2").
std::optional<CUresult> parse_error(std::string_view text);

}  // namespace emu
