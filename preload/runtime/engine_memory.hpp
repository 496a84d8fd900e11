// What the engine holds on the device through the hooked allocators (cuMemAlloc — the
// layout's allocations and the driver's alike — and cuMemCreate of device memory), and the
// budget thawd granted it when it runs attached to a prewarm slot or on memory leased from
// thawd's pool: the two numbers cuMemGetInfo answers from then, and the limit every
// allocation is checked against. One per process, owned by the ShimRuntime.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace thaw::preload {

class EngineMemory {
 public:
  // Counts `bytes` as the engine's if they fit the budget (always, when there is none);
  // false: they do not, and nothing was counted — the caller answers OUT_OF_MEMORY without
  // asking the driver.
  bool charge(std::uint64_t bytes);
  // Takes back a charge whose allocation failed, or the part of one not used.
  void refund(std::uint64_t bytes);

  // A successful allocation: `charged` bytes were charged for it, `bytes` is what it really
  // holds (a layout allocation is rounded up to the granularity): the difference is counted
  // too, even past the budget (the memory is taken already).
  void note_alloc(CUdeviceptr ptr, std::uint64_t charged, std::uint64_t bytes);
  void note_free(CUdeviceptr ptr);
  void note_create(CUmemGenericAllocationHandle handle, std::uint64_t charged, std::uint64_t bytes);
  void note_release(CUmemGenericAllocationHandle handle);
  std::uint64_t bytes() const;

  // thawd's grant: the engine may allocate `bytes` beyond what it held when it got its first
  // grant (memory allocated before from the driver's own share stays its own). A later grant
  // (attaching after a lease) replaces the earlier one.
  void grant_budget(std::uint64_t bytes);
  std::optional<std::uint64_t> budget() const;

  // Held across fork() by the runtime's fork steps (shim_runtime_fork.cpp).
  std::mutex& fork_mutex() { return mutex_; }

 private:
  void settle_locked(std::uint64_t charged, std::uint64_t bytes);
  template <typename Key>
  void forget_locked(std::map<Key, std::uint64_t>& held, Key key);

  mutable std::mutex mutex_;
  // Live allocations by device pointer and live physical handles, with the bytes each holds.
  std::map<CUdeviceptr, std::uint64_t> live_;
  std::map<CUmemGenericAllocationHandle, std::uint64_t> handles_;
  std::uint64_t bytes_ = 0;
  std::optional<std::uint64_t> baseline_;  // what the engine held at the first grant
  std::atomic<std::uint64_t> budget_{0};   // 0: none granted
};

}  // namespace thaw::preload
