#include "daemon/prewarm/engine_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/layout/layout_record.hpp"

namespace thaw::daemon {

namespace {

ServiceError refused(std::string why) {
  return ServiceError{error_name::kInvalidArgument,
                      "the engine layout record cannot be prewarmed: " + std::move(why)};
}

}  // namespace

ServiceResult<EngineLayout> engine_layout_from_record(std::string_view document,
                                                      const safetensors::Model& model) {
  auto doc = nlohmann::json::parse(document, nullptr, false);
  if (doc.is_discarded()) return std::unexpected(refused("it is not JSON"));
  // The record comes from the state directory, which thawd does not trust to be well
  // formed: a field of the wrong JSON type is a refused record, never an exception on the
  // prewarm thread (which would end thawd).
  std::expected<layout::LayoutRecord, std::string> record;
  try {
    record = layout::layout_record_from_json(doc);
  } catch (const std::exception& e) {
    return std::unexpected(refused(e.what()));
  }
  if (!record) return std::unexpected(refused(record.error()));
  if (record->copies.empty()) return std::unexpected(refused("it records no weight copies"));

  // Every tensor's file range and layer, from the packed layout (which knows the layers).
  auto packed = vmm::WeightLayout::packed(model);
  if (!packed) return std::unexpected(refused(packed.error().message));
  std::map<std::string, std::map<std::uint64_t, const vmm::LayoutPiece*>> tensors;
  std::map<std::string, std::uint64_t> file_end;
  for (const vmm::LayoutPiece& p : packed->pieces()) {
    tensors[p.file][p.file_offset] = &p;
    file_end[p.file] = std::max(file_end[p.file], p.file_offset + p.bytes);
  }

  std::vector<vmm::LayoutPiece> pieces;
  for (const layout::RecordedCopy& c : record->copies) {
    if (c.allocation >= record->allocations.size()) {
      return std::unexpected(refused(fmt::format("a copy names allocation #{} of {}", c.allocation,
                                                 record->allocations.size())));
    }
    auto in_file = tensors.find(c.file);
    if (in_file == tensors.end() || c.file_offset + c.bytes > file_end[c.file]) {
      return std::unexpected(refused(fmt::format("{} bytes {}+{} are not tensor data of this model",
                                                 c.file, c.file_offset, c.bytes)));
    }
    const auto& by_offset = in_file->second;
    auto t = by_offset.upper_bound(c.file_offset);
    const int layer = t == by_offset.begin() ? -1 : std::prev(t)->second->layer;
    pieces.push_back(vmm::LayoutPiece{record->allocations[c.allocation].offset + c.offset, c.file,
                                      c.file_offset, c.bytes, layer});
  }
  auto layout = vmm::WeightLayout::engine(std::move(pieces));
  if (!layout) return std::unexpected(refused(layout.error().message));
  return EngineLayout{std::move(*layout), layout::record_fingerprint(document)};
}

}  // namespace thaw::daemon
