// LayoutRecord: what a run under the deterministic layout did, as recorded on a first run
// and kept by thawd (kind "layout") for later runs of the same engine on the same model,
// GPU type and driver:
//   - the allocation sequence (size of each cuMemAlloc the layout served, and the offset
//     from the region's base it landed at),
//   - the H2D copy map (which bytes of which model file were copied to which allocation
//     offset: thawd prewarms a slot in this "engine layout", whose pages the shim then maps
//     at the engine's own allocations — weight injection's zero-copy mode),
//   - the cuMemGetInfo answers the engine got (what it sized its KV cache by).
//
// A later run checks each allocation against the record (SequenceCheck) and leaves
// deterministic mode at the first one that differs: addresses a restored artifact relies on
// are then no longer promised.
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace thaw::layout {

struct LayoutIdentity {
  std::string engine;  // fingerprint of the program (engine_fingerprint())
  std::string model;   // model key in thawd's cache
  std::string gpu;     // device name
  std::string driver;  // cuDriverGetVersion, as a string

  nlohmann::json to_json() const;
  bool complete() const {
    return !engine.empty() && !model.empty() && !gpu.empty() && !driver.empty();
  }
  bool operator==(const LayoutIdentity&) const = default;
};

struct RecordedAllocation {
  std::uint64_t size = 0;
  std::uint64_t offset = 0;  // from the region's base
  bool operator==(const RecordedAllocation&) const = default;
};

struct RecordedCopy {
  std::uint64_t allocation = 0;  // index in the allocation sequence
  std::uint64_t offset = 0;      // within it
  std::string file;              // relative path in the model
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
  bool operator==(const RecordedCopy&) const = default;
};

struct RecordedMemInfo {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
  bool operator==(const RecordedMemInfo&) const = default;
};

struct LayoutRecord {
  static constexpr int kFormat = 1;
  // Caps that keep a record bounded (an engine serving for days allocates on and on);
  // what goes past them is left out and `truncated` says so.
  static constexpr std::size_t kMaxAllocations = 65536;
  static constexpr std::size_t kMaxCopies = 65536;
  static constexpr std::size_t kMaxMemInfo = 256;

  LayoutIdentity identity;
  std::uint64_t va_base = 0;
  std::uint64_t granularity = 0;
  std::vector<RecordedAllocation> allocations;
  std::vector<RecordedCopy> copies;
  std::vector<RecordedMemInfo> mem_info;
  bool truncated = false;

  // Adds a copy, merged into the previous one when it continues it (same allocation and
  // file, both offsets contiguous): a tensor loaded in pieces is one entry.
  void add_copy(RecordedCopy copy);

  nlohmann::json to_json() const;
};

std::expected<LayoutRecord, std::string> layout_record_from_json(const nlohmann::json& doc);

// A short name for one stored record's exact text (64-bit FNV-1a, hex): thawd tells the
// shim which record a slot's engine layout was built from, and the shim compares it with the
// record it is checking its own allocations against.
std::string record_fingerprint(std::string_view document);

// Compares a live allocation sequence with a record, one allocation at a time.
class SequenceCheck {
 public:
  explicit SequenceCheck(std::vector<RecordedAllocation> recorded)
      : recorded_(std::move(recorded)) {}

  // Allocation number `index` of this run asks for `size` bytes and would land at
  // `offset`. nullopt: as recorded (or past the record's end). Otherwise where and how the
  // run diverged.
  std::optional<std::string> check(std::uint64_t index, std::uint64_t size,
                                   std::uint64_t offset) const;

 private:
  std::vector<RecordedAllocation> recorded_;
};

}  // namespace thaw::layout
