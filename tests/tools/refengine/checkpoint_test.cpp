// The reference engine's checkpoint reader (tools/refengine/safetensors, checkpoint): the real
// tiny GPT-2 loads, both tensor namings and sharded indexes work, every malformed file gives a
// one-line error naming the file and tensor, tensors are views of a second, private file
// mapping (the header having been read through a first open, as safetensors + PyTorch do), and
// pipeline stages load only their layers. Small safetensors files are written here.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "open_counter.hpp"
#include "safetensors.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using refengine::Checkpoint;
using refengine::StageSpec;
using refengine::TensorView;

namespace {

struct Spec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype = "F32";
};

std::size_t elems(const std::vector<std::int64_t>& s) {
  std::size_t n = 1;
  for (auto d : s) n *= static_cast<std::size_t>(d);
  return n;
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file image from a raw header text and a data section of `data_bytes` patterned bytes.
std::string image(const std::string& header, std::size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (std::size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i * 7 + 1);
  return le64(header.size()) + header + data;
}

// A valid header for the specs laid out contiguously, and the data size.
std::pair<json, std::size_t> layout(const std::vector<Spec>& specs) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::size_t off = 0;
  for (const auto& s : specs) {
    std::size_t bytes = elems(s.shape) * (s.dtype == "F32" ? 4 : s.dtype == "F64" ? 8 : 2);
    h[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  return {h, off};
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << p;
}

void write_st(const fs::path& p, const std::vector<Spec>& specs) {
  auto [h, n] = layout(specs);
  write_file(p, image(h.dump(), n));
}

struct Cfg {
  int n_embd = 4, n_layer = 2, n_head = 2, n_positions = 8, vocab = 11;
};

std::vector<Spec> layer_specs(const Cfg& c, int i, const std::string& prefix) {
  const std::int64_t e = c.n_embd, in = 4 * e;
  const std::string p = prefix + "h." + std::to_string(i) + ".";
  return {{p + "ln_1.weight", {e}},
          {p + "ln_1.bias", {e}},
          {p + "attn.c_attn.weight", {e, 3 * e}},
          {p + "attn.c_attn.bias", {3 * e}},
          {p + "attn.c_proj.weight", {e, e}},
          {p + "attn.c_proj.bias", {e}},
          {p + "ln_2.weight", {e}},
          {p + "ln_2.bias", {e}},
          {p + "mlp.c_fc.weight", {e, in}},
          {p + "mlp.c_fc.bias", {in}},
          {p + "mlp.c_proj.weight", {in, e}},
          {p + "mlp.c_proj.bias", {e}}};
}

std::vector<Spec> model_specs(const Cfg& c, const std::string& prefix) {
  std::vector<Spec> s{{prefix + "wte.weight", {c.vocab, c.n_embd}},
                      {prefix + "wpe.weight", {c.n_positions, c.n_embd}}};
  for (int i = 0; i < c.n_layer; ++i)
    for (auto& t : layer_specs(c, i, prefix)) s.push_back(t);
  s.push_back({prefix + "ln_f.weight", {c.n_embd}});
  s.push_back({prefix + "ln_f.bias", {c.n_embd}});
  return s;
}

void write_config(const fs::path& dir, const Cfg& c, const std::string& dtype = "float32") {
  json j = {{"model_type", "gpt2"}, {"n_embd", c.n_embd},           {"n_layer", c.n_layer},
            {"n_head", c.n_head},   {"n_positions", c.n_positions}, {"vocab_size", c.vocab},
            {"n_inner", nullptr},   {"layer_norm_epsilon", 1e-5},   {"torch_dtype", dtype}};
  write_file(dir / "config.json", j.dump(2));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "refengine-ckpt-XXXXXX").string();
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads everything; returns the canonical names handed to the callback, or the error.
  static std::expected<std::vector<std::string>, std::string> load_names(
      const fs::path& dir, StageSpec stage = {}, std::vector<std::string>* files = nullptr) {
    auto ck = Checkpoint::open(dir);
    if (!ck) return std::unexpected(ck.error());
    std::vector<std::string> names;
    auto r = ck->load(
        stage,
        [&](const TensorView& t) -> std::expected<void, std::string> {
          names.emplace_back(t.name);
          return {};
        },
        [&](const refengine::FileLoaded& f) {
          if (files) files->push_back(fs::path(f.path).filename().string());
        });
    if (!r) return std::unexpected(r.error());
    return names;
  }

  // An error from loading `dir` (the test fails if loading succeeds).
  static std::string load_error(const fs::path& dir) {
    auto r = load_names(dir);
    EXPECT_FALSE(r.has_value()) << "loading " << dir << " should fail";
    return r ? std::string() : r.error();
  }

  fs::path dir_;
};

void expect_one_line_naming(const std::string& err, const std::string& file,
                            const std::string& tensor = "") {
  EXPECT_FALSE(err.empty());
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_NE(err.find(file), std::string::npos) << "error does not name " << file << ": " << err;
  if (!tensor.empty())
    EXPECT_NE(err.find("'" + tensor + "'"), std::string::npos)
        << "error does not name tensor " << tensor << ": " << err;
}

// ---- the real tiny model ----

TEST_F(CheckpointTest, RealTinyGpt2LoadsWithBytesEqualToTheFile) {
  const fs::path dir = REFENGINE_TINY_GPT2_DIR;
  ASSERT_TRUE(fs::exists(dir / "model.safetensors")) << "the real tiny model is missing: " << dir;
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck) << ck.error();
  const auto& c = ck->config();
  EXPECT_EQ(c.n_embd, 2);
  EXPECT_EQ(c.n_layer, 1);
  EXPECT_EQ(c.n_head, 1);
  EXPECT_EQ(c.n_positions, 1024);
  EXPECT_EQ(c.vocab_size, 21);
  EXPECT_EQ(c.n_inner, 8);
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-5);
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_FALSE(ck->sharded());

  // The file read independently, to compare each tensor's bytes.
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto ref = refengine::parse_safetensors(
      std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), "ref");
  ASSERT_TRUE(ref) << ref.error();

  std::set<std::string> seen;
  std::vector<refengine::FileLoaded> files;
  auto r = ck->load(
      {},
      [&](const TensorView& t) -> std::expected<void, std::string> {
        const auto* info = ref->find(t.name);
        EXPECT_NE(info, nullptr) << t.name;
        if (info == nullptr) return {};
        EXPECT_EQ(t.bytes, info->bytes());
        EXPECT_EQ(std::vector<std::int64_t>(t.shape.begin(), t.shape.end()), info->shape);
        EXPECT_EQ(t.dtype, refengine::DType::F32);
        EXPECT_EQ(std::memcmp(t.data, bytes.data() + 8 + ref->header_size + info->begin, t.bytes),
                  0)
            << t.name;
        seen.insert(std::string(t.name));
        return {};
      },
      [&](const refengine::FileLoaded& f) { files.push_back(f); });
  ASSERT_TRUE(r) << r.error();
  std::set<std::string> expected;
  for (const auto& t : ck->expected_tensors({})) expected.insert(t.name);
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(seen.size(), 16u);  // wte, wpe, 12 per layer, ln_f.{weight,bias}
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].tensors, 16u);
  EXPECT_EQ(files[0].file_size, bytes.size());
}

