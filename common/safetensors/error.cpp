#include "common/safetensors/error.hpp"

#include <fmt/format.h>

namespace thaw::safetensors {

std::string_view errc_name(errc code) {
  switch (code) {
    case errc::io:
      return "io";
    case errc::truncated:
      return "truncated";
    case errc::header_too_large:
      return "header_too_large";
    case errc::invalid_utf8:
      return "invalid_utf8";
    case errc::invalid_json:
      return "invalid_json";
    case errc::duplicate_key:
      return "duplicate_key";
    case errc::invalid_entry:
      return "invalid_entry";
    case errc::unknown_dtype:
      return "unknown_dtype";
    case errc::metadata_not_string:
      return "metadata_not_string";
    case errc::offsets_reversed:
      return "offsets_reversed";
    case errc::offsets_gap:
      return "offsets_gap";
    case errc::offsets_overlap:
      return "offsets_overlap";
    case errc::out_of_bounds:
      return "out_of_bounds";
    case errc::trailing_bytes:
      return "trailing_bytes";
    case errc::shape_overflow:
      return "shape_overflow";
    case errc::misaligned_size:
      return "misaligned_size";
    case errc::size_mismatch:
      return "size_mismatch";
    case errc::invalid_index:
      return "invalid_index";
    case errc::index_missing_shard:
      return "index_missing_shard";
    case errc::index_tensor_missing:
      return "index_tensor_missing";
    case errc::index_tensor_unlisted:
      return "index_tensor_unlisted";
    case errc::invalid_config:
      return "invalid_config";
    case errc::no_weights:
      return "no_weights";
    case errc::unknown_family:
      return "unknown_family";
    case errc::unknown_tensor_name:
      return "unknown_tensor_name";
    case errc::layer_gap:
      return "layer_gap";
    case errc::layer_count_mismatch:
      return "layer_count_mismatch";
    case errc::invalid_stage:
      return "invalid_stage";
  }
  return "unknown";
}

namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "thaw.safetensors"; }
  std::string message(int code) const override {
    return std::string(errc_name(static_cast<errc>(code)));
  }
};

}  // namespace

const std::error_category& safetensors_category() {
  static const Category category;  // immutable; function-local so initialisation is ordered
  return category;
}

std::error_code make_error_code(errc code) {
  return {static_cast<int>(code), safetensors_category()};
}

std::string quote_name(std::string_view name) {
  constexpr std::size_t kMaxShown = 200;
  std::string out = "'";
  std::size_t shown = 0;
  for (const char c : name) {
    if (shown++ == kMaxShown) {
      out += fmt::format("...' ({} bytes)", name.size());
      return out;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

}  // namespace thaw::safetensors
