#include "common/proto/document_fd.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace thaw::proto {

std::expected<UniqueFd, std::string> document_memfd(const char* name, std::string_view text) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (!fd) return std::unexpected(fmt::format("memfd_create: {}", std::strerror(errno)));
  while (!text.empty()) {
    const ssize_t n = ::write(fd.get(), text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::unexpected(fmt::format("writing a memfd: {}", std::strerror(errno)));
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return fd;
}

std::expected<std::string, std::string> read_document(int fd, std::uint64_t bytes) {
  std::string out(bytes, '\0');
  std::uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out.data() + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(std::strerror(errno));
    if (n == 0) return std::unexpected(fmt::format("it ends after {} of {} bytes", done, bytes));
    done += static_cast<std::uint64_t>(n);
  }
  return out;
}

}  // namespace thaw::proto
