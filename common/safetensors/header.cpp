#include "common/safetensors/header.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors/header_parser.hpp"
#include "common/safetensors/unique_fd.hpp"

namespace thaw::safetensors {

std::expected<std::uint64_t, Error> header_length(std::span<const std::byte> first_bytes,
                                                  std::uint64_t file_size, std::string_view file) {
  std::uint64_t n = 0;
  if (auto e = core::read_header_length(first_bytes, file_size, file, n)) {
    return std::unexpected(std::move(*e));
  }
  return n;
}

std::expected<Header, Error> parse_header(std::span<const std::byte> prefix,
                                          std::uint64_t file_size, std::string_view file) {
  Header h;
  if (auto e = core::parse_header(prefix, file_size, file, h))
    return std::unexpected(std::move(*e));
  return h;
}

std::expected<Header, Error> parse_header(std::string_view prefix, std::uint64_t file_size,
                                          std::string_view file) {
  return parse_header(std::as_bytes(std::span(prefix.data(), prefix.size())), file_size, file);
}

namespace {

// Reads exactly `size` bytes at `offset`; short only when the file is shorter.
std::expected<std::size_t, int> pread_full(int fd, std::byte* out, std::size_t size,
                                           std::uint64_t offset) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(errno);
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

}  // namespace

std::expected<Header, Error> read_header(const std::filesystem::path& path,
                                         std::string_view display_name) {
  const std::string name = display_name.empty() ? path.string() : std::string(display_name);
  const auto io_error = [&](std::string_view step, int err) {
    return std::unexpected(
        Error{errc::io, fmt::format("{}: {}: {}", name, step, std::strerror(err))});
  };

  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return io_error("open", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    return std::unexpected(Error{errc::io, fmt::format("{}: not a regular file", name)});
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);

  std::vector<std::byte> bytes(kLengthPrefixBytes);
  const auto got = pread_full(fd.get(), bytes.data(), bytes.size(), 0);
  if (!got) return io_error("read", got.error());
  const auto n = header_length(std::span(bytes.data(), *got), file_size, name);
  if (!n) return std::unexpected(n.error());

  bytes.resize(kLengthPrefixBytes + *n);
  const auto rest = pread_full(fd.get(), bytes.data() + kLengthPrefixBytes, *n, kLengthPrefixBytes);
  if (!rest) return io_error("read", rest.error());
  if (*rest != *n) {  // the file shrank since fstat
    return std::unexpected(
        Error{errc::truncated, fmt::format("{}: header length {} but only {} header bytes could "
                                           "be read",
                                           name, *n, *rest)});
  }
  return parse_header(std::span<const std::byte>(bytes), file_size, name);
}

}  // namespace thaw::safetensors
