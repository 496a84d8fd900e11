// WeightInjector: an engine attached to a prewarmed slot gets its weights from the slot's
// pages instead of over PCIe (WarmServe's universal GPU workers, for an unmodified engine).
//
// thawd's attach hands over the slot's pages (POSIX fds of its physical memory) and its
// layout (slot offset → file bytes). Two modes:
//
// - Copy mode (any layout): an H2D copy whose source is bytes of a managed model file that
//   the slot holds becomes device-to-device copies from the slot's pages, imported into
//   this process and mapped read-only at an address of the shim's, on the engine's own
//   stream (so ordering and events are the engine's). A page all of whose bytes have been
//   copied is given back to thawd once the copy is done (an event on the stream says so),
//   so the engine is not left holding the model twice.
// - Zero-copy (the slot was prewarmed in this engine's recorded layout, and this run is
//   checked against that same record): the deterministic layout maps the slot's pages at
//   the engine's allocations (PageBacking), and an H2D copy whose destination provably holds
//   its bytes already — the pages there are the slot's, the slot's layout puts exactly
//   those file bytes exactly there, they are resident, and nothing has written the slot's
//   pages since — completes without moving a byte. Anything else is copied for real (and
//   a real write into the slot's pages means the slot can no longer be handed back).
//
// Partial prewarm: only the layout's resident prefix counts; other bytes are copied as
// usual. At exit, finish() waits for outstanding copies and says whether the slot can be
// handed back prewarmed (zero-copy, nothing freed, nothing written).
//
// The driver and thawd come in through InjectorDriver / InjectorEnvironment, so the logic is
// testable on the emulator without the rest of the shim. Thread-safe.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/layout/layout_kind.hpp"
#include "preload/layout/deterministic_layout.hpp"

namespace thaw::preload {

struct InjectorDriver {
  CUresult (*mem_import)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*ctx_get_device)(CUdevice*) = nullptr;
  bool complete() const;
};

struct SlotPiece {
  std::uint64_t slot_offset = 0;
  std::string file;
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t slot_end() const { return slot_offset + bytes; }
};

// What thawd's attach granted.
struct SlotGrant {
  std::string slot;   // "g0s1"
  std::string model;  // cache key
  layout::LayoutKind layout_kind = layout::LayoutKind::packed;
  std::string record_fingerprint;  // engine layout: the record it was built from
  std::uint64_t page_bytes = 0;
  std::uint64_t resident_bytes = 0;         // pieces ending at or below this are in the pages
  std::vector<SlotPiece> pieces;            // sorted by slot offset
  std::map<std::uint64_t, UniqueFd> pages;  // slot offset → the page's memory
};

struct InjectorEnvironment {
  // This run's record, as layout::record_fingerprint, once the recorder found one.
  std::function<std::optional<std::string>()> record_fingerprint;
  // Gives pages (slot offsets) back to thawd.
  std::function<void(const std::vector<std::uint64_t>&)> free_pages;
  std::function<void(const std::string&)> notice;
};

struct InjectorStats {
  std::uint64_t bytes_injected = 0;  // copied device-to-device from the slot
  std::uint64_t bytes_skipped = 0;   // already in place (zero-copy)
  std::uint64_t bytes_copied = 0;    // from the file after all (not in the slot, or mismatch)
  std::uint64_t pages_mapped = 0;    // slot pages mapped at the engine's allocations
  std::uint64_t pages_freed = 0;     // given back to thawd
  bool zero_copy = false;
  bool dirty = false;
};

class WeightInjector : public PageBacking {
 public:
  WeightInjector(InjectorDriver driver, InjectorEnvironment env, SlotGrant grant);
  ~WeightInjector() override;  // joins the importer
  WeightInjector(const WeightInjector&) = delete;
  WeightInjector& operator=(const WeightInjector&) = delete;

  // Starts importing the slot's pages on a thread of the injector's (the driver must be
  // initialised). Otherwise the first use starts it and waits.
  void start_import();

  const SlotGrant& grant() const { return grant_; }

