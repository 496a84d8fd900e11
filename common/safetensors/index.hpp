// model.safetensors.index.json: the expected-returning API (rules in index_parser.hpp).
#pragma once

#include <expected>
#include <string_view>

#include "common/safetensors/error.hpp"
#include "common/safetensors/index_parser.hpp"

namespace thaw::safetensors {

// `file` names the index in messages (e.g. "<model dir>/model.safetensors.index.json").
std::expected<ShardIndex, Error> parse_index(std::string_view text, std::string_view file);

}  // namespace thaw::safetensors
