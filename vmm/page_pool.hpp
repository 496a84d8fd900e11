// PagePool: the physical memory of one GPU that thaw manages, as equal pages.
//
// At creation the pool makes `bytes / page` physical allocations of one page each
// (cuMemCreate, the driver's allocation granularity — 2 MiB on current GPUs — and
// exportable as POSIX file descriptors), as WarmServe pre-allocates a GPU's memory: after
// that no cuMemCreate is ever on a critical path, and each page can be mapped into any
// prewarm slot, or handed to an engine process, on its own.
//
// Every page has exactly one owner at any time: free, or a slot's weights, a slot's KV
// cache, or lent (a page of an active slot's KV region given to another slot for
// proactive prewarm), or returned: its memory given back to the driver for an engine that
// needs the room (an engine that copied a slot's weights into its own memory), re-created
// by take_back() once the engine is gone. The pool only keeps the book; mapping pages is
// PrewarmSlot's job.
//
// Thread safety: all members may be called from any thread.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/cuda/driver.hpp"
#include "vmm/vmm_error.hpp"

namespace thaw::vmm {

using PageId = std::uint32_t;
using SlotId = std::uint32_t;
inline constexpr SlotId kNoSlot = ~SlotId{0};

enum class PageUse : std::uint8_t { free, weights, kv, lent, returned };
std::string_view to_string(PageUse use);

struct PageOwner {
  PageUse use = PageUse::free;
  SlotId slot = kNoSlot;  // the slot whose VA the page is (or is to be) mapped into
  bool operator==(const PageOwner&) const = default;
};

class PagePool {
 public:
  // Creates floor(bytes / granularity) pages on `device` (the calling thread's current
  // context must be on it). A driver failure part-way releases what was created and
  // returns the error: nothing leaks.
  static VmmResult<std::unique_ptr<PagePool>> create(std::shared_ptr<const cuda::Driver> driver,
                                                     CUdevice device, std::size_t bytes);
  // Releases every page's handle. Mappings must be gone first (slots unmap theirs).
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t page_count() const { return handles_.size(); }
  std::size_t count(PageUse use) const;
  std::size_t count(PageUse use, SlotId slot) const;

  // Takes `n` free pages for `owner` (all or none; lowest ids first).
  VmmResult<std::vector<PageId>> take(std::size_t n, PageOwner owner);
  // Gives pages back: they become free.
  void release(std::span<const PageId> pages);
  // Moves a page to another owner (lending, reclaiming, handing KV to weights).
  void reassign(PageId page, PageOwner owner);
  PageOwner owner(PageId page) const;
  // The pages `owner` holds, in id order.
  std::vector<PageId> pages_of(PageOwner owner) const;

  CUmemGenericAllocationHandle handle(PageId page) const;
  // A new descriptor for the page's memory (the caller owns and closes it).
  VmmResult<int> export_fd(PageId page) const;

  // Gives the memory of these free pages back to the driver (cuMemRelease): they become
  // `returned`, for `slot` (the slot whose engine needs the room; kNoSlot: none said).
  // Pages that are not free are left alone. Returns how many were given.
  std::size_t give_back(std::span<const PageId> pages, SlotId slot = kNoSlot);
  // Re-creates returned pages (free again) until the driver has no more memory for them.
  // Returns how many came back.
  std::size_t take_back();

 private:
  PagePool(std::shared_ptr<const cuda::Driver> driver, CUmemAllocationProp prop,
           std::size_t page_bytes, std::vector<CUmemGenericAllocationHandle> handles);

  std::shared_ptr<const cuda::Driver> driver_;
  CUmemAllocationProp prop_;
  std::size_t page_bytes_;
  mutable std::mutex mutex_;
  std::vector<CUmemGenericAllocationHandle> handles_;  // under mutex_; 0 while returned
  std::vector<PageOwner> owners_;                      // under mutex_
};

}  // namespace thaw::vmm
