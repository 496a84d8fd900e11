// A GPT-2 model directory (Hugging Face layout) for the reference engine: config.json plus
// model.safetensors or a sharded model.safetensors.index.json. Tensor names may carry the
// "transformer." prefix (GPT2LMHeadModel) or not (GPT2Model); the callback always gets the
// name without it. The LM head is tied to wte.weight; a stored lm_head.weight is skipped.
//
// load() reads each needed file the safetensors + PyTorch way (MappedCheckpointFile: open and
// map for the header, open again and map privately) and hands every tensor's bytes, a view of
// the private mapping, to a callback, so the engine can copy them to the device from there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safetensors.hpp"

namespace refengine {

struct GPT2Config {
  std::int64_t n_embd = 0;
  std::int64_t n_layer = 0;
  std::int64_t n_head = 0;
  std::int64_t n_positions = 0;
  std::int64_t vocab_size = 0;
  std::int64_t n_inner = 0;  // 4 * n_embd when config.json has null or nothing
  double layer_norm_epsilon = 1e-5;
  std::int64_t eos_token_id = 50256;  // GPT-2's <|endoftext|>
  std::string torch_dtype;            // "float32", "float16", "bfloat16" (empty if absent)
  DType dtype = DType::F32;           // torch_dtype as a safetensors dtype
  bool has_dtype = false;             // torch_dtype was given: every tensor must have that dtype
};

struct ExpectedTensor {
  std::string name;  // without "transformer."
  std::vector<std::int64_t> shape;
};

// Which part of the model a pipeline stage loads: layers [layer_begin, layer_end) (layer_end
// < 0: all layers), embeddings (wte, wpe) on the first stage, ln_f and the tied LM head (wte)
// on the last.
struct StageSpec {
  int layer_begin = 0;
  int layer_end = -1;
  bool first_stage = true;
  bool last_stage = true;
};

struct TensorView {
  std::string_view name;  // without "transformer."
  DType dtype;
  std::span<const std::int64_t> shape;
  const void* data;  // inside the file's private mapping
  std::size_t bytes;
};

struct FileLoaded {
  std::string path;
  std::size_t tensors = 0;  // tensors handed to the callback from this file
  std::uint64_t bytes = 0;  // their bytes
  std::uint64_t file_size = 0;
};

class Checkpoint {
 public:
  // The callback's error aborts the load and is returned as is.
  using TensorCallback = std::function<std::expected<void, std::string>(const TensorView&)>;
  using FileCallback = std::function<void(const FileLoaded&)>;

  // Reads config.json and, if present, model.safetensors.index.json (checking that every file
  // it names exists). Does not open the safetensors files.
  static std::expected<Checkpoint, std::string> open(const std::filesystem::path& dir);

  const GPT2Config& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  // The safetensors files, in load order.
  const std::vector<std::filesystem::path>& files() const { return files_; }

  std::vector<ExpectedTensor> expected_tensors(int layer_begin, int layer_end, bool first_stage,
                                               bool last_stage) const;
  std::vector<ExpectedTensor> expected_tensors(const StageSpec& s) const {
    return expected_tensors(s.layer_begin, s.layer_end, s.first_stage, s.last_stage);
  }

  // Loads the stage's tensors: files in order, each tensor (in file offset order) validated
  // against config.json (shape, dtype) and handed to on_tensor; on_file after each file.
  // Files holding none of the stage's tensors (per the index) are not opened. Tensors of other
  // layers/stages are skipped. Missing tensors are an error after the walk.
  std::expected<void, std::string> load(const StageSpec& stage, const TensorCallback& on_tensor,
                                        const FileCallback& on_file = {}) const;

 private:
  std::filesystem::path dir_;
  GPT2Config config_;
  bool sharded_ = false;
  std::vector<std::filesystem::path> files_;
  // Sharded only: the index's tensor name (as stored) -> file path.
  std::map<std::string, std::filesystem::path> weight_map_;
};

// "transformer.h.0.ln_1.weight" -> "h.0.ln_1.weight"; other names unchanged.
std::string_view canonical_tensor_name(std::string_view stored);

std::string format_shape(std::span<const std::int64_t> shape);

}  // namespace refengine
