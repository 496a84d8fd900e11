// How one requested range is cut into parts fetched over separate connections.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/store/registry/fetch_types.hpp"

namespace thaw::store {

// Parts cover `range` exactly, in order, without overlap. Their count is the larger of
// ceil(length / part_bytes) and min(connections, ceil(length / min_part_bytes)) (rounding
// may lower it by one or two); all parts but the last have the same size, rounded up to a
// multiple of 64 KiB when that stays within part_bytes.
std::vector<ByteRange> split_range(ByteRange range, std::uint64_t part_bytes,
                                   std::uint64_t min_part_bytes, std::uint32_t connections);

}  // namespace thaw::store
