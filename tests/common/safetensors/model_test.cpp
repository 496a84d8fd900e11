// Real files: the tiny GPT-2 in ../shared/data/models (as Hugging Face saved it) and models
// written by the reference engine's generator, thaw-genmodel, generated here at test time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/safetensors/fetch_plan.hpp"
#include "common/safetensors/header.hpp"
#include "common/safetensors/layers.hpp"
#include "common/safetensors/model.hpp"
#include "plan_checks.hpp"
#include "temp_dir.hpp"

#ifndef THAW_SHARED_MODELS_DIR
#error \
    "THAW_SHARED_MODELS_DIR must name ../shared/data/models (tests/common/safetensors/CMakeLists.txt)"
#endif
#ifndef THAW_GENMODEL
#error "THAW_GENMODEL must name the thaw-genmodel binary (tests/common/safetensors/CMakeLists.txt)"
#endif

namespace thaw::safetensors {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::ElementsAre;

fs::path tiny_gpt2_dir() {
  return fs::path(THAW_SHARED_MODELS_DIR) / "tiny_gpt2";
}

TEST(SafetensorsRealModel, TinyGpt2Parses) {
  const fs::path dir = tiny_gpt2_dir();
  ASSERT_TRUE(fs::is_regular_file(dir / "model.safetensors"))
      << "the tiny GPT-2 test model is missing: expected " << dir
      << "/model.safetensors (the shared data next to the repository, ../shared/data/models)";
  const auto h = read_header(dir / "model.safetensors");
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->header_size(), 1200u);
  EXPECT_EQ(h->file_size(), 9880u);
  EXPECT_EQ(h->tensors().size(), 16u);
  EXPECT_EQ(h->metadata().at("format"), "pt");
  const TensorInfo* wte = h->find("wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->dtype, Dtype::F32);
  EXPECT_EQ(wte->shape, (std::vector<std::uint64_t>{21, 2}));
  EXPECT_EQ(wte->begin, 8u + 1200u + 8504u);
  EXPECT_EQ(wte->end, 9880u);

  const auto m = Model::open(dir);
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_TRUE(m->config());
  EXPECT_EQ(m->config()->model_type, "gpt2");
  EXPECT_THAT(m->config()->architectures, ElementsAre("GPT2Model"));
  EXPECT_EQ(m->config()->num_layers, 1);
  std::vector<std::string> small;
  for (const FileEntry& f : m->small_files()) small.push_back(f.name);
  EXPECT_THAT(small, ElementsAre("config.json", "merges.txt", "special_tokens_map.json",
                                 "tokenizer_config.json", "vocab.json"));

  // Saved as GPT2Model: names without "transformer.", no lm_head, so the head is tied.
  const auto layout = infer_layout(*m);
  ASSERT_TRUE(layout) << layout.error().message;
  EXPECT_EQ(layout->family, Family::gpt2);
  EXPECT_EQ(layout->num_layers, 1);
  EXPECT_FALSE(layout->has_lm_head);
  EXPECT_TRUE(layout->tied_lm_head);
  const auto plan = plan_stage(*m, 0, 1);
  ASSERT_TRUE(plan) << plan.error().message;
  testing::expect_well_formed(*m, *plan);
  EXPECT_TRUE(plan->tied_embedding);
  // One stage: the whole file, wte listed once (the tie adds no second copy within a stage).
  EXPECT_EQ(plan->tensors().size(), 16u);
  EXPECT_EQ(plan->files.back().bytes(), 9880u);
}

// Runs thaw-genmodel into a fresh directory.
void genmodel(const fs::path& out, std::vector<std::string> extra) {
  std::vector<std::string> args = {
      THAW_GENMODEL, "--size",  "custom", "--layers",    "8",  "--embd", "16",         "--heads",
      "2",           "--vocab", "64",     "--positions", "32", "--out",  out.string(), "-q"};
  args.insert(args.end(), extra.begin(), extra.end());
  ASSERT_EQ(testing::run_program(args), 0) << "thaw-genmodel failed: " << THAW_GENMODEL;
}

TEST(SafetensorsGeneratedModel, SingleFileParses) {
  testing::TempDir tmp;
  for (const char* dtype : {"f32", "f16", "bf16"}) {
    SCOPED_TRACE(dtype);
    const fs::path dir = tmp.path() / dtype;
    ASSERT_NO_FATAL_FAILURE(genmodel(dir, {"--dtype", dtype}));
    const auto m = Model::open(dir);
    ASSERT_TRUE(m) << m.error().message;
    ASSERT_EQ(m->shards().size(), 1u);
    EXPECT_FALSE(m->index());
    EXPECT_EQ(m->shards()[0].header_size() % 8, 0u);
    // wte, wpe, 12 per layer, ln_f weight and bias.
    EXPECT_EQ(m->tensor_count(), 2u + 8u * 12u + 2u);
    const TensorInfo* wte = m->find("transformer.wte.weight");
    ASSERT_NE(wte, nullptr);
    EXPECT_EQ(wte->shape, (std::vector<std::uint64_t>{64, 16}));
    EXPECT_EQ(dtype_name(wte->dtype), std::string(dtype == std::string("f32")   ? "F32"
                                                  : dtype == std::string("f16") ? "F16"
                                                                                : "BF16"));
    const auto layout = infer_layout(*m);
    ASSERT_TRUE(layout) << layout.error().message;
    EXPECT_EQ(layout->num_layers, 8);
    EXPECT_TRUE(layout->tied_lm_head);
  }
}

TEST(SafetensorsGeneratedModel, ShardedModelParsesAndFourStagesCoverItOnce) {
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "sharded";
  ASSERT_NO_FATAL_FAILURE(genmodel(dir, {"--shard-size", "20000"}));
  ASSERT_TRUE(fs::is_regular_file(dir / "model.safetensors.index.json"));
  const auto m = Model::open(dir);
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_TRUE(m->index());
  EXPECT_GT(m->shards().size(), 3u);
  EXPECT_EQ(m->index()->total_size, m->tensor_bytes());
  EXPECT_EQ(m->index()->weight_map.size(), m->tensor_count());

  std::vector<FetchPlan> plans;
  for (int k = 0; k < 4; ++k) {
    auto plan = plan_stage(*m, k, 4);
    ASSERT_TRUE(plan) << plan.error().message;
    testing::expect_well_formed(*m, *plan);
    EXPECT_EQ(plan->layer_begin, 2 * k);
    EXPECT_EQ(plan->layer_end, 2 * k + 2);
    for (const std::string& t : plan->tensors()) {
      const auto layer_at = t.find("transformer.h.");
      if (layer_at == std::string::npos) continue;
      const int layer = std::stoi(t.substr(14));
      EXPECT_TRUE(layer >= 2 * k && layer < 2 * k + 2) << t << " in stage " << k;
    }
    plans.push_back(std::move(*plan));
  }
  // Every tensor exactly once, except wte: the tied LM head makes the last stage fetch it too.
  const auto count = testing::coverage(plans);
  EXPECT_EQ(count.size(), m->tensor_count());
  for (const auto& [name, n] : count) {
    EXPECT_EQ(n, name == "transformer.wte.weight" ? 2 : 1) << name;
  }
  EXPECT_THAT(plans[0].tensors(), Contains("transformer.wpe.weight"));
  EXPECT_THAT(plans[3].tensors(), Contains("transformer.ln_f.weight"));
  EXPECT_TRUE(plans[3].tied_embedding);

  // The data bytes of the four plans add up to the model's, plus wte once more.
  std::uint64_t data = 0;
  for (const FetchPlan& p : plans) {
    for (const FileFetch& f : p.files) {
      for (std::size_t r = f.whole ? 0 : 1; r < f.ranges.size(); ++r) {
        data += f.whole ? 0 : f.ranges[r].end - f.ranges[r].begin;
      }
    }
  }
  EXPECT_EQ(data, m->tensor_bytes() + m->find("transformer.wte.weight")->bytes());
}

}  // namespace
}  // namespace thaw::safetensors
