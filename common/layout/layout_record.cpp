#include "common/layout/layout_record.hpp"

#include <fmt/format.h>

namespace thaw::layout {

nlohmann::json LayoutIdentity::to_json() const {
  return {{"engine", engine}, {"model", model}, {"gpu", gpu}, {"driver", driver}};
}

void LayoutRecord::add_copy(RecordedCopy copy) {
  if (!copies.empty()) {
    RecordedCopy& last = copies.back();
    if (last.allocation == copy.allocation && last.file == copy.file &&
        last.offset + last.bytes == copy.offset &&
        last.file_offset + last.bytes == copy.file_offset) {
      last.bytes += copy.bytes;
      return;
    }
  }
  if (copies.size() >= kMaxCopies) {
    truncated = true;
    return;
  }
  copies.push_back(std::move(copy));
}

nlohmann::json LayoutRecord::to_json() const {
  // Compact rows (arrays, not objects): a big model's copy map stays small.
  nlohmann::json allocs = nlohmann::json::array();
  for (const auto& a : allocations) allocs.push_back({a.size, a.offset});
  nlohmann::json copy_rows = nlohmann::json::array();
  for (const auto& c : copies)
    copy_rows.push_back({c.allocation, c.offset, c.file, c.file_offset, c.bytes});
  nlohmann::json infos = nlohmann::json::array();
  for (const auto& m : mem_info) infos.push_back({m.free, m.total});
  return {{"format", kFormat},
          {"identity", identity.to_json()},
          {"va_base", va_base},
          {"granularity", granularity},
          {"allocations", std::move(allocs)},
          {"copies", std::move(copy_rows)},
          {"mem_info", std::move(infos)},
          {"truncated", truncated}};
}

namespace {

template <typename T>
bool get_to(const nlohmann::json& j, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) return false;
  } else {
    if (!j.is_number_unsigned()) return false;
  }
  out = j.get<T>();
  return true;
}

}  // namespace

std::expected<LayoutRecord, std::string> layout_record_from_json(const nlohmann::json& doc) {
  auto fail = [](std::string what) {
    return std::unexpected("not a layout record this shim reads: " + std::move(what));
  };
  if (!doc.is_object()) return fail("not a JSON object");
  if (doc.value("format", 0) != LayoutRecord::kFormat) return fail("format is not 1");
  LayoutRecord r;
  const auto& id = doc.value("identity", nlohmann::json::object());
  if (!id.is_object() || !get_to(id.value("engine", nlohmann::json()), r.identity.engine) ||
      !get_to(id.value("model", nlohmann::json()), r.identity.model) ||
      !get_to(id.value("gpu", nlohmann::json()), r.identity.gpu) ||
      !get_to(id.value("driver", nlohmann::json()), r.identity.driver)) {
    return fail("identity");
  }
  if (!get_to(doc.value("va_base", nlohmann::json()), r.va_base) ||
      !get_to(doc.value("granularity", nlohmann::json()), r.granularity)) {
    return fail("va_base / granularity");
  }
  for (const auto& row : doc.value("allocations", nlohmann::json::array())) {
    RecordedAllocation a;
    if (!row.is_array() || row.size() != 2 || !get_to(row[0], a.size) || !get_to(row[1], a.offset))
      return fail("allocations");
    r.allocations.push_back(a);
  }
  for (const auto& row : doc.value("copies", nlohmann::json::array())) {
    RecordedCopy c;
    if (!row.is_array() || row.size() != 5 || !get_to(row[0], c.allocation) ||
        !get_to(row[1], c.offset) || !get_to(row[2], c.file) || !get_to(row[3], c.file_offset) ||
        !get_to(row[4], c.bytes))
      return fail("copies");
    r.copies.push_back(std::move(c));
  }
  for (const auto& row : doc.value("mem_info", nlohmann::json::array())) {
    RecordedMemInfo m;
    if (!row.is_array() || row.size() != 2 || !get_to(row[0], m.free) || !get_to(row[1], m.total))
      return fail("mem_info");
    r.mem_info.push_back(m);
  }
  r.truncated = doc.value("truncated", false);
  return r;
}

std::optional<std::string> SequenceCheck::check(std::uint64_t index, std::uint64_t size,
                                                std::uint64_t offset) const {
  // Past the record's end: nothing to compare with (the recorded run stopped earlier, or
  // allocated less while serving); the cursor keeps addresses deterministic.
  if (index >= recorded_.size()) return std::nullopt;
  const RecordedAllocation& r = recorded_[index];
  if (r.size != size) {
    return fmt::format("allocation #{} asks for {} bytes; the record has {} bytes there", index,
                       size, r.size);
  }
  if (r.offset != offset) {
    return fmt::format("allocation #{} ({} bytes) would land at offset {:#x}; the record has {:#x}",
                       index, size, offset, r.offset);
  }
  return std::nullopt;
}

std::string record_fingerprint(std::string_view document) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : document) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace thaw::layout
