#include "common/safetensors/fetch_plan.hpp"

#include <fmt/format.h>

#include <functional>

#include "common/safetensors/layers.hpp"

namespace thaw::safetensors {

std::uint64_t FileFetch::bytes() const {
  std::uint64_t n = 0;
  for (const ByteRange& r : ranges) n += r.end - r.begin;
  return n;
}

std::uint64_t FetchPlan::bytes() const {
  std::uint64_t n = 0;
  for (const FileFetch& f : files) n += f.bytes();
  return n;
}

std::vector<std::string> FetchPlan::tensors() const {
  std::vector<std::string> out;
  for (const FileFetch& f : files) {
    for (const ByteRange& r : f.ranges) out.insert(out.end(), r.tensors.begin(), r.tensors.end());
  }
  return out;
}

LayerSpan stage_layers(int stage, int num_stages, int num_layers) {
  const auto at = [&](int k) {
    return static_cast<int>(static_cast<long long>(k) * num_layers / num_stages);
  };
  return {at(stage), at(stage + 1)};
}

namespace {

// Small files first, config.json leading: an engine reads it before anything else.
void add_small_files(const Model& model, FetchPlan& plan) {
  const auto add = [&](const FileEntry& f) {
    FileFetch fetch{.file = f.name, .size = f.size, .whole = true, .ranges = {}};
    if (f.size > 0) fetch.ranges.push_back(ByteRange{0, f.size, {}});
    plan.files.push_back(std::move(fetch));
  };
  for (const FileEntry& f : model.small_files()) {
    if (f.name == kConfigFileName) add(f);
  }
  for (const FileEntry& f : model.small_files()) {
    if (f.name != kConfigFileName) add(f);
  }
}

// Each weight file: its header, then the tensors `wanted` accepts, adjacent ones merged.
void add_weight_files(const Model& model,
                      const std::function<bool(std::size_t shard, std::size_t tensor)>& wanted,
                      FetchPlan& plan) {
  const auto shards = model.shards();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const Header& h = shards[s];
    FileFetch fetch{.file = h.file(), .size = h.file_size(), .whole = false, .ranges = {}};
    fetch.ranges.push_back(ByteRange{0, h.data_begin(), {}});
    const auto tensors = h.tensors();
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      if (!wanted(s, t)) continue;
      const TensorInfo& info = tensors[t];
      if (info.begin == info.end) {
        fetch.ranges.front().tensors.push_back(info.name);
        continue;
      }
      ByteRange& last = fetch.ranges.back();
      // Merge with the previous tensor range (never into the header: it stays ranges[0]).
      if (fetch.ranges.size() > 1 && last.end == info.begin) {
        last.end = info.end;
        last.tensors.push_back(info.name);
      } else {
        fetch.ranges.push_back(ByteRange{info.begin, info.end, {info.name}});
      }
    }
    plan.files.push_back(std::move(fetch));
  }
}

}  // namespace

std::expected<FetchPlan, Error> plan_stage(const Model& model, int stage, int num_stages) {
  auto layout = infer_layout(model);
  if (!layout) return std::unexpected(layout.error());
  const int layers = layout->num_layers;
  if (num_stages < 1 || num_stages > layers || stage < 0 || stage >= num_stages) {
    return std::unexpected(Error{
        errc::invalid_stage,
        fmt::format("{}: stage {} of {} does not exist for a model of {} layers (need 0 <= stage "
                    "< stages <= layers)",
                    model.label(), stage, num_stages, layers)});
  }

  FetchPlan plan;
  plan.stage = stage;
  plan.num_stages = num_stages;
  const LayerSpan span = stage_layers(stage, num_stages, layers);
  plan.layer_begin = span.begin;
  plan.layer_end = span.end;
  plan.has_embedding = stage == 0;
  plan.has_final = stage == num_stages - 1;
  plan.tied_embedding = plan.has_final && layout->tied_lm_head;

  const auto wanted = [&](std::size_t s, std::size_t t) {
    const TensorRole role = layout->roles[s][t];
    switch (role.part) {
      case Part::token_embedding:
        return plan.has_embedding || plan.tied_embedding;
      case Part::input:
        return plan.has_embedding;
      case Part::layer:
        return role.layer >= span.begin && role.layer < span.end;
      case Part::final_norm:
      case Part::lm_head:
        return plan.has_final;
    }
    return false;
  };
  add_small_files(model, plan);
  add_weight_files(model, wanted, plan);
  return plan;
}

FetchPlan plan_full(const Model& model) {
  FetchPlan plan;
  plan.has_embedding = plan.has_final = true;
  plan.layer_begin = plan.layer_end = 0;  // not inferred: the plan holds everything anyway
  add_small_files(model, plan);
  add_weight_files(
      model, [](std::size_t, std::size_t) { return true; }, plan);
  return plan;
}

}  // namespace thaw::safetensors
