// DeterministicLayout: the engine's cuMemAlloc allocations, served from one VA region at a
// fixed base through VMM, in allocation order — so the same engine on the same model gets
// the same device addresses every run (the idea Foundry uses for graph persistence). The
// foundation for weight injection (prewarmed pages mapped at exactly the weights' addresses)
// and graph restore (recorded pointers stay valid).
//
// - The region (4 × the device's memory of VA, reserved once at `base`) is carved by a
//   monotonic cursor: allocation i lands at base + Σ round_up(size_j, granularity), j < i.
//   VA reservations the engine makes for itself (cuMemAddressReserve with no fixed address:
//   PyTorch's expandable segments) are carved from it the same way, in the same sequence.
//   A freed allocation's pages go back to the driver; its VA is not reused, so a later
//   allocation never depends on the order of frees.
// - Each allocation is cuMemCreate (pinned device memory, POSIX-fd shareable) + cuMemMap +
//   cuMemSetAccess(read/write) — the physical handle is released at once, the mapping
//   keeps the memory alive until cuMemUnmap at free.
// - Queries answer as for cuMemAlloc memory: the allocation's own base and requested size,
//   not the region's.
// - When the region cannot be reserved at `base`, or fills up, or the observer says the
//   run diverged from its record, the layout stops (later allocations go to the driver as
//   usual) and says so once: slower to restore, never wrong.
//
// Thread-safe. The driver functions are passed in, so this is testable on the emulator
// without the rest of the shim.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace thaw::preload {

struct LayoutDriver {
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  // Optional: without it allocations record no context (LayoutAllocation::ctx stays null).
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*device_total_mem)(size_t*, CUdevice) = nullptr;
  CUresult (*mem_get_allocation_granularity)(size_t*, const CUmemAllocationProp*,
                                             CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                         unsigned long long) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;

  bool complete() const;
};

struct LayoutAllocation;

// Told about the layout's decisions, under the layout's lock (so in allocation order):
// the recorder of the shim (preload/artifact) records them and compares them with a
// record. Must not call back into the layout.
class LayoutObserver {
 public:
  virtual ~LayoutObserver() = default;
  virtual void region_reserved(CUdevice device, std::uint64_t base, std::uint64_t granularity) = 0;
  // Allocation `index` would take `size` bytes at `offset` from the base. A reason stops the
  // layout before serving it (the allocation then goes to the driver).
  virtual std::optional<std::string> admit(std::uint64_t index, std::uint64_t size,
                                           std::uint64_t offset) = 0;
  virtual void served(const LayoutAllocation& allocation) = 0;
};

// Physical pages to map at given region offsets instead of fresh memory: weight injection's
// zero-copy mode hands the layout the pages of a slot thawd prewarmed in this engine's
// recorded layout. Consulted under the layout's lock, once per granularity page of each
// allocation; the handle stays the backing's (the layout maps it and never releases it).
class PageBacking {
 public:
  virtual ~PageBacking() = default;
  // `granularity`: the region's page size, which the backing's pages must have.
  virtual std::optional<CUmemGenericAllocationHandle> page_at(std::uint64_t region_offset,
                                                              std::uint64_t granularity) = 0;
};

struct LayoutAllocation {
  static constexpr std::uint64_t kOutOfSequence = ~std::uint64_t{0};
  std::uint64_t index = 0;  // allocation order in this process, from 0; or kOutOfSequence
  CUdeviceptr base = 0;
  std::size_t size = 0;    // as requested
  std::size_t mapped = 0;  // rounded up to the granularity
  CUdevice device = 0;
  // A VA reservation (cuMemAddressReserve, e.g. PyTorch's expandable segments): the engine
  // maps its own memory into it; the layout only chose where it lies.
  bool reservation = false;
  // Some of its pages are a PageBacking's (a prewarm slot's), not fresh memory.
  bool backed = false;
  // The context current when it was allocated: what the driver answers for the CONTEXT
  // attribute of cuMemAlloc memory, and whose destruction frees it. Null for reservations
  // (VMM memory belongs to no context).
  CUcontext ctx = nullptr;
};

class DeterministicLayout {
 public:
  DeterministicLayout(LayoutDriver driver, std::uint64_t base, LayoutObserver* observer = nullptr);

