#include "common/safetensors/dtype.hpp"

namespace thaw::safetensors {

std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::BOOL:
      return "BOOL";
    case Dtype::F4:
      return "F4";
    case Dtype::F6_E2M3:
      return "F6_E2M3";
    case Dtype::F6_E3M2:
      return "F6_E3M2";
    case Dtype::U8:
      return "U8";
    case Dtype::I8:
      return "I8";
    case Dtype::F8_E5M2:
      return "F8_E5M2";
    case Dtype::F8_E4M3:
      return "F8_E4M3";
    case Dtype::F8_E8M0:
      return "F8_E8M0";
    case Dtype::F8_E4M3FNUZ:
      return "F8_E4M3FNUZ";
    case Dtype::F8_E5M2FNUZ:
      return "F8_E5M2FNUZ";
    case Dtype::I16:
      return "I16";
    case Dtype::U16:
      return "U16";
    case Dtype::F16:
      return "F16";
    case Dtype::BF16:
      return "BF16";
    case Dtype::I32:
      return "I32";
    case Dtype::U32:
      return "U32";
    case Dtype::F32:
      return "F32";
    case Dtype::C64:
      return "C64";
    case Dtype::F64:
      return "F64";
    case Dtype::I64:
      return "I64";
    case Dtype::U64:
      return "U64";
  }
  return "?";
}

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const Dtype d : kAllDtypes) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

unsigned dtype_bits(Dtype dtype) {
  switch (dtype) {
    case Dtype::F4:
      return 4;
    case Dtype::F6_E2M3:
    case Dtype::F6_E3M2:
      return 6;
    case Dtype::BOOL:
    case Dtype::U8:
    case Dtype::I8:
    case Dtype::F8_E5M2:
    case Dtype::F8_E4M3:
    case Dtype::F8_E8M0:
    case Dtype::F8_E4M3FNUZ:
    case Dtype::F8_E5M2FNUZ:
      return 8;
    case Dtype::I16:
    case Dtype::U16:
    case Dtype::F16:
    case Dtype::BF16:
      return 16;
    case Dtype::I32:
    case Dtype::U32:
    case Dtype::F32:
      return 32;
    case Dtype::C64:
    case Dtype::F64:
    case Dtype::I64:
    case Dtype::U64:
      return 64;
  }
  return 0;
}

}  // namespace thaw::safetensors
