// Stage plans (common/safetensors/fetch_plan.hpp) on synthesised models of each family.
#include "common/safetensors/fetch_plan.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "families.hpp"
#include "model_builder.hpp"
#include "plan_checks.hpp"

namespace thaw::safetensors {
namespace {

using testing::assemble_model;
using ::testing::ElementsAre;
using testing::FamilyModel;
using ::testing::HasSubstr;

MATCHER_P(Fails, code, "") {
  if (arg) {
    *result_listener << "succeeded";
    return false;
  }
  *result_listener << "error " << errc_name(arg.error().code) << ": " << arg.error().message;
  return arg.error().code == code;
}

TEST(SafetensorsStageLayers, ContiguousEvenSplitFloorRule) {
  // 10 layers in 4 stages: floor(k*10/4) = 0, 2, 5, 7, 10.
  const int expect[][2] = {{0, 2}, {2, 5}, {5, 7}, {7, 10}};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(stage_layers(k, 4, 10).begin, expect[k][0]);
    EXPECT_EQ(stage_layers(k, 4, 10).end, expect[k][1]);
  }
  for (int layers = 1; layers <= 40; ++layers) {
    for (int stages = 1; stages <= layers; ++stages) {
      int next = 0;
      for (int k = 0; k < stages; ++k) {
        const LayerSpan s = stage_layers(k, stages, layers);
        ASSERT_EQ(s.begin, next) << layers << "/" << stages;
        const int size = s.end - s.begin;
        ASSERT_TRUE(size == layers / stages || size == layers / stages + 1);
        next = s.end;
      }
      ASSERT_EQ(next, layers);
    }
  }
}

std::string config(const std::string& model_type, int layers, std::optional<bool> tie = {}) {
  std::string c =
      R"({"model_type":")" + model_type + R"(","num_hidden_layers":)" + std::to_string(layers);
  if (tie) c += std::string(R"(,"tie_word_embeddings":)") + (*tie ? "true" : "false");
  return c + "}";
}

struct FamilyCase {
  std::string label;
  FamilyModel model;
  std::optional<bool> tie;
  bool tied;  // expected: the last stage holds the token embedding as well
};

void PrintTo(const FamilyCase& c, std::ostream* os) {
  *os << c.label;
}

class SafetensorsStagePlan : public ::testing::TestWithParam<FamilyCase> {};

// Each stage of 4 over 8 layers gets exactly its layers, the first the inputs, the last the
// final norm and head; over the 4 stages every tensor is covered exactly once, except the
// token embedding of a tied model, which stages 0 and 3 both fetch (by design: the tied LM
// head on the last stage multiplies by it).
TEST_P(SafetensorsStagePlan, FourStagesCoverEveryTensorOnce) {
  const FamilyCase& c = GetParam();
  const auto m =
      assemble_model({{"model.safetensors", c.model.file()}}, config(c.model.model_type, 8, c.tie));
  ASSERT_TRUE(m) << m.error().message;
  std::vector<FetchPlan> plans;
  for (int k = 0; k < 4; ++k) {
    auto plan = plan_stage(*m, k, 4);
    ASSERT_TRUE(plan) << plan.error().message;
    testing::expect_well_formed(*m, *plan);
    EXPECT_EQ(plan->stage, k);
    EXPECT_EQ(plan->num_stages, 4);
    EXPECT_EQ(plan->layer_begin, 2 * k);
    EXPECT_EQ(plan->layer_end, 2 * k + 2);
    EXPECT_EQ(plan->has_embedding, k == 0);
    EXPECT_EQ(plan->has_final, k == 3);
    EXPECT_EQ(plan->tied_embedding, k == 3 && c.tied);

    std::vector<std::string> expected;
    if (k == 0) expected = c.model.first;
    for (int l = 2 * k; l < 2 * k + 2; ++l) {
      expected.insert(expected.end(), c.model.layers[l].begin(), c.model.layers[l].end());
    }
    if (k == 3) {
      expected.insert(expected.end(), c.model.last.begin(), c.model.last.end());
      if (c.tied) expected.push_back(c.model.token_embedding);
    }
    std::vector<std::string> got = plan->tensors();
    std::sort(got.begin(), got.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(got, expected) << "stage " << k;
    plans.push_back(std::move(*plan));
  }

  const auto count = testing::coverage(plans);
  const auto all = c.model.all();
  EXPECT_EQ(count.size(), all.size());
  for (const std::string& name : all) {
    const int expected = c.tied && name == c.model.token_embedding ? 2 : 1;
    EXPECT_EQ(count.count(name) ? count.at(name) : 0, expected) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, SafetensorsStagePlan,
    ::testing::Values(
        FamilyCase{"gpt2_tied", testing::gpt2_model(8, true, false), std::nullopt, true},
        FamilyCase{"gpt2_unprefixed_head_untied", testing::gpt2_model(8, false, true), false,
                   false},
        FamilyCase{"llama_untied", testing::llama_model(8, true), std::nullopt, false},
        FamilyCase{"mistral_no_head_tied", testing::llama_model(8, false, "mistral"), std::nullopt,
                   true},
        FamilyCase{"qwen2_tied_by_config", testing::llama_model(8, true, "qwen2"), true, true},
        FamilyCase{"opt_tied", testing::opt_model(8, true), std::nullopt, true},
        FamilyCase{"opt_base_names", testing::opt_model(8, false), std::nullopt, true},
        FamilyCase{"falcon_tied_by_default", testing::falcon_model(8), std::nullopt, true},
        FamilyCase{"falcon_untied", testing::falcon_model(8), false, false}),
    [](const ::testing::TestParamInfo<FamilyCase>& info) { return info.param.label; });

TEST(SafetensorsFetchPlan, MergesAdjacentTensorsAndKeepsTheHeaderFirst) {
  // File order: a, b (layer 0), c (layer 1), d (layer 0), e (final).
  testing::FileBuilder b;
  b.tensor("model.layers.0.a.weight", "F32", {4})
      .tensor("model.layers.0.b.weight", "F32", {4})
      .tensor("model.layers.1.c.weight", "F32", {4})
      .tensor("model.layers.0.d.weight", "F32", {2})
      .tensor("model.layers.0.z.weight", "F32", {0})
      .tensor("model.embed_tokens.weight", "F32", {8})
      .tensor("model.norm.weight", "F32", {4})
      .tensor("lm_head.weight", "F32", {8});
  const auto m = assemble_model({{"model.safetensors", b}}, config("llama", 2));
  ASSERT_TRUE(m) << m.error().message;
  const auto plan = plan_stage(*m, 0, 2);
  ASSERT_TRUE(plan) << plan.error().message;
  testing::expect_well_formed(*m, *plan);
  const Header& h = m->shards()[0];
  const FileFetch& f = plan->files.back();
  ASSERT_EQ(f.ranges.size(), 3u);
  EXPECT_EQ(f.ranges[0].end, h.data_begin());
  EXPECT_THAT(f.ranges[0].tensors, ElementsAre("model.layers.0.z.weight"));  // zero-size
  EXPECT_EQ(f.ranges[1].begin, h.data_begin());
  EXPECT_EQ(f.ranges[1].end, h.data_begin() + 32);
  EXPECT_THAT(f.ranges[1].tensors,
              ElementsAre("model.layers.0.a.weight", "model.layers.0.b.weight"));
  // d, z (empty) and the embedding are adjacent: one range.
  EXPECT_THAT(f.ranges[2].tensors,
              ElementsAre("model.layers.0.d.weight", "model.embed_tokens.weight"));
  EXPECT_EQ(f.ranges[2].end - f.ranges[2].begin, 8u + 32u);
  EXPECT_EQ(f.bytes(), h.data_begin() + 32 + 40);
}

TEST(SafetensorsFetchPlan, EveryStageFetchesSmallFilesAndEveryHeader) {
  // Two shards: layers 0-1 in the first, layers 2-3 and the rest in the second. Stage 0 of 2
  // needs nothing from the second shard but its header.
  const FamilyModel model = testing::llama_model(4, true);
  testing::FileBuilder first, second;
  std::vector<std::pair<std::string, std::string>> map;
  for (const std::string& n : model.all()) {
    const bool in_first = n.starts_with("model.layers.0.") || n.starts_with("model.layers.1.");
    (in_first ? first : second).tensor(n, "BF16", {2, 2});
    map.emplace_back(
        n, in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
  }
  std::sort(map.begin(), map.end());
  const auto m = assemble_model(
      {{"model-00001-of-00002.safetensors", first}, {"model-00002-of-00002.safetensors", second}},
      config("llama", 4), testing::index_for(map));
  ASSERT_TRUE(m) << m.error().message;
  const auto plan = plan_stage(*m, 1, 2);
  ASSERT_TRUE(plan) << plan.error().message;
  testing::expect_well_formed(*m, *plan);
  std::vector<std::string> files;
  for (const FileFetch& f : plan->files) files.push_back(f.file);
  EXPECT_THAT(files,
              ElementsAre("config.json", "model.safetensors.index.json", "tokenizer.json",
                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  const FileFetch& shard1 = plan->files[3];
  ASSERT_EQ(shard1.ranges.size(), 1u);  // only the header: stage 1 has layers 2-3
  EXPECT_EQ(shard1.bytes(), m->shards()[0].data_begin());
  // The second shard: all of it but the (untied) token embedding, which is stage 0's.
  EXPECT_EQ(plan->files[4].bytes(),
            m->shards()[1].file_size() - m->find("model.embed_tokens.weight")->bytes());
}

TEST(SafetensorsFetchPlan, FullPlanCoversEverything) {
  const FamilyModel model = testing::gpt2_model(3, true, false);
  const auto m = assemble_model({{"model.safetensors", model.file()}}, config("gpt2", 3));
  ASSERT_TRUE(m);
  const FetchPlan plan = plan_full(*m);
  testing::expect_well_formed(*m, plan);
  EXPECT_EQ(plan.tensors().size(), model.all().size());
  std::uint64_t expected = m->shards()[0].file_size();
  for (const FileEntry& f : m->small_files()) expected += f.size;
  EXPECT_EQ(plan.bytes(), expected);
}

TEST(SafetensorsFetchPlan, StagesOutOfRangeAreRefused) {
  const auto m = assemble_model({{"model.safetensors", testing::llama_model(3, true).file()}},
                                config("llama", 3));
  ASSERT_TRUE(m);
  EXPECT_THAT(plan_stage(*m, 0, 0), Fails(errc::invalid_stage));
  EXPECT_THAT(plan_stage(*m, -1, 2), Fails(errc::invalid_stage));
  EXPECT_THAT(plan_stage(*m, 2, 2), Fails(errc::invalid_stage));
  const auto too_many = plan_stage(*m, 0, 4);
  ASSERT_THAT(too_many, Fails(errc::invalid_stage));
  EXPECT_THAT(too_many.error().message,
              HasSubstr("stage 0 of 4 does not exist for a model of 3 layers"));
  EXPECT_TRUE(plan_stage(*m, 2, 3));
  // One stage is the whole model.
  const auto one = plan_stage(*m, 0, 1);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->tensors().size(), m->tensor_count());
}

TEST(SafetensorsFetchPlan, LayerInferenceErrorsPropagate) {
  auto model = testing::gpt2_model(2, true, false);
  model.last.push_back("transformer.mystery");
  const auto m = assemble_model({{"model.safetensors", model.file()}}, config("gpt2", 2));
  ASSERT_TRUE(m);
  EXPECT_THAT(plan_stage(*m, 0, 2), Fails(errc::unknown_tensor_name));
}

}  // namespace
}  // namespace thaw::safetensors
