// Sizes in configuration and on command lines ("4MiB", "2GB", "1048576") and in
// human-readable output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace thaw::text {

// A number (decimal fraction allowed) with an optional unit: B, KB/MB/GB/TB (powers of
// 1000), KiB/MiB/GiB/TiB (powers of 1024); case-insensitive. nullopt unless >= 1 byte.
std::optional<std::uint64_t> parse_byte_size(std::string_view text);

// "1.5 MiB", "512 B".
std::string format_bytes(double bytes);
// "1:05", "2:03:04"; "?" when unknown.
std::string format_duration(std::optional<double> seconds);

}  // namespace thaw::text