// ---- how the file is read: two opens, a private mapping ----

struct MapLine {
  std::uintptr_t lo, hi;
  std::string perms, path;
};

std::vector<MapLine> maps_of(const std::string& path) {
  std::ifstream in("/proc/self/maps");
  std::vector<MapLine> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string range, perms, off, dev, inode, p;
    ls >> range >> perms >> off >> dev >> inode >> p;
    if (p != path) continue;
    auto dash = range.find('-');
    out.push_back({std::stoull(range.substr(0, dash), nullptr, 16),
                   std::stoull(range.substr(dash + 1), nullptr, 16), perms, p});
  }
  return out;
}

TEST_F(CheckpointTest, TensorsAreViewsOfAPrivateMappingAndTheHeaderCameThroughASeparateOpen) {
  const fs::path file = fs::canonical(fs::path(REFENGINE_TINY_GPT2_DIR) / "model.safetensors");
  auto ck = Checkpoint::open(file.parent_path());
  ASSERT_TRUE(ck) << ck.error();
  watch_opens(file.string());
  int tensors = 0;
  std::size_t mappings_during_load = 0;
  auto r = ck->load({}, [&](const TensorView& t) -> std::expected<void, std::string> {
    const auto maps = maps_of(file.string());
    mappings_during_load = maps.size();
    const auto a = reinterpret_cast<std::uintptr_t>(t.data);
    bool inside = false;
    for (const auto& m : maps)
      if (a >= m.lo && a + t.bytes <= m.hi) {
        inside = true;
        EXPECT_EQ(m.perms, "r--p") << t.name << " lies in a mapping that is not private read-only";
      }
    EXPECT_TRUE(inside) << t.name << " does not lie in a mapping of " << file;
    ++tensors;
    return {};
  });
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(tensors, 16);
  // safetensors' Rust side opens and maps the file for the header; PyTorch opens and maps it
  // again: two opens, two mappings alive while the tensors are handed out.
  EXPECT_EQ(watched_opens(), 2);
  EXPECT_EQ(mappings_during_load, 2u);
  // Both mappings are gone once the load is over (RAII).
  EXPECT_TRUE(maps_of(file.string()).empty());
  watch_opens("");
}

