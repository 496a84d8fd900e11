// thaw-genmodel: writes deterministic synthetic GPT-2 checkpoints in the Hugging Face
// layout (config.json + model.safetensors, or shards + model.safetensors.index.json),
// so tests and benchmarks have models of any size from tiny to gpt2-xl without downloads.
//
// Layout, as `GPT2LMHeadModel.save_pretrained(..., safe_serialization=True)` writes it:
// - tensors named transformer.* in HF Conv1D layout (in x out), LM head tied to wte and
//   not stored, no attn.bias / attn.masked_bias buffers;
// - shards filled greedily in state_dict order (wte, wpe, h.0 ... h.N-1, ln_f) exactly as
//   huggingface_hub's split_torch_state_dict_into_shards does;
// - inside each file the safetensors library's order: sorted by name, the header JSON
//   compact with "__metadata__" first and padded with spaces to a multiple of 8.
// Values depend only on (seed, tensor name, element index): a splitmix64 hash of the
// counter gives an Irwin-Hall (sum of four uniforms) approximately normal value with the
// GPT-2 initialisation's scale. f16/bf16 are the f32 values rounded to nearest even, so
// the same seed gives the same numbers in every dtype and byte-identical files for any
// shard size.
//
// Writing streams tensor by tensor through a small buffer into temporary files that are
// renamed into place only when every file is complete (config.json last); SIGINT/SIGTERM
// remove the temporary files.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kProg = "thaw-genmodel";

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------
// Model description

enum class DType { F32, F16, BF16 };

struct DTypeInfo {
  const char* cli;          // --dtype spelling
  const char* safetensors;  // header "dtype"
  const char* torch;        // config.json "torch_dtype"
  uint64_t size;
};

DTypeInfo info(DType d) {
  switch (d) {
    case DType::F32:
      return {"f32", "F32", "float32", 4};
    case DType::F16:
      return {"f16", "F16", "float16", 2};
    case DType::BF16:
      return {"bf16", "BF16", "bfloat16", 2};
  }
  return {"f32", "F32", "float32", 4};
}

struct Dims {
  uint64_t layers, embd, heads, vocab, positions;
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
  uint64_t numel = 0;
  float center = 0;  // mean of the values (1 for layernorm weights)
  float mult = 0;    // scale from the centred Irwin-Hall integer to the value
};

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into Plan::tensors, in file (name) order
  std::vector<uint64_t> offsets;
  std::string header;  // padded JSON, without the 8-byte length
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
};

struct Plan {
  Dims dims{};
  DType dtype = DType::F32;
  uint64_t seed = 0;
  std::vector<TensorSpec> tensors;  // state_dict order
  std::vector<Shard> shards;
  uint64_t parameters = 0;
  uint64_t total_size = 0;  // tensor bytes, as the index's metadata.total_size
  std::string config_json;
  std::string index_json;  // empty when not sharded
};

// The Irwin-Hall sum of four 16-bit uniforms, centred, has standard deviation
// 65536/sqrt(3) (to within 1e-9 relative).
float mult_for_std(double stddev) {
  return static_cast<float>(stddev * std::sqrt(3.0) / 65536.0);
}

