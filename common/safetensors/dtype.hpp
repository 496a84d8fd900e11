// The element types of the safetensors format, as huggingface/safetensors' Dtype enum spells
// them (safetensors/src/tensor.rs, 2026). Sizes are in bits: F4 is 4 bits and F6_E2M3 / F6_E3M2
// are 6, so a tensor of those must hold a whole number of bytes in total (see misaligned_size).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace thaw::safetensors {

enum class Dtype {
  BOOL,
  F4,       // MXFP4 (OCP microscaling), 4 bits
  F6_E2M3,  // MXFP6, 6 bits
  F6_E3M2,  // MXFP6, 6 bits
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,  // the MX scale type
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,  // complex, two F32 parts
  F64,
  I64,
  U64,
};

inline constexpr Dtype kAllDtypes[] = {
    Dtype::BOOL,        Dtype::F4,      Dtype::F6_E2M3, Dtype::F6_E3M2, Dtype::U8,
    Dtype::I8,          Dtype::F8_E5M2, Dtype::F8_E4M3, Dtype::F8_E8M0, Dtype::F8_E4M3FNUZ,
    Dtype::F8_E5M2FNUZ, Dtype::I16,     Dtype::U16,     Dtype::F16,     Dtype::BF16,
    Dtype::I32,         Dtype::U32,     Dtype::F32,     Dtype::C64,     Dtype::F64,
    Dtype::I64,         Dtype::U64,
};

// The header spelling: "F32", "F8_E4M3", ...
std::string_view dtype_name(Dtype dtype);
// Exact, case-sensitive match of the header spelling (the official parser is).
std::optional<Dtype> parse_dtype(std::string_view name);
// Bits per element: 4, 6, 8, 16, 32 or 64.
unsigned dtype_bits(Dtype dtype);

}  // namespace thaw::safetensors
