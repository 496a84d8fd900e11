// Synthesised models for the index, layer and plan tests: headers built by FileBuilder,
// assembled into a Model without touching the disk.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "builder.hpp"
#include "common/safetensors/header.hpp"
#include "common/safetensors/model.hpp"

namespace thaw::safetensors::testing {

struct ShardSpec {
  std::string file;
  FileBuilder contents;
};

inline std::expected<Model, Error> assemble_model(const std::vector<ShardSpec>& shards,
                                                  std::optional<std::string> config_json,
                                                  std::optional<std::string> index_json = {}) {
  ModelParts parts;
  parts.label = "synthetic";
  for (const ShardSpec& s : shards) {
    const std::string bytes = s.contents.build();
    auto h = parse_header(bytes, bytes.size(), s.file);
    if (!h) return std::unexpected(h.error());
    parts.shards.push_back(std::move(*h));
  }
  if (config_json) parts.small_files.push_back({"config.json", config_json->size()});
  if (index_json) parts.small_files.push_back({"model.safetensors.index.json", index_json->size()});
  parts.small_files.push_back({"tokenizer.json", 1234});
  parts.config_json = std::move(config_json);
  parts.index_json = std::move(index_json);
  return Model::assemble(std::move(parts));
}

// An index for `shards` mapping every tensor to the shard that holds it.
inline std::string index_for(const std::vector<std::pair<std::string, std::string>>& map) {
  std::string s = R"({"metadata":{"total_size":0},"weight_map":{)";
  for (std::size_t i = 0; i < map.size(); ++i) {
    if (i) s += ',';
    s += '"' + map[i].first + "\":\"" + map[i].second + '"';
  }
  return s + "}}";
}

}  // namespace thaw::safetensors::testing