std::vector<TensorSpec> gpt2_tensors(const Dims& d) {
  std::vector<TensorSpec> t;
  const double w_std = 0.02;  // GPT-2 initializer_range
  // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(d.layers));
  const double bias_std = 0.01;
  const double ln_w_std = 0.02;  // around 1
  auto add = [&](std::string name, std::vector<uint64_t> shape, float center, double stddev) {
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    t.push_back({std::move(name), std::move(shape), n, center, mult_for_std(stddev)});
  };
  const uint64_t e = d.embd;
  add("transformer.wte.weight", {d.vocab, e}, 0, w_std);
  add("transformer.wpe.weight", {d.positions, e}, 0, w_std / 2);
  for (uint64_t i = 0; i < d.layers; ++i) {
    const std::string p = fmt::format("transformer.h.{}.", i);
    add(p + "ln_1.weight", {e}, 1, ln_w_std);
    add(p + "ln_1.bias", {e}, 0, bias_std);
    add(p + "attn.c_attn.weight", {e, 3 * e}, 0, w_std);
    add(p + "attn.c_attn.bias", {3 * e}, 0, bias_std);
    add(p + "attn.c_proj.weight", {e, e}, 0, proj_std);
    add(p + "attn.c_proj.bias", {e}, 0, bias_std);
    add(p + "ln_2.weight", {e}, 1, ln_w_std);
    add(p + "ln_2.bias", {e}, 0, bias_std);
    add(p + "mlp.c_fc.weight", {e, 4 * e}, 0, w_std);
    add(p + "mlp.c_fc.bias", {4 * e}, 0, bias_std);
    add(p + "mlp.c_proj.weight", {4 * e, e}, 0, proj_std);
    add(p + "mlp.c_proj.bias", {e}, 0, bias_std);
  }
  add("transformer.ln_f.weight", {e}, 1, ln_w_std);
  add("transformer.ln_f.bias", {e}, 0, bias_std);
  return t;
}

std::string config_json(const Dims& d, DType dtype) {
  // The keys GPT2Config.save_pretrained writes (sorted, indent 2, as json.dumps does),
  // plus n_ctx and tie_word_embeddings spelled out for loaders that do not know defaults.
  json c = {
      {"activation_function", "gelu_new"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", 0.1},
      {"bos_token_id", d.vocab - 1},
      {"embd_pdrop", 0.1},
      {"eos_token_id", d.vocab - 1},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", 1e-5},
      {"model_type", "gpt2"},
      {"n_ctx", d.positions},
      {"n_embd", d.embd},
      {"n_head", d.heads},
      {"n_inner", nullptr},
      {"n_layer", d.layers},
      {"n_positions", d.positions},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.1},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"summary_activation", nullptr},
      {"summary_first_dropout", 0.1},
      {"summary_proj_to_labels", true},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      {"tie_word_embeddings", true},
      {"torch_dtype", info(dtype).torch},
      {"use_cache", true},
      {"vocab_size", d.vocab},
  };
  return c.dump(2) + "\n";
}

// huggingface_hub split_state_dict_into_shards_factory: greedy in state_dict order; a
// tensor larger than the limit gets a shard of its own (appended at once, before the
// shard being filled, as the reference does).
std::vector<std::vector<size_t>> split_into_shards(const std::vector<TensorSpec>& t, uint64_t elem,
                                                   uint64_t max_shard) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const uint64_t size = t[i].numel * elem;
    if (size > max_shard) {
      shards.push_back({i});
      continue;
    }
    if (current_size + size > max_shard) {
      shards.push_back(std::move(current));
      current = {};
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

Plan make_plan(const Dims& dims, DType dtype, uint64_t seed, uint64_t max_shard) {
  Plan p;
  p.dims = dims;
  p.dtype = dtype;
  p.seed = seed;
  p.tensors = gpt2_tensors(dims);
  const uint64_t elem = info(dtype).size;
  for (const auto& t : p.tensors) {
    p.parameters += t.numel;
    p.total_size += t.numel * elem;
  }
  auto groups = split_into_shards(p.tensors, elem, max_shard);
  const size_t n = groups.size();
  for (size_t s = 0; s < n; ++s) {
    Shard sh;
    sh.file =
        n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
    sh.tensors = std::move(groups[s]);
    // safetensors orders the data by dtype (all equal here) then by name, bytewise.
    std::sort(sh.tensors.begin(), sh.tensors.end(),
              [&](size_t a, size_t b) { return p.tensors[a].name < p.tensors[b].name; });
    std::string h = R"({"__metadata__":{"format":"pt"})";
    uint64_t off = 0;
    for (size_t i : sh.tensors) {
      const auto& t = p.tensors[i];
      std::string shape;
      for (size_t k = 0; k < t.shape.size(); ++k)
        shape += fmt::format("{}{}", k ? "," : "", t.shape[k]);
      const uint64_t end = off + t.numel * elem;
      h += fmt::format(R"(,"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t.name,
                       info(dtype).safetensors, shape, off, end);
      sh.offsets.push_back(off);
      off = end;
    }
    h += "}";
    h.append((8 - h.size() % 8) % 8, ' ');
    sh.header = std::move(h);
    sh.data_bytes = off;
    p.shards.push_back(std::move(sh));
  }
  if (n > 1) {
    json wm = json::object();
    for (const auto& sh : p.shards)
      for (size_t i : sh.tensors) wm[p.tensors[i].name] = sh.file;
    json idx = {{"metadata", {{"total_size", p.total_size}}}, {"weight_map", wm}};
    p.index_json = idx.dump(2) + "\n";
  }
  p.config_json = config_json(dims, dtype);
  return p;
}

// ---------------------------------------------------------------------------------------
// Values

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t tensor_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(splitmix64(seed) ^ h);
}