TEST_F(CheckpointTest, MappedFileHasTwoSeparatePrivateMappings) {
  const fs::path file = fs::canonical(fs::path(REFENGINE_TINY_GPT2_DIR) / "model.safetensors");
  watch_opens(file.string());
  {
    auto f = refengine::MappedCheckpointFile::open(file.string());
    ASSERT_TRUE(f) << f.error();
    EXPECT_EQ(watched_opens(), 2);
    auto maps = maps_of(file.string());
    ASSERT_EQ(maps.size(), 2u);
    for (const auto& m : maps) EXPECT_EQ(m.perms, "r--p");
    // Both fds were closed: nothing in /proc/self/fd points at the file.
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      EXPECT_NE(fs::read_symlink(e.path(), ec), file);
    }
    auto moved = std::move(*f);
    EXPECT_EQ(maps_of(file.string()).size(), 2u);
  }
  EXPECT_TRUE(maps_of(file.string()).empty());
  watch_opens("");
}

// ---- namings, tied head, sharding ----

TEST_F(CheckpointTest, TransformerPrefixedNamesLoadUnderCanonicalNamesAndLmHeadIsSkipped) {
  Cfg c;
  write_config(dir_, c);
  auto specs = model_specs(c, "transformer.");
  specs.push_back({"lm_head.weight", {c.vocab, c.n_embd}});
  write_st(dir_ / "model.safetensors", specs);
  auto names = load_names(dir_);
  ASSERT_TRUE(names) << names.error();
  EXPECT_EQ(names->size(), 2u + 12u * c.n_layer + 2u);
  for (const auto& n : *names) {
    EXPECT_FALSE(n.starts_with("transformer.")) << n;
    EXPECT_NE(n, "lm_head.weight");
  }
  EXPECT_NE(std::find(names->begin(), names->end(), "h.1.mlp.c_proj.weight"), names->end());
}

TEST_F(CheckpointTest, UnprefixedNamesLoad) {
  Cfg c;
  write_config(dir_, c);
  write_st(dir_ / "model.safetensors", model_specs(c, ""));
  auto names = load_names(dir_);
  ASSERT_TRUE(names) << names.error();
  EXPECT_EQ(names->size(), 2u + 12u * c.n_layer + 2u);
}

