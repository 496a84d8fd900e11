// KvRecord: the "kvcache" artifact — what an engine's profiling pass decided about its KV
// cache (preload/include/thaw/thaw_restore.h), with what the shim saw the engine size it from,
// so that a later run is given the size only when nothing of that has changed.
//
// The document is JSON, stored by thawd (daemon/artifacts) and read back from its state
// directory, so it is parsed as untrusted input: at most kMaxDocumentBytes, nested at most
// two levels, exactly the fields of its version (unknown versions and unknown fields refused),
// every number an unsigned integer, the values consistent with one another. Pure functions:
// no driver, no thawd (tests/preload/restore).
#pragma once

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

namespace thaw::preload::restore {

// What thawd keys the record by (as the layout record's identity): engine fingerprint, model
// (its key in thaw's cache), GPU name, driver version.
struct KvIdentity {
  std::string engine;
  std::string model;
  std::string gpu;
  std::string driver;
  bool complete() const {
    return !engine.empty() && !model.empty() && !gpu.empty() && !driver.empty();
  }
  bool operator==(const KvIdentity&) const = default;
};

// What the engine sizes its KV cache from, as the shim sees it when the engine looks a record
// up (before its profiling pass).
struct KvConditions {
  std::uint64_t device_total = 0;  // cuDeviceTotalMem of the context's device
  std::uint64_t mem_total = 0;     // cuMemGetInfo's total as the engine is answered (budget)
  std::uint64_t mem_free = 0;      // cuMemGetInfo's free, likewise
  std::uint64_t engine_bytes = 0;  // device memory the engine holds (weights, buffers)
  bool operator==(const KvConditions&) const = default;
};

// The profiling pass's decision.
struct KvSize {
  std::uint64_t kv_bytes = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_bytes = 0;
  bool operator==(const KvSize&) const = default;
};

struct KvRecord {
  static constexpr std::uint64_t kVersion = 1;
  static constexpr std::size_t kMaxDocumentBytes = 64 * 1024;
  static constexpr std::size_t kMaxKeyBytes = 4096;  // THAW_RESTORE_MAX_KEY_BYTES

  KvIdentity identity;
  std::string key;  // the engine's configuration key
  KvConditions conditions;
  KvSize size;

  // The document thawd stores ("identity" as thawd requires it of every artifact).
  std::string to_json_text() const;
  bool operator==(const KvRecord&) const = default;
};

// The record in `text`, or why it is refused (one printable line).
std::expected<KvRecord, std::string> parse_kv_record(std::string_view text);

// nullopt when `key` is a valid configuration key (1 to kMaxKeyBytes printable ASCII bytes);
// else why not.
std::optional<std::string> invalid_key(std::string_view key);

// nullopt when the size is self-consistent (at least one block of at least one byte,
// kv_bytes = num_blocks * block_bytes without overflow); else why not.
std::optional<std::string> invalid_size(const KvSize& size);

// How far cuMemGetInfo's free bytes may have moved (either way) for a record to hold: 1/256 of
// the total, as free memory drifts a little between runs (contexts, other tenants).
std::uint64_t free_tolerance(std::uint64_t mem_total);

// Why `stored` does not hold for this run (configuration `key`, conditions `now`), naming the
// first thing that differs and both values; nullopt when it holds. The identity is not
// compared here (thawd finds records by it; the caller checks it).
std::optional<std::string> staleness(const KvRecord& stored, std::string_view key,
                                     const KvConditions& now);

}  // namespace thaw::preload::restore
