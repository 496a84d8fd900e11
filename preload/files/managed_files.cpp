#include "preload/files/managed_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <mutex>
#include <vector>

#include "preload/runtime/shim_config.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

namespace fs = std::filesystem;

bool path_exists(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

std::optional<ModelFilePath> classify(int dirfd, const char* path) {
  if (path == nullptr) return std::nullopt;
  fs::path full(path);
  if (full.is_relative()) {
    // Relative to the working directory or to dirfd.
    std::error_code ec;
    fs::path base = dirfd == AT_FDCWD
                        ? fs::current_path(ec)
                        : fs::read_symlink("/proc/self/fd/" + std::to_string(dirfd), ec);
    if (ec) return std::nullopt;
    full = base / full;
  }
  full = full.lexically_normal();
  // <root>/<key>/<relative path>: find the ancestor holding the cache marker.
  std::vector<fs::path> parts(full.begin(), full.end());
  for (std::size_t i = parts.size() >= 3 ? parts.size() - 2 : 0; i >= 1 && i < parts.size(); --i) {
    fs::path root;
    for (std::size_t j = 0; j < i; ++j) root /= parts[j];
    if (!path_exists(root / ".thaw-cache")) continue;
    if (i + 1 >= parts.size()) return std::nullopt;  // the model directory itself
    fs::path relative;
    for (std::size_t j = i + 1; j < parts.size(); ++j) relative /= parts[j];
    if (relative.begin()->string() == ".thaw") return std::nullopt;
    return ModelFilePath{full.string(), root.string(), parts[i].string(), relative.string()};
  }
  return std::nullopt;
}

std::shared_ptr<ManagedFile> open_managed_file(const ModelFilePath& where,
                                               std::optional<UniqueFd> from_thawd) {
  // thawd's readiness map when it runs (it may be the only one allowed to open the cache's
  // files), else straight from the cache.
  UniqueFd fd;
  const char* source = "thawd";
  if (from_thawd) {
    fd = std::move(*from_thawd);
  } else {
    source = "the cache";
    const fs::path map = fs::path(where.root) / where.model / ".thaw" / "ready" / where.relative;
    fd.reset(::open(map.c_str(), O_RDONLY | O_CLOEXEC));
  }
  if (!fd) return nullptr;
  auto readiness = store::ChunkReadiness::open_reader(std::move(fd), where.relative);
  if (!readiness) {
    debug("{}: readiness map unusable ({}); reads pass through", where.full,
          readiness.error().message);
    return nullptr;
  }
  const bool complete = readiness->state() == store::FillState::complete;
  auto file = std::make_shared<ManagedFile>(ManagedFile{where.full, readiness->file_size(),
                                                        std::move(*readiness), where.model,
                                                        where.relative, complete});
  if (!complete) {
    debug("{}: streamed ({} bytes, {} of {} chunks in; readiness from {})", file->path, file->size,
          file->readiness.verified_chunks(), file->readiness.chunk_count(), source);
  }
  return file;
}

bool wait_readable(ManagedFile& file, std::uint64_t offset, std::uint64_t length) {
  if (offset >= file.size || length == 0) return true;
  length = std::min(length, file.size - offset);
  if (file.readiness.is_ready(offset, length)) return true;
  counters().reads_waited.fetch_add(1, std::memory_order_relaxed);
  const auto w = file.readiness.wait_ready(offset, length, config().read_timeout);
  if (w.status == store::WaitStatus::ready) return true;
  notice_once("wait-failed:" + file.path,
              w.status == store::WaitStatus::failed
                  ? fmt::format("{}: its fetch failed ({}); reads of it fail with EIO", file.path,
                                w.failure_reason)
                  : fmt::format("{}: bytes [{}, {}) did not arrive in time "
                                "(THAW_PRELOAD_READ_TIMEOUT); the read fails with EIO",
                                file.path, offset, offset + length));
  errno = EIO;
  return false;
}

void ManagedFileTable::track(int fd, std::shared_ptr<ManagedFile> file) {
  std::unique_lock lock(mutex_);
  by_fd_[fd] = std::move(file);
  count_.store(by_fd_.size(), std::memory_order_release);
}

std::shared_ptr<ManagedFile> ManagedFileTable::find(int fd) const {
  if (count_.load(std::memory_order_acquire) == 0) return nullptr;
  std::shared_lock lock(mutex_);
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? nullptr : it->second;
}

void ManagedFileTable::untrack(int fd) {
  std::shared_ptr<ManagedFile> last;  // destroyed after the lock is released: its readiness
                                      // map's close() comes back through the close hook
  std::unique_lock lock(mutex_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  last = std::move(it->second);
  by_fd_.erase(it);
  count_.store(by_fd_.size(), std::memory_order_release);
}

}  // namespace thaw::preload