// One shard per layer (plus embeddings in the first, ln_f in the last), with an index.
void write_sharded(const fs::path& dir, const Cfg& c, const std::string& prefix) {
  write_config(dir, c);
  json wm = json::object();
  for (int i = 0; i < c.n_layer; ++i) {
    auto specs = layer_specs(c, i, prefix);
    if (i == 0) {
      specs.push_back({prefix + "wte.weight", {c.vocab, c.n_embd}});
      specs.push_back({prefix + "wpe.weight", {c.n_positions, c.n_embd}});
    }
    if (i == c.n_layer - 1) {
      specs.push_back({prefix + "ln_f.weight", {c.n_embd}});
      specs.push_back({prefix + "ln_f.bias", {c.n_embd}});
    }
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, c.n_layer);
    write_st(dir / name, specs);
    for (const auto& s : specs) wm[s.name] = name;
  }
  json idx = {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}};
  write_file(dir / "model.safetensors.index.json", idx.dump(2));
}

TEST_F(CheckpointTest, ShardedIndexLoadsEveryFileInOrder) {
  Cfg c;
  c.n_layer = 3;
  write_sharded(dir_, c, "transformer.");
  std::vector<std::string> files;
  auto names = load_names(dir_, {}, &files);
  ASSERT_TRUE(names) << names.error();
  EXPECT_EQ(names->size(), 2u + 12u * 3 + 2u);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                             "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors"}));
}

TEST_F(CheckpointTest, IndexedTensorAbsentFromItsFileIsAnError) {
  Cfg c;
  write_sharded(dir_, c, "");
  auto idx = json::parse(std::ifstream(dir_ / "model.safetensors.index.json"));
  idx["weight_map"]["h.0.extra.weight"] = "model-00001-of-00002.safetensors";
  write_file(dir_ / "model.safetensors.index.json", idx.dump());
  expect_one_line_naming(load_error(dir_), "model-00001-of-00002.safetensors", "h.0.extra.weight");
}

TEST_F(CheckpointTest, IndexNamingAMissingFileIsAnError) {
  Cfg c;
  write_sharded(dir_, c, "");
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  auto ck = Checkpoint::open(dir_);
  ASSERT_FALSE(ck);
  expect_one_line_naming(ck.error(), "model-00002-of-00002.safetensors");
}

TEST_F(CheckpointTest, TensorMissingFromTheIndexIsAnError) {
  Cfg c;
  write_sharded(dir_, c, "");
  auto idx = json::parse(std::ifstream(dir_ / "model.safetensors.index.json"));
  idx["weight_map"].erase("h.1.ln_2.bias");
  write_file(dir_ / "model.safetensors.index.json", idx.dump());
  expect_one_line_naming(load_error(dir_), "model.safetensors.index.json", "h.1.ln_2.bias");
}

// ---- pipeline stages ----

TEST_F(CheckpointTest, StagesLoadOnlyTheirLayers) {
  Cfg c;
  c.n_layer = 4;
  write_sharded(dir_, c, "transformer.");
  auto has = [](const std::vector<std::string>& v, const std::string& n) {
    return std::find(v.begin(), v.end(), n) != v.end();
  };
  auto layers = [](const std::vector<std::string>& v) {
    std::set<int> s;
    for (const auto& n : v)
      if (n.starts_with("h.")) s.insert(std::stoi(n.substr(2)));
    return s;
  };

  std::vector<std::string> files;
  auto first = load_names(dir_, {0, 2, true, false}, &files);
  ASSERT_TRUE(first) << first.error();
  EXPECT_EQ(layers(*first), (std::set<int>{0, 1}));
  EXPECT_TRUE(has(*first, "wte.weight"));
  EXPECT_TRUE(has(*first, "wpe.weight"));
  EXPECT_FALSE(has(*first, "ln_f.weight"));
  EXPECT_EQ(first->size(), 2u + 24u);
  EXPECT_EQ(files.size(), 2u);  // shards 3 and 4 are not opened

  files.clear();
  auto middle = load_names(dir_, {1, 3, false, false}, &files);
  ASSERT_TRUE(middle) << middle.error();
  EXPECT_EQ(layers(*middle), (std::set<int>{1, 2}));
  EXPECT_EQ(middle->size(), 24u);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors"}));

  auto last = load_names(dir_, {2, 4, false, true});
  ASSERT_TRUE(last) << last.error();
  EXPECT_EQ(layers(*last), (std::set<int>{2, 3}));
  EXPECT_TRUE(has(*last, "ln_f.weight"));
  EXPECT_TRUE(has(*last, "ln_f.bias"));
  EXPECT_TRUE(has(*last, "wte.weight"));  // the tied LM head
  EXPECT_FALSE(has(*last, "wpe.weight"));
  EXPECT_EQ(last->size(), 24u + 3u);
}

