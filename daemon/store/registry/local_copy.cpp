#include "daemon/store/registry/local_copy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace thaw::store {

namespace {

Fault local_fault(FetchErrc code, std::string cause) {
  Fault fault;
  fault.permanent = true;
  fault.code = code;
  fault.cause = std::move(cause);
  return fault;
}

Fault errno_fault(std::string_view call, const std::string& path, int err) {
  FetchErrc code = err == ENOENT                     ? FetchErrc::not_found
                   : (err == EACCES || err == EPERM) ? FetchErrc::forbidden
                                                     : FetchErrc::local_io;
  return local_fault(code, fmt::format("{} {}: {}", call, path, std::strerror(err)));
}

}  // namespace

LocalSliceResult copy_local_slice(FetchPart& part, FetchSink& sink, std::span<std::byte> buffer,
                                  std::uint64_t max_bytes) {
  const RangeRequest& spec = part.request->spec;
  const std::string& path = spec.source.location;
  LocalSliceResult result;
  if (part.local_fd < 0) {
    part.local_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (part.local_fd < 0) {
      result.fault = errno_fault("open", path, errno);
      return result;
    }
  }
  std::uint64_t want = std::min(max_bytes, part.range.end() - part.next);
  if (want == 0) return result;

  if (!part.copy_range_unsupported) {
    int destination = sink.destination_fd(spec.file);
    if (destination >= 0) {
      loff_t in = static_cast<loff_t>(part.next);
      loff_t out = static_cast<loff_t>(part.next);
      ssize_t n = ::copy_file_range(part.local_fd, &in, destination, &out, want, 0);
      if (n > 0) {
        auto ok = sink.written_in_place(spec.file, part.next, static_cast<std::uint64_t>(n));
        if (!ok) {
          result.fault = local_fault(FetchErrc::sink, ok.error());
          return result;
        }
        part.next += static_cast<std::uint64_t>(n);
        result.copied = static_cast<std::uint64_t>(n);
        return result;
      }
      if (n == 0) {
        result.fault = local_fault(FetchErrc::local_io,
                                   fmt::format("{} ends at byte {}, before the requested end {}",
                                               path, part.next, part.range.end()));
        return result;
      }
      int err = errno;
      if (err != EXDEV && err != EINVAL && err != ENOSYS && err != EOPNOTSUPP && err != EBADF &&
          err != EINTR) {
        result.fault = errno_fault("copy_file_range from", path, err);
        return result;
      }
      if (err != EINTR) part.copy_range_unsupported = true;
      if (err == EINTR) return result;
    }
  }

  std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(want, buffer.size()));
  ssize_t n = ::pread(part.local_fd, buffer.data(), chunk, static_cast<off_t>(part.next));
  if (n < 0) {
    if (errno == EINTR) return result;
    result.fault = errno_fault("pread", path, errno);
    return result;
  }
  if (n == 0) {
    result.fault = local_fault(FetchErrc::local_io,
                               fmt::format("{} ends at byte {}, before the requested end {}", path,
                                           part.next, part.range.end()));
    return result;
  }
  auto ok = sink.write(spec.file, part.next, buffer.first(static_cast<std::size_t>(n)));
  if (!ok) {
    result.fault = local_fault(FetchErrc::sink, ok.error());
    return result;
  }
  part.next += static_cast<std::uint64_t>(n);
  result.copied = static_cast<std::uint64_t>(n);
  return result;
}

}  // namespace thaw::store
