#include "checkpoint.hpp"

#include <fmt/format.h>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace refengine {
namespace {

using nlohmann::json;

std::expected<json, std::string> read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected(fmt::format("{}: cannot open", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return std::unexpected(fmt::format("{}: not a JSON object", path.string()));
  return doc;
}

std::expected<std::int64_t, std::string> positive_int(const json& cfg, const char* key,
                                                      const std::string& label) {
  auto it = cfg.find(key);
  if (it == cfg.end() || !it->is_number_integer() || it->get<std::int64_t>() <= 0)
    return std::unexpected(
        fmt::format("{}: '{}' is missing or not a positive integer", label, key));
  return it->get<std::int64_t>();
}

}  // namespace

std::string_view canonical_tensor_name(std::string_view stored) {
  constexpr std::string_view kPrefix = "transformer.";
  if (stored.starts_with(kPrefix)) stored.remove_prefix(kPrefix.size());
  return stored;
}

std::string format_shape(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

std::expected<Checkpoint, std::string> Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const auto config_path = dir / "config.json";
  auto cfg = read_json(config_path);
  if (!cfg) return std::unexpected(cfg.error());
  const std::string label = config_path.string();
  GPT2Config& g = c.config_;
  for (auto [key, out] : {std::pair{"n_embd", &g.n_embd}, std::pair{"n_layer", &g.n_layer},
                          std::pair{"n_head", &g.n_head}, std::pair{"n_positions", &g.n_positions},
                          std::pair{"vocab_size", &g.vocab_size}}) {
    auto v = positive_int(*cfg, key, label);
    if (!v) return std::unexpected(v.error());
    *out = *v;
  }
  if (g.n_embd % g.n_head != 0)
    return std::unexpected(
        fmt::format("{}: n_embd {} is not a multiple of n_head {}", label, g.n_embd, g.n_head));
  g.n_inner = 4 * g.n_embd;
  if (auto it = cfg->find("n_inner"); it != cfg->end() && !it->is_null()) {
    auto v = positive_int(*cfg, "n_inner", label);
    if (!v) return std::unexpected(v.error());
    g.n_inner = *v;
  }
  // What the engine's kernels compute; anything else would give wrong answers silently.
  if (auto it = cfg->find("activation_function");
      it != cfg->end() && !(it->is_string() && (*it == "gelu_new" || *it == "gelu_pytorch_tanh")))
    return std::unexpected(
        fmt::format("{}: activation_function {} is not supported (gelu_new or gelu_pytorch_tanh)",
                    label, it->dump()));
  for (const char* flag : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (auto it = cfg->find(flag); it != cfg->end() && it->is_boolean() && it->get<bool>())
      return std::unexpected(fmt::format("{}: '{}': true is not supported", label, flag));
  if (auto it = cfg->find("scale_attn_weights");
      it != cfg->end() && it->is_boolean() && !it->get<bool>())
    return std::unexpected(fmt::format("{}: 'scale_attn_weights': false is not supported", label));
  if (auto it = cfg->find("eos_token_id"); it != cfg->end() && it->is_number_integer())
    g.eos_token_id = it->get<std::int64_t>();
  if (auto it = cfg->find("layer_norm_epsilon"); it != cfg->end()) {
    if (!it->is_number() || it->get<double>() <= 0)
      return std::unexpected(
          fmt::format("{}: 'layer_norm_epsilon' is not a positive number", label));
    g.layer_norm_epsilon = it->get<double>();
  }
  if (auto it = cfg->find("torch_dtype"); it != cfg->end() && !it->is_null()) {
    if (!it->is_string())
      return std::unexpected(fmt::format("{}: 'torch_dtype' is not a string", label));
    g.torch_dtype = it->get<std::string>();
    if (g.torch_dtype == "float32") {
      g.dtype = DType::F32;
    } else if (g.torch_dtype == "float16") {
      g.dtype = DType::F16;
    } else if (g.torch_dtype == "bfloat16") {
      g.dtype = DType::BF16;
    } else {
      return std::unexpected(fmt::format("{}: unsupported torch_dtype '{}'", label, g.torch_dtype));
    }
    g.has_dtype = true;
  }

  const auto index_path = dir / "model.safetensors.index.json";
  const auto single_path = dir / "model.safetensors";
  if (std::filesystem::exists(index_path)) {
    c.sharded_ = true;
    auto idx = read_json(index_path);
    if (!idx) return std::unexpected(idx.error());
    auto wm = idx->find("weight_map");
    if (wm == idx->end() || !wm->is_object() || wm->empty())
      return std::unexpected(
          fmt::format("{}: 'weight_map' is missing or empty", index_path.string()));
    std::set<std::string> names;
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos)
        return std::unexpected(fmt::format("{}: tensor '{}': file is not a plain file name",
                                           index_path.string(), tensor));
      names.insert(file.get<std::string>());
      c.weight_map_[tensor] = dir / file.get<std::string>();
    }
    for (const auto& n : names) {
      auto p = dir / n;
      if (!std::filesystem::is_regular_file(p))
        return std::unexpected(
            fmt::format("{}: names '{}', which does not exist", index_path.string(), p.string()));
      c.files_.push_back(p);  // std::set: sorted, as vLLM's glob order
    }
  } else if (std::filesystem::is_regular_file(single_path)) {
    c.files_.push_back(single_path);
  } else {
    return std::unexpected(
        fmt::format("{}: neither model.safetensors nor "
                    "model.safetensors.index.json",
                    dir.string()));
  }
  return c;
}

