#include "preload/layout/deterministic_layout.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::preload {

bool LayoutDriver::complete() const {
  return ctx_get_device && device_total_mem && mem_get_allocation_granularity &&
         mem_address_reserve && mem_address_free && mem_create && mem_release && mem_map &&
         mem_unmap && mem_set_access;
}

namespace {

CUmemAllocationProp device_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  // Shareable, so that CUDA IPC of this memory can be carried over POSIX-fd VMM sharing.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

DeterministicLayout::DeterministicLayout(LayoutDriver driver, std::uint64_t base,
                                         LayoutObserver* observer)
    : driver_(driver), base_(base), observer_(observer) {
  if (!driver_.complete()) stopped_ = "the driver lacks a VMM entry point the layout needs";
}

void DeterministicLayout::stop_locked(std::string why) {
  if (!stopped_) stopped_ = std::move(why);
}

bool DeterministicLayout::ensure_region_locked(CUdevice device) {
  if (reserved_) return device == device_;  // other devices: the driver's usual addresses
  const CUmemAllocationProp prop = device_prop(device);
  std::size_t total = 0;
  if (driver_.mem_get_allocation_granularity(&granularity_, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      granularity_ == 0 || driver_.device_total_mem(&total, device) != CUDA_SUCCESS) {
    stop_locked("cannot query the device's granularity or memory size");
    return false;
  }
  // Room for the allocations and for expandable segments' reservations (each 1.125 × the
  // device's memory in PyTorch); VA is cheap.
  region_size_ = round_up(4 * static_cast<std::uint64_t>(total), granularity_);
  CUdeviceptr got = 0;
  if (driver_.mem_address_reserve(&got, region_size_, granularity_, base_, 0) != CUDA_SUCCESS) {
    stop_locked(fmt::format("cannot reserve {} bytes of VA", region_size_));
    return false;
  }
  if (got != base_) {
    // Not where asked: addresses would differ from run to run, so the layout stops rather
    // than serve them.
    (void)driver_.mem_address_free(got, region_size_);
    stop_locked(
        fmt::format("the driver placed the region at {:#x}, not at {:#x} (is that VA "
                    "in use? set THAW_PRELOAD_VA_BASE)",
                    got, base_));
    return false;
  }
  reserved_ = true;
  device_ = device;
  if (observer_ != nullptr) observer_->region_reserved(device, base_, granularity_);
  return true;
}

std::optional<CUresult> DeterministicLayout::allocate(CUdeviceptr* out, std::size_t size) {
  if (out == nullptr || size == 0) return std::nullopt;  // the driver's own error
  CUdevice device = 0;
  if (driver_.ctx_get_device(&device) != CUDA_SUCCESS) return std::nullopt;
  CUcontext ctx = nullptr;
  if (driver_.ctx_get_current != nullptr && driver_.ctx_get_current(&ctx) != CUDA_SUCCESS) {
    ctx = nullptr;
  }
  std::lock_guard lock(mutex_);
  if (stopped_ || !ensure_region_locked(device)) return std::nullopt;
  // More than the device could ever hold: the driver's OUT_OF_MEMORY (rounding it up would
  // wrap), and no reason to stop the layout.
  if (size > region_size_) return std::nullopt;
  const std::uint64_t mapped = round_up(size, granularity_);
  if (cursor_ + mapped > region_size_) {
    stop_locked(fmt::format("the region is full after {} allocations", next_index_));
    return std::nullopt;
  }
  if (overlaps_live_locked(base_ + cursor_, mapped)) return std::nullopt;
  if (observer_ != nullptr) {
    if (auto diverged = observer_->admit(next_index_, size, cursor_)) {
      stop_locked(std::move(*diverged));
      return std::nullopt;
    }
  }
  const CUdeviceptr va = base_ + cursor_;
  bool backed = false;
  if (CUresult r = map_locked(va, mapped, device, backed); r != CUDA_SUCCESS) return r;
  cursor_ += mapped;
  live_[va] = LayoutAllocation{next_index_++, va, size, mapped, device, false, backed, ctx};
  if (observer_ != nullptr) observer_->served(live_[va]);
  *out = va;
  return CUDA_SUCCESS;
}

CUresult DeterministicLayout::map_locked(CUdeviceptr va, std::uint64_t mapped, CUdevice device,
                                         bool& backed) {
  const CUmemAllocationProp prop = device_prop(device);
  auto backing_at = [&](std::uint64_t at) -> std::optional<CUmemGenericAllocationHandle> {
    if (backing_ == nullptr) return std::nullopt;
    return backing_->page_at(va - base_ + at, granularity_);
  };
  std::uint64_t at = 0;
  CUresult r = CUDA_SUCCESS;
  while (at < mapped && r == CUDA_SUCCESS) {
    std::uint64_t length = granularity_;
    if (auto page = backing_at(at)) {
      r = driver_.mem_map(va + at, length, 0, *page, 0);
      backed = backed || r == CUDA_SUCCESS;
    } else {
      std::optional<CUmemGenericAllocationHandle> next;
      while (at + length < mapped && !(next = backing_at(at + length))) length += granularity_;
      CUmemGenericAllocationHandle handle = 0;
      r = driver_.mem_create(&handle, length, &prop, 0);
      if (r == CUDA_SUCCESS) {
        r = driver_.mem_map(va + at, length, 0, handle, 0);
        (void)driver_.mem_release(handle);  // the mapping keeps the memory
      }
      if (r == CUDA_SUCCESS && next) {
        // The backed page found while measuring the run comes next; asking again would
        // hand it out twice.
        at += length;
        length = granularity_;
        r = driver_.mem_map(va + at, length, 0, *next, 0);
        backed = backed || r == CUDA_SUCCESS;
      }
    }
    if (r == CUDA_SUCCESS) at += length;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (r == CUDA_SUCCESS) r = driver_.mem_set_access(va, mapped, &access, 1);
  if (r != CUDA_SUCCESS && at != 0) (void)driver_.mem_unmap(va, at);
  return r;
}

void DeterministicLayout::set_backing(PageBacking* backing) {
  std::lock_guard lock(mutex_);
  backing_ = backing;
}

bool DeterministicLayout::overlaps_live_locked(CUdeviceptr va, std::uint64_t size) {
  // Only a reservation the caller placed at a fixed address can be there — ahead of the
  // cursor, or begun in freed VA behind it and running past it: the sequence cannot go on
  // at its addresses, so the layout stops.
  auto next = live_.lower_bound(va);
  auto in_the_way = live_.end();
  if (next != live_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.base + std::max<std::uint64_t>(prev->second.size, prev->second.mapped) > va) {
      in_the_way = prev;
    }
  }
  if (in_the_way == live_.end() && next != live_.end() && next->first < va + size) {
    in_the_way = next;
  }
  if (in_the_way == live_.end()) return false;
  stop_locked(fmt::format(
      "a reservation placed at the fixed address {:#x} lies where allocation {} would go",
      in_the_way->first, next_index_));
  return true;
}

std::optional<CUresult> DeterministicLayout::free(CUdeviceptr ptr) {
  std::lock_guard lock(mutex_);
  if (!reserved_ || ptr < base_ || ptr >= base_ + region_size_) return std::nullopt;
  auto it = live_.find(ptr);
  // Inside the region but not an allocation's start (or freed twice, or a reservation):
  // what cuMemFree says.
  if (it == live_.end() || it->second.reservation) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = driver_.mem_unmap(it->second.base, it->second.mapped); r != CUDA_SUCCESS) {
    return r;
  }
  live_.erase(it);
  return CUDA_SUCCESS;
}

std::vector<LayoutAllocation> DeterministicLayout::free_context(CUcontext ctx) {
  std::vector<LayoutAllocation> freed;
  if (ctx == nullptr) return freed;
  std::lock_guard lock(mutex_);
  for (auto it = live_.begin(); it != live_.end();) {
    const LayoutAllocation& a = it->second;
    // An allocation whose unmap fails stays live (still mapped, still the caller's to free).
    if (a.reservation || a.ctx != ctx || driver_.mem_unmap(a.base, a.mapped) != CUDA_SUCCESS) {
      ++it;
      continue;
    }
    freed.push_back(a);
    it = live_.erase(it);
  }
  return freed;
}

std::optional<CUresult> DeterministicLayout::reserve(CUdeviceptr* out, std::size_t size,
                                                     std::size_t alignment) {
  if (out == nullptr || size == 0) return std::nullopt;
  CUdevice device = 0;
  if (driver_.ctx_get_device(&device) != CUDA_SUCCESS) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (stopped_ || !ensure_region_locked(device)) return std::nullopt;
  // What the driver would refuse (alignment not a power of two), or place otherwise, it
  // answers itself.
  if (size % granularity_ != 0 || size > region_size_ ||
      (alignment != 0 && (alignment % granularity_ != 0 || (alignment & (alignment - 1)) != 0))) {
    return std::nullopt;
  }
  const std::uint64_t align = alignment == 0 ? granularity_ : alignment;
  const std::uint64_t offset = round_up(cursor_, align);
  if (offset + size > region_size_) {
    stop_locked(fmt::format("the region is full after {} allocations", next_index_));
    return std::nullopt;
  }
  if (overlaps_live_locked(base_ + offset, size)) return std::nullopt;
  if (observer_ != nullptr) {
    if (auto diverged = observer_->admit(next_index_, size, offset)) {
      stop_locked(std::move(*diverged));
      return std::nullopt;
    }
  }
  const CUdeviceptr va = base_ + offset;
  cursor_ = offset + size;
  live_[va] = LayoutAllocation{next_index_++, va, size, size, device, true};
  if (observer_ != nullptr) observer_->served(live_[va]);
  *out = va;
  return CUDA_SUCCESS;
}

std::optional<CUresult> DeterministicLayout::reserve_at(CUdeviceptr* out, std::size_t size,
                                                        std::size_t alignment, CUdeviceptr addr) {
  if (out == nullptr || size == 0) return std::nullopt;
  std::lock_guard lock(mutex_);
  if (stopped_ || !reserved_ || addr < base_ || addr >= base_ + region_size_) return std::nullopt;
  const std::uint64_t align = alignment == 0 ? granularity_ : alignment;
  if (size % granularity_ != 0 || align % granularity_ != 0 || (align & (align - 1)) != 0 ||
      addr % align != 0 || size > base_ + region_size_ - addr) {
    return std::nullopt;
  }
  // Nothing live overlaps [addr, addr + size).
  auto next = live_.lower_bound(addr);
  if (next != live_.end() && next->first < addr + size) return std::nullopt;
  if (next != live_.begin()) {
    const LayoutAllocation& prev = std::prev(next)->second;
    if (prev.base + std::max<std::uint64_t>(prev.size, prev.mapped) > addr) return std::nullopt;
  }
  live_[addr] = LayoutAllocation{LayoutAllocation::kOutOfSequence, addr, size, size, device_, true};
  *out = addr;
  return CUDA_SUCCESS;
}

std::optional<CUresult> DeterministicLayout::release(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard lock(mutex_);
  if (!reserved_ || ptr < base_ || ptr >= base_ + region_size_) return std::nullopt;
  auto it = live_.find(ptr);
  if (it == live_.end() || !it->second.reservation || it->second.size != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The driver frees only a reservation with nothing mapped in it any more.
  if (auto m = caller_mapped_.lower_bound(ptr);
      m != caller_mapped_.end() && m->first < ptr + size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  live_.erase(it);  // its VA is not reused
  return CUDA_SUCCESS;
}

DeterministicLayout::CallerRange DeterministicLayout::caller_range(CUdeviceptr ptr,
                                                                   std::size_t size) const {
  std::lock_guard lock(mutex_);
  if (!reserved_ || ptr < base_ || ptr >= base_ + region_size_) return CallerRange::not_in_region;
  auto it = live_.upper_bound(ptr);
  if (it == live_.begin()) return CallerRange::outside;
  const LayoutAllocation& a = std::prev(it)->second;
  const bool inside = a.reservation && ptr - a.base < a.size && size <= a.size - (ptr - a.base);
  return inside ? CallerRange::inside : CallerRange::outside;
}

CUdeviceptr DeterministicLayout::unreserved_alias(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  return granularity_ == 0 ? 0 : ptr % granularity_;
}

void DeterministicLayout::note_caller_mapped(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard lock(mutex_);
  caller_mapped_[ptr] = size;
}

void DeterministicLayout::note_caller_unmapped(CUdeviceptr ptr, std::size_t size) {
  std::lock_guard lock(mutex_);
  // The driver unmapped whole mappings, back to back: all that start in the range.
  caller_mapped_.erase(caller_mapped_.lower_bound(ptr), caller_mapped_.lower_bound(ptr + size));
}

std::optional<LayoutAllocation> DeterministicLayout::find(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  auto it = live_.upper_bound(ptr);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (ptr >= it->second.base + it->second.size) return std::nullopt;
  return it->second;
}

bool DeterministicLayout::in_region(CUdeviceptr ptr) const {
  std::lock_guard lock(mutex_);
  return reserved_ && ptr >= base_ && ptr < base_ + region_size_;
}

bool DeterministicLayout::active() const {
  std::lock_guard lock(mutex_);
  return !stopped_;
}

std::optional<std::string> DeterministicLayout::stop_reason() const {
  std::lock_guard lock(mutex_);
  return stopped_;
}

void DeterministicLayout::stop(std::string why) {
  std::lock_guard lock(mutex_);
  stop_locked(std::move(why));
}

std::uint64_t DeterministicLayout::allocations() const {
  std::lock_guard lock(mutex_);
  return next_index_;
}

void DeterministicLayout::reset_after_fork() {
  // Only the forking thread exists in the child; the mutex may have been held by another.
  new (&mutex_) std::mutex();
  // A parent that had not used the layout yet (engines fork workers before initialising
  // CUDA) leaves the child a fresh one. One that had cannot share its region with the
  // child (the child's driver state is not the parent's): the child's layout stops.
  if (reserved_) {
    live_.clear();
    caller_mapped_.clear();
    reserved_ = false;
    stopped_ = "this process was forked from one that had already used the layout";
  }
}

}  // namespace thaw::preload
