// WeightLayout: which file bytes go where in a prewarm slot.
//
// Two kinds:
// - packed: every tensor of a safetensors model, shards in order and tensors in file order,
//   each at the next offset aligned to `alignment` (256 bytes, what CUDA allocators give);
//   what thaw uses when it knows nothing of the engine that will run the model.
// - engine: destination offsets recorded from an engine's own start-up (the shim's H2D copy
//   map: "file F bytes [a, b) were copied to device address base + o"), so that mapping the
//   slot's pages at the engine's own addresses reproduces its memory image exactly.
//
// Pieces are sorted by slot offset and never overlap; `layer` (from the model's layer
// layout, -1 for embeddings, norms and heads) lets a prewarm stop after the first k layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors/model.hpp"
#include "vmm/vmm_error.hpp"

namespace thaw::vmm {

struct LayoutPiece {
  std::uint64_t slot_offset = 0;  // bytes from the slot's base
  std::string file;               // relative to the model directory
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
  int layer = -1;  // transformer block, or -1
  std::uint64_t slot_end() const { return slot_offset + bytes; }
};

class WeightLayout {
 public:
  // Tensors in file order, aligned. Layers come from the model's layer layout when the
  // family is known; otherwise every piece has layer -1 (and a k-layer prewarm loads all).
  static VmmResult<WeightLayout> packed(const safetensors::Model& model,
                                        std::uint64_t alignment = 256);
  // Pieces as recorded (any order); refused if two overlap or one is empty.
  static VmmResult<WeightLayout> engine(std::vector<LayoutPiece> pieces);

  const std::vector<LayoutPiece>& pieces() const { return pieces_; }
  // End of the last piece: the weights region's size.
  std::uint64_t extent() const { return pieces_.empty() ? 0 : pieces_.back().slot_end(); }
  std::uint64_t bytes() const;  // sum of the pieces
  // Bytes of the slot up to the first piece of a layer >= k: with a layout in layer order
  // (embeddings, then blocks 0, 1, ...), the prefix that holds everything layers [0, k)
  // need to start inference while the rest streams in (WarmServe §4.1).
  std::uint64_t prefix_for_layers(int k) const;
  int max_layer() const;

 private:
  explicit WeightLayout(std::vector<LayoutPiece> pieces) : pieces_(std::move(pieces)) {}
  std::vector<LayoutPiece> pieces_;
};

}  // namespace thaw::vmm
