// Layer inference from tensor names (common/safetensors/layers.hpp).
#include "common/safetensors/layers.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "families.hpp"
#include "model_builder.hpp"

namespace thaw::safetensors {
namespace {

using testing::assemble_model;
using ::testing::HasSubstr;

MATCHER_P(Fails, code, "") {
  if (arg) {
    *result_listener << "succeeded";
    return false;
  }
  *result_listener << "error " << errc_name(arg.error().code) << ": " << arg.error().message;
  return arg.error().code == code;
}

struct Case {
  Family family;
  const char* name;
  std::optional<Part> part;  // nullopt: not a name of the family
  int layer = -1;
};

TEST(SafetensorsLayers, ClassifiesEachFamilysNames) {
  const Case cases[] = {
      {Family::gpt2, "transformer.wte.weight", Part::token_embedding},
      {Family::gpt2, "wte.weight", Part::token_embedding},
      {Family::gpt2, "transformer.wpe.weight", Part::input},
      {Family::gpt2, "transformer.h.11.mlp.c_fc.weight", Part::layer, 11},
      {Family::gpt2, "h.0.attn.bias", Part::layer, 0},
      {Family::gpt2, "ln_f.bias", Part::final_norm},
      {Family::gpt2, "lm_head.weight", Part::lm_head},
      {Family::gpt2, "transformer.h.01.attn.bias", std::nullopt},
      {Family::gpt2, "transformer.h.x.attn.bias", std::nullopt},
      {Family::gpt2, "transformer.h.3", std::nullopt},
      {Family::gpt2, "transformer.h.3.", std::nullopt},
      {Family::gpt2, "transformer.wte", std::nullopt},
      {Family::gpt2, "model.embed_tokens.weight", std::nullopt},
      {Family::gpt2, "transformer.lm_head.weight", std::nullopt},
      {Family::gpt2, "lm_head", std::nullopt},
      {Family::llama, "model.embed_tokens.weight", Part::token_embedding},
      {Family::llama, "embed_tokens.weight", Part::token_embedding},
      {Family::llama, "model.layers.31.self_attn.rotary_emb.inv_freq", Part::layer, 31},
      {Family::llama, "model.norm.weight", Part::final_norm},
      {Family::llama, "lm_head.weight", Part::lm_head},
      {Family::llama, "model.layers.1000000.mlp.up_proj.weight", std::nullopt},
      {Family::llama, "model.final_norm.weight", std::nullopt},
      {Family::llama, "model.layers.-1.mlp.weight", std::nullopt},
      {Family::opt, "model.decoder.embed_tokens.weight", Part::token_embedding},
      {Family::opt, "decoder.embed_positions.weight", Part::input},
      {Family::opt, "model.decoder.project_in.weight", Part::input},
      {Family::opt, "model.decoder.layers.5.fc1.bias", Part::layer, 5},
      {Family::opt, "model.decoder.final_layer_norm.weight", Part::final_norm},
      {Family::opt, "model.decoder.project_out.weight", Part::final_norm},
      {Family::opt, "lm_head.weight", Part::lm_head},
      {Family::opt, "model.layers.5.fc1.bias", std::nullopt},
      {Family::opt, "model.decoder.norm.weight", std::nullopt},
      {Family::falcon, "transformer.word_embeddings.weight", Part::token_embedding},
      {Family::falcon, "transformer.h.7.self_attention.dense.weight", Part::layer, 7},
      {Family::falcon, "transformer.ln_f.bias", Part::final_norm},
      {Family::falcon, "lm_head.weight", Part::lm_head},
      {Family::falcon, "transformer.wte.weight", std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << family_name(c.family) << " " << c.name);
    const auto role = classify(c.family, c.name);
    ASSERT_EQ(role.has_value(), c.part.has_value());
    if (!role) continue;
    EXPECT_EQ(role->part, *c.part);
    EXPECT_EQ(role->layer, c.layer);
  }
}

TEST(SafetensorsLayers, ModelTypesMapToFamilies) {
  EXPECT_EQ(family_of_model_type("gpt2"), Family::gpt2);
  for (const char* t : {"llama", "mistral", "mixtral", "qwen2", "qwen3"}) {
    EXPECT_EQ(family_of_model_type(t), Family::llama) << t;
  }
  EXPECT_EQ(family_of_model_type("opt"), Family::opt);
  EXPECT_EQ(family_of_model_type("falcon"), Family::falcon);
  EXPECT_EQ(family_of_model_type("RefinedWebModel"), Family::falcon);
  EXPECT_EQ(family_of_model_type("bert"), std::nullopt);
  EXPECT_EQ(family_of_model_type("Llama"), std::nullopt);
}

std::string config(const std::string& model_type, int layers, std::optional<bool> tie = {}) {
  std::string c =
      R"({"model_type":")" + model_type + R"(","num_hidden_layers":)" + std::to_string(layers);
  if (tie) c += std::string(R"(,"tie_word_embeddings":)") + (*tie ? "true" : "false");
  return c + "}";
}

TEST(SafetensorsLayers, InfersFamilyLayersAndTying) {
  struct Expect {
    testing::FamilyModel model;
    std::optional<std::string> config;
    Family family;
    bool lm_head, tied;
  };
  const Expect cases[] = {
      {testing::gpt2_model(3, true, false), config("gpt2", 3), Family::gpt2, false, true},
      // GPT-2 ties by default, even with a stored lm_head (engines then use wte).
      {testing::gpt2_model(3, false, true), config("gpt2", 3), Family::gpt2, true, true},
      {testing::gpt2_model(3, false, true), config("gpt2", 3, false), Family::gpt2, true, false},
      {testing::llama_model(3, true), config("llama", 3), Family::llama, true, false},
      {testing::llama_model(3, true, "qwen2"), config("qwen2", 3, true), Family::llama, true, true},
      {testing::llama_model(3, false), config("mistral", 3), Family::llama, false, true},
      {testing::opt_model(3, true), config("opt", 3), Family::opt, false, true},
      {testing::falcon_model(3), config("falcon", 3), Family::falcon, true, true},
      // Without config.json the family comes from the names.
      {testing::falcon_model(3), std::nullopt, Family::falcon, true, true},
      {testing::opt_model(3, false), std::nullopt, Family::opt, false, true},
      {testing::llama_model(3, true), std::nullopt, Family::llama, true, false},
  };
  for (const Expect& c : cases) {
    SCOPED_TRACE(c.model.model_type + " " + c.config.value_or("(no config)"));
    const auto m = assemble_model({{"model.safetensors", c.model.file()}}, c.config);
    ASSERT_TRUE(m) << m.error().message;
    const auto layout = infer_layout(*m);
    ASSERT_TRUE(layout) << layout.error().message;
    EXPECT_EQ(layout->family, c.family);
    EXPECT_EQ(layout->num_layers, 3);
    EXPECT_EQ(layout->has_lm_head, c.lm_head);
    EXPECT_EQ(layout->tied_lm_head, c.tied);
    ASSERT_EQ(layout->roles.size(), 1u);
    EXPECT_EQ(layout->roles[0].size(), m->shards()[0].tensors().size());
  }
}

TEST(SafetensorsLayers, UnknownTensorNameIsAnErrorNamingIt) {
  auto model = testing::llama_model(2, true);
  model.layers[1].push_back("model.layers.1.mystery.weight");
  model.last.push_back("model.vision_tower.patch_embed.weight");
  const auto m = assemble_model({{"model.safetensors", model.file()}}, config("llama", 2));
  ASSERT_TRUE(m) << m.error().message;
  const auto layout = infer_layout(*m);
  ASSERT_THAT(layout, Fails(errc::unknown_tensor_name));
  EXPECT_THAT(
      layout.error().message,
      HasSubstr("synthetic/model.safetensors: tensor 'model.vision_tower.patch_embed.weight' "
                "is not a llama tensor name"));
  // Without a config no family fits: still an error naming a tensor.
  const auto bare = assemble_model({{"model.safetensors", model.file()}}, std::nullopt);
  ASSERT_TRUE(bare);
  const auto guess = infer_layout(*bare);
  ASSERT_THAT(guess, Fails(errc::unknown_tensor_name));
  EXPECT_THAT(guess.error().message,
              HasSubstr("tensor 'model.vision_tower.patch_embed.weight' fits none"));
}

TEST(SafetensorsLayers, UnknownModelTypeIsRefused) {
  const auto m = assemble_model({{"model.safetensors", testing::llama_model(2, true).file()}},
                                config("bert", 2));
  ASSERT_TRUE(m);
  const auto layout = infer_layout(*m);
  ASSERT_THAT(layout, Fails(errc::unknown_family));
  EXPECT_THAT(layout.error().message, HasSubstr("model_type 'bert'"));
}

TEST(SafetensorsLayers, LayerGapIsRefused) {
  auto model = testing::llama_model(4, true);
  model.layers.erase(model.layers.begin() + 2);
  const auto m = assemble_model({{"model.safetensors", model.file()}}, std::nullopt);
  ASSERT_TRUE(m);
  const auto layout = infer_layout(*m);
  ASSERT_THAT(layout, Fails(errc::layer_gap));
  EXPECT_THAT(layout.error().message,
              HasSubstr("no tensor belongs to layer 2, but layer 3 has tensors"));
}

TEST(SafetensorsLayers, ConfigLayerCountMustMatchTheNames) {
  const auto m = assemble_model({{"model.safetensors", testing::gpt2_model(4, true, false).file()}},
                                R"({"model_type":"gpt2","n_layer":6})");
  ASSERT_TRUE(m);
  const auto layout = infer_layout(*m);
  ASSERT_THAT(layout, Fails(errc::layer_count_mismatch));
  EXPECT_THAT(layout.error().message,
              HasSubstr("config.json: 6 layers, but the tensor names have 4"));
}

}  // namespace
}  // namespace thaw::safetensors
