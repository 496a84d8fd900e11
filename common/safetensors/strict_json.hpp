// JSON the way the safetensors ecosystem's Rust side (serde_json) reads it, on top of
// nlohmann::json, which on its own is more lenient in ways that would let thaw and an engine
// disagree about what a file says:
// - nlohmann stops at a NUL byte as if the input ended there ("{}\0garbage" parses);
// - it skips a leading UTF-8 byte order mark;
// - it keeps the last of duplicate keys (serde keeps the last for maps but refuses duplicate
//   struct fields; thaw refuses every duplicate, so no two readers can pick different values);
// - it nests without limit (serde_json stops at 128 levels).
// Part of the parser core (builds with clang 14 for the fuzzer).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "common/safetensors/error.hpp"

namespace thaw::safetensors::core {

inline constexpr int kMaxJsonDepth = 128;

// The offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or nullopt when all of `text` is.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

// UTF-8, no NUL byte, no byte order mark. `what` names the text in messages, e.g.
// "model.safetensors: header" or "config.json".
std::optional<Error> check_json_text(std::string_view text, std::string_view what);

// check_json_text, then a strict parse into `out`: no duplicate keys, at most kMaxJsonDepth
// levels, nothing but whitespace after the value.
std::optional<Error> parse_strict_json(std::string_view text, std::string_view what,
                                       nlohmann::json& out);

// nlohmann's exception text without its "[json.exception.parse_error.101] " prefix.
std::string json_error_text(const std::exception& e);

}  // namespace thaw::safetensors::core
