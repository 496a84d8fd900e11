#include "vmm/prewarm_slot.hpp"

#include <fmt/format.h>

namespace thaw::vmm {

VmmResult<std::unique_ptr<PrewarmSlot>> PrewarmSlot::create(
    std::shared_ptr<const cuda::Driver> driver, CUdevice device, SlotId id, std::size_t pages,
    std::size_t page_bytes) {
  auto base = driver->address_reserve(pages * page_bytes, page_bytes);
  if (!base) {
    return std::unexpected(driver_error(
        base.error(), fmt::format("slot {}: reserving {} bytes of VA", id, pages * page_bytes)));
  }
  return std::unique_ptr<PrewarmSlot>(
      new PrewarmSlot(std::move(driver), device, id, *base, pages, page_bytes));
}

PrewarmSlot::PrewarmSlot(std::shared_ptr<const cuda::Driver> driver, CUdevice device, SlotId id,
                         CUdeviceptr base, std::size_t pages, std::size_t page_bytes)
    : driver_(std::move(driver)),
      device_(device),
      id_(id),
      base_(base),
      page_bytes_(page_bytes),
      table_(pages) {}

PrewarmSlot::~PrewarmSlot() {
  // Each call is tried a second time: a transient driver error must not leak VA.
  for (std::size_t i = 0; i < table_.size(); ++i) {
    if (table_[i] && !driver_->mem_unmap(address_of(i), page_bytes_)) {
      (void)driver_->mem_unmap(address_of(i), page_bytes_);
    }
  }
  const std::size_t bytes = table_.size() * page_bytes_;
  if (!driver_->address_free(base_, bytes)) (void)driver_->address_free(base_, bytes);
}

VmmResult<void> PrewarmSlot::map(std::size_t index, PageId page,
                                 CUmemGenericAllocationHandle handle) {
  if (index >= table_.size() || table_[index]) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("slot {}: page {} is {}", id_, index,
                                   index >= table_.size() ? "outside the slot" : "already mapped"));
  }
  const CUdeviceptr at = address_of(index);
  if (auto ok = driver_->mem_map(at, page_bytes_, 0, handle); !ok) {
    return std::unexpected(driver_error(
        ok.error(),
        fmt::format("slot {}: mapping pool page {} at slot page {}", id_, page, index)));
  }
  if (auto ok = driver_->mem_set_access(at, page_bytes_, device_); !ok) {
    // Undo the mapping (a second try for a transient error: a mapping left here would
    // be in no table, and the VA could never be freed).
    if (!driver_->mem_unmap(at, page_bytes_)) (void)driver_->mem_unmap(at, page_bytes_);
    return std::unexpected(driver_error(
        ok.error(), fmt::format("slot {}: granting access to slot page {}", id_, index)));
  }
  table_[index] = page;
  return {};
}

VmmResult<PageId> PrewarmSlot::unmap(std::size_t index) {
  if (auto ok = unmap_only(index); !ok) return std::unexpected(ok.error());
  return forget(index);
}

VmmResult<void> PrewarmSlot::unmap_only(std::size_t index) const {
  if (index >= table_.size() || !table_[index]) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("slot {}: page {} is not mapped", id_, index));
  }
  if (auto ok = driver_->mem_unmap(address_of(index), page_bytes_); !ok) {
    return std::unexpected(
        driver_error(ok.error(), fmt::format("slot {}: unmapping slot page {}", id_, index)));
  }
  return {};
}

PageId PrewarmSlot::forget(std::size_t index) {
  const PageId page = *table_.at(index);
  table_[index].reset();
  return page;
}

std::size_t PrewarmSlot::mapped_count() const {
  std::size_t n = 0;
  for (const auto& p : table_) n += p.has_value();
  return n;
}

}  // namespace thaw::vmm
