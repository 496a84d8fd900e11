// Which part of a transformer each tensor belongs to, from its name, for the families thaw
// splits into pipeline stages. Names are matched exactly against each family's scheme (as
// transformers' modeling code names parameters, with or without the base-model prefix that
// checkpoints saved from the base class lack); a name the scheme does not know is an error,
// never a guess, because a wrongly placed tensor would be missing on the stage that needs it.
#pragma once

#include <expected>
#include <optional>
#include <string_view>
#include <vector>

#include "common/safetensors/error.hpp"
#include "common/safetensors/model.hpp"

namespace thaw::safetensors {

enum class Family {
  gpt2,    // [transformer.]wte, wpe, h.<N>, ln_f; lm_head
  llama,   // also Mistral, Mixtral, Qwen2, Qwen3: [model.]embed_tokens, layers.<N>, norm; lm_head
  opt,     // [model.]decoder.{embed_tokens, embed_positions, project_in, layers.<N>,
           //   final_layer_norm, project_out}; lm_head
  falcon,  // [transformer.]word_embeddings, h.<N>, ln_f; lm_head
};
inline constexpr Family kAllFamilies[] = {Family::gpt2, Family::llama, Family::opt, Family::falcon};

std::string_view family_name(Family family);
// config.json's model_type → family: gpt2; llama, mistral, mixtral, qwen2, qwen3; opt; falcon
// (and its pre-transformers names RefinedWeb, RefinedWebModel). nullopt for any other.
std::optional<Family> family_of_model_type(std::string_view model_type);

enum class Part {
  token_embedding,  // the token embedding matrix (wte, embed_tokens, word_embeddings): stage 0,
                    // and also the last stage when the LM head is tied to it
  input,            // other first-stage tensors: position embeddings, OPT's project_in
  layer,            // transformer block TensorRole::layer
  final_norm,       // the final norm (ln_f, norm, final_layer_norm) and OPT's project_out
  lm_head,          // the LM head (lm_head.*)
};

struct TensorRole {
  Part part = Part::layer;
  int layer = -1;  // for Part::layer
};

// The role of `name` in `family`'s scheme; nullopt when the scheme has no such name. Layer
// numbers are decimal without leading zeros, below 1,000,000.
std::optional<TensorRole> classify(Family family, std::string_view name);

struct LayerLayout {
  Family family = Family::gpt2;
  int num_layers = 0;
  bool has_lm_head = false;
  // The LM head reuses the token embedding, so the last stage needs the token embedding too.
  // True when the checkpoint stores no lm_head (GPT-2 and OPT save_pretrained drop the tied
  // copy), or when config.json's tie_word_embeddings (absent: the family's default, true for
  // GPT-2, OPT and Falcon, false for the Llama family) says engines use the embedding even
  // though an lm_head is stored (vLLM then skips lm_head.weight).
  bool tied_lm_head = false;
  std::vector<std::vector<TensorRole>> roles;  // [shard][tensor], as Model::shards()
};

// The family: config.json's model_type when there is one (unknown_family if thaw does not know
// it), else the first family whose scheme knows every tensor name. Then every tensor's role,
// and the layer count: layers 0..L-1 must each have tensors (layer_gap) and L must equal the
// config's layer count when it states one (layer_count_mismatch).
std::expected<LayerLayout, Error> infer_layout(const Model& model);

}  // namespace thaw::safetensors