// Only integer operations, one float multiply and one float add: the same bits on any
// IEEE-754 machine.
inline float value_at(uint64_t key, uint64_t i, float center, float mult) {
  const uint64_t h = splitmix64(key + i * kGolden);
  const int32_t sum =
      static_cast<int32_t>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48)) -
      2 * 65535;
  return center + static_cast<float>(sum) * mult;
}

// IEEE binary32 -> binary16, round to nearest, ties to even.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t a = x & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00 | static_cast<uint16_t>((a >> 13) & 0x3FF);  // NaN
  if (a >= 0x477FF000) return sign | 0x7C00;  // >= 65520 (halfway past 65504): infinity
  if (a >= 0x38800000) {                      // normal in binary16 (>= 2^-14)
    a += 0xFFF + ((a >> 13) & 1);
    return sign | static_cast<uint16_t>((a - 0x38000000) >> 13);
  }
  // Subnormal or zero: the result counts units of 2^-24.
  const uint32_t e = a >> 23;
  if (e == 0) return sign;  // binary32 subnormals are far below 2^-25
  const uint32_t m = (a & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;  // >= 14
  if (shift > 24) return sign;     // < 2^-25 rounds to zero
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  return sign | static_cast<uint16_t>(q);
}

// IEEE binary32 -> bfloat16, round to nearest, ties to even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x0040);
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// ---------------------------------------------------------------------------------------
// Writing

// Temporary files of this run, all named before the first is created, so that the signal
// handler only reads immutable strings.
std::vector<std::string> g_tmp_paths;
volatile sig_atomic_t g_tmp_created = 0;

extern "C" void on_fatal_signal(int sig) {
  for (sig_atomic_t i = 0; i < g_tmp_created; ++i) ::unlink(g_tmp_paths[i].c_str());
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void remove_tmp_files() {
  for (sig_atomic_t i = 0; i < g_tmp_created; ++i) ::unlink(g_tmp_paths[i].c_str());
  g_tmp_created = 0;
}

std::string human_bytes(uint64_t b) {
  if (b >= 1000000000ull) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1000000ull) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1000ull) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", b);
}

class Writer {
 public:
  Writer(const std::string& path, int fd) : path_(path), fd_(fd) { buf_.reserve(kBuf); }
  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  void put(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) return write_all(c, n);
    buf_.insert(buf_.end(), c, c + n);
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  void finish() {
    flush();
    if (::fsync(fd_) != 0) throw Error(fmt::format("fsync {}: {}", path_, std::strerror(errno)));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(fmt::format("close {}: {}", path_, std::strerror(errno)));
  }

 private:
  static constexpr size_t kBuf = 4 << 20;
  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        throw Error(fmt::format("write {}: {}", path_, std::strerror(w < 0 ? errno : EIO)));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  std::string path_;
  int fd_;
  std::vector<char> buf_;
};

class Progress {
 public:
  Progress(uint64_t total, bool on) : total_(total), on_(on) {}
  void add(uint64_t n) {
    done_ += n;
    if (!on_ || total_ == 0) return;
    const unsigned pct = static_cast<unsigned>(done_ * 100 / total_);
    if (pct / 10 > last_ / 10) {
      last_ = pct;
      fmt::print(stderr, "{}: {:3d}% ({} of {})\n", kProg, pct, human_bytes(done_),
                 human_bytes(total_));
    }
  }

