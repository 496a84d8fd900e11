#include "daemon/store/registry/range_split.hpp"

#include <algorithm>

namespace thaw::store {

namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return a / b + (a % b != 0);
}

constexpr std::uint64_t kAlign = 64u << 10;

}  // namespace

std::vector<ByteRange> split_range(ByteRange range, std::uint64_t part_bytes,
                                   std::uint64_t min_part_bytes, std::uint32_t connections) {
  std::vector<ByteRange> parts;
  if (range.length == 0) return parts;
  part_bytes = std::max<std::uint64_t>(part_bytes, 1);
  min_part_bytes = std::clamp<std::uint64_t>(min_part_bytes, 1, part_bytes);
  connections = std::max<std::uint32_t>(connections, 1);

  std::uint64_t count =
      std::max(ceil_div(range.length, part_bytes),
               std::min<std::uint64_t>(connections, ceil_div(range.length, min_part_bytes)));
  std::uint64_t step = ceil_div(range.length, count);
  // Rounding the step up to 64 KiB keeps part boundaries aligned; it may reduce the count.
  if (step > kAlign && ceil_div(step, kAlign) * kAlign <= part_bytes) {
    step = ceil_div(step, kAlign) * kAlign;
  }
  for (std::uint64_t offset = range.offset; offset < range.end(); offset += step) {
    parts.push_back(ByteRange{offset, std::min(step, range.end() - offset)});
  }
  return parts;
}

}  // namespace thaw::store
