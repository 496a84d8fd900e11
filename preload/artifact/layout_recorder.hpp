// LayoutRecorder: records this run's deterministic layout (allocation sequence, H2D copy
// map, cuMemGetInfo answers) and, when thawd holds a record for the same engine, model,
// GPU type and driver, compares the live sequence with it allocation by allocation —
// stopping the layout at the first divergence and saying where.
//
// The identity is complete once the engine has opened a file of a managed model (usually
// its config.json, before CUDA starts) and the layout has reserved its region (the device
// is known). The record is looked up then; allocations made before it are compared at
// that moment. At exit the run's record is stored in thawd when there was none, when this
// run diverged from it (the newer sequence replaces it) or went past its end.
//
// The outside world (driver queries, thawd) comes in through RecorderEnvironment, so the
// logic is testable without either.
#pragma once

#include <cuda.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "common/layout/layout_record.hpp"
#include "preload/layout/deterministic_layout.hpp"

namespace thaw::preload {

using layout::layout_record_from_json;
using layout::LayoutIdentity;
using layout::LayoutRecord;
using layout::RecordedAllocation;
using layout::RecordedCopy;
using layout::RecordedMemInfo;
using layout::SequenceCheck;

struct RecorderEnvironment {
  std::string engine;  // the engine's fingerprint
  std::function<std::optional<std::string>(CUdevice)> gpu_name;
  std::function<std::optional<std::string>()> driver_version;
  // The stored record's JSON text for `identity`, or nullopt (none, or no thawd).
  std::function<std::optional<std::string>(const LayoutIdentity&)> fetch;
  // Stores a record; false when it could not be (no thawd).
  std::function<bool(const LayoutIdentity&, const std::string& json)> store;
  // Stops the layout (called without the recorder's lock held).
  std::function<void(const std::string& why)> stop_layout;
  // Said once (divergence, unusable record).
  std::function<void(const std::string& message)> notice;
  // The run diverged from its record (counted).
  std::function<void()> diverged;
};

class LayoutRecorder : public LayoutObserver {
 public:
  explicit LayoutRecorder(RecorderEnvironment env) : env_(std::move(env)) {}

  // LayoutObserver (called under the layout's lock).
  void region_reserved(CUdevice device, std::uint64_t base, std::uint64_t granularity) override;
  std::optional<std::string> admit(std::uint64_t index, std::uint64_t size,
                                   std::uint64_t offset) override;
  void served(const LayoutAllocation& allocation) override;

  // The engine opened a file of managed model `key` (only the first model counts).
  void model_opened(const std::string& key);
  void note_copy(RecordedCopy copy);
  void note_mem_info(std::uint64_t free, std::uint64_t total);

  enum class Outcome { no_identity, stored, matched, store_failed, nothing_allocated };
  // At exit: stores the record when it should (see above).
  Outcome finish();

  bool diverged() const;
  bool has_record() const;  // a record was found for this run
  // The fingerprint of the record this run follows (layout::record_fingerprint of its
  // text); nullopt without one, or once the run left it.
  std::optional<std::string> record_fingerprint() const;
  LayoutRecord snapshot() const;

  // In a forked child: a fresh run (the parent's allocations are not the child's).
  void reset_after_fork();
  // Held across fork() by the shim's fork steps (preload/runtime/shim_runtime_fork.cpp).
  std::mutex& fork_mutex() const { return mutex_; }

 private:
  // Looks the record up once the identity is complete; returns a divergence of the prefix
  // already allocated, to stop the layout with (outside the lock).
  std::optional<std::string> lookup_locked();
  void diverge_locked(std::string why);

  RecorderEnvironment env_;
  mutable std::mutex mutex_;
  LayoutRecord live_;
  bool looked_up_ = false;
  std::optional<SequenceCheck> check_;
  std::uint64_t recorded_count_ = 0;
  std::optional<std::string> diverged_;
  std::optional<std::string> fingerprint_;
  bool finished_ = false;
};

}  // namespace thaw::preload
