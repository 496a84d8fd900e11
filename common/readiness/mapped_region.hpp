// An owned MAP_SHARED mapping of a file, unmapped on destruction.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "common/readiness/cache_error.hpp"

namespace thaw::store {

class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion();
  MappedRegion(MappedRegion&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        skip_(std::exchange(other.skip_, 0)) {}
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps [0, size) of `fd` shared; read-only unless `writable`. `what` names the file
  // in the error. A size of 0 gives an empty region (mmap refuses length 0).
  static CacheResult<MappedRegion> map(int fd, size_t size, bool writable, std::string_view what);
  // Maps [offset, offset + length) of `fd` read-only with its page tables filled at once
  // (MAP_POPULATE: one call instead of a fault per few pages), for reading a range through
  // and dropping it. `offset` need not be page-aligned; data() points at it.
  static CacheResult<MappedRegion> map_range_read_only(int fd, size_t offset, size_t length,
                                                       std::string_view what);

  std::byte* data() const { return static_cast<std::byte*>(addr_) + skip_; }
  size_t size() const { return size_ - skip_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;  // of the whole mapping, from addr_
  size_t skip_ = 0;  // bytes before the first one asked for (page alignment)
};

}  // namespace thaw::store