 private:
  uint64_t total_, done_ = 0;
  bool on_;
  unsigned last_ = 0;
};

int open_tmp(size_t slot) {
  const std::string& path = g_tmp_paths[slot];
  // Counted before it exists: a signal between open() and the count would leave the file
  // behind (unlinking one not yet created is harmless).
  g_tmp_created = static_cast<sig_atomic_t>(slot + 1);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    g_tmp_created = static_cast<sig_atomic_t>(slot);
    throw Error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  }
  return fd;
}

void write_text(size_t slot, const std::string& text) {
  Writer w(g_tmp_paths[slot], open_tmp(slot));
  w.put(text.data(), text.size());
  w.finish();
}

void write_shard(const Plan& p, const Shard& sh, size_t slot, Progress& progress) {
  Writer w(g_tmp_paths[slot], open_tmp(slot));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(sh.header.size() >> (8 * i));
  w.put(len, 8);
  w.put(sh.header.data(), sh.header.size());
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<uint8_t> buf(kChunk * 4);
  for (size_t ti : sh.tensors) {
    const TensorSpec& t = p.tensors[ti];
    const uint64_t key = tensor_key(p.seed, t.name);
    for (uint64_t start = 0; start < t.numel; start += kChunk) {
      const uint64_t n = std::min(kChunk, t.numel - start);
      uint8_t* out = buf.data();
      // Little-endian output: this tool (like safetensors) assumes a little-endian host.
      for (uint64_t i = 0; i < n; ++i) {
        const float v = value_at(key, start + i, t.center, t.mult);
        switch (p.dtype) {
          case DType::F32:
            std::memcpy(out + 4 * i, &v, 4);
            break;
          case DType::F16: {
            const uint16_t h = f32_to_f16(v);
            std::memcpy(out + 2 * i, &h, 2);
            break;
          }
          case DType::BF16: {
            const uint16_t h = f32_to_bf16(v);
            std::memcpy(out + 2 * i, &h, 2);
            break;
          }
        }
      }
      const uint64_t bytes = n * info(p.dtype).size;
      w.put(out, bytes);
      progress.add(bytes);
    }
  }
  w.finish();
}

// What this tool writes (final names, and the temporary names of an interrupted run).
bool is_output_name(const std::string& name) {
  static const std::regex re(
      R"(\.?(config\.json|model\.safetensors|model\.safetensors\.index\.json)"
      R"(|model-\d{5}-of-\d{5}\.safetensors)(\.tmp\.\d+)?)");
  std::smatch m;
  // A leading dot only with the .tmp.<pid> suffix, and the suffix only with the dot.
  return std::regex_match(name, m, re) && (name[0] == '.') == m[2].matched;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_model(const Plan& p, const fs::path& dir, bool force, bool progress_on) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw Error(fmt::format("{} exists and is not a directory", dir.string()));
    if (!fs::is_empty(dir, ec) && !force)
      throw Error(fmt::format("output directory {} is not empty (pass --force to overwrite)",
                              dir.string()));
  } else if (!fs::create_directories(dir, ec) && ec) {
    throw Error(fmt::format("cannot create directory {}: {}", dir.string(), ec.message()));
  }

  // Final names: shards, then the index, then config.json (renamed last: a directory with
  // a config.json is complete).
  std::vector<std::string> finals;
  for (const auto& sh : p.shards) finals.push_back(sh.file);
  if (!p.index_json.empty()) finals.push_back("model.safetensors.index.json");
  finals.push_back("config.json");
  const int pid = static_cast<int>(::getpid());
  for (const auto& f : finals)
    g_tmp_paths.push_back((dir / fmt::format(".{}.tmp.{}", f, pid)).string());

  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  try {
    Progress progress(p.total_size, progress_on);
    size_t slot = 0;
    for (const auto& sh : p.shards) {
      if (progress_on)
        fmt::print(stderr, "{}: writing {} ({}, {} of {})\n", kProg, sh.file,
                   human_bytes(sh.file_bytes()), slot + 1, p.shards.size());
      write_shard(p, sh, slot++, progress);
    }
    if (!p.index_json.empty()) write_text(slot++, p.index_json);
    write_text(slot++, p.config_json);

    // --force: outputs of an earlier run that this one does not replace (stale shards, an
    // index when now unsharded, temporary files of a killed run) would mislead loaders.
    if (force) {
      for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        const bool ours = std::find(finals.begin(), finals.end(), name) != finals.end() ||
                          std::find(g_tmp_paths.begin(), g_tmp_paths.end(),
                                    entry.path().string()) != g_tmp_paths.end();
        if (!ours && is_output_name(name) && entry.is_regular_file()) fs::remove(entry.path());
      }
    }
    for (size_t i = 0; i < finals.size(); ++i) {
      if (::rename(g_tmp_paths[i].c_str(), (dir / finals[i]).c_str()) != 0)
        throw Error(
            fmt::format("rename {} to {}: {}", g_tmp_paths[i], finals[i], std::strerror(errno)));
    }
    g_tmp_created = 0;
    fsync_dir(dir);
  } catch (...) {
    remove_tmp_files();
    throw;
  }
}

