// GpuMemory: thaw's manager of one GPU's memory — a PagePool and the prewarm slots that
// map it (WarmServe §4.2, "universal GPU workers").
//
// Slot states:
//
//   empty ──prewarm──▶ loading ──▶ prewarmed ──activate──▶ active ──deactivate──▶ draining
//     ▲                   │ (error: back to what it was)  ▲                        │
//     │                   ▼                               └────────────────────────┘
//     └──(background)── evicting ◀──evict── prewarmed          (KV unmapped: prewarmed)
//
// - prewarm copies a model's weights (a WeightLayout, from a WeightSource) into the slot:
//   page i+1 is mapped on the host while page i's bytes copy on a low-priority stream, and
//   a prewarm may stop after the first k layers (and resume later). Bytes go through a few
//   pinned staging buffers, so copies queue behind each other while the host maps ahead.
// - activate makes a prewarmed slot the GPU's one active slot and returns at once: on the
//   critical path there is no driver call at all — the weights are mapped already. A
//   background thread then maps free pages into the slot's KV region (evicting other
//   prewarmed slots, least recently prewarmed first, when the free pages do not cover the
//   KV budget); ensure_kv() blocks until a given amount is mapped, so the engine's KV
//   allocation never outruns it.
// - lend_kv / reclaim_kv: proactive prewarm (WarmServe §4.1). KV pages of the active slot
//   above a reservation target (reservation.hpp) are unmapped and lent to another slot,
//   whose prewarm uses them first; reclaim takes them back on demand (the borrower's
//   weights on them are lost and its loaded prefix shrinks). When the active slot is
//   deactivated, lent pages become the borrower's for good.
// - export_range hands an engine process descriptors of the pages backing a range of a
//   slot; they stay pinned (no eviction may unmap them) until confirm_import().
//
// Every operation either completes or leaves each page with exactly one owner and the slot
// in a defined state (check_invariants() proves it), and returns the driver's error.
//
// Thread safety: every member may be called from any thread; operations on one slot are
// serialised by its state (a loading slot refuses activate/evict, and so on).
#pragma once

#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda/driver.hpp"
#include "vmm/page_pool.hpp"
#include "vmm/prewarm_slot.hpp"
#include "vmm/vmm_error.hpp"
#include "vmm/weight_layout.hpp"
#include "vmm/weight_source.hpp"

namespace thaw::vmm {

enum class SlotState { empty, loading, prewarmed, active, draining, evicting };
std::string_view to_string(SlotState state);

struct GpuMemoryConfig {
  int ordinal = 0;               // CUDA device ordinal
  std::uint64_t pool_bytes = 0;  // 0: pool_share of the device's total memory
  double pool_share = 0.9;
  std::size_t max_slots = 8;
};

struct SlotInfo {
  SlotId id = kNoSlot;
  std::string model;
  SlotState state = SlotState::empty;
  CUdeviceptr base = 0;
  std::uint64_t weight_bytes = 0;  // the layout's extent (0 before the first prewarm)
  std::uint64_t loaded_bytes = 0;  // prefix of the weights region resident and valid
  int layers_resident = -1;        // layers [0, n) resident; -1: all (or unknown)
  std::size_t weight_pages = 0;    // pages mapped in the weights region
  std::size_t kv_pages = 0;        // pages mapped in the KV region
  std::uint64_t kv_target_bytes = 0;
  bool complete() const { return weight_bytes != 0 && loaded_bytes >= weight_bytes; }
};

struct PoolInfo {
  std::size_t page_bytes = 0;
  std::size_t pages = 0;
  std::size_t free = 0, weights = 0, kv = 0, lent = 0;
  std::size_t returned = 0;  // given back to the driver for an attached engine
};

struct PrewarmOptions {
  std::optional<int> layers;  // only embeddings and layers [0, k) (the layout's prefix)
  // Bytes queued for copy so far, of the total this prewarm copies; on the calling thread.
  std::function<void(std::uint64_t done, std::uint64_t total)> on_progress;
};

struct PrewarmReport {
  std::uint64_t bytes_copied = 0;
  std::size_t pages_mapped = 0;
  std::size_t copies = 0;
  double seconds = 0;
};

struct ActivationOptions {
  std::uint64_t kv_bytes = 0;  // KV cache to map; 0: every page the pool can give
};

struct ActivationReport {
  std::chrono::nanoseconds critical_path{0};  // inside activate(), on the caller's thread
  CUdeviceptr base = 0;
  std::uint64_t weight_bytes = 0;
  std::uint64_t kv_offset = 0;  // where the KV region starts, from base
  std::uint64_t kv_target_bytes = 0;
};

struct ExportedPage {
  int fd = -1;  // the caller owns it (close it once sent)
  std::uint64_t slot_offset = 0;
  std::uint64_t bytes = 0;
};

struct ExportedRange {
  std::uint64_t token = 0;  // for confirm_import
  std::vector<ExportedPage> pages;
};

class GpuMemory {
 public:
  // Retains the device's primary context, creates the pool and the prewarm stream.
  static VmmResult<std::unique_ptr<GpuMemory>> create(std::shared_ptr<const cuda::Driver> driver,
                                                      GpuMemoryConfig config);
  // Stops background work, unmaps and frees everything, releases the context.
  ~GpuMemory();
  GpuMemory(const GpuMemory&) = delete;
  GpuMemory& operator=(const GpuMemory&) = delete;

