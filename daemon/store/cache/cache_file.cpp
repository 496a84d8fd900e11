#include "daemon/store/cache/cache_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace thaw::store {
namespace fs = std::filesystem;
namespace {

// Engines open cached model files by path (the shim classifies the path, it does not hand
// out the data): readable by the cache's group (HostCacheConfig::group), never writable.
constexpr mode_t kFileMode = 0640;

std::string human_bytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", bytes / 1073741824.0);
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

CacheError no_space_error(const fs::path& dir, uint64_t bytes, const fs::path& file,
                          std::string_view cause) {
  return CacheError{
      CacheErrc::no_space,
      fmt::format("cache directory {}: cannot reserve {} bytes ({}) for {}: {}; free space on "
                  "that filesystem, make the cache budget fit its free space, or evict models",
                  dir.string(), bytes, human_bytes(bytes), file.filename().string(), cause)};
}

// Whether the filesystem of `dir` has room for the file and its readiness map beyond
// what is promised to other files.
CacheResult<void> check_free_space(const fs::path& dir, const fs::path& data_path,
                                   CacheFileSpec spec, const CacheFilesystem& filesystem,
                                   uint64_t promised_elsewhere) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) {
    return std::unexpected(errno_error(errno, fmt::format("statvfs {}", dir.string())));
  }
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  auto needed = cache_allocation_bytes(spec, filesystem);
  if (!needed) return std::unexpected(needed.error());
  const uint64_t available = free_bytes > promised_elsewhere ? free_bytes - promised_elsewhere : 0;
  if (*needed <= available) return {};
  return std::unexpected(no_space_error(
      dir, data_file_bytes(spec.size, filesystem), data_path,
      fmt::format("with its readiness map it needs {}, the filesystem has {} free{}",
                  human_bytes(*needed), human_bytes(free_bytes),
                  promised_elsewhere == 0
                      ? std::string()
                      : fmt::format(" of which {} is promised to files still being fetched",
                                    human_bytes(promised_elsewhere)))));
}

// An unnamed file in `dir`, linked in only once it is complete (see the header).
CacheResult<UniqueFd> open_unnamed(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, kFileMode));
  if (fd) return fd;
  const int err = errno;
  if (err == EOPNOTSUPP || err == EISDIR) {
    return cache_failure(
        CacheErrc::unsupported,
        fmt::format("cache directory {}: the filesystem does not support O_TMPFILE, which the "
                    "cache needs so that a half-created file is never visible; use tmpfs, "
                    "hugetlbfs, ext4 or xfs",
                    dir.string()));
  }
  return std::unexpected(errno_error(err, fmt::format("creating a file in {}", dir.string())));
}

CacheResult<void> link_into_place(int fd, const fs::path& path) {
  const std::string proc = fmt::format("/proc/self/fd/{}", fd);
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0) {
    return {};
  }
  const int err = errno;
  if (err == EEXIST) {
    return cache_failure(CacheErrc::exists, fmt::format("{} already exists", path.string()));
  }
  return std::unexpected(errno_error(err, fmt::format("linking {}", path.string())));
}

CacheResult<void> take_writer_lock(int fd, const fs::path& readiness_path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return {};
  if (errno == EWOULDBLOCK) {
    return cache_failure(CacheErrc::locked,
                         fmt::format("{} is already open for writing (by another CacheFile or "
                                     "process); only one writer may fill a cached file",
                                     readiness_path.string()));
  }
  return std::unexpected(errno_error(errno, fmt::format("flock {}", readiness_path.string())));
}

CacheResult<void> make_parent(const fs::path& path) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return std::unexpected(
        errno_error(ec.value(), fmt::format("creating directory {}", path.parent_path().string())));
  }
  return {};
}

}  // namespace

CacheResult<CacheFilesystem> probe_cache_filesystem(const fs::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) {
    return std::unexpected(errno_error(errno, fmt::format("statfs {}", dir.string())));
  }
  CacheFilesystem result;
  result.hugetlbfs = static_cast<unsigned long>(st.f_type) == HUGETLBFS_MAGIC;
  if (st.f_bsize > 0) result.block_bytes = static_cast<uint64_t>(st.f_bsize);
  return result;
}

uint64_t data_file_bytes(uint64_t size, const CacheFilesystem& fs) {
  if (!fs.hugetlbfs) return size;
  return (size + fs.block_bytes - 1) / fs.block_bytes * fs.block_bytes;
}

