// Tests of thaw-genmodel (tools/genmodel): runs the built tool into temporary directories
// and checks what it wrote with a safetensors parser and f16/bf16 converters written here,
// independently of the tool's code, against the safetensors format rules
// (huggingface/safetensors: 8-byte little-endian header length N, N bytes of JSON padded
// with spaces, data_offsets relative to the byte buffer, contiguous, no gaps or overlaps)
// and the Hugging Face GPT2LMHeadModel checkpoint layout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef THAW_GENMODEL_PATH
#error "THAW_GENMODEL_PATH must name the thaw-genmodel executable"
#endif

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class GenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "genmodel_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  Result run(const std::vector<std::string>& args) {
    std::string cmd = quote(THAW_GENMODEL_PATH);
    for (const auto& a : args) cmd += " " + quote(a);
    const fs::path out = tmp_ / "stdout.txt", err = tmp_ / "stderr.txt";
    cmd += " >" + quote(out.string()) + " 2>" + quote(err.string());
    const int status = std::system(cmd.c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out);
    r.err = slurp(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  // Runs the tool into tmp_/name and expects success.
  fs::path gen(const std::string& name, std::vector<std::string> args) {
    const fs::path dir = tmp_ / name;
    args.push_back("--out");
    args.push_back(dir.string());
    const Result r = run(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    return dir;
  }

  fs::path tmp_;
};

// ---------------------------------------------------------------------------------------
// An independent safetensors reader.

struct Tensor {
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
};

struct File {
  std::vector<std::string> order;  // header key order (without __metadata__)
  std::map<std::string, Tensor> tensors;
};

uint64_t dtype_size(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  ADD_FAILURE() << "unexpected dtype " << d;
  return 1;
}

// Checks every rule of the format and returns the tensors; failures are reported with the
// file name.
void parse_into(const fs::path& path, File& f) {
  const std::string raw = slurp(path);
  SCOPED_TRACE(path.string());
  if (raw.size() < 8) {
    ADD_FAILURE() << "shorter than the 8-byte header length";
    return;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u) << "header length " << n << " is not a multiple of 8";
  if (n > raw.size() - 8) {
    ADD_FAILURE() << "header length " << n << " exceeds the file";
    return;
  }
  const std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  // Padding is spaces only, after the closing brace.
  const size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding is not spaces";
  EXPECT_LT(header.size() - close - 1, 8u) << "more padding than needed";
  const json h = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) {
    ADD_FAILURE() << "header is not a JSON object";
    return;
  }
  EXPECT_EQ(h.value("__metadata__", json()), json({{"format", "pt"}}));
  const uint64_t buffer = raw.size() - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    ASSERT_TRUE(t.is_object()) << name;
    EXPECT_EQ(t.size(), 3u) << name << ": " << t.dump();
    Tensor out;
    out.dtype = t.at("dtype").get<std::string>();
    out.shape = t.at("shape").get<std::vector<uint64_t>>();
    const auto off = t.at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(off.size(), 2u) << name;
    ASSERT_LE(off[0], off[1]) << name;
    ASSERT_LE(off[1], buffer) << name;
    uint64_t numel = 1;
    for (uint64_t d : out.shape) numel *= d;
    EXPECT_EQ(off[1] - off[0], numel * dtype_size(out.dtype)) << name;
    out.bytes = raw.substr(8 + n + off[0], off[1] - off[0]);
    spans.emplace_back(off[0], off[1]);
    f.tensors[name] = std::move(out);
  }
  // nlohmann's json sorts keys: recover the header's own key order from the text.
  static const std::regex key_re(R"re("([^"]+)":\{"dtype")re");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), key_re);
       it != std::sregex_iterator(); ++it)
    f.order.push_back((*it)[1]);
  EXPECT_EQ(f.order.size(), f.tensors.size());
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at) << "gap or overlap at offset " << at;
    at = e;
  }
  EXPECT_EQ(at, buffer) << "data does not end at the end of the file";
}