std::vector<ExpectedTensor> Checkpoint::expected_tensors(int layer_begin, int layer_end,
                                                         bool first_stage, bool last_stage) const {
  const auto& g = config_;
  const std::int64_t e = g.n_embd;
  std::vector<ExpectedTensor> out;
  if (first_stage || last_stage) out.push_back({"wte.weight", {g.vocab_size, e}});  // tied head
  if (first_stage) out.push_back({"wpe.weight", {g.n_positions, e}});
  if (layer_end < 0 || layer_end > g.n_layer) layer_end = static_cast<int>(g.n_layer);
  for (int i = std::max(layer_begin, 0); i < layer_end; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    out.push_back({p + "ln_1.weight", {e}});
    out.push_back({p + "ln_1.bias", {e}});
    out.push_back({p + "attn.c_attn.weight", {e, 3 * e}});  // Conv1D: [in, out]
    out.push_back({p + "attn.c_attn.bias", {3 * e}});
    out.push_back({p + "attn.c_proj.weight", {e, e}});
    out.push_back({p + "attn.c_proj.bias", {e}});
    out.push_back({p + "ln_2.weight", {e}});
    out.push_back({p + "ln_2.bias", {e}});
    out.push_back({p + "mlp.c_fc.weight", {e, g.n_inner}});
    out.push_back({p + "mlp.c_fc.bias", {g.n_inner}});
    out.push_back({p + "mlp.c_proj.weight", {g.n_inner, e}});
    out.push_back({p + "mlp.c_proj.bias", {e}});
  }
  if (last_stage) {
    out.push_back({"ln_f.weight", {e}});
    out.push_back({"ln_f.bias", {e}});
  }
  return out;
}

std::expected<void, std::string> Checkpoint::load(const StageSpec& stage,
                                                  const TensorCallback& on_tensor,
                                                  const FileCallback& on_file) const {
  std::unordered_map<std::string, const ExpectedTensor*> wanted;
  const auto expected = expected_tensors(stage);
  for (const auto& t : expected) wanted.emplace(t.name, &t);
  // Where each wanted tensor was found (canonical name -> file), for duplicates and misses.
  std::unordered_map<std::string, std::string> found;

  // Sharded: which files hold wanted tensors, and every wanted tensor must be in the index.
  std::set<std::filesystem::path> needed_files;
  if (sharded_) {
    std::set<std::string> indexed;
    for (const auto& [stored, file] : weight_map_) {
      std::string canon(canonical_tensor_name(stored));
      if (wanted.contains(canon)) needed_files.insert(file);
      indexed.insert(canon);
    }
    for (const auto& t : expected)
      if (!indexed.contains(t.name))
        return std::unexpected(fmt::format("{}: missing tensor '{}' (expected shape {})",
                                           (dir_ / "model.safetensors.index.json").string(), t.name,
                                           format_shape(t.shape)));
  }

  for (const auto& path : files_) {
    if (sharded_ && !needed_files.contains(path)) continue;
    auto file = MappedCheckpointFile::open(path.string());
    if (!file) return std::unexpected(file.error());
    const auto& header = file->header();
    if (sharded_) {
      for (const auto& [stored, listed] : weight_map_)
        if (listed == path && header.find(stored) == nullptr)
          return std::unexpected(fmt::format(
              "{}: missing tensor '{}' that model.safetensors.index.json places in this file",
              path.string(), stored));
    }
    FileLoaded report{path.string(), 0, 0, 8 + header.header_size + header.data_size};
    for (const auto& t : header.tensors) {
      const std::string_view canon = canonical_tensor_name(t.name);
      auto it = wanted.find(std::string(canon));
      if (it == wanted.end()) continue;  // another stage's, lm_head.weight (tied), attn.bias...
      const ExpectedTensor& want = *it->second;
      if (auto [prev, inserted] = found.emplace(want.name, path.string()); !inserted)
        return std::unexpected(fmt::format("{}: tensor '{}' is stored twice (also in {})",
                                           path.string(), t.name, prev->second));
      if (t.shape != want.shape)
        return std::unexpected(
            fmt::format("{}: tensor '{}': shape {} does not match config.json (expected {})",
                        path.string(), t.name, format_shape(t.shape), format_shape(want.shape)));
      if (config_.has_dtype
              ? t.dtype != config_.dtype
              : (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16))
        return std::unexpected(
            fmt::format("{}: tensor '{}': dtype {} does not match config.json (expected {})",
                        path.string(), t.name, dtype_name(t.dtype),
                        config_.has_dtype ? dtype_name(config_.dtype) : "F32, F16 or BF16"));
      const auto bytes = file->data(t);
      auto r = on_tensor(TensorView{want.name, t.dtype, t.shape, bytes.data(), bytes.size()});
      if (!r) return r;
      ++report.tensors;
      report.bytes += bytes.size();
    }
    if (on_file) on_file(report);
  }
  for (const auto& t : expected)
    if (!found.contains(t.name))
      return std::unexpected(fmt::format("{}: missing tensor '{}' (expected shape {})",
                                         files_.size() == 1 ? files_[0].string() : dir_.string(),
                                         t.name, format_shape(t.shape)));
  return {};
}

}  // namespace refengine
