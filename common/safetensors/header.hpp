// Reading safetensors headers: the API the rest of thaw uses (the rules are in
// header_parser.hpp; the result types in header_types.hpp).
//
// A fetcher parses a header before the body arrives:
//   1. fetch bytes [0, 8): n = header_length(bytes, file_size, name)
//   2. fetch bytes [8, 8 + n): header = parse_header(bytes [0, 8 + n), file_size, name)
// and then knows where every tensor's bytes are. A local file: read_header(path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <span>
#include <string_view>

#include "common/safetensors/error.hpp"
#include "common/safetensors/header_types.hpp"

namespace thaw::safetensors {

// N, the JSON header's length, from the file's first 8 bytes (`first_bytes` may be longer).
// Errors: truncated (file shorter than 8 or than 8 + N), header_too_large.
std::expected<std::uint64_t, Error> header_length(std::span<const std::byte> first_bytes,
                                                  std::uint64_t file_size, std::string_view file);

// The header, from the file's first 8 + N bytes or more, for a file of `file_size` bytes.
// `file` names the file in error messages and becomes Header::file().
std::expected<Header, Error> parse_header(std::span<const std::byte> prefix,
                                          std::uint64_t file_size, std::string_view file);

// The same from bytes held in a string (tests, small files).
std::expected<Header, Error> parse_header(std::string_view prefix, std::uint64_t file_size,
                                          std::string_view file);

// Reads and parses the header of a local file (two preads: the length, then the header; the
// data section is not read). Errors name the file as `display_name`, or as the path if empty.
std::expected<Header, Error> read_header(const std::filesystem::path& path,
                                         std::string_view display_name = {});

}  // namespace thaw::safetensors