File parse(const fs::path& path) {
  File f;
  parse_into(path, f);
  return f;
}

// The tensors GPT2LMHeadModel's state_dict saves, in state_dict order (lm_head tied).
std::vector<std::pair<std::string, std::vector<uint64_t>>> expected_tensors(uint64_t layers,
                                                                            uint64_t e,
                                                                            uint64_t vocab,
                                                                            uint64_t positions) {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> t;
  t.push_back({"transformer.wte.weight", {vocab, e}});
  t.push_back({"transformer.wpe.weight", {positions, e}});
  for (uint64_t i = 0; i < layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    t.push_back({p + "ln_1.weight", {e}});
    t.push_back({p + "ln_1.bias", {e}});
    t.push_back({p + "attn.c_attn.weight", {e, 3 * e}});
    t.push_back({p + "attn.c_attn.bias", {3 * e}});
    t.push_back({p + "attn.c_proj.weight", {e, e}});
    t.push_back({p + "attn.c_proj.bias", {e}});
    t.push_back({p + "ln_2.weight", {e}});
    t.push_back({p + "ln_2.bias", {e}});
    t.push_back({p + "mlp.c_fc.weight", {e, 4 * e}});
    t.push_back({p + "mlp.c_fc.bias", {4 * e}});
    t.push_back({p + "mlp.c_proj.weight", {4 * e, e}});
    t.push_back({p + "mlp.c_proj.bias", {e}});
  }
  t.push_back({"transformer.ln_f.weight", {e}});
  t.push_back({"transformer.ln_f.bias", {e}});
  return t;
}

void expect_model(const File& f, uint64_t layers, uint64_t e, uint64_t vocab, uint64_t positions,
                  const std::string& dtype) {
  const auto want = expected_tensors(layers, e, vocab, positions);
  std::set<std::string> names;
  for (const auto& [name, shape] : want) {
    names.insert(name);
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    EXPECT_EQ(it->second.shape, shape) << name;
    EXPECT_EQ(it->second.dtype, dtype) << name;
  }
  for (const auto& [name, t] : f.tensors)
    EXPECT_TRUE(names.count(name)) << "unexpected tensor " << name;  // no lm_head, no attn.bias
  // The safetensors library writes tensors sorted by name (one dtype).
  EXPECT_TRUE(std::is_sorted(f.order.begin(), f.order.end()));
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), v.size() * 4);
  return v;
}
std::vector<uint16_t> halves(const Tensor& t) {
  std::vector<uint16_t> v(t.bytes.size() / 2);
  std::memcpy(v.data(), t.bytes.data(), v.size() * 2);
  return v;
}

// ---------------------------------------------------------------------------------------
// Independent reference conversions: nearest representable value by exhaustive search
// over the target format's values (in double), ties to the even bit pattern.

double f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

uint16_t ref_f16(float f) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (uint32_t h = 0; h <= 0x7BFF; ++h) t.push_back(f16_value(static_cast<uint16_t>(h)));
    return t;
  }();
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;  // halfway above 65504 and beyond: infinity
  const auto it = std::lower_bound(table.begin(), table.end(), a);
  if (it == table.end()) return sign | 0x7BFF;  // (65504, 65520)
  const uint16_t hi = static_cast<uint16_t>(it - table.begin());
  if (*it == a || hi == 0) return sign | hi;
  const uint16_t lo = hi - 1;
  const double dl = a - table[lo], dh = table[hi] - a;
  if (dl < dh) return sign | lo;
  if (dh < dl) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

uint16_t ref_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t lo = x & 0xFFFF0000u, hi = lo + 0x10000u;
  const double a = std::fabs(static_cast<double>(f));
  const double dl = a - std::fabs(static_cast<double>(std::bit_cast<float>(lo)));
  const double dh = std::fabs(static_cast<double>(std::bit_cast<float>(hi))) - a;
  const uint32_t r = dl < dh ? lo : dh < dl ? hi : (((lo >> 16) & 1) ? hi : lo);
  return static_cast<uint16_t>(r >> 16);
}

