#include "vmm/page_pool.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::vmm {

std::string_view to_string(PageUse use) {
  switch (use) {
    case PageUse::free:
      return "free";
    case PageUse::weights:
      return "weights";
    case PageUse::kv:
      return "kv";
    case PageUse::lent:
      return "lent";
    case PageUse::returned:
      return "returned";
  }
  return "unknown";
}

VmmResult<std::unique_ptr<PagePool>> PagePool::create(std::shared_ptr<const cuda::Driver> driver,
                                                      CUdevice device, std::size_t bytes) {
  const CUmemAllocationProp prop = cuda::device_allocation_prop(device);
  auto granularity = driver->allocation_granularity(prop);
  if (!granularity) {
    return std::unexpected(driver_error(granularity.error(), "page pool: allocation granularity"));
  }
  const std::size_t pages = bytes / *granularity;
  if (pages == 0) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("page pool: {} bytes is less than one page ({} bytes); give "
                                   "the pool a larger share of the GPU",
                                   bytes, *granularity));
  }
  std::vector<CUmemGenericAllocationHandle> handles;
  handles.reserve(pages);
  for (std::size_t i = 0; i < pages; ++i) {
    auto handle = driver->mem_create(*granularity, prop);
    if (!handle) {
      for (auto h : handles) (void)driver->mem_release(h);
      return std::unexpected(driver_error(
          handle.error(), fmt::format("page pool: creating page {} of {} ({} bytes each)", i + 1,
                                      pages, *granularity)));
    }
    handles.push_back(*handle);
  }
  return std::unique_ptr<PagePool>(
      new PagePool(std::move(driver), prop, *granularity, std::move(handles)));
}

PagePool::PagePool(std::shared_ptr<const cuda::Driver> driver, CUmemAllocationProp prop,
                   std::size_t page_bytes, std::vector<CUmemGenericAllocationHandle> handles)
    : driver_(std::move(driver)),
      prop_(prop),
      page_bytes_(page_bytes),
      handles_(std::move(handles)),
      owners_(handles_.size()) {}

PagePool::~PagePool() {
  for (auto h : handles_) {
    if (h != 0) (void)driver_->mem_release(h);
  }
}

CUmemGenericAllocationHandle PagePool::handle(PageId page) const {
  std::lock_guard lock(mutex_);
  return handles_.at(page);
}

std::size_t PagePool::give_back(std::span<const PageId> pages, SlotId slot) {
  std::lock_guard lock(mutex_);
  std::size_t given = 0;
  for (PageId p : pages) {
    if (owners_.at(p).use != PageUse::free || handles_[p] == 0) continue;
    if (!driver_->mem_release(handles_[p])) continue;  // still the pool's: stays free
    handles_[p] = 0;
    owners_[p] = PageOwner{PageUse::returned, slot};
    ++given;
  }
  return given;
}

std::size_t PagePool::take_back() {
  std::lock_guard lock(mutex_);
  std::size_t taken = 0;
  for (PageId p = 0; p < owners_.size(); ++p) {
    if (owners_[p].use != PageUse::returned) continue;
    auto h = driver_->mem_create(page_bytes_, prop_);
    if (!h) break;  // the driver has no room yet (the engine's memory is still going)
    handles_[p] = *h;
    owners_[p] = PageOwner{};
    ++taken;
  }
  return taken;
}

std::size_t PagePool::count(PageUse use) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(std::count_if(owners_.begin(), owners_.end(),
                                                [&](const PageOwner& o) { return o.use == use; }));
}

std::size_t PagePool::count(PageUse use, SlotId slot) const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(std::count(owners_.begin(), owners_.end(), PageOwner{use, slot}));
}

VmmResult<std::vector<PageId>> PagePool::take(std::size_t n, PageOwner owner) {
  std::lock_guard lock(mutex_);
  std::vector<PageId> taken;
  taken.reserve(n);
  for (PageId p = 0; p < owners_.size() && taken.size() < n; ++p) {
    if (owners_[p].use == PageUse::free) taken.push_back(p);
  }
  if (taken.size() < n) {
    return vmm_failure(
        VmmErrc::pool_exhausted,
        fmt::format("page pool: {} pages ({} MiB) asked for, {} free of {}; evict a prewarmed "
                    "slot or give the pool a larger share of the GPU",
                    n, n * page_bytes_ >> 20, taken.size(), owners_.size()));
  }
  for (PageId p : taken) owners_[p] = owner;
  return taken;
}

void PagePool::release(std::span<const PageId> pages) {
  std::lock_guard lock(mutex_);
  for (PageId p : pages) owners_.at(p) = PageOwner{};
}

void PagePool::reassign(PageId page, PageOwner owner) {
  std::lock_guard lock(mutex_);
  owners_.at(page) = owner;
}

PageOwner PagePool::owner(PageId page) const {
  std::lock_guard lock(mutex_);
  return owners_.at(page);
}

std::vector<PageId> PagePool::pages_of(PageOwner owner) const {
  std::lock_guard lock(mutex_);
  std::vector<PageId> out;
  for (PageId p = 0; p < owners_.size(); ++p) {
    if (owners_[p] == owner) out.push_back(p);
  }
  return out;
}

VmmResult<int> PagePool::export_fd(PageId page) const {
  const CUmemGenericAllocationHandle h = handle(page);
  if (h == 0) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("page {} was given back to the driver", page));
  }
  auto fd = driver_->export_to_fd(h);
  if (!fd) return std::unexpected(driver_error(fd.error(), fmt::format("exporting page {}", page)));
  return *fd;
}

}  // namespace thaw::vmm
