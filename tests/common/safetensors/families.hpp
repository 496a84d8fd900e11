// Tensor names of the families thaw splits into stages, as transformers names them, for
// synthesised models.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "builder.hpp"

namespace thaw::safetensors::testing {

struct FamilyModel {
  std::string model_type;
  std::vector<std::string> first;  // token embedding and other input tensors (stage 0)
  std::string token_embedding;     // the tensor a tied head reuses
  std::vector<std::vector<std::string>> layers;
  std::vector<std::string> last;  // final norm and LM head (last stage)
  std::vector<std::string> all() const {
    std::vector<std::string> out = first;
    for (const auto& l : layers) out.insert(out.end(), l.begin(), l.end());
    out.insert(out.end(), last.begin(), last.end());
    return out;
  }
  // One file, tensors sorted by name as the official writer orders same-dtype tensors.
  FileBuilder file() const {
    std::vector<std::string> names = all();
    std::sort(names.begin(), names.end());
    FileBuilder b;
    for (const std::string& n : names) b.tensor(n, "F16", {4});
    return b;
  }
};

inline std::vector<std::string> per_layer(const std::string& stem, int i,
                                          const std::vector<std::string>& leaves) {
  std::vector<std::string> out;
  for (const std::string& leaf : leaves) out.push_back(stem + std::to_string(i) + "." + leaf);
  return out;
}

inline FamilyModel gpt2_model(int layers, bool prefix, bool lm_head) {
  const std::string p = prefix ? "transformer." : "";
  FamilyModel m{.model_type = "gpt2",
                .first = {p + "wte.weight", p + "wpe.weight"},
                .token_embedding = p + "wte.weight",
                .layers = {},
                .last = {p + "ln_f.weight", p + "ln_f.bias"}};
  for (int i = 0; i < layers; ++i) {
    m.layers.push_back(per_layer(
        p + "h.", i,
        {"ln_1.weight", "attn.c_attn.weight", "attn.c_attn.bias", "mlp.c_fc.weight", "attn.bias"}));
  }
  if (lm_head) m.last.push_back("lm_head.weight");
  return m;
}

inline FamilyModel llama_model(int layers, bool lm_head, const std::string& model_type = "llama") {
  FamilyModel m{.model_type = model_type,
                .first = {"model.embed_tokens.weight"},
                .token_embedding = "model.embed_tokens.weight",
                .layers = {},
                .last = {"model.norm.weight"}};
  for (int i = 0; i < layers; ++i) {
    m.layers.push_back(
        per_layer("model.layers.", i,
                  {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                   "mlp.down_proj.weight", "post_attention_layernorm.weight"}));
  }
  if (lm_head) m.last.push_back("lm_head.weight");
  return m;
}

inline FamilyModel opt_model(int layers, bool model_prefix) {
  const std::string p = model_prefix ? "model.decoder." : "decoder.";
  FamilyModel m{
      .model_type = "opt",
      .first = {p + "embed_tokens.weight", p + "embed_positions.weight", p + "project_in.weight"},
      .token_embedding = p + "embed_tokens.weight",
      .layers = {},
      .last = {p + "final_layer_norm.weight", p + "project_out.weight"}};
  for (int i = 0; i < layers; ++i) {
    m.layers.push_back(per_layer(
        p + "layers.", i,
        {"self_attn.k_proj.weight", "self_attn_layer_norm.bias", "fc1.weight", "fc2.weight"}));
  }
  return m;
}

inline FamilyModel falcon_model(int layers) {
  FamilyModel m{.model_type = "falcon",
                .first = {"transformer.word_embeddings.weight"},
                .token_embedding = "transformer.word_embeddings.weight",
                .layers = {},
                .last = {"transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"}};
  for (int i = 0; i < layers; ++i) {
    m.layers.push_back(
        per_layer("transformer.h.", i,
                  {"self_attention.query_key_value.weight", "self_attention.dense.weight",
                   "mlp.dense_h_to_4h.weight", "input_layernorm.weight"}));
  }
  return m;
}

}  // namespace thaw::safetensors::testing