  // nullopt: not served here (layout stopped, no context, other device): the caller asks
  // the driver. Otherwise the driver's result of the VMM calls (e.g. OUT_OF_MEMORY).
  std::optional<CUresult> allocate(CUdeviceptr* out, std::size_t size);
  // nullopt: `ptr` is not in the region (the driver's own allocation).
  std::optional<CUresult> free(CUdeviceptr ptr);
  // The driver destroyed (or reset) `ctx`, which frees the cuMemAlloc memory allocated in
  // it: the layout frees its allocations made in `ctx` the same way (their VA is not
  // reused). Returns those freed. Reservations are VMM VA and stay.
  std::vector<LayoutAllocation> free_context(CUcontext ctx);
  // A VA reservation of `size` bytes (a multiple of the granularity) aligned to `alignment`
  // (0: the granularity), next in the sequence. nullopt: not served here (the driver's).
  std::optional<CUresult> reserve(CUdeviceptr* out, std::size_t size, std::size_t alignment);
  // A reservation at a requested address inside the region: served there when that VA is
  // free to the caller — freed VA the sequence has passed (never handed out again), or VA
  // ahead of the cursor — as the driver honours a free requested address (a peer process
  // mapping memory it imports at the exporter's address asks for such VA). Not part of the
  // sequence (index kOutOfSequence, not told to the observer); should the sequence reach it,
  // the layout stops. nullopt: not served here (the driver places it).
  std::optional<CUresult> reserve_at(CUdeviceptr* out, std::size_t size, std::size_t alignment,
                                     CUdeviceptr addr);
  // cuMemAddressFree of a reservation the layout made (refused while the caller still has
  // memory mapped in it, as the driver refuses). nullopt: not in the region.
  std::optional<CUresult> release(CUdeviceptr ptr, std::size_t size);

  // The caller's VMM calls (cuMemMap, cuMemUnmap, cuMemSetAccess, ...) on region VA. To the
  // driver the region is one reservation, so it would accept ranges that run past the end of
  // the caller's own reservation, into freed VA or into cuMemAlloc memory; the caller's
  // driver would refuse them. The hooks ask first and send refused ranges to the driver at
  // unreserved_alias(ptr), so the refusal is the driver's own answer, errors included.
  enum class CallerRange {
    not_in_region,  // not the layout's VA: the driver's to judge
    inside,         // [ptr, ptr + size) lies within one live caller reservation
    outside,        // region VA the caller has not reserved (or cuMemAlloc memory)
  };
  CallerRange caller_range(CUdeviceptr ptr, std::size_t size) const;
  // An address no driver has reserved (below one granule, where nothing is ever mapped) with
  // `ptr`'s offset within its granule, so alignment checks answer as for `ptr`.
  CUdeviceptr unreserved_alias(CUdeviceptr ptr) const;
  // The caller mapped / unmapped [ptr, ptr + size) in one of its reservations (the driver
  // said yes): what release() consults.
  void note_caller_mapped(CUdeviceptr ptr, std::size_t size);
  void note_caller_unmapped(CUdeviceptr ptr, std::size_t size);
  // The live allocation containing `ptr`.
  std::optional<LayoutAllocation> find(CUdeviceptr ptr) const;
  // Whether `ptr` lies in the region at all (live or freed).
  bool in_region(CUdeviceptr ptr) const;

  // From now on, allocations map the backing's pages where it has them (nullptr: none).
  void set_backing(PageBacking* backing);

  bool active() const;
  std::optional<std::string> stop_reason() const;
  // Stops serving allocations (those made stay valid); the first reason given is kept.
  void stop(std::string why);
  std::uint64_t base() const { return base_; }
  std::uint64_t allocations() const;  // served so far
  // In a forked child: a layout the parent had not used yet starts afresh; one it had used
  // stops (the parent's driver state is not the child's). Never touches the driver.
  void reset_after_fork();
  // Held across fork() by the shim's fork steps (preload/runtime/shim_runtime_fork.cpp).
  std::mutex& fork_mutex() const { return mutex_; }

 private:
  bool ensure_region_locked(CUdevice device);
  // Maps [va, va + mapped): the backing's pages where it has them, fresh memory (one
  // cuMemCreate per run of pages) elsewhere; read-write for `device`. On failure nothing
  // stays mapped.
  CUresult map_locked(CUdeviceptr va, std::uint64_t mapped, CUdevice device, bool& backed);
  void stop_locked(std::string why);
  // Whether a live entry (an out-of-sequence reservation) lies in [va, va + size): then the
  // layout stops, and the caller hands the allocation to the driver.
  bool overlaps_live_locked(CUdeviceptr va, std::uint64_t size);

  LayoutDriver driver_;
  const std::uint64_t base_;
  LayoutObserver* observer_;
  PageBacking* backing_ = nullptr;  // under mutex_
  mutable std::mutex mutex_;
  bool reserved_ = false;
  std::optional<std::string> stopped_;
  CUdevice device_ = 0;
  std::size_t granularity_ = 0;
  std::uint64_t region_size_ = 0;
  std::uint64_t cursor_ = 0;  // offset of the next allocation
  std::uint64_t next_index_ = 0;
  std::map<CUdeviceptr, LayoutAllocation> live_;  // by base
  // What the caller mapped into its reservations: start -> size.
  std::map<CUdeviceptr, std::uint64_t> caller_mapped_;
};

}  // namespace thaw::preload
