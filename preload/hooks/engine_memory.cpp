#include "preload/hooks/engine_memory.hpp"

#include <atomic>
#include <map>
#include <mutex>

namespace thaw::preload {

namespace {

std::mutex& mutex() {
  static auto* m = new std::mutex();  // never destroyed: hooks run during exit
  return *m;
}
std::map<CUdeviceptr, std::uint64_t>& live() {
  static auto* m = new std::map<CUdeviceptr, std::uint64_t>();
  return *m;
}
std::atomic<std::uint64_t> g_bytes{0};
std::atomic<std::uint64_t> g_budget{0};  // 0: none granted

}  // namespace

void note_engine_alloc(CUdeviceptr ptr, std::uint64_t bytes) {
  std::lock_guard lock(mutex());
  live()[ptr] = bytes;
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void note_engine_free(CUdeviceptr ptr) {
  std::lock_guard lock(mutex());
  auto it = live().find(ptr);
  if (it == live().end()) return;
  g_bytes.fetch_sub(it->second, std::memory_order_relaxed);
  live().erase(it);
}

std::uint64_t engine_bytes() {
  return g_bytes.load(std::memory_order_relaxed);
}

void set_memory_budget(std::uint64_t bytes) {
  g_budget.store(bytes, std::memory_order_release);
}

std::optional<std::uint64_t> memory_budget() {
  const std::uint64_t b = g_budget.load(std::memory_order_acquire);
  return b == 0 ? std::nullopt : std::optional(b);
}

}  // namespace thaw::preload
