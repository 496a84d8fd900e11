#include "preload/runtime/engine_memory.hpp"

#include <algorithm>

namespace thaw::preload {

void EngineMemory::settle_locked(std::uint64_t charged, std::uint64_t bytes) {
  if (bytes >= charged) {
    bytes_ += bytes - charged;
  } else {
    bytes_ -= charged - bytes;
  }
}

// An allocation or handle is gone: its bytes no longer count (unknown keys: not ours).
template <typename Key>
void EngineMemory::forget_locked(std::map<Key, std::uint64_t>& held, Key key) {
  auto it = held.find(key);
  if (it == held.end()) return;
  bytes_ -= std::min(bytes_, it->second);
  held.erase(it);
}

bool EngineMemory::charge(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const std::uint64_t budget = budget_.load(std::memory_order_acquire);
  if (budget != 0 && (bytes_ > budget || bytes > budget - bytes_)) return false;
  bytes_ += bytes;
  return true;
}

void EngineMemory::refund(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  bytes_ -= std::min(bytes_, bytes);
}

void EngineMemory::note_alloc(CUdeviceptr ptr, std::uint64_t charged, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  live_[ptr] = bytes;
  settle_locked(charged, bytes);
}

void EngineMemory::note_free(CUdeviceptr ptr) {
  std::lock_guard lock(mutex_);
  forget_locked(live_, ptr);
}

void EngineMemory::note_create(CUmemGenericAllocationHandle handle, std::uint64_t charged,
                               std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  handles_[handle] = bytes;
  settle_locked(charged, bytes);
}

void EngineMemory::note_release(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(mutex_);
  forget_locked(handles_, handle);
}

std::uint64_t EngineMemory::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void EngineMemory::grant_budget(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (!baseline_) baseline_ = bytes_;
  budget_.store(std::max<std::uint64_t>(*baseline_ + bytes, 1), std::memory_order_release);
}

std::optional<std::uint64_t> EngineMemory::budget() const {
  const std::uint64_t b = budget_.load(std::memory_order_acquire);
  return b == 0 ? std::nullopt : std::optional(b);
}

}  // namespace thaw::preload
