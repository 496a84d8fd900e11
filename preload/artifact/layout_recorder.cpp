#include "preload/artifact/layout_recorder.hpp"

#include <fmt/format.h>

namespace thaw::preload {

void LayoutRecorder::region_reserved(CUdevice device, std::uint64_t base,
                                     std::uint64_t granularity) {
  std::lock_guard lock(mutex_);
  live_.va_base = base;
  live_.granularity = granularity;
  live_.identity.engine = env_.engine;
  if (env_.gpu_name) live_.identity.gpu = env_.gpu_name(device).value_or("");
  if (env_.driver_version) live_.identity.driver = env_.driver_version().value_or("");
  // No allocation has been made yet, so there is no prefix that could have diverged from
  // the record: the lookup's verdict on it is always "none".
  (void)lookup_locked();
}

std::optional<std::string> LayoutRecorder::admit(std::uint64_t index, std::uint64_t size,
                                                 std::uint64_t offset) {
  std::lock_guard lock(mutex_);
  if (diverged_ || !check_) return std::nullopt;
  if (auto why = check_->check(index, size, offset)) {
    diverge_locked(std::move(*why));
    return diverged_;
  }
  return std::nullopt;
}

void LayoutRecorder::diverge_locked(std::string why) {
  if (env_.notice) {
    env_.notice(
        fmt::format("this run diverged from its recorded layout: {}; leaving "
                    "deterministic mode (later allocations use the driver's addresses)",
                    why));
  }
  if (env_.diverged) env_.diverged();
  diverged_ = std::move(why);
}

void LayoutRecorder::served(const LayoutAllocation& a) {
  std::lock_guard lock(mutex_);
  if (live_.allocations.size() >= LayoutRecord::kMaxAllocations) {
    live_.truncated = true;
    return;
  }
  live_.allocations.push_back({a.size, a.base - live_.va_base});
}

void LayoutRecorder::model_opened(const std::string& key) {
  std::optional<std::string> stop;
  {
    std::lock_guard lock(mutex_);
    if (!live_.identity.model.empty()) return;
    live_.identity.model = key;
    stop = lookup_locked();
  }
  if (stop && env_.stop_layout) env_.stop_layout(*stop);
}

std::optional<std::string> LayoutRecorder::lookup_locked() {
  if (looked_up_ || !live_.identity.complete() || !env_.fetch) return std::nullopt;
  looked_up_ = true;
  auto text = env_.fetch(live_.identity);
  if (!text) return std::nullopt;  // none yet: this run records one
  const nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  auto record = layout_record_from_json(doc);
  if (!record) {
    if (env_.notice) {
      env_.notice("thawd's layout record is unusable (" + record.error() +
                  "); this run records a new one");
    }
    return std::nullopt;
  }
  if (record->identity != live_.identity || record->va_base != live_.va_base ||
      record->granularity != live_.granularity) {
    if (env_.notice) {
      env_.notice(
          fmt::format("thawd's layout record was made with VA base {:#x} and granularity "
                      "{} (this run: {:#x}, {}); this run records a new one",
                      record->va_base, record->granularity, live_.va_base, live_.granularity));
    }
    return std::nullopt;
  }
  recorded_count_ = record->allocations.size();
  check_.emplace(std::move(record->allocations));
  fingerprint_ = layout::record_fingerprint(*text);
  // Allocations made before the identity was known are checked now.
  for (std::uint64_t i = 0; i < live_.allocations.size(); ++i) {
    const RecordedAllocation& a = live_.allocations[i];
    if (auto why = check_->check(i, a.size, a.offset)) {
      diverge_locked(std::move(*why));
      return diverged_;
    }
  }
  return std::nullopt;
}

void LayoutRecorder::note_copy(RecordedCopy copy) {
  std::lock_guard lock(mutex_);
  live_.add_copy(std::move(copy));
}

void LayoutRecorder::note_mem_info(std::uint64_t free, std::uint64_t total) {
  std::lock_guard lock(mutex_);
  if (live_.mem_info.size() >= LayoutRecord::kMaxMemInfo) {
    live_.truncated = true;
    return;
  }
  live_.mem_info.push_back({free, total});
}

LayoutRecorder::Outcome LayoutRecorder::finish() {
  LayoutRecord record;
  {
    std::lock_guard lock(mutex_);
    if (finished_) return Outcome::matched;
    finished_ = true;
    if (!live_.identity.complete()) return Outcome::no_identity;
    if (live_.allocations.empty()) return Outcome::nothing_allocated;
    // A run that matched its record all the way (and did not go past it) has nothing new.
    if (check_ && !diverged_ && live_.allocations.size() <= recorded_count_) {
      return Outcome::matched;
    }
    record = live_;
  }
  if (!env_.store || !env_.store(record.identity, record.to_json().dump())) {
    return Outcome::store_failed;
  }
  return Outcome::stored;
}

std::optional<std::string> LayoutRecorder::record_fingerprint() const {
  std::lock_guard lock(mutex_);
  if (diverged_) return std::nullopt;
  return fingerprint_;
}

bool LayoutRecorder::diverged() const {
  std::lock_guard lock(mutex_);
  return diverged_.has_value();
}

bool LayoutRecorder::has_record() const {
  std::lock_guard lock(mutex_);
  return check_.has_value();
}

LayoutRecord LayoutRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  return live_;
}

void LayoutRecorder::reset_after_fork() {
  new (&mutex_) std::mutex();
  const std::string model = live_.identity.model;
  live_ = LayoutRecord{};
  live_.identity.model = model;  // opened before the fork: the child runs the same model
  looked_up_ = false;
  check_.reset();
  recorded_count_ = 0;
  diverged_.reset();
  fingerprint_.reset();
  finished_ = false;
}

}  // namespace thaw::preload
