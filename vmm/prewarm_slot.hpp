// PrewarmSlot: one model's view of a GPU — a VA reservation as large as its memory, weights
// at its start and the KV cache after them — and which pool page backs each of its pages.
//
// A slot only maps and unmaps (cuMemMap + cuMemSetAccess, cuMemUnmap); which pages it may
// use, and its state, are GpuMemory's business. A failed map leaves the page unmapped and
// the table unchanged; the destructor unmaps whatever is still mapped and frees the VA.
//
// Not thread-safe: GpuMemory serialises access to each slot.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/driver.hpp"
#include "vmm/page_pool.hpp"
#include "vmm/vmm_error.hpp"

namespace thaw::vmm {

class PrewarmSlot {
 public:
  static VmmResult<std::unique_ptr<PrewarmSlot>> create(std::shared_ptr<const cuda::Driver> driver,
                                                        CUdevice device, SlotId id,
                                                        std::size_t pages, std::size_t page_bytes);
  ~PrewarmSlot();
  PrewarmSlot(const PrewarmSlot&) = delete;
  PrewarmSlot& operator=(const PrewarmSlot&) = delete;

  SlotId id() const { return id_; }
  CUdeviceptr base() const { return base_; }
  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t page_count() const { return table_.size(); }
  CUdeviceptr address_of(std::size_t index) const { return base_ + index * page_bytes_; }

  // Maps pool page `page` (memory `handle`) at slot page `index`, read-write for the device.
  VmmResult<void> map(std::size_t index, PageId page, CUmemGenericAllocationHandle handle);
  // Unmaps slot page `index` and returns the pool page that was there.
  VmmResult<PageId> unmap(std::size_t index);
  // unmap() in two steps, for a caller that must not hold its lock across the driver call:
  // unmap_only() drops the mapping and leaves the table as it was (it may run while others
  // read the table), forget() then clears the entry and returns the page.
  VmmResult<void> unmap_only(std::size_t index) const;
  PageId forget(std::size_t index);
  std::optional<PageId> page_at(std::size_t index) const { return table_.at(index); }
  std::size_t mapped_count() const;

 private:
  PrewarmSlot(std::shared_ptr<const cuda::Driver> driver, CUdevice device, SlotId id,
              CUdeviceptr base, std::size_t pages, std::size_t page_bytes);

  std::shared_ptr<const cuda::Driver> driver_;
  CUdevice device_;
  SlotId id_;
  CUdeviceptr base_;
  std::size_t page_bytes_;
  std::vector<std::optional<PageId>> table_;
};

}  // namespace thaw::vmm
