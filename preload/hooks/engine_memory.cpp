#include "preload/hooks/engine_memory.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

namespace thaw::preload {

namespace {

std::mutex& mutex() {
  static auto* m = new std::mutex();  // never destroyed: hooks run during exit
  return *m;
}
// Live allocations by device pointer and live physical handles, with the bytes each holds.
std::map<CUdeviceptr, std::uint64_t>& live() {
  static auto* m = new std::map<CUdeviceptr, std::uint64_t>();
  return *m;
}
std::map<CUmemGenericAllocationHandle, std::uint64_t>& handles() {
  static auto* m = new std::map<CUmemGenericAllocationHandle, std::uint64_t>();
  return *m;
}
std::uint64_t g_bytes = 0;               // under mutex()
std::atomic<std::uint64_t> g_budget{0};  // 0: none granted

void settle_locked(std::uint64_t charged, std::uint64_t bytes) {
  if (bytes >= charged) {
    g_bytes += bytes - charged;
  } else {
    g_bytes -= charged - bytes;
  }
}

// An allocation or handle is gone: its bytes no longer count (unknown keys: not ours).
template <typename Key>
void forget_locked(std::map<Key, std::uint64_t>& held, Key key) {
  auto it = held.find(key);
  if (it == held.end()) return;
  g_bytes -= std::min(g_bytes, it->second);
  held.erase(it);
}

}  // namespace

bool charge_engine_bytes(std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  const std::uint64_t budget = g_budget.load(std::memory_order_acquire);
  if (budget != 0 && (g_bytes > budget || bytes > budget - g_bytes)) return false;
  g_bytes += bytes;
  return true;
}

void refund_engine_bytes(std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  g_bytes -= std::min(g_bytes, bytes);
}

void note_engine_alloc(CUdeviceptr ptr, std::uint64_t charged, std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  live()[ptr] = bytes;
  settle_locked(charged, bytes);
}

void note_engine_free(CUdeviceptr ptr) {
  std::lock_guard lock(mutex());
  forget_locked(live(), ptr);
}

void note_engine_create(CUmemGenericAllocationHandle handle, std::uint64_t charged,
                        std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  handles()[handle] = bytes;
  settle_locked(charged, bytes);
}

void note_engine_release(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(mutex());
  forget_locked(handles(), handle);
}

std::uint64_t engine_bytes() {
  std::lock_guard lock(mutex());
  return g_bytes;
}

void grant_memory_budget(std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  static std::optional<std::uint64_t> baseline;
  if (!baseline) baseline = g_bytes;
  g_budget.store(std::max<std::uint64_t>(*baseline + bytes, 1), std::memory_order_release);
}

std::optional<std::uint64_t> memory_budget() {
  const std::uint64_t b = g_budget.load(std::memory_order_acquire);
  return b == 0 ? std::nullopt : std::optional(b);
}

}  // namespace thaw::preload
