// An owned MAP_SHARED mapping of a file, unmapped on destruction.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "daemon/store/cache/cache_error.hpp"

namespace thaw::store {

class MappedRegion {
 public:
  MappedRegion() = default;
  ~MappedRegion();
  MappedRegion(MappedRegion&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // Maps [0, size) of `fd` shared; read-only unless `writable`. `what` names the file
  // in the error. A size of 0 gives an empty region (mmap refuses length 0).
  static CacheResult<MappedRegion> map(int fd, size_t size, bool writable, std::string_view what);

  std::byte* data() const { return static_cast<std::byte*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace thaw::store
