// The Content-Range header of a 206 answer: "bytes <first>-<last>/<total|*>".
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace thaw::store {

struct ContentRange {
  std::uint64_t first = 0;
  std::uint64_t last = 0;              // inclusive
  std::optional<std::uint64_t> total;  // nullopt for "*"
};

// nullopt when malformed (including last < first, or last ≥ total).
std::optional<ContentRange> parse_content_range(std::string_view header);

}  // namespace thaw::store
