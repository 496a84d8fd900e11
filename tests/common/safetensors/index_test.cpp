// model.safetensors.index.json parsing, and the checks that tie an index to its shards.
#include "common/safetensors/index.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model_builder.hpp"
#include "temp_dir.hpp"

namespace thaw::safetensors {
namespace {

using namespace std::literals;
using testing::assemble_model;
using ::testing::ElementsAre;
using testing::FileBuilder;
using ::testing::HasSubstr;
using testing::index_for;
using ::testing::Pair;

MATCHER_P(Fails, code, "") {
  if (arg) {
    *result_listener << "succeeded";
    return false;
  }
  *result_listener << "error " << errc_name(arg.error().code) << ": " << arg.error().message;
  return arg.error().code == code;
}

TEST(SafetensorsIndex, ParsesWeightMapAndTotalSize) {
  const auto index = parse_index(R"({"metadata":{"total_size":48,"format":"pt"},"weight_map":{
      "b.weight":"model-00002-of-00002.safetensors","a.weight":"model-00001-of-00002.safetensors",
      "c.weight":"model-00001-of-00002.safetensors"}})",
                                 "index.json");
  ASSERT_TRUE(index) << index.error().message;
  EXPECT_EQ(index->total_size, 48u);
  EXPECT_THAT(index->weight_map, ElementsAre(Pair("a.weight", "model-00001-of-00002.safetensors"),
                                             Pair("b.weight", "model-00002-of-00002.safetensors"),
                                             Pair("c.weight", "model-00001-of-00002.safetensors")));
  EXPECT_THAT(index->files,
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  ASSERT_NE(index->shard_of("b.weight"), nullptr);
  EXPECT_EQ(*index->shard_of("b.weight"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(index->shard_of("d.weight"), nullptr);
}

TEST(SafetensorsIndex, MetadataIsOptionalAndTotalSizeMayBeAnIntegralFloat) {
  const auto bare = parse_index(R"({"weight_map":{"a":"m.safetensors"}})", "i");
  ASSERT_TRUE(bare) << bare.error().message;
  EXPECT_FALSE(bare->total_size);
  const auto f = parse_index(
      R"({"metadata":{"total_size":16060522496.0},"weight_map":{"a":"m.safetensors"}})", "i");
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->total_size, 16060522496u);
}

TEST(SafetensorsIndex, MalformedIndexesAreRefused) {
  EXPECT_THAT(parse_index("[]", "i"), Fails(errc::invalid_index));
  EXPECT_THAT(parse_index("{}", "i"), Fails(errc::invalid_index));
  EXPECT_THAT(parse_index(R"({"weight_map":[]})", "i"), Fails(errc::invalid_index));
  EXPECT_THAT(parse_index(R"({"weight_map":{}})", "i"), Fails(errc::invalid_index));
  EXPECT_THAT(parse_index(R"({"weight_map":{"a":1}})", "i"), Fails(errc::invalid_index));
  EXPECT_THAT(parse_index(R"({"metadata":[],"weight_map":{"a":"m.safetensors"}})", "i"),
              Fails(errc::invalid_index));
  EXPECT_THAT(
      parse_index(R"({"metadata":{"total_size":-1},"weight_map":{"a":"m.safetensors"}})", "i"),
      Fails(errc::invalid_index));
  EXPECT_THAT(
      parse_index(R"({"metadata":{"total_size":"1"},"weight_map":{"a":"m.safetensors"}})", "i"),
      Fails(errc::invalid_index));
  EXPECT_THAT(parse_index(R"({"weight_map":{"a":"m.safetensors","a":"n.safetensors"}})", "i"),
              Fails(errc::duplicate_key));
  EXPECT_THAT(parse_index("{\"weight_map\":{\"a\":\"m.safetensors\"}}\0"sv, "i"),
              Fails(errc::invalid_json));
  EXPECT_THAT(parse_index("{\"weight_map\":{\"a\":\"\xff.safetensors\"}}", "i"),
              Fails(errc::invalid_utf8));
}

TEST(SafetensorsIndex, ShardNamesCannotLeaveTheModelDirectory) {
  for (const std::string bad :
       {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", "..", "", "model.bin",
        ".hidden.safetensors", "a\\\\b.safetensors", "a\\u0000.safetensors"}) {
    const auto index = parse_index(R"({"weight_map":{"t":")" + bad + R"("}})", "index.json");
    ASSERT_THAT(index, Fails(errc::invalid_index)) << bad;
    EXPECT_THAT(index.error().message,
                HasSubstr("index.json: \"weight_map\" maps tensor 't' to shard"));
  }
}

// ---- An index against its shards (Model::assemble). ----

std::vector<testing::ShardSpec> two_shards() {
  return {{"model-00001-of-00002.safetensors",
           FileBuilder().tensor("a", "F16", {4}).tensor("b", "F16", {4})},
          {"model-00002-of-00002.safetensors", FileBuilder().tensor("c", "F16", {4})}};
}

TEST(SafetensorsIndex, ConsistentIndexAssembles) {
  const auto m = assemble_model(two_shards(), std::nullopt,
                                index_for({{"a", "model-00001-of-00002.safetensors"},
                                           {"b", "model-00001-of-00002.safetensors"},
                                           {"c", "model-00002-of-00002.safetensors"}}));
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->shards().size(), 2u);
  EXPECT_EQ(m->tensor_count(), 3u);
  EXPECT_EQ(m->tensor_bytes(), 24u);
  const Header* shard = nullptr;
  ASSERT_NE(m->find("c", &shard), nullptr);
  EXPECT_EQ(shard->file(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(m->find("d"), nullptr);
}

TEST(SafetensorsIndex, IndexNamingAMissingShardIsRefused) {
  const auto m = assemble_model(two_shards(), std::nullopt,
                                index_for({{"a", "model-00001-of-00002.safetensors"},
                                           {"b", "model-00001-of-00002.safetensors"},
                                           {"c", "model-00003-of-00002.safetensors"}}));
  ASSERT_THAT(m, Fails(errc::index_missing_shard));
  EXPECT_THAT(m.error().message,
              HasSubstr("tensor 'c' to shard 'model-00003-of-00002.safetensors'"));
}

TEST(SafetensorsIndex, IndexTensorMissingFromItsShardIsRefused) {
  const auto m = assemble_model(two_shards(), std::nullopt,
                                index_for({{"a", "model-00001-of-00002.safetensors"},
                                           {"b", "model-00001-of-00002.safetensors"},
                                           {"c", "model-00002-of-00002.safetensors"},
                                           {"d", "model-00002-of-00002.safetensors"}}));
  ASSERT_THAT(m, Fails(errc::index_tensor_missing));
  EXPECT_THAT(m.error().message, HasSubstr("tensor 'd'"));
}

TEST(SafetensorsIndex, ShardTensorNotInTheIndexIsRefused) {
  const auto m = assemble_model(two_shards(), std::nullopt,
                                index_for({{"a", "model-00001-of-00002.safetensors"},
                                           {"c", "model-00002-of-00002.safetensors"}}));
  ASSERT_THAT(m, Fails(errc::index_tensor_unlisted));
  EXPECT_THAT(m.error().message, HasSubstr("tensor 'b' is not in the index"));
}

TEST(SafetensorsIndex, TensorInTheWrongShardIsRefused) {
  // "b" is in shard 1, the index says shard 2 (whose header does not have it).
  auto m = assemble_model(two_shards(), std::nullopt,
                          index_for({{"a", "model-00001-of-00002.safetensors"},
                                     {"b", "model-00002-of-00002.safetensors"},
                                     {"c", "model-00002-of-00002.safetensors"}}));
  EXPECT_THAT(m, Fails(errc::index_tensor_missing));
  // The same tensor in both shards: the index can name only one of them.
  auto shards = two_shards();
  shards[1].contents.tensor("a", "F16", {4});
  m = assemble_model(shards, std::nullopt,
                     index_for({{"a", "model-00001-of-00002.safetensors"},
                                {"b", "model-00001-of-00002.safetensors"},
                                {"c", "model-00002-of-00002.safetensors"}}));
  ASSERT_THAT(m, Fails(errc::index_tensor_unlisted));
  EXPECT_THAT(m.error().message,
              HasSubstr("tensor 'a' is mapped to shard 'model-00001-of-00002.safetensors'"));
}

TEST(SafetensorsIndex, SeveralWeightFilesNeedAnIndex) {
  EXPECT_THAT(assemble_model(two_shards(), std::nullopt), Fails(errc::invalid_index));
  EXPECT_THAT(assemble_model({}, std::nullopt), Fails(errc::no_weights));
}

// ---- A model directory on disk. ----

TEST(SafetensorsModelDir, OpensAShardedDirectory) {
  testing::TempDir dir;
  for (const auto& s : two_shards()) testing::write_file(dir.path() / s.file, s.contents.build());
  testing::write_file(dir.path() / "model.safetensors.index.json",
                      index_for({{"a", "model-00001-of-00002.safetensors"},
                                 {"b", "model-00001-of-00002.safetensors"},
                                 {"c", "model-00002-of-00002.safetensors"}}));
  testing::write_file(dir.path() / "config.json",
                      R"({"model_type":"llama","num_hidden_layers":2})");
  testing::write_file(dir.path() / "tokenizer.json", "{}");
  testing::write_file(dir.path() / "README.md", "# hi");
  testing::write_file(dir.path() / "pytorch_model.bin", "not fetched");
  const auto m = Model::open(dir.path());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->label(), dir.path().string());
  ASSERT_EQ(m->shards().size(), 2u);
  EXPECT_EQ(m->shards()[0].file(), "model-00001-of-00002.safetensors");
  ASSERT_TRUE(m->config());
  EXPECT_EQ(m->config()->model_type, "llama");
  EXPECT_EQ(m->config()->num_layers, 2);
  std::vector<std::string> small;
  for (const FileEntry& f : m->small_files()) small.push_back(f.name);
  EXPECT_THAT(small, ElementsAre("config.json", "model.safetensors.index.json", "tokenizer.json"));
}

TEST(SafetensorsModelDir, MissingShardFileIsNamed) {
  testing::TempDir dir;
  const auto shards = two_shards();
  testing::write_file(dir.path() / shards[0].file, shards[0].contents.build());
  testing::write_file(dir.path() / "model.safetensors.index.json",
                      index_for({{"a", "model-00001-of-00002.safetensors"},
                                 {"b", "model-00001-of-00002.safetensors"},
                                 {"c", "model-00002-of-00002.safetensors"}}));
  const auto m = Model::open(dir.path());
  ASSERT_THAT(m, Fails(errc::index_missing_shard));
  EXPECT_THAT(m.error().message,
              HasSubstr("'model-00002-of-00002.safetensors', which is not in the directory"));
}

TEST(SafetensorsModelDir, BadShardErrorsCarryTheFullPath) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "model.safetensors",
                      FileBuilder().tensor_at("w", "F32", {3, 5}, 0, 100).build());
  const auto m = Model::open(dir.path());
  ASSERT_THAT(m, Fails(errc::size_mismatch));
  EXPECT_THAT(m.error().message,
              HasSubstr((dir.path() / "model.safetensors").string() + ": tensor 'w'"));
}