TEST(GenModelReference, ReferenceConvertersGiveKnownBitPatterns) {
  EXPECT_EQ(ref_f16(1.0f), 0x3C00);
  EXPECT_EQ(ref_f16(-2.0f), 0xC000);
  EXPECT_EQ(ref_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(ref_f16(65520.0f), 0x7C00);  // tie above max: even = infinity
  EXPECT_EQ(ref_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(ref_f16(0.1f), 0x2E66);                 // 0.0999755859375
  EXPECT_EQ(ref_f16(1.0f + 0x1p-11f), 0x3C00);      // tie, even stays
  EXPECT_EQ(ref_f16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, odd rounds up
  EXPECT_EQ(ref_f16(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(ref_f16(0x1p-25f), 0x0000);             // tie with zero: even
  EXPECT_EQ(ref_f16(0x1.8p-24f), 0x0002);           // 1.5 units: tie, rounds to even 2
  EXPECT_EQ(ref_bf16(1.0f), 0x3F80);
  EXPECT_EQ(ref_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(ref_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(ref_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(ref_bf16(-3.0f), 0xC040);
}

// ---------------------------------------------------------------------------------------

TEST_F(GenModel, TinyHasEveryGpt2TensorWithHfShapesAndNothingElse) {
  const fs::path dir = gen("tiny", {"--size", "tiny", "--dtype", "f32", "--seed", "1"});
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  const File f = parse(dir / "model.safetensors");
  expect_model(f, 2, 64, 256, 128, "F32");
  // Only the two outputs: no temporary files left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
}

TEST_F(GenModel, ConfigJsonIsGpt2LMHeadModels) {
  const fs::path dir = gen("tiny", {"--size", "tiny", "--dtype", "bf16"});
  const json c = json::parse(slurp(dir / "config.json"));
  EXPECT_EQ(c.at("model_type"), "gpt2");
  EXPECT_EQ(c.at("architectures"), json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c.at("n_layer"), 2);
  EXPECT_EQ(c.at("n_embd"), 64);
  EXPECT_EQ(c.at("n_head"), 4);
  EXPECT_EQ(c.at("vocab_size"), 256);
  EXPECT_EQ(c.at("n_positions"), 128);
  EXPECT_EQ(c.at("n_ctx"), 128);
  EXPECT_EQ(c.at("bos_token_id"), 255);
  EXPECT_EQ(c.at("eos_token_id"), 255);
  EXPECT_DOUBLE_EQ(c.at("layer_norm_epsilon").get<double>(), 1e-5);
  EXPECT_EQ(c.at("activation_function"), "gelu_new");
  EXPECT_EQ(c.at("tie_word_embeddings"), true);
  EXPECT_EQ(c.at("torch_dtype"), "bfloat16");
  EXPECT_TRUE(c.at("n_inner").is_null());
  for (auto [dt, torch] : {std::pair{"f32", "float32"}, std::pair{"f16", "float16"}}) {
    const json c2 = json::parse(slurp(gen(dt, {"--dtype", dt}) / "config.json"));
    EXPECT_EQ(c2.at("torch_dtype"), torch);
  }
}

TEST_F(GenModel, CustomSizeFollowsTheGivenDimensions) {
  const fs::path dir =
      gen("custom", {"--size", "custom", "--layers", "3", "--embd", "48", "--heads", "6", "--vocab",
                     "100", "--positions", "32", "--dtype", "f16"});
  expect_model(parse(dir / "model.safetensors"), 3, 48, 100, 32, "F16");
  const json c = json::parse(slurp(dir / "config.json"));
  EXPECT_EQ(c.at("n_layer"), 3);
  EXPECT_EQ(c.at("n_head"), 6);
  EXPECT_EQ(c.at("bos_token_id"), 99);
}

TEST_F(GenModel, SameSeedIsByteIdenticalAndAnotherSeedChangesEveryTensor) {
  const fs::path a = gen("a", {"--seed", "7"}), b = gen("b", {"--seed", "7"}),
                 c = gen("c", {"--seed", "8"});
  EXPECT_EQ(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
  EXPECT_EQ(slurp(a / "config.json"), slurp(b / "config.json"));
  const File fa = parse(a / "model.safetensors"), fc = parse(c / "model.safetensors");
  for (const auto& [name, t] : fa.tensors) {
    ASSERT_TRUE(fc.tensors.count(name));
    EXPECT_NE(t.bytes, fc.tensors.at(name).bytes) << name;
  }
  // Distinct tensors of one model differ too (the name is part of the key).
  EXPECT_NE(fa.tensors.at("transformer.h.0.ln_1.bias").bytes,
            fa.tensors.at("transformer.h.0.ln_2.bias").bytes);
}

TEST_F(GenModel, ValuesLookLikeGpt2Initialisation) {
  const File f = parse(gen("tiny", {"--seed", "3"}) / "model.safetensors");
  for (const auto& [name, t] : f.tensors) {
    const auto v = floats(t);
    double sum = 0, sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << name;
      sum += x;
    }
    const double mean = sum / v.size();
    for (float x : v) sq += (x - mean) * (x - mean);
    const double sd = std::sqrt(sq / v.size());
    const bool ln_weight = name.find("ln_") != std::string::npos && name.ends_with(".weight");
    if (ln_weight) {
      EXPECT_NEAR(mean, 1.0, 0.01) << name;
    } else {
      EXPECT_NEAR(mean, 0.0, 0.01) << name;
    }
    EXPECT_GT(sd, 0.001) << name;
    EXPECT_LT(sd, 0.03) << name;
    if (name == "transformer.wte.weight" || name.ends_with("c_fc.weight")) {
      EXPECT_NEAR(sd, 0.02, 0.002) << name;  // GPT-2's initializer_range
    }
  }
}

TEST_F(GenModel, HalfPrecisionFilesAreTheF32ValuesRoundedToNearestEven) {
  const File f32 = parse(gen("f32", {"--seed", "5"}) / "model.safetensors");
  const File f16 = parse(gen("f16", {"--seed", "5", "--dtype", "f16"}) / "model.safetensors");
  const File bf16 = parse(gen("bf16", {"--seed", "5", "--dtype", "bf16"}) / "model.safetensors");
  size_t f16_ties = 0, f16_subnormals = 0, mismatches = 0;
  for (const auto& [name, t] : f32.tensors) {
    const auto v = floats(t);
    const auto h = halves(f16.tensors.at(name));
    const auto b = halves(bf16.tensors.at(name));
    ASSERT_EQ(v.size(), h.size());
    ASSERT_EQ(v.size(), b.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t want_h = ref_f16(v[i]), want_b = ref_bf16(v[i]);
      if (h[i] != want_h || b[i] != want_b) {
        if (++mismatches <= 5)
          ADD_FAILURE() << name << "[" << i << "] = " << v[i] << ": f16 " << h[i] << " want "
                        << want_h << ", bf16 " << b[i] << " want " << want_b;
      }
      const uint32_t bits = std::bit_cast<uint32_t>(v[i]);
      const uint32_t exp = (bits >> 23) & 0xFF;
      if (exp >= 113 && (bits & 0x1FFF) == 0x1000) ++f16_ties;  // exactly halfway, normal range
      if ((h[i] & 0x7C00) == 0 && (h[i] & 0x3FF) != 0) ++f16_subnormals;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // The comparison covered the hard cases (deterministic for this seed).
  EXPECT_GT(f16_ties, 0u);
  EXPECT_GT(f16_subnormals, 0u);
}

TEST_F(GenModel, SmallShardSizeWritesHfShardsAndAnIndex) {
  // tiny f32 is 498,688 bytes of tensors; 100 kB gives several shards.
  const fs::path one = gen("one", {"--seed", "2"});
  const fs::path dir = gen("sharded", {"--seed", "2", "--shard-size", "100kB"});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const json idx = json::parse(slurp(dir / "model.safetensors.index.json"));
  const json& wm = idx.at("weight_map");
  std::set<std::string> files;
  for (const auto& [name, file] : wm.items()) files.insert(file.get<std::string>());
  ASSERT_GE(files.size(), 4u);
  const std::regex shard_re(R"(model-(\d{5})-of-(\d{5})\.safetensors)");
  size_t k = 0;
  uint64_t total = 0;
  std::map<std::string, std::string> found;  // tensor -> file
  for (const auto& file : files) {           // sorted: model-00001-of-..., -00002-...
    std::smatch m;
    ASSERT_TRUE(std::regex_match(file, m, shard_re)) << file;
    EXPECT_EQ(std::stoul(m[1]), ++k);
    EXPECT_EQ(std::stoul(m[2]), files.size());
    const File f = parse(dir / file);
    uint64_t bytes = 0;
    for (const auto& [name, t] : f.tensors) {
      bytes += t.bytes.size();
      found[name] = file;
    }
    // Greedy filling never exceeds the limit unless a single tensor is larger.
    if (f.tensors.size() > 1) {
      EXPECT_LE(bytes, 100000u) << file;
    }
    total += bytes;
  }
  EXPECT_EQ(idx.at("metadata").at("total_size").get<uint64_t>(), total);
  EXPECT_EQ(total, 498688u);
  // weight_map names exactly the tensors each shard holds, and every tensor once.
  EXPECT_EQ(found.size(), wm.size());
  for (const auto& [name, file] : found) EXPECT_EQ(wm.value(name, ""), file) << name;
  const File whole = parse(one / "model.safetensors");
  expect_model(whole, 2, 64, 256, 128, "F32");
  ASSERT_EQ(found.size(), whole.tensors.size());
  // Shards follow state_dict order (layer by layer); values do not depend on sharding.
  std::string prev_file;
  for (const auto& [name, shape] : expected_tensors(2, 64, 256, 128)) {
    EXPECT_GE(found[name], prev_file) << name << " goes back to an earlier shard";
    prev_file = found[name];
    const File f = parse(dir / found[name]);
    EXPECT_EQ(f.tensors.at(name).bytes, whole.tensors.at(name).bytes) << name;
  }
}

TEST_F(GenModel, ShardSizeAboveTheTotalWritesOneFile) {
  const fs::path dir = gen("m", {"--shard-size", "2GB"});
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
}

TEST_F(GenModel, JsonSummaryMatchesTheFilesWritten) {
  const fs::path dir = tmp_ / "s";
  const Result r = run({"--shard-size", "200kB", "--json", "--out", dir.string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const json s = json::parse(r.out);
  EXPECT_EQ(s.at("parameters"), 124672);
  EXPECT_EQ(s.at("total_size"), 124672 * 4);
  uint64_t bytes = 0;
  size_t n = 0;
  for (const auto& f : s.at("files")) {
    const fs::path p = dir / f.at("name").get<std::string>();
    EXPECT_EQ(fs::file_size(p), f.at("bytes").get<uint64_t>()) << p;
    bytes += f.at("bytes").get<uint64_t>();
    ++n;
  }
  EXPECT_EQ(s.at("bytes"), bytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()),
            static_cast<long>(n));
}

TEST_F(GenModel, DryRunCountsGpt2ParametersWithTiedHeadWithoutWriting) {
  // Parameter counts of the released GPT-2 checkpoints (LM head tied to wte).
  const std::vector<std::pair<std::string, uint64_t>> sizes = {
      {"small", 124439808}, {"medium", 354823168}, {"large", 774030080}, {"xl", 1557611200}};
  const fs::path dir = tmp_ / "never";
  for (const auto& [size, params] : sizes) {
    const Result r = run({"--size", size, "--dry-run", "--json", "--out", dir.string()});
    ASSERT_EQ(r.rc, 0) << r.err;
    const json s = json::parse(r.out);
    EXPECT_EQ(s.at("parameters").get<uint64_t>(), params) << size;
    EXPECT_EQ(s.at("total_size").get<uint64_t>(), params * 4) << size;
  }
  const json s = json::parse(
      run({"--size", "small", "--dtype", "bf16", "--dry-run", "--json", "--shard-size", "100MB"})
          .out);
  EXPECT_EQ(s.at("total_size").get<uint64_t>(), 124439808u * 2);
  EXPECT_GT(s.at("shards").get<int>(), 1);
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(GenModel, RefusesANonEmptyDirectoryWithoutForce) {
  const fs::path dir = tmp_ / "full";
  fs::create_directories(dir);
  std::ofstream(dir / "keep.txt") << "mine";
  const Result r = run({"--out", dir.string()});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "config.json"));
  EXPECT_EQ(slurp(dir / "keep.txt"), "mine");
}

TEST_F(GenModel, ForceReplacesAnEarlierShardedModelCompletely) {
  const fs::path dir = gen("m", {"--shard-size", "100kB"});
  std::ofstream(dir / "keep.txt") << "mine";
  std::ofstream(dir / ".keep.tmp.1") << "mine too";
  std::ofstream(dir / ".model-00002-of-00005.safetensors.tmp.99999") << "left by a killed run";
  const Result r = run({"--out", dir.string(), "--force", "--dtype", "f16"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{".keep.tmp.1", "config.json", "keep.txt", "model.safetensors"}));
  expect_model(parse(dir / "model.safetensors"), 2, 64, 256, 128, "F16");
}

TEST_F(GenModel, InterruptedRunLeavesNoFileBehind) {
  // gpt2-small in f32 is ~500 MB: the tool is still writing its first shard when the
  // temporary file appears and SIGTERM follows within a millisecond.
  const fs::path dir = tmp_ / "killed";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(THAW_GENMODEL_PATH, THAW_GENMODEL_PATH, "--size", "small", "--dtype", "f32", "--out",
            dir.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  bool writing = false;
  for (int i = 0; i < 30000 && !writing; ++i) {  // up to ~30 s
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec))
      writing = true;
    if (!writing) ::usleep(1000);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(writing) << "the tool never started writing";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST_F(GenModel, BadArgumentsGiveOneLineErrorsAndNonZeroExit) {
  const std::string out = (tmp_ / "bad").string();
  const std::vector<std::vector<std::string>> cases = {
      {"--size", "huge", "--out", out},
      {"--dtype", "f8", "--out", out},
      {"--size", "custom", "--layers", "2", "--embd", "64", "--heads", "5", "--out", out},
      {"--size", "custom", "--layers", "2", "--out", out},  // no --embd/--heads
      {"--size", "small", "--layers", "2", "--out", out},   // overrides need custom
      {"--size", "custom", "--layers", "0", "--embd", "64", "--heads", "4", "--out", out},
      {"--shard-size", "abc", "--out", out},
      {"--shard-size", "0", "--out", out},
      {"--seed", "-1", "--out", out},
      {"--seed", "12x", "--out", out},
      {"--no-such-flag", "--out", out},
      {},  // no --out
  };
  for (const auto& args : cases) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    const Result r = run(args);
    EXPECT_NE(r.rc, 0) << joined;
    EXPECT_TRUE(r.out.empty()) << joined;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "-> " << r.err;
    EXPECT_TRUE(r.err.starts_with("thaw-genmodel: error: ")) << joined << "-> " << r.err;
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