CacheResult<uint64_t> cache_allocation_bytes(CacheFileSpec spec, const CacheFilesystem& fs) {
  const uint64_t alignment = fs.hugetlbfs ? fs.block_bytes : static_cast<uint64_t>(::getpagesize());
  auto region = ChunkReadiness::region_bytes_for(spec.size, spec.chunk_size, alignment);
  if (!region) return std::unexpected(region.error());
  const uint64_t block = std::max<uint64_t>(fs.block_bytes, 1);
  return (spec.size + block - 1) / block * block + *region;
}

CacheFile::CacheFile(fs::path data_path, fs::path readiness_path, UniqueFd data_fd,
                     uint64_t data_bytes, ChunkReadiness readiness)
    : data_path_(std::move(data_path)),
      readiness_path_(std::move(readiness_path)),
      data_fd_(std::move(data_fd)),
      data_bytes_(data_bytes),
      readiness_(std::move(readiness)) {}

CacheResult<CacheFile> CacheFile::create(const fs::path& data_path, const fs::path& readiness_path,
                                         CacheFileSpec spec, CacheFileOptions options) {
  if (auto geometry = ChunkReadiness::region_bytes_for(spec.size, spec.chunk_size, 1); !geometry) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("{}: {}", data_path.string(), geometry.error().message));
  }
  for (const fs::path* p : {&data_path, &readiness_path}) {
    if (auto ok = make_parent(*p); !ok) return std::unexpected(ok.error());
    std::error_code ec;
    if (fs::exists(fs::symlink_status(*p, ec))) {
      return cache_failure(CacheErrc::exists, fmt::format("{} already exists", p->string()));
    }
  }
  const fs::path dir = data_path.parent_path();
  auto filesystem = probe_cache_filesystem(dir);
  if (!filesystem) return std::unexpected(filesystem.error());

  auto data_fd = open_unnamed(dir);
  if (!data_fd) return std::unexpected(data_fd.error());
  const uint64_t data_bytes = data_file_bytes(spec.size, *filesystem);
  const bool preallocate = filesystem->hugetlbfs || options.space == SpaceReservation::preallocate;
  if (data_bytes > 0 && !preallocate) {
    auto ok = check_free_space(dir, data_path, spec, *filesystem, options.promised_elsewhere);
    if (!ok) return std::unexpected(ok.error());
    if (::ftruncate(data_fd->get(), static_cast<off_t>(data_bytes)) != 0) {
      return std::unexpected(errno_error(
          errno, fmt::format("setting {} to {} bytes", data_path.string(), data_bytes)));
    }
  }
  if (data_bytes > 0 && preallocate) {
    int rc = 0;
    do {
      rc = ::fallocate(data_fd->get(), 0, 0, static_cast<off_t>(data_bytes));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (errno == ENOSPC || errno == EDQUOT) {
        return std::unexpected(no_space_error(dir, data_bytes, data_path, std::strerror(errno)));
      }
      return std::unexpected(errno_error(
          errno, fmt::format("reserving {} bytes for {}", data_bytes, data_path.string())));
    }
  }

  auto map_fd = open_unnamed(readiness_path.parent_path());
  if (!map_fd) return std::unexpected(map_fd.error());
  auto readiness = ChunkReadiness::create(std::move(*map_fd), readiness_path.string(), spec.size,
                                          spec.chunk_size);
  if (!readiness) {
    if (readiness.error().code == CacheErrc::no_space) {
      return cache_failure(
          CacheErrc::no_space,
          fmt::format("cache directory {}: no space for the readiness map of {} ({}); free "
                      "space on that filesystem, make the cache budget fit its free space, or "
                      "evict models",
                      readiness_path.parent_path().string(), data_path.filename().string(),
                      readiness.error().message));
    }
    return std::unexpected(readiness.error());
  }
  if (options.writer_lock) {
    if (auto ok = take_writer_lock(readiness->fd(), readiness_path); !ok) {
      return std::unexpected(ok.error());
    }
  }

  // Map first, data second: a data file is never visible without its map.
  if (auto ok = link_into_place(readiness->fd(), readiness_path); !ok) {
    return std::unexpected(ok.error());
  }
  if (auto ok = link_into_place(data_fd->get(), data_path); !ok) {
    ::unlink(readiness_path.c_str());
    return std::unexpected(ok.error());
  }
  CacheFile file(data_path, readiness_path, std::move(*data_fd), data_bytes, std::move(*readiness));
  if (auto ok = file.set_up_writes(options.write_mode, *filesystem); !ok) {
    ::unlink(data_path.c_str());
    ::unlink(readiness_path.c_str());
    return std::unexpected(ok.error());
  }
  return file;
}