  // --- slots (gpu_memory.cpp) ---
  VmmResult<SlotId> create_slot(std::string model);
  VmmResult<void> destroy_slot(SlotId slot);  // only an empty slot

  // --- prewarm (gpu_memory_prewarm.cpp) ---
  VmmResult<PrewarmReport> prewarm(SlotId slot, const WeightLayout& layout, WeightSource& source,
                                   const PrewarmOptions& options = {});
  // --- activation and KV (gpu_memory_kv.cpp) ---
  VmmResult<ActivationReport> activate(SlotId slot, const ActivationOptions& options = {});
  // Blocks until `bytes` of the active slot's KV region are mapped (or the budget is
  // reached, or `timeout`): what the engine calls before using more KV.
  VmmResult<std::uint64_t> ensure_kv(SlotId slot, std::uint64_t bytes,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(30));
  VmmResult<void> deactivate(SlotId slot);
  VmmResult<void> evict(SlotId slot);  // gpu_memory.cpp

  // --- proactive prewarm: KV lent between slots (gpu_memory_lending.cpp) ---
  // Keeps `keep_bytes` of `active`'s KV mapped and lends the pages above to `borrower`.
  // Returns the pages lent.
  VmmResult<std::size_t> lend_kv(SlotId active, SlotId borrower, std::uint64_t keep_bytes);
  // Takes lent pages back into `active`'s KV region until `bytes` more are mapped (or
  // none are lent). Returns the pages reclaimed.
  VmmResult<std::size_t> reclaim_kv(SlotId active, std::uint64_t bytes);