TEST_F(CheckpointTest, ExpectedTensorsUseConv1DLayout) {
  Cfg c;
  write_config(dir_, c);
  write_st(dir_ / "model.safetensors", model_specs(c, ""));
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck) << ck.error();
  std::map<std::string, std::vector<std::int64_t>> m;
  for (const auto& t : ck->expected_tensors(0, -1, true, true)) m[t.name] = t.shape;
  EXPECT_EQ(m["h.0.attn.c_attn.weight"], (std::vector<std::int64_t>{4, 12}));
  EXPECT_EQ(m["h.1.mlp.c_fc.weight"], (std::vector<std::int64_t>{4, 16}));
  EXPECT_EQ(m["h.1.mlp.c_proj.weight"], (std::vector<std::int64_t>{16, 4}));
  EXPECT_EQ(m["wpe.weight"], (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(m.size(), 2u + 24u + 2u);
}

// ---- malformed checkpoints ----

// Writes a model whose file is replaced by `bytes` and returns the load error.
class MalformedTest : public CheckpointTest {
 protected:
  std::string error_for(const std::string& bytes) {
    write_config(dir_, Cfg{});
    write_file(dir_ / "model.safetensors", bytes);
    return load_error(dir_);
  }
  std::string file() const { return (dir_ / "model.safetensors").string(); }
  // A valid model's header, for editing.
  std::pair<json, std::size_t> valid() const { return layout(model_specs(Cfg{}, "")); }
};

TEST_F(MalformedTest, FileShorterThanTheHeaderLength) {
  expect_one_line_naming(error_for("\x10\x00\x00"), file());
}

TEST_F(MalformedTest, TruncatedHeader) {
  auto [h, n] = valid();
  std::string img = image(h.dump(), n);
  expect_one_line_naming(error_for(img.substr(0, 8 + h.dump().size() / 2)), file());
}

TEST_F(MalformedTest, HeaderLengthBeyondTheFile) {
  expect_one_line_naming(error_for(le64(1'000'000) + "{}"), file());
}

TEST_F(MalformedTest, HeaderLengthAboveTheLimit) {
  auto err = error_for(le64(200'000'000) + "{}");
  expect_one_line_naming(err, file());
  EXPECT_NE(err.find("200000000"), std::string::npos) << err;
}

TEST_F(MalformedTest, BadJson) {
  expect_one_line_naming(error_for(image("{\"a\": [1, 2", 0)), file());
}

TEST_F(MalformedTest, InvalidUtf8) {
  expect_one_line_naming(error_for(image("{\"__metadata__\": {\"k\": \"\xff\xfe\"}}", 0)), file());
}

TEST_F(MalformedTest, UnknownDtype) {
  auto [h, n] = valid();
  h["h.0.ln_1.bias"]["dtype"] = "F13";
  auto err = error_for(image(h.dump(), n));
  expect_one_line_naming(err, file(), "h.0.ln_1.bias");
  EXPECT_NE(err.find("F13"), std::string::npos) << err;
}

TEST_F(MalformedTest, OverlappingOffsets) {
  json h = {{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
            {"b", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}}}};
  auto err = error_for(image(h.dump(), 24));
  expect_one_line_naming(err, file(), "b");
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
}

