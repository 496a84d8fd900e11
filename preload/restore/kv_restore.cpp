#include "preload/restore/kv_restore.hpp"

#include <fmt/format.h>

namespace thaw::preload::restore {

std::string_view to_string(KvStatus status) {
  switch (status) {
    case KvStatus::ok:
      return "ok";
    case KvStatus::none:
      return "none";
    case KvStatus::stale:
      return "stale";
    case KvStatus::corrupt:
      return "corrupt";
    case KvStatus::unavailable:
      return "unavailable";
    case KvStatus::invalid_argument:
      return "invalid argument";
    case KvStatus::no_lookup:
      return "no lookup";
  }
  return "?";
}

void KvRestore::model_opened(const std::string& key) {
  std::lock_guard lock(mutex_);
  if (model_.empty()) model_ = key;
}

KvLookupResult KvRestore::lookup(std::string_view key) {
  if (auto bad = invalid_key(key)) return {KvStatus::invalid_argument, {}, *bad};
  std::string model;
  {
    std::lock_guard lock(mutex_);
    model = model_;
  }
  if (model.empty()) {
    return {KvStatus::unavailable,
            {},
            "the engine opened no model from thaw's cache: nothing identifies a KV record"};
  }
  if (!env_.identity || !env_.conditions) return {KvStatus::unavailable, {}, "no driver"};
  auto identity = env_.identity();
  if (!identity) return {KvStatus::unavailable, {}, identity.error()};
  identity->model = model;
  if (!identity->complete()) {
    return {KvStatus::unavailable, {}, "this run's engine, GPU or driver is not known"};
  }
  auto now = env_.conditions();
  if (!now) return {KvStatus::unavailable, {}, now.error()};
  {
    std::lock_guard lock(mutex_);
    noted_ = Noted{std::string(key), *identity, *now};
  }
  std::optional<std::string> text = env_.fetch ? env_.fetch(*identity) : std::nullopt;
  if (!text) {
    return {KvStatus::none,
            {},
            fmt::format("thawd holds no KV record for this engine and {} on {} (or thawd is not "
                        "reachable)",
                        identity->model, identity->gpu)};
  }
  auto stored = parse_kv_record(*text);
  if (!stored) {
    return {KvStatus::corrupt, {}, "thawd's KV record is refused: " + stored.error()};
  }
  if (stored->identity != *identity) {
    return {KvStatus::corrupt,
            {},
            "thawd's KV record is refused: its identity (engine, model, GPU, driver) is not this "
            "run's"};
  }
  if (auto why = staleness(*stored, key, *now)) {
    return {KvStatus::stale, {}, "the KV record is stale: " + *why};
  }
  return {KvStatus::ok, stored->size, {}};
}

KvRecordResult KvRestore::record(std::string_view key, const KvSize& size) {
  if (auto bad = invalid_key(key)) return {KvStatus::invalid_argument, *bad};
  if (auto bad = invalid_size(size)) return {KvStatus::invalid_argument, *bad};
  KvRecord r;
  {
    std::lock_guard lock(mutex_);
    if (!noted_ || noted_->key != key) {
      return {KvStatus::no_lookup,
              "no lookup with this configuration key was made in this process: look up before "
              "the profiling pass, record after it"};
    }
    r.identity = noted_->identity;
    r.key = noted_->key;
    r.conditions = noted_->conditions;
  }
  r.size = size;
  if (size.kv_bytes > r.conditions.mem_total) {
    return {KvStatus::invalid_argument,
            fmt::format("a KV cache of {} bytes exceeds the memory budget of {} bytes it was "
                        "sized in",
                        size.kv_bytes, r.conditions.mem_total)};
  }
  if (!env_.store || !env_.store(r.identity, r.to_json_text())) {
    return {KvStatus::unavailable, "thawd did not store the KV record (not reachable?)"};
  }
  return {KvStatus::ok, {}};
}

void KvRestore::reset_after_fork() {
  new (&mutex_) std::mutex();
  noted_.reset();
}

}  // namespace thaw::preload::restore
