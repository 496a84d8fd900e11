// The few facts of a Hugging Face config.json that splitting a model into pipeline stages
// needs: the family (model_type), the architectures, the layer count and whether the LM head
// is tied to the token embedding.
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/safetensors/error.hpp"

namespace thaw::safetensors {

inline constexpr std::string_view kConfigFileName = "config.json";

struct ModelConfig {
  std::string model_type;  // empty when absent
  std::vector<std::string> architectures;
  // num_hidden_layers, or GPT-2's n_layer (also num_layers / n_layers in some families).
  std::optional<int> num_layers;
  // tie_word_embeddings when the file states it (absent: the family's default applies).
  std::optional<bool> tie_word_embeddings;
};

// Strict JSON (strict_json.hpp); a JSON object; the fields above, when present, of the right
// type (a string, an array of strings, an integer in [0, 1000000], a boolean). Other keys are
// not looked at. Errors: invalid_config (and the JSON codes), naming `file`.
std::expected<ModelConfig, Error> parse_model_config(std::string_view text, std::string_view file);

}  // namespace thaw::safetensors
