#include "vmm/weight_layout.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "common/safetensors/layers.hpp"

namespace thaw::vmm {

VmmResult<WeightLayout> WeightLayout::packed(const safetensors::Model& model,
                                             std::uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("packed layout: alignment {} is not a power of two", alignment));
  }
  std::optional<safetensors::Family> family;
  if (auto layout = safetensors::infer_layout(model)) family = layout->family;
  std::vector<LayoutPiece> pieces;
  std::uint64_t at = 0;
  for (const safetensors::Header& shard : model.shards()) {
    for (const safetensors::TensorInfo& t : shard.tensors()) {
      if (t.bytes() == 0) continue;
      at = (at + alignment - 1) / alignment * alignment;
      int layer = -1;
      if (family) {
        if (auto role = safetensors::classify(*family, t.name);
            role && role->part == safetensors::Part::layer) {
          layer = role->layer;
        }
      }
      pieces.push_back(LayoutPiece{at, shard.file(), t.begin, t.bytes(), layer});
      at += t.bytes();
    }
  }
  return WeightLayout(std::move(pieces));
}

VmmResult<WeightLayout> WeightLayout::engine(std::vector<LayoutPiece> pieces) {
  std::sort(pieces.begin(), pieces.end(), [](const LayoutPiece& a, const LayoutPiece& b) {
    return a.slot_offset < b.slot_offset;
  });
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].bytes == 0) {
      return vmm_failure(VmmErrc::invalid_argument,
                         fmt::format("engine layout: piece at slot offset {} ({}) is empty",
                                     pieces[i].slot_offset, pieces[i].file));
    }
    if (i > 0 && pieces[i].slot_offset < pieces[i - 1].slot_end()) {
      return vmm_failure(
          VmmErrc::invalid_argument,
          fmt::format("engine layout: {} bytes {}+{} at slot offset {} overlap {} at {}-{}; the "
                      "recorded copy map is inconsistent: record it again",
                      pieces[i].file, pieces[i].file_offset, pieces[i].bytes, pieces[i].slot_offset,
                      pieces[i - 1].file, pieces[i - 1].slot_offset, pieces[i - 1].slot_end()));
    }
  }
  return WeightLayout(std::move(pieces));
}

std::uint64_t WeightLayout::bytes() const {
  std::uint64_t sum = 0;
  for (const auto& p : pieces_) sum += p.bytes;
  return sum;
}

std::uint64_t WeightLayout::prefix_for_layers(int k) const {
  for (const auto& p : pieces_) {
    if (p.layer >= k) return p.slot_offset;
  }
  return extent();
}

int WeightLayout::max_layer() const {
  int m = -1;
  for (const auto& p : pieces_) m = std::max(m, p.layer);
  return m;
}

}  // namespace thaw::vmm
