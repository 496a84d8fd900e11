// KvRestore: the shim's side of the restore ABI's KV calls (preload/include/thaw/thaw_restore.h;
// the C entry points are preload/restore/restore_abi.cpp). One per process, owned by the
// ShimRuntime.
//
//   lookup   notes this run's identity and conditions (what the engine sizes its KV cache
//            from), fetches the "kvcache" artifact from thawd and returns its size only when it
//            parses, is this run's and is not stale (kv_record.hpp says what is compared)
//   record   stores what the engine's profiling pass decided, with the conditions noted at the
//            lookup with the same key (after the pass they are no longer what it sized from)
//
// The outside world (the driver, the engine's memory, thawd) comes in through
// KvRestoreEnvironment, so the logic is testable without either. Its calls are made without
// KvRestore's lock held: the lock guards only the model and the noted lookup (a leaf lock).
#pragma once

#include <expected>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "preload/restore/kv_record.hpp"

namespace thaw::preload::restore {

// The ABI's codes (THAW_RESTORE_*, same values).
enum class KvStatus : int {
  ok = 0,
  none = 1,
  stale = 2,
  corrupt = 3,
  unavailable = 4,
  invalid_argument = 5,
  no_lookup = 6,
};
std::string_view to_string(KvStatus status);

struct KvRestoreEnvironment {
  // This run's engine fingerprint, GPU name and driver version (the model is KvRestore's own,
  // from model_opened), or why they cannot be known (no driver, no current context).
  std::function<std::expected<KvIdentity, std::string>()> identity;
  // What the engine would be answered now, or why it cannot be known.
  std::function<std::expected<KvConditions, std::string>()> conditions;
  // The stored record's text for `identity`, or nullopt (none, or no thawd).
  std::function<std::optional<std::string>(const KvIdentity&)> fetch;
  // Stores a record; false when it could not be (no thawd, or thawd refused it).
  std::function<bool(const KvIdentity&, const std::string& document)> store;
};

struct KvLookupResult {
  KvStatus status = KvStatus::unavailable;
  KvSize size;      // with ok
  std::string why;  // with anything else
};

struct KvRecordResult {
  KvStatus status = KvStatus::unavailable;
  std::string why;
};

class KvRestore {
 public:
  explicit KvRestore(KvRestoreEnvironment env) : env_(std::move(env)) {}
  KvRestore(const KvRestore&) = delete;
  KvRestore& operator=(const KvRestore&) = delete;

  // The engine opened a file of managed model `key` (the first model counts, as for the
  // layout record).
  void model_opened(const std::string& key);

  KvLookupResult lookup(std::string_view key);
  KvRecordResult record(std::string_view key, const KvSize& size);

  // In a forked child: no lookup made (the model, opened before the fork, stays).
  void reset_after_fork();
  // Held across fork() by the shim's fork steps (preload/runtime/shim_runtime_fork.cpp).
  std::mutex& fork_mutex() { return mutex_; }

 private:
  struct Noted {
    std::string key;
    KvIdentity identity;
    KvConditions conditions;
  };

  KvRestoreEnvironment env_;
  std::mutex mutex_;
  std::string model_;
  std::optional<Noted> noted_;  // the last lookup's
};

}  // namespace thaw::preload::restore