  // The engine copies `bytes` bytes of model file `file` from `file_offset` to `dst`;
  // `region_offset` is dst's offset in the deterministic region (nullopt: not there), and
  // `backed` whether dst's allocation maps slot pages. `stream`: the stream to order on
  // (synchronous copies pass the default stream they use, and `synchronous`). nullopt: the
  // copy is the driver's to do (it is counted); otherwise the result of doing it here.
  std::optional<CUresult> copy(CUdeviceptr dst, std::optional<std::uint64_t> region_offset,
                               bool backed, const std::string& model, const std::string& file,
                               std::uint64_t file_offset, std::uint64_t bytes, CUstream stream,
                               bool synchronous);
  // Something other than a skipped copy writes [region_offset, +bytes) (a copy into a backed
  // allocation that was not skipped): the slot's pages may no longer hold the model.
  void note_write(std::uint64_t region_offset, std::uint64_t bytes);

  // PageBacking: zero-copy pages for the layout.
  std::optional<CUmemGenericAllocationHandle> page_at(std::uint64_t region_offset,
                                                      std::uint64_t granularity) override;

  // Gives back pages whose copies have finished (without waiting). Freed pages go to thawd
  // in batches of kFreeBatch as copies finish, and whatever is left at poll() — which the
  // shim calls when the engine asks cuMemGetInfo, i.e. before it sizes its KV cache.
  static constexpr std::size_t kFreeBatch = 64;
  void poll();
  // At exit: waits for outstanding copies, gives their pages back; true when the slot can
  // be handed back prewarmed.
  bool finish();
  InjectorStats stats() const;

 private:
  struct Segment {
    std::uint64_t slot_offset;
    std::uint64_t bytes;
  };
  // Slot ranges holding [file_offset, +bytes) of `file` (resident pieces only), in order;
  // nullopt when some byte is not in the slot.
  std::optional<std::vector<Segment>> cover_locked(const std::string& file,
                                                   std::uint64_t file_offset,
                                                   std::uint64_t bytes) const;
  bool zero_copy_locked(std::uint64_t granularity);
  void start_import_locked();
  // Waits until every page is imported (true) or an import failed (false).
  bool import_locked(std::unique_lock<std::mutex>& lock);
  // Waits until the page at `offset` is imported; nullopt if it cannot be.
  std::optional<CUmemGenericAllocationHandle> handle_locked(std::unique_lock<std::mutex>& lock,
                                                            std::uint64_t offset);
  CUresult map_for_copy_locked(std::unique_lock<std::mutex>& lock);  // the copy-mode view (once)
  void account_locked(const std::vector<Segment>& segments, CUstream stream);
  void reap_locked(bool wait);
  void send_freed_locked();

  InjectorDriver driver_;
  InjectorEnvironment env_;
  SlotGrant grant_;
  mutable std::mutex mutex_;
  // file → file offset → index in grant_.pieces (resident pieces only).
  std::map<std::string, std::map<std::uint64_t, std::size_t>> by_file_;
  std::map<std::uint64_t, CUmemGenericAllocationHandle> handles_;  // slot offset → handle
  bool import_started_ = false;
  bool imported_ = false;
  bool import_failed_ = false;
  std::condition_variable imported_cv_;
  std::thread importer_;
  std::optional<bool> zero_copy_;         // decided at the first page asked for
  std::set<std::uint64_t> engine_pages_;  // slot pages mapped at the engine's allocations
  CUdeviceptr view_ = 0;                  // copy mode: where the slot's pages are mapped
  std::uint64_t view_bytes_ = 0;
  bool view_failed_ = false;
  std::map<std::uint64_t, std::uint64_t> page_left_;  // page → resident bytes not copied yet
  struct Pending {
    CUevent done;
    std::vector<std::uint64_t> pages;
  };
  std::vector<Pending> pending_;
  std::vector<std::uint64_t> unsent_;  // freed here, not yet told to thawd
  InjectorStats stats_;
};

}  // namespace thaw::preload
