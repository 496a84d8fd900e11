// The index of a sharded model, model.safetensors.index.json, as transformers' save_pretrained
// and huggingface_hub write it:
//   {"metadata": {"total_size": <bytes of tensor data>, ...}, "weight_map": {tensor: shard}}
// Rules: a JSON object (strict JSON, see strict_json.hpp) with a non-empty "weight_map" object
// of string values; every shard a plain "*.safetensors" file name in the model's directory (no
// '/', no "..": the index cannot make a reader leave the directory); "metadata", if present,
// an object whose "total_size", if present, is a non-negative integer. Other keys are ignored.
// Whether the shards really hold those tensors is checked when a Model is assembled.
//
// Part of the parser core (builds with clang 14 for the fuzzer): errors via out-parameter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/safetensors/error.hpp"

namespace thaw::safetensors {

inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleFileName = "model.safetensors";

struct ShardIndex {
  // metadata.total_size when present. Informational: writers disagree on what it counts (tied
  // weights, duplicates), and transformers does not check it either.
  std::optional<std::uint64_t> total_size;
  // (tensor, shard file), sorted by tensor name.
  std::vector<std::pair<std::string, std::string>> weight_map;
  // The distinct shard files, sorted.
  std::vector<std::string> files;

  // The shard the index maps `tensor` to; nullptr when it does not list it.
  const std::string* shard_of(std::string_view tensor) const;
};

namespace core {

// Why `name` cannot be a shard file of a model directory (empty, a path separator, a leading
// '.', not *.safetensors), or nullopt when it can.
std::optional<std::string_view> shard_name_problem(std::string_view name);

// `file` names the index in messages.
std::optional<Error> parse_index(std::string_view text, std::string_view file, ShardIndex& out);

}  // namespace core

}  // namespace thaw::safetensors