  // --- pages handed to an engine process (gpu_memory_engine.cpp) ---
  VmmResult<ExportedRange> export_range(SlotId slot, std::uint64_t offset, std::uint64_t length);
  VmmResult<void> confirm_import(std::uint64_t token);
  // An engine that copied a slot's weights into memory of its own (weight injection's copy
  // mode) is done with these pages of the weights region (offsets from the slot's base, one
  // per page): they are unmapped and their memory given back to the driver — the engine
  // needs that room for its KV cache — the slot's resident prefix ends at the first of
  // them, and a slot left with no weight page mapped is empty. Returns the pages freed.
  VmmResult<std::size_t> free_weight_pages(SlotId slot, std::span<const std::uint64_t> offsets);
  // An engine (attached to `slot`, or kNoSlot) is to allocate its own memory (activations,
  // KV cache, workspaces) out of this pool: up to `max_pages` free pages are given back to
  // the driver for it (they become `returned`), so the driver — and only the driver —
  // has their room for the engine's allocations, whatever call it makes them with. No
  // prewarm can take them while they are out; take_back_returned() re-creates them once the
  // engine is gone. Returns the pages given.
  VmmResult<std::size_t> lend_to_engine(SlotId slot, std::size_t max_pages);
  // Whether the slot's weights region holds exactly what `layout` puts there (each piece
  // read back and compared with `source`): what thawd checks before it offers a slot an
  // engine handed back to the next one — an engine may have written its weights. Returns
  // the first piece that differs (its slot offset), or nullopt when all match.
  VmmResult<std::optional<std::uint64_t>> find_difference(SlotId slot, const WeightLayout& layout,
                                                          WeightSource& source);
  // Re-creates pages given back to the driver, as far as it has room (call again later for
  // the rest: an engine's memory goes some time after it exits). Returns how many.
  std::size_t take_back_returned();

  // --- background work and inspection (gpu_memory.cpp) ---
  void wait_idle();  // until the background thread has nothing queued or running
  std::vector<SlotInfo> slots() const;
  VmmResult<SlotInfo> slot(SlotId slot) const;
  PoolInfo pool() const;
  CUdevice device() const { return device_; }
  // The device's UUID as 32 hex digits (how a process that sees other ordinals names it).
  const std::string& uuid() const { return uuid_; }
  // Every page has one owner and is mapped where its owner says (after wait_idle()).
  std::expected<void, std::string> check_invariants() const;

 private:
  struct Slot;  // gpu_memory_internal.hpp
  GpuMemory(std::shared_ptr<const cuda::Driver> driver, CUdevice device, CUcontext context);

  Slot* find_locked(SlotId id) const;
  VmmResult<Slot*> require_locked(SlotId id) const;
  std::size_t kv_first_page(const Slot& s) const;
  VmmResult<void> make_current() const;
  // Unmaps every page of `s` that is not pinned by an export and releases it; locked.
  VmmResult<void> unmap_all_locked(Slot& s);
  bool pinned_locked(const Slot& s) const;
  void post(std::function<void()> job);
  void worker_loop();
  void map_kv_job(SlotId id);
  void drain_job(SlotId id);
  void evict_job(SlotId id);

  std::shared_ptr<const cuda::Driver> driver_;
  CUdevice device_;
  CUcontext context_;
  std::unique_ptr<PagePool> pool_;
  std::size_t slot_pages_ = 0;  // each slot's VA, in pages: the device's whole memory
  CUstream stream_ = nullptr;   // low-priority prewarm copies
  std::string uuid_;
  // Pinned staging buffers for prewarm copies, each with the event of its last copy. A
  // copy from pageable memory returns only once it is done (the driver stages it itself),
  // which would serialise page mapping with transfer; from pinned memory it is queued.
  struct Staging {
    void* buffer = nullptr;
    CUevent done = nullptr;
    bool in_flight = false;
  };
  std::vector<Staging> staging_;
  std::size_t staging_bytes_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<SlotId, std::unique_ptr<Slot>> slots_;
  SlotId next_slot_ = 0;
  std::uint64_t prewarm_clock_ = 0;  // orders slots for eviction
  std::uint64_t next_token_ = 1;
  std::map<std::uint64_t, std::vector<std::pair<SlotId, PageId>>> exports_;  // token → pages
  std::size_t max_slots_ = 8;

  std::deque<std::function<void()>> jobs_;
  int busy_ = 0;  // jobs running
  bool stopping_ = false;
  // Two background threads, so that a switch maps the new slot's KV pages while the old
  // slot's are still being unmapped (each page goes from one to the other as it frees).
  std::vector<std::thread> workers_;
};

}  // namespace thaw::vmm