json summary(const Plan& p, const std::string& out, bool dry_run) {
  json files = json::array();
  uint64_t bytes = 0;
  for (const auto& sh : p.shards) {
    files.push_back(
        {{"name", sh.file}, {"bytes", sh.file_bytes()}, {"tensors", sh.tensors.size()}});
    bytes += sh.file_bytes();
  }
  if (!p.index_json.empty()) {
    files.push_back({{"name", "model.safetensors.index.json"}, {"bytes", p.index_json.size()}});
    bytes += p.index_json.size();
  }
  files.push_back({{"name", "config.json"}, {"bytes", p.config_json.size()}});
  bytes += p.config_json.size();
  return {
      {"out", out},
      {"dry_run", dry_run},
      {"dtype", info(p.dtype).cli},
      {"seed", p.seed},
      {"n_layer", p.dims.layers},
      {"n_embd", p.dims.embd},
      {"n_head", p.dims.heads},
      {"vocab_size", p.dims.vocab},
      {"n_positions", p.dims.positions},
      {"parameters", p.parameters},
      {"tensors", p.tensors.size()},
      {"total_size", p.total_size},
      {"shards", p.shards.size()},
      {"bytes", bytes},
      {"files", files},
  };
}

// ---------------------------------------------------------------------------------------
// Command line

// "2GB", "500MB", "1.5GiB", "123456" (bytes). Units as transformers' convert_file_size_to_int:
// kB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024 (case-insensitive).
std::optional<uint64_t> parse_size(std::string s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double num = 0;
  try {
    size_t used = 0;
    num = std::stod(s.substr(0, i), &used);
    if (used != i) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},      {"b", 1},        {"kb", 1e3},     {"mb", 1e6},     {"gb", 1e9},
      {"tb", 1e12}, {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40},
  };
  double mult = 0;
  for (const auto& [name, m] : kUnits)
    if (unit == name) mult = m;
  if (mult == 0) return std::nullopt;
  const double v = num * mult;
  if (!(v >= 1) || v > 1e18) return std::nullopt;
  return static_cast<uint64_t>(v);
}

struct Options {
  std::string size = "tiny";
  std::optional<uint64_t> layers, embd, heads, vocab, positions;
  std::string dtype = "f32";
  uint64_t seed = 0;
  std::string shard_size = "5GB";
  std::string out;
  bool force = false, json = false, dry_run = false, quiet = false;
};

