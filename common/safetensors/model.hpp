// A model as Hugging Face lays it out: config.json, tokenizer files, and its weights as one
// model.safetensors or as shards listed by model.safetensors.index.json. A Model holds the
// parsed headers (never tensor data), so it can be built from a local directory or from bytes
// fetched from a registry before any weight has arrived.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors/error.hpp"
#include "common/safetensors/header_types.hpp"
#include "common/safetensors/index_parser.hpp"
#include "common/safetensors/model_config.hpp"

namespace thaw::safetensors {

struct FileEntry {
  std::string name;  // relative to the model directory
  std::uint64_t size = 0;
};

// Whether a file of a model directory is one every pipeline stage fetches whole: *.json
// (config, generation config, tokenizer, index), *.txt (merges, vocab), *.model (sentencepiece),
// *.tiktoken, *.jinja (chat templates), *.py (remote code). Weights in any format, READMEs and
// hidden files are not.
bool is_small_model_file(std::string_view name);

// The pieces a Model is assembled from, wherever they came from.
struct ModelParts {
  std::string label;                       // where the model is, for messages (dir, URL)
  std::optional<std::string> config_json;  // config.json's contents, if the model has one
  std::optional<std::string> index_json;   // model.safetensors.index.json's, if sharded
  std::vector<Header> shards;              // every weight file's header; Header::file() is its
                                           // name relative to the model directory
  std::vector<FileEntry> small_files;      // files fetched whole (config and index included)
};

class Model {
 public:
  // Reads a local model directory: config.json (optional), then model.safetensors if present
  // (transformers prefers it), else model.safetensors.index.json and the shards it names; the
  // headers only. small_files: the directory's regular files that is_small_model_file accepts.
  // Errors: io, no_weights, index_missing_shard, and everything assemble() checks.
  static std::expected<Model, Error> open(const std::filesystem::path& dir);

  // Checks the pieces against each other: with an index, every file it names is among the
  // shards and every shard is named; each tensor it lists is in that shard's header and each
  // header tensor is listed for that shard (so no tensor is in two shards). Without an index
  // there must be exactly one weight file.
  static std::expected<Model, Error> assemble(ModelParts parts);

  const std::string& label() const { return label_; }
  const std::optional<ModelConfig>& config() const { return config_; }
  const std::optional<ShardIndex>& index() const { return index_; }
  // In index order (sorted by file name), or the single file.
  std::span<const Header> shards() const { return shards_; }
  // Sorted by name.
  std::span<const FileEntry> small_files() const { return small_files_; }

  // The tensor named `name` and, in `shard`, the header holding it; nullptr when absent.
  const TensorInfo* find(std::string_view name, const Header** shard = nullptr) const;
  std::size_t tensor_count() const { return by_name_.size(); }
  // Sum of the shards' data sections.
  std::uint64_t tensor_bytes() const;

 private:
  struct Ref {  // indices, not pointers, so that copies of a Model stay valid
    std::uint32_t shard;
    std::uint32_t tensor;
  };
  Model() = default;
  const std::string& name_of(Ref r) const { return shards_[r.shard].tensors()[r.tensor].name; }

  std::string label_;
  std::optional<ModelConfig> config_;
  std::optional<ShardIndex> index_;
  std::vector<Header> shards_;
  std::vector<FileEntry> small_files_;
  std::vector<Ref> by_name_;  // sorted by name
};

}  // namespace thaw::safetensors