CacheResult<CacheFile> CacheFile::open(const fs::path& data_path, const fs::path& readiness_path,
                                       CacheFileOptions options) {
  UniqueFd map_fd(::open(readiness_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!map_fd) {
    const CacheErrc code = errno == ENOENT ? CacheErrc::not_found : CacheErrc::io_error;
    return cache_failure(code, fmt::format("opening readiness map {}: {}", readiness_path.string(),
                                           std::strerror(errno)));
  }
  UniqueFd data_fd(::open(data_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!data_fd) {
    const CacheErrc code = errno == ENOENT ? CacheErrc::not_found : CacheErrc::io_error;
    return cache_failure(
        code, fmt::format("opening cached file {}: {}", data_path.string(), std::strerror(errno)));
  }
  if (options.writer_lock) {
    if (auto ok = take_writer_lock(map_fd.get(), readiness_path); !ok) {
      return std::unexpected(ok.error());
    }
  }
  auto readiness = ChunkReadiness::open_writer(std::move(map_fd), readiness_path.string());
  if (!readiness) return std::unexpected(readiness.error());

  auto filesystem = probe_cache_filesystem(data_path.parent_path());
  if (!filesystem) return std::unexpected(filesystem.error());
  struct stat st {};
  if (::fstat(data_fd.get(), &st) != 0) {
    return std::unexpected(errno_error(errno, fmt::format("fstat {}", data_path.string())));
  }
  const uint64_t expected = data_file_bytes(readiness->file_size(), *filesystem);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != expected) {
    return cache_failure(CacheErrc::corrupt,
                         fmt::format("cached file {} is {} bytes, its readiness map says {}",
                                     data_path.string(), st.st_size, expected));
  }
  CacheFile file(data_path, readiness_path, std::move(data_fd), expected, std::move(*readiness));
  if (auto ok = file.set_up_writes(options.write_mode, *filesystem); !ok) {
    return std::unexpected(ok.error());
  }
  return file;
}

CacheResult<void> CacheFile::set_up_writes(DataWriteMode mode, const CacheFilesystem& fs) {
  if (mode == DataWriteMode::automatic) {
    mode = fs.hugetlbfs ? DataWriteMode::mapping : DataWriteMode::pwrite;
  }
  if (mode != DataWriteMode::mapping) return {};
  auto map = MappedRegion::map(data_fd_.get(), data_bytes_, /*writable=*/true, data_path_.string());
  if (!map) return std::unexpected(map.error());
  write_map_ = std::move(*map);
  return {};
}

CacheResult<void> CacheFile::write_at(uint64_t offset, std::span<const std::byte> bytes) {
  const uint64_t size = readiness_.file_size();
  if (offset > size || bytes.size() > size - offset) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("{}: write of {} bytes at {} runs past its {} bytes",
                                     data_path_.string(), bytes.size(), offset, size));
  }
  if (bytes.empty()) return {};
  if (write_map_.size() > 0) {
    std::memcpy(write_map_.data() + offset, bytes.data(), bytes.size());
    return {};
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(data_fd_.get(), bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(
          errno_error(errno, fmt::format("writing {} bytes at {} of {}", bytes.size() - done,
                                         offset + done, data_path_.string())));
    }
    if (n == 0) {
      return cache_failure(CacheErrc::io_error,
                           fmt::format("writing at {} of {}: pwrite wrote nothing", offset + done,
                                       data_path_.string()));
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

CacheResult<MappedRegion> CacheFile::map_range_read_only(uint64_t offset, uint64_t length) const {
  return MappedRegion::map_range_read_only(data_fd_.get(), static_cast<size_t>(offset),
                                           static_cast<size_t>(length), data_path_.string());
}

CacheResult<UniqueFd> CacheFile::reader_data_fd() const {
  const std::string proc = fmt::format("/proc/self/fd/{}", data_fd_.get());
  UniqueFd fd(::open(proc.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    return std::unexpected(
        errno_error(errno, fmt::format("reopening {} read-only", data_path_.string())));
  }
  return fd;
}

}  // namespace thaw::store
