// Documents too large for one shim message (artifacts, a slot's layout) travel as a memfd:
// the sender writes the text into one, the receiver reads `bytes` bytes from offset 0.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "common/fd/unique_fd.hpp"

namespace thaw::proto {

// A memfd holding `text` (named `name` in /proc/<pid>/fd, for debugging).
std::expected<UniqueFd, std::string> document_memfd(const char* name, std::string_view text);
// Exactly `bytes` bytes at offset 0 of `fd`.
std::expected<std::string, std::string> read_document(int fd, std::uint64_t bytes);

}  // namespace thaw::proto