TEST(SafetensorsModelDir, DirectoryWithoutWeightsIsRefused) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "config.json", "{}");
  EXPECT_THAT(Model::open(dir.path()), Fails(errc::no_weights));
  EXPECT_THAT(Model::open(dir.path() / "absent"), Fails(errc::io));
}

TEST(SafetensorsModelDir, MalformedConfigIsRefused) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "model.safetensors",
                      FileBuilder().tensor("w", "F32", {1}).build());
  testing::write_file(dir.path() / "config.json", R"({"num_hidden_layers":"two"})");
  const auto m = Model::open(dir.path());
  ASSERT_THAT(m, Fails(errc::invalid_config));
  EXPECT_THAT(m.error().message, HasSubstr("config.json: \"num_hidden_layers\" is \"two\""));
}

TEST(SafetensorsModelDir, SmallFileSelection) {
  for (const char* yes :
       {"config.json", "generation_config.json", "tokenizer.model", "merges.txt", "vocab.json",
        "qwen.tiktoken", "chat_template.jinja", "modeling_x.py", "model.safetensors.index.json"}) {
    EXPECT_TRUE(is_small_model_file(yes)) << yes;
  }
  for (const char* no : {"model.safetensors", "pytorch_model.bin", "README.md", ".gitattributes",
                         "model.gguf", "consolidated.pth", ""}) {
    EXPECT_FALSE(is_small_model_file(no)) << no;
  }
}

}  // namespace
}  // namespace thaw::safetensors
