#include "common/safetensors/index.hpp"

namespace thaw::safetensors {

std::expected<ShardIndex, Error> parse_index(std::string_view text, std::string_view file) {
  ShardIndex index;
  if (auto e = core::parse_index(text, file, index)) return std::unexpected(std::move(*e));
  return index;
}

}  // namespace thaw::safetensors
