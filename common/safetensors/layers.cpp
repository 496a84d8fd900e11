#include "common/safetensors/layers.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::safetensors {

std::string_view family_name(Family family) {
  switch (family) {
    case Family::gpt2:
      return "gpt2";
    case Family::llama:
      return "llama";
    case Family::opt:
      return "opt";
    case Family::falcon:
      return "falcon";
  }
  return "?";
}

std::optional<Family> family_of_model_type(std::string_view t) {
  if (t == "gpt2") return Family::gpt2;
  if (t == "llama" || t == "mistral" || t == "mixtral" || t == "qwen2" || t == "qwen3") {
    return Family::llama;
  }
  if (t == "opt") return Family::opt;
  if (t == "falcon" || t == "RefinedWeb" || t == "RefinedWebModel") return Family::falcon;
  return std::nullopt;
}

namespace {

// The scheme, for messages.
std::string_view scheme_text(Family family) {
  switch (family) {
    case Family::gpt2:
      return "[transformer.]{wte, wpe, h.<N>, ln_f}.* or lm_head.*";
    case Family::llama:
      return "[model.]{embed_tokens, layers.<N>, norm}.* or lm_head.*";
    case Family::opt:
      return "[model.]decoder.{embed_tokens, embed_positions, project_in, layers.<N>, "
             "final_layer_norm, project_out}.* or lm_head.*";
    case Family::falcon:
      return "[transformer.]{word_embeddings, h.<N>, ln_f}.* or lm_head.*";
  }
  return "";
}

bool default_tie(Family family) {
  return family != Family::llama;
}

// `name` is `component` + "." + a non-empty rest.
bool is_under(std::string_view name, std::string_view component) {
  return name.size() > component.size() + 1 && name.starts_with(component) &&
         name[component.size()] == '.';
}

std::string_view without_prefix(std::string_view name, std::string_view prefix) {
  if (is_under(name, prefix)) name.remove_prefix(prefix.size() + 1);
  return name;
}

// "<blocks>.<N>.<rest>" → N.
std::optional<int> block_number(std::string_view name, std::string_view blocks) {
  if (!is_under(name, blocks)) return std::nullopt;
  name.remove_prefix(blocks.size() + 1);
  const std::size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == name.size()) return std::nullopt;
  const std::string_view digits = name.substr(0, dot);
  if (digits.size() > 6 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  int n = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

struct Component {
  std::string_view name;
  Part part;
};

std::optional<TensorRole> match(std::string_view name, std::string_view blocks,
                                std::initializer_list<Component> components) {
  if (const auto n = block_number(name, blocks)) return TensorRole{Part::layer, *n};
  for (const Component& c : components) {
    if (is_under(name, c.name)) return TensorRole{c.part, -1};
  }
  return std::nullopt;
}

}  // namespace

std::optional<TensorRole> classify(Family family, std::string_view name) {
  if (is_under(name, "lm_head")) return TensorRole{Part::lm_head, -1};
  switch (family) {
    case Family::gpt2:
      return match(
          without_prefix(name, "transformer"), "h",
          {{"wte", Part::token_embedding}, {"wpe", Part::input}, {"ln_f", Part::final_norm}});
    case Family::llama:
      return match(without_prefix(name, "model"), "layers",
                   {{"embed_tokens", Part::token_embedding}, {"norm", Part::final_norm}});
    case Family::opt: {
      const std::string_view n = without_prefix(name, "model");
      if (!is_under(n, "decoder")) return std::nullopt;
      return match(n.substr(8), "layers",
                   {{"embed_tokens", Part::token_embedding},
                    {"embed_positions", Part::input},
                    {"project_in", Part::input},
                    {"final_layer_norm", Part::final_norm},
                    {"project_out", Part::final_norm}});
    }
    case Family::falcon:
      return match(without_prefix(name, "transformer"), "h",
                   {{"word_embeddings", Part::token_embedding}, {"ln_f", Part::final_norm}});
  }
  return std::nullopt;
}

namespace {

// The first tensor `family` cannot classify, as (shard, tensor) indices; nullopt if none.
std::optional<std::pair<std::size_t, std::size_t>> first_unknown(const Model& model,
                                                                 Family family) {
  const auto shards = model.shards();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const auto tensors = shards[s].tensors();
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (!classify(family, tensors[t].name)) return std::pair(s, t);
    }
  }
  return std::nullopt;
}

}  // namespace

