// The safetensors header parser's core: the format's rules as huggingface/safetensors'
// SafeTensors::read_metadata and Metadata::validate apply them (safetensors/src/tensor.rs).
//
//   [N: u64 little-endian][N bytes: JSON object][data section]
//
// - N <= 100,000,000 and the file holds at least 8 + N bytes;
// - the N bytes are UTF-8 and one JSON object, optionally surrounded by JSON whitespace (the
//   official writer pads with spaces to a multiple of 8);
// - "__metadata__", if present and not null, maps strings to strings;
// - every other key is a tensor: {"dtype": one of the format's dtypes, "shape": [u64...],
//   "data_offsets": [begin, end]}; like the official parser (serde, which ignores unknown
//   struct fields), other fields of an entry are allowed and ignored;
// - sorted by (begin, end), the tensors tile the data section: the first starts at 0, each
//   starts where the previous ends, and the last ends exactly at the end of the file
//   (data_end + 8 + N == file size: trailing bytes are an error, as are missing ones);
// - product(shape) x dtype bits fits in 64 bits, is a whole number of bytes, and equals
//   end - begin.
// Stricter than the official parser in one respect: a key that appears twice (a tensor name
// or a field) is an error rather than last-one-wins, so no two readers can disagree about
// which entry counts.
//
// This core reports errors through an out-parameter, not std::expected, so that it builds
// with clang 14 + libstdc++ 12 (the fuzzer build), which lacks <expected>. header.hpp is the
// API everything else uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "common/safetensors/error.hpp"
#include "common/safetensors/header_types.hpp"

namespace thaw::safetensors::core {

// N from the file's first 8 bytes (`first_bytes` may be longer), checked against the limit and
// against `file_size`. On success stores N in `header_size`.
std::optional<Error> read_header_length(std::span<const std::byte> first_bytes,
                                        std::uint64_t file_size, std::string_view file,
                                        std::uint64_t& header_size);

// Parses and validates the header from `prefix`, the file's first bytes: at least 8 + N of
// them (more is fine; the data section is never read). `file_size` is the whole file's size,
// which the tensors must tile exactly. On success stores the result in `out`.
std::optional<Error> parse_header(std::span<const std::byte> prefix, std::uint64_t file_size,
                                  std::string_view file, Header& out);

}  // namespace thaw::safetensors::core
