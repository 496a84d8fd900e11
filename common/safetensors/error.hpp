// Errors of the safetensors format, sharded indexes, layer inference and fetch plans.
//
// Every failure is an Error value: a code callers and tests branch on, and one line that
// names the file, the tensor and the rule broken, with the numbers involved, e.g.
//   model-00001-of-00002.safetensors: tensor 'h.0.attn.c_attn.weight': data_offsets [0, 100)
//   hold 100 bytes but shape [3, 5] of F32 needs 60
// This header is part of the parser core, which also builds with clang 14 (the fuzzer), so it
// must not need <expected>.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

namespace thaw::safetensors {

enum class errc {
  // Reading and framing.
  io = 1,            // a file could not be opened or read
  truncated,         // the file ends before its 8-byte length prefix or its header
  header_too_large,  // header length above 100,000,000 bytes
  // The header JSON.
  invalid_utf8,         // the header bytes are not UTF-8
  invalid_json,         // not JSON, not an object, NUL byte, byte order mark, nesting too deep
  duplicate_key,        // a key appears twice in one object
  invalid_entry,        // a tensor entry is not an object, lacks a field or has a wrong type
  unknown_dtype,        // "dtype" is not one of the format's dtypes
  metadata_not_string,  // "__metadata__" is not an object of string values
  // Tensor extents.
  offsets_reversed,  // data_offsets [begin, end) with end < begin
  offsets_gap,       // bytes of the data section that belong to no tensor
  offsets_overlap,   // two tensors share bytes
  out_of_bounds,     // a tensor ends past the end of the file
  trailing_bytes,    // the file goes on after the last tensor
  shape_overflow,    // product(shape) x dtype bits does not fit in 64 bits
  misaligned_size,   // a sub-byte dtype whose total bits are not a whole number of bytes
  size_mismatch,     // data_offsets hold a different byte count than shape x dtype needs
  // Models: index, config, shards.
  invalid_index,          // model.safetensors.index.json is malformed
  index_missing_shard,    // the index names a shard file the model does not have
  index_tensor_missing,   // the index maps a tensor to a shard whose header lacks it
  index_tensor_unlisted,  // a shard holds a tensor the index does not map to that shard
  invalid_config,         // config.json is malformed
  no_weights,             // no model.safetensors and no model.safetensors.index.json
  // Layer inference and stage plans.
  unknown_family,        // config.json's model_type is not a family thaw can split
  unknown_tensor_name,   // a tensor name the family's naming scheme does not know
  layer_gap,             // some layer below the highest has no tensors
  layer_count_mismatch,  // config.json's layer count differs from the tensor names'
  invalid_stage,         // stage / num_stages out of range
};

// "offsets_gap" etc., as the enumerator is spelled.
std::string_view errc_name(errc code);

const std::error_category& safetensors_category();
std::error_code make_error_code(errc code);

struct Error {
  errc code = errc::io;
  std::string message;  // one line, starting with the file (or model) it is about

  std::error_code error_code() const { return make_error_code(code); }
};

// A name for a message: in single quotes, control characters and quotes escaped, cut to 200
// characters (a header may hold a megabyte-long name).
std::string quote_name(std::string_view name);

}  // namespace thaw::safetensors

template <>
struct std::is_error_code_enum<thaw::safetensors::errc> : std::true_type {};