TEST_F(MalformedTest, GapBetweenTensors) {
  json h = {{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
            {"b", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {20, 36}}}}};
  auto err = error_for(image(h.dump(), 36));
  expect_one_line_naming(err, file(), "b");
  EXPECT_NE(err.find("gap"), std::string::npos) << err;
}

TEST_F(MalformedTest, OffsetsBeyondTheDataSection) {
  json h = {{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}};
  auto err = error_for(image(h.dump(), 8));
  expect_one_line_naming(err, file(), "a");
}

TEST_F(MalformedTest, ByteSizeDisagreesWithShape) {
  json h = {{"a", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}}}};
  expect_one_line_naming(error_for(image(h.dump(), 16)), file(), "a");
}

TEST_F(MalformedTest, ShapeWhoseByteSizeOverflows) {
  const std::uint64_t big = 1ull << 62;
  json h = {{"a", {{"dtype", "F32"}, {"shape", {big, big}}, {"data_offsets", {0, 16}}}}};
  expect_one_line_naming(error_for(image(h.dump(), 16)), file(), "a");
}

TEST_F(MalformedTest, TrailingBytes) {
  auto [h, n] = valid();
  auto err = error_for(image(h.dump(), n + 4));
  expect_one_line_naming(err, file());
  EXPECT_NE(err.find("trailing"), std::string::npos) << err;
}

TEST_F(MalformedTest, MetadataValueNotAString) {
  auto [h, n] = valid();
  h["__metadata__"]["format"] = 3;
  expect_one_line_naming(error_for(image(h.dump(), n)), file());
}

TEST_F(MalformedTest, MissingTensor) {
  write_config(dir_, Cfg{});
  auto specs = model_specs(Cfg{}, "");
  std::erase_if(specs, [](const Spec& s) { return s.name == "h.1.attn.c_proj.bias"; });
  write_st(dir_ / "model.safetensors", specs);
  expect_one_line_naming(load_error(dir_), file(), "h.1.attn.c_proj.bias");
}

TEST_F(MalformedTest, ShapeMismatchWithConfigNamesExpectedAndActual) {
  write_config(dir_, Cfg{});
  auto specs = model_specs(Cfg{}, "transformer.");
  for (auto& s : specs)
    if (s.name == "transformer.h.0.attn.c_attn.weight") s.shape = {12, 4};  // nn.Linear layout
  write_st(dir_ / "model.safetensors", specs);
  auto err = load_error(dir_);
  expect_one_line_naming(err, file(), "transformer.h.0.attn.c_attn.weight");
  EXPECT_NE(err.find("[12, 4]"), std::string::npos) << err;
  EXPECT_NE(err.find("[4, 12]"), std::string::npos) << err;
}

TEST_F(MalformedTest, DtypeMismatchWithConfig) {
  write_config(dir_, Cfg{}, "float16");
  write_st(dir_ / "model.safetensors", model_specs(Cfg{}, ""));
  auto err = load_error(dir_);
  expect_one_line_naming(err, file());
  EXPECT_NE(err.find("F16"), std::string::npos) << err;
}

TEST_F(MalformedTest, MissingConfigFieldNamesTheField) {
  json j = {{"n_embd", 4}, {"n_layer", 2}, {"n_head", 2}, {"vocab_size", 11}};
  write_file(dir_ / "config.json", j.dump());
  auto ck = Checkpoint::open(dir_);
  ASSERT_FALSE(ck);
  expect_one_line_naming(ck.error(), "config.json");
  EXPECT_NE(ck.error().find("n_positions"), std::string::npos) << ck.error();
}

TEST_F(MalformedTest, CallbackErrorAbortsTheLoad) {
  write_config(dir_, Cfg{});
  write_st(dir_ / "model.safetensors", model_specs(Cfg{}, ""));
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck) << ck.error();
  int calls = 0;
  auto r = ck->load({}, [&](const TensorView&) -> std::expected<void, std::string> {
    ++calls;
    return std::unexpected(std::string("device copy failed"));
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), "device copy failed");
  EXPECT_EQ(calls, 1);
}

}  // namespace
