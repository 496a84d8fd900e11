#include "vmm/weight_source.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace thaw::vmm {

MappedFileSource::~MappedFileSource() {
  for (auto& [name, m] : files_) {
    if (m.addr != nullptr) ::munmap(m.addr, m.size);
  }
}

VmmResult<const std::byte*> MappedFileSource::wait_bytes(std::string_view file,
                                                         std::uint64_t offset,
                                                         std::uint64_t length) {
  std::lock_guard lock(mutex_);
  auto it = files_.find(file);
  if (it == files_.end()) {
    const std::filesystem::path path = dir_ / file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return vmm_failure(VmmErrc::source,
                         fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    }
    struct stat st {};
    Mapping m;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      m.size = static_cast<std::size_t>(st.st_size);
      m.addr = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    const int err = errno;
    ::close(fd);
    if (m.addr == MAP_FAILED || m.addr == nullptr) {
      return vmm_failure(VmmErrc::source,
                         fmt::format("{}: cannot map: {}", path.string(),
                                     m.size == 0 ? "empty file" : std::strerror(err)));
    }
    it = files_.emplace(std::string(file), m).first;
  }
  const Mapping& m = it->second;
  if (offset > m.size || length > m.size - offset) {
    return vmm_failure(VmmErrc::source,
                       fmt::format("{}: bytes {}+{} lie past its end ({} bytes); the layout does "
                                   "not belong to these files",
                                   (dir_ / file).string(), offset, length, m.size));
  }
  return static_cast<const std::byte*>(m.addr) + offset;
}

}  // namespace thaw::vmm
