#include "common/safetensors/model_config.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/safetensors/strict_json.hpp"

namespace thaw::safetensors {

std::expected<ModelConfig, Error> parse_model_config(std::string_view text, std::string_view file) {
  nlohmann::json doc;
  if (auto e = core::parse_strict_json(text, file, doc)) return std::unexpected(std::move(*e));
  const auto invalid = [&](std::string message) {
    return std::unexpected(Error{errc::invalid_config, fmt::format("{}: {}", file, message)});
  };
  if (!doc.is_object()) return invalid(fmt::format("is a JSON {}, not an object", doc.type_name()));

  ModelConfig config;
  if (const auto t = doc.find("model_type"); t != doc.end()) {
    if (!t->is_string())
      return invalid(fmt::format("\"model_type\" is {}, not a string", t->dump()));
    config.model_type = t->get<std::string>();
  }
  if (const auto a = doc.find("architectures"); a != doc.end() && !a->is_null()) {
    if (!a->is_array()) return invalid("\"architectures\" is not an array of strings");
    for (const auto& name : *a) {
      if (!name.is_string()) return invalid("\"architectures\" is not an array of strings");
      config.architectures.push_back(name.get<std::string>());
    }
  }
  for (const char* key : {"num_hidden_layers", "n_layer", "num_layers", "n_layers"}) {
    const auto l = doc.find(key);
    if (l == doc.end()) continue;
    constexpr std::uint64_t kMaxLayers = 1'000'000;
    if (!l->is_number_unsigned() || l->get<std::uint64_t>() > kMaxLayers) {
      return invalid(
          fmt::format("\"{}\" is {}, not a layer count in [0, {}]", key, l->dump(), kMaxLayers));
    }
    config.num_layers = static_cast<int>(l->get<std::uint64_t>());
    break;
  }
  if (const auto t = doc.find("tie_word_embeddings"); t != doc.end()) {
    if (!t->is_boolean()) {
      return invalid(fmt::format("\"tie_word_embeddings\" is {}, not a boolean", t->dump()));
    }
    config.tie_word_embeddings = t->get<bool>();
  }
  return config;
}

}  // namespace thaw::safetensors
