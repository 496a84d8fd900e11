#include "common/readiness/mapped_region.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace thaw::store {

MappedRegion::~MappedRegion() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    skip_ = std::exchange(other.skip_, 0);
  }
  return *this;
}

CacheResult<MappedRegion> MappedRegion::map(int fd, size_t size, bool writable,
                                            std::string_view what) {
  MappedRegion region;
  if (size == 0) return region;
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* addr = ::mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    return std::unexpected(errno_error(errno, fmt::format("mmap of {} ({} bytes)", what, size)));
  }
  region.addr_ = addr;
  region.size_ = size;
  return region;
}

CacheResult<MappedRegion> MappedRegion::map_range_read_only(int fd, size_t offset, size_t length,
                                                            std::string_view what) {
  MappedRegion region;
  if (length == 0) return region;
  const size_t page = static_cast<size_t>(::getpagesize());
  const size_t skip = offset % page;
  void* addr = ::mmap(nullptr, length + skip, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                      static_cast<off_t>(offset - skip));
  if (addr == MAP_FAILED) {
    return std::unexpected(errno_error(
        errno, fmt::format("mmap of {} bytes {}-{}", what, offset, offset + length - 1)));
  }
  region.addr_ = addr;
  region.size_ = length + skip;
  region.skip_ = skip;
  return region;
}

}  // namespace thaw::store
