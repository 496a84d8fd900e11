#include "allocator.hpp"

#include <fmt/format.h>
#include <iterator>

namespace refengine {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}

CachingAllocator::CachingAllocator(Driver& driver, CUdevice device, Mode mode)
    : d_(driver), device_(device), mode_(mode) {
  d_.check(d_.device_total_mem(&total_memory_, device_), "cuDeviceTotalMem");
  if (mode_ == Mode::kExpandableSegments) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::size_t granularity = 0;
    d_.check(d_.mem_get_allocation_granularity(&granularity, &prop,
                                               CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             "cuMemGetAllocationGranularity");
    if (granularity == 0 || kLargeBuffer % granularity != 0) {
      throw std::runtime_error(fmt::format(
          "expandable segments: the device's allocation granularity ({} bytes) does not divide "
          "the {} MiB page size",
          granularity, kLargeBuffer >> 20));
    }
  }
}

CachingAllocator::~CachingAllocator() {
  for (auto& s : segments_) {
    if (s->expandable) {
      if (!s->pages.empty()) (void)d_.stream_synchronize(s->stream);
      while (!s->pages.empty()) {
        CUdeviceptr addr = s->base + s->size - kLargeBuffer;
        (void)d_.mem_unmap(addr, kLargeBuffer);
        (void)d_.mem_release(s->pages.back());
        s->pages.pop_back();
        s->size -= kLargeBuffer;
      }
      (void)d_.mem_address_free(s->base, s->reserved);
    } else {
      (void)d_.mem_free(s->base);
    }
  }
}