std::expected<LayerLayout, Error> infer_layout(const Model& model) {
  const auto fail = [](errc code, std::string message) {
    return std::unexpected(Error{code, std::move(message)});
  };
  const auto& config = model.config();
  const auto shards = model.shards();
  const auto tensor_at = [&](std::pair<std::size_t, std::size_t> at) -> const TensorInfo& {
    return shards[at.first].tensors()[at.second];
  };

  LayerLayout layout;
  if (config && !config->model_type.empty()) {
    const auto family = family_of_model_type(config->model_type);
    if (!family) {
      return fail(errc::unknown_family,
                  fmt::format("{}/{}: model_type {} is not a family thaw can split into stages "
                              "(gpt2; llama, mistral, mixtral, qwen2, qwen3; opt; falcon)",
                              model.label(), kConfigFileName, quote_name(config->model_type)));
    }
    layout.family = *family;
    if (const auto bad = first_unknown(model, *family)) {
      return fail(errc::unknown_tensor_name,
                  fmt::format("{}/{}: tensor {} is not a {} tensor name ({})", model.label(),
                              shards[bad->first].file(), quote_name(tensor_at(*bad).name),
                              family_name(*family), scheme_text(*family)));
    }
  } else {
    std::optional<std::pair<std::size_t, std::size_t>> bad;
    bool found = false;
    for (const Family f : kAllFamilies) {
      const auto unknown = first_unknown(model, f);
      if (!unknown) {
        layout.family = f;
        found = true;
        break;
      }
      if (!bad || *unknown > *bad) bad = unknown;  // report the family that got furthest
    }
    if (!found) {
      return fail(
          errc::unknown_tensor_name,
          fmt::format("{}/{}: tensor {} fits none of the naming schemes thaw knows "
                      "(gpt2, llama, opt, falcon), and there is no config.json "
                      "model_type to choose one",
                      model.label(), shards[bad->first].file(), quote_name(tensor_at(*bad).name)));
    }
  }

  std::vector<bool> layer_seen;
  for (const Header& shard : shards) {
    auto& roles = layout.roles.emplace_back();
    for (const TensorInfo& t : shard.tensors()) {
      const TensorRole role = *classify(layout.family, t.name);
      roles.push_back(role);
      if (role.part == Part::layer) {
        if (layer_seen.size() <= static_cast<std::size_t>(role.layer)) {
          layer_seen.resize(static_cast<std::size_t>(role.layer) + 1);
        }
        layer_seen[static_cast<std::size_t>(role.layer)] = true;
      }
      layout.has_lm_head |= role.part == Part::lm_head;
    }
  }
  layout.num_layers = static_cast<int>(layer_seen.size());
  if (layout.num_layers == 0) {
    return fail(errc::layer_gap,
                fmt::format("{}: no tensor belongs to a transformer layer", model.label()));
  }
  if (const auto gap = std::find(layer_seen.begin(), layer_seen.end(), false);
      gap != layer_seen.end()) {
    return fail(errc::layer_gap,
                fmt::format("{}: no tensor belongs to layer {}, but layer {} has tensors",
                            model.label(), gap - layer_seen.begin(), layout.num_layers - 1));
  }
  if (config && config->num_layers && *config->num_layers != layout.num_layers) {
    return fail(errc::layer_count_mismatch,
                fmt::format("{}/{}: {} layers, but the tensor names have {} (0 to {})",
                            model.label(), kConfigFileName, *config->num_layers, layout.num_layers,
                            layout.num_layers - 1));
  }
  const bool config_ties = config && config->tie_word_embeddings ? *config->tie_word_embeddings
                                                                 : default_tie(layout.family);
  layout.tied_lm_head = !layout.has_lm_head || config_ties;
  return layout;
}

}  // namespace thaw::safetensors
