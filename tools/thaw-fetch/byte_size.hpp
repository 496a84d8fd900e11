// Sizes on the command line and in output: common/text/byte_size.hpp, under this tool's
// namespace.
#pragma once

#include "common/text/byte_size.hpp"

namespace thaw::fetch_cli {
using text::format_bytes;
using text::format_duration;
using text::parse_byte_size;
}  // namespace thaw::fetch_cli