std::size_t CachingAllocator::round_size(std::size_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

std::size_t CachingAllocator::allocation_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

CUdeviceptr CachingAllocator::allocate(std::size_t size, CUstream stream) {
  if (size == 0) return 0;
  std::lock_guard lock(mu_);
  std::size_t rounded = round_size(size);
  bool small = mode_ == Mode::kDefault && rounded <= kSmallSize;
  Block* b = find_free(rounded, stream, small);
  if (b == nullptr) {
    b = mode_ == Mode::kDefault ? new_segment(allocation_size(rounded), stream, small)
                                : grow_expandable(rounded, stream);
  }
  b = split(b, rounded);
  b->allocated = true;
  return b->ptr;
}

CachingAllocator::Block* CachingAllocator::find_free(std::size_t size, CUstream stream,
                                                     bool small) {
  Block* best = nullptr;
  for (auto& [ptr, b] : blocks_) {
    if (b.allocated || b.size < size || b.segment->stream != stream) continue;
    if (mode_ == Mode::kDefault && b.segment->small != small) continue;
    if (best == nullptr || b.size < best->size) best = &b;
  }
  return best;
}

CachingAllocator::Block* CachingAllocator::split(Block* b, std::size_t size) {
  std::size_t remaining = b->size - size;
  bool should = (mode_ == Mode::kExpandableSegments || b->segment->small)
                    ? remaining >= kMinBlockSize
                    : remaining > kSmallSize;
  if (should) {
    Block rest{b->ptr + size, remaining, false, b->segment};
    b->size = size;
    blocks_.emplace(rest.ptr, rest);
  }
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(std::size_t size, CUstream stream,
                                                       bool small) {
  CUdeviceptr p = 0;
  CUresult r = d_.mem_alloc(&p, size);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    release_free_segments();
    r = d_.mem_alloc(&p, size);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) throw_oom(size, r);
  d_.check(r, fmt::format("cuMemAlloc of {} bytes", size));
  auto seg = std::make_unique<Segment>();
  seg->base = p;
  seg->size = size;
  seg->stream = stream;
  seg->small = small;
  Segment* s = seg.get();
  segments_.push_back(std::move(seg));
  return &blocks_.emplace(p, Block{p, size, false, s}).first->second;
}

CachingAllocator::Segment* CachingAllocator::expandable_for(CUstream stream) {
  for (auto& s : segments_) {
    if (s->expandable && s->stream == stream) return s.get();
  }
  // PyTorch: max_handles = numSegments(totalGlobalMem + totalGlobalMem / 8).
  std::size_t want = total_memory_ + total_memory_ / 8;
  std::size_t reserved = kLargeBuffer * ((want + kLargeBuffer - 1) / kLargeBuffer);
  CUdeviceptr base = 0;
  d_.check(d_.mem_address_reserve(&base, reserved, 0, 0, 0),
           fmt::format("cuMemAddressReserve of {} bytes", reserved));
  auto seg = std::make_unique<Segment>();
  seg->base = base;
  seg->stream = stream;
  seg->expandable = true;
  seg->reserved = reserved;
  segments_.push_back(std::move(seg));
  return segments_.back().get();
}

bool CachingAllocator::map_page(Segment& s) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = d_.mem_create(&h, kLargeBuffer, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
  d_.check(r, fmt::format("cuMemCreate of {} bytes", kLargeBuffer));
  CUdeviceptr addr = s.base + s.size;
  r = d_.mem_map(addr, kLargeBuffer, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    (void)d_.mem_release(h);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
    d_.check(r, "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d_.mem_set_access(addr, kLargeBuffer, &access, 1);
  if (r != CUDA_SUCCESS) {
    (void)d_.mem_unmap(addr, kLargeBuffer);
    (void)d_.mem_release(h);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
    d_.check(r, "cuMemSetAccess");
  }
  s.pages.push_back(h);
  s.size += kLargeBuffer;
  return true;
}

void CachingAllocator::unmap_last_page(Segment& s) {
  CUdeviceptr addr = s.base + s.size - kLargeBuffer;
  d_.check(d_.mem_unmap(addr, kLargeBuffer), "cuMemUnmap");
  d_.check(d_.mem_release(s.pages.back()), "cuMemRelease");
  s.pages.pop_back();
  s.size -= kLargeBuffer;
}

CachingAllocator::Block* CachingAllocator::grow_expandable(std::size_t size, CUstream stream,
                                                           bool retried) {
  Segment* s = expandable_for(stream);
  CUdeviceptr end = s->base + s->size;
  Block* tail = nullptr;
  if (s->size > 0) {
    auto it = blocks_.lower_bound(end);
    if (it != blocks_.begin()) {
      Block& last = std::prev(it)->second;
      if (last.segment == s && !last.allocated) tail = &last;
    }
  }
  std::size_t have = tail ? tail->size : 0;
  std::size_t pages = (size - have + kLargeBuffer - 1) / kLargeBuffer;
  if (s->size + pages * kLargeBuffer > s->reserved) throw_oom(size, CUDA_ERROR_OUT_OF_MEMORY);
  std::size_t mapped = 0;
  while (mapped < pages) {
    if (!map_page(*s)) {
      // Roll back this growth, return the cache (this segment's free tail included), retry.
      while (mapped-- > 0) unmap_last_page(*s);
      if (retried) throw_oom(size, CUDA_ERROR_OUT_OF_MEMORY);
      release_free_segments();
      return grow_expandable(size, stream, true);
    }
    ++mapped;
  }
  if (tail != nullptr) {
    tail->size += pages * kLargeBuffer;
    return tail;
  }
  return &blocks_.emplace(end, Block{end, pages * kLargeBuffer, false, s}).first->second;
}

void CachingAllocator::free(CUdeviceptr ptr) {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.allocated) {
    throw std::invalid_argument(
        fmt::format("free of 0x{:x}: not allocated by this allocator", ptr));
  }
  it->second.allocated = false;
  auto adjacent = [](const Block& a, const Block& b) {
    return a.segment == b.segment && !b.allocated && a.ptr + a.size == b.ptr;
  };
  if (auto next = std::next(it); next != blocks_.end() && adjacent(it->second, next->second)) {
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.segment == it->second.segment &&
        prev->second.ptr + prev->second.size == it->second.ptr) {
      prev->second.size += it->second.size;
      blocks_.erase(it);
    }
  }
}

void CachingAllocator::release_free_segments() {
  for (auto sit = segments_.begin(); sit != segments_.end();) {
    Segment& s = **sit;
    if (s.expandable) {
      // Unmap the whole free pages at the segment's end, once the stream is done with them.
      auto it = s.size == 0 ? blocks_.end() : blocks_.lower_bound(s.base + s.size);
      Block* tail = nullptr;
      if (s.size > 0 && it != blocks_.begin()) {
        Block& last = std::prev(it)->second;
        if (last.segment == &s && !last.allocated) tail = &last;
      }
      if (tail != nullptr) {
        CUdeviceptr first_page =
            s.base + kLargeBuffer * ((tail->ptr - s.base + kLargeBuffer - 1) / kLargeBuffer);
        if (first_page < s.base + s.size) {
          d_.check(d_.stream_synchronize(s.stream), "cuStreamSynchronize");
          while (s.base + s.size > first_page) unmap_last_page(s);
          CUdeviceptr tail_ptr = tail->ptr;
          if (first_page == tail_ptr) {
            blocks_.erase(tail_ptr);
          } else {
            tail->size = first_page - tail_ptr;
          }
        }
      }
      ++sit;
      continue;
    }
    auto b = blocks_.find(s.base);
    if (b != blocks_.end() && !b->second.allocated && b->second.size == s.size) {
      d_.check(d_.mem_free(s.base), "cuMemFree");
      blocks_.erase(b);
      sit = segments_.erase(sit);
    } else {
      ++sit;
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  release_free_segments();
}

void CachingAllocator::throw_oom(std::size_t size, CUresult r) {
  std::size_t free_bytes = 0, total_bytes = 0;
  (void)d_.mem_get_info(&free_bytes, &total_bytes);
  AllocatorStats st = stats_locked();
  throw OutOfMemory(fmt::format(
      "CUDA out of memory: tried to allocate {:.2f} MiB ({} bytes); device total {:.2f} MiB, "
      "free {:.2f} MiB; this allocator has {:.2f} MiB reserved, {:.2f} MiB allocated ({})",
      size / kMiB, size, total_bytes / kMiB, free_bytes / kMiB, st.reserved_bytes / kMiB,
      st.allocated_bytes / kMiB, d_.error_message(r, "driver")));
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_locked();
}

AllocatorStats CachingAllocator::stats_locked() const {
  AllocatorStats st;
  for (const auto& s : segments_) {
    st.reserved_bytes += s->size;
    st.mapped_pages += s->pages.size();
    st.address_reserved_bytes += s->reserved;
  }
  st.segments = segments_.size();
  for (const auto& [ptr, b] : blocks_) {
    if (b.allocated) st.allocated_bytes += b.size;
  }
  return st;
}

std::vector<CUmemGenericAllocationHandle> CachingAllocator::page_handles() const {
  std::lock_guard lock(mu_);
  std::vector<CUmemGenericAllocationHandle> out;
  for (const auto& s : segments_) out.insert(out.end(), s->pages.begin(), s->pages.end());
  return out;
}

}  // namespace refengine