Dims resolve_dims(const Options& o) {
  const bool overrides = o.layers || o.embd || o.heads || o.vocab || o.positions;
  Dims d{};
  if (o.size == "tiny") {
    d = {2, 64, 4, 256, 128};
  } else if (o.size == "small") {
    d = {12, 768, 12, 50257, 1024};
  } else if (o.size == "medium") {
    d = {24, 1024, 16, 50257, 1024};
  } else if (o.size == "large") {
    d = {36, 1280, 20, 50257, 1024};
  } else if (o.size == "xl") {
    d = {48, 1600, 25, 50257, 1024};
  } else if (o.size == "custom") {
    if (!o.layers || !o.embd || !o.heads)
      throw CLI::ValidationError("--size custom needs --layers, --embd and --heads");
    d = {*o.layers, *o.embd, *o.heads, o.vocab.value_or(50257), o.positions.value_or(1024)};
  } else {
    throw CLI::ValidationError(
        fmt::format("--size: unknown size '{}' (tiny, small, medium, large, xl, custom)", o.size));
  }
  if (o.size != "custom" && overrides)
    throw CLI::ValidationError("--layers/--embd/--heads/--vocab/--positions need --size custom");
  if (d.embd % d.heads != 0)
    throw CLI::ValidationError(
        fmt::format("--embd {} is not a multiple of --heads {}", d.embd, d.heads));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Writes a deterministic synthetic GPT-2 model (GPT2LMHeadModel layout: config.json and\n"
      "safetensors, sharded with model.safetensors.index.json above --shard-size).",
      kProg};
  app.add_option("--size", o.size, "tiny | small | medium | large | xl | custom")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "n_layer (--size custom)")->check(CLI::Range(1, 4096));
  app.add_option("--embd", o.embd, "n_embd (--size custom)")->check(CLI::Range(1, 65536));
  app.add_option("--heads", o.heads, "n_head (--size custom); must divide --embd")
      ->check(CLI::Range(1, 65536));
  app.add_option("--vocab", o.vocab, "vocab_size (--size custom; default 50257)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--positions", o.positions, "n_positions (--size custom; default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", o.dtype, "f32 | f16 | bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  std::string seed_str = "0";
  app.add_option("--seed", seed_str, "seed of the values (0 to 2^64-1)")
      ->type_name("UINT64")
      ->capture_default_str();
  app.add_option("--shard-size", o.shard_size, "largest shard, e.g. 2GB, 500MB, 1GiB, or bytes")
      ->type_name("SIZE")
      ->capture_default_str();
  app.add_option("--out", o.out, "output directory (created; must be empty unless --force)")
      ->type_name("DIR");
  app.add_flag("--force", o.force, "write into a non-empty directory, replacing earlier outputs");
  app.add_flag("--dry-run", o.dry_run, "plan only: write nothing (use with --json)");
  app.add_flag("--json", o.json, "print a JSON summary on stdout");
  app.add_flag("-q,--quiet", o.quiet, "no progress on stderr");

  Plan plan;
  try {
    app.parse(argc, argv);
    const char* end = seed_str.data() + seed_str.size();
    if (auto [ptr, ec] = std::from_chars(seed_str.data(), end, o.seed);
        ec != std::errc{} || ptr != end)
      throw CLI::ValidationError(
          fmt::format("--seed: '{}' is not an integer in 0 to 2^64-1", seed_str));
    const Dims dims = resolve_dims(o);
    const auto shard = parse_size(o.shard_size);
    if (!shard)
      throw CLI::ValidationError(
          fmt::format("--shard-size: cannot parse '{}' (e.g. 2GB, 500MB, 1GiB)", o.shard_size));
    if (o.out.empty() && !o.dry_run) throw CLI::RequiredError("--out");
    const DType dtype = o.dtype == "f16"    ? DType::F16
                        : o.dtype == "bf16" ? DType::BF16
                                            : DType::F32;
    plan = make_plan(dims, dtype, o.seed, *shard);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    fmt::print(stderr, "{}: error: {}\n", kProg, msg);
    return 2;
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    const bool progress_on = !o.quiet && plan.total_size >= (256ull << 20);
    if (!o.dry_run) write_model(plan, o.out, o.force, progress_on);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const json s = summary(plan, o.out, o.dry_run);
    if (o.json) {
      fmt::print("{}\n", s.dump());
    } else {
      fmt::print("{}{}: {} parameters, {} in {} file(s){}\n", o.dry_run ? "(dry run) " : "",
                 o.out.empty() ? "-" : o.out, plan.parameters,
                 human_bytes(s["bytes"].get<uint64_t>()), s["files"].size(),
                 o.dry_run ? "" : fmt::format(", {:.1f} s", secs));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: error: {}\n", kProg, e.what());
    return 1;
  }
  return 0;
}
