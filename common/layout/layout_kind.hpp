// How a prewarmed slot lays out a model's bytes, as one type wherever it travels inside thaw:
// thawd's prewarm and slots (daemon/service), the shim socket's `slot` message (common/proto)
// and the shim's grant (preload/inject). Text only at the edges where text is the format —
// the socket's JSON body, the D-Bus Slot.Layout property, log lines — and converted there with
// this one pair, so a misspelt kind cannot slip past a comparison.
//
// Header-only: the shim's and thawd's libraries take it without another link dependency.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace thaw::layout {

// packed: tensors in file order (vmm::WeightLayout::packed). engine: the layout an engine's
// recorded run used (its allocation sequence, so the slot's pages map in place).
enum class LayoutKind : std::uint8_t { packed, engine };

constexpr std::string_view to_string(LayoutKind kind) {
  return kind == LayoutKind::engine ? "engine" : "packed";
}

// nullopt when `name` is neither "packed" nor "engine".
constexpr std::optional<LayoutKind> parse_layout_kind(std::string_view name) {
  if (name == to_string(LayoutKind::packed)) return LayoutKind::packed;
  if (name == to_string(LayoutKind::engine)) return LayoutKind::engine;
  return std::nullopt;
}

}  // namespace thaw::layout
