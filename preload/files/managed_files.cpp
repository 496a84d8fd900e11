#include "preload/files/managed_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string_view>

#include "preload/thawd_client/thawd_client.hpp"
#include "preload/hooks/engine_memory.hpp"
#include "preload/hooks/injector_instance.hpp"
#include "preload/hooks/recorder_instance.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

namespace fs = std::filesystem;

std::shared_mutex& table_mutex() {
  static auto* m = new std::shared_mutex();  // never destroyed: hooks run during exit
  return *m;
}
std::map<int, std::shared_ptr<ManagedFile>>& table() {
  static auto* t = new std::map<int, std::shared_ptr<ManagedFile>>();
  return *t;
}

std::chrono::nanoseconds read_timeout() {
  static const std::chrono::nanoseconds t = [] {
    const char* v = std::getenv("THAW_PRELOAD_READ_TIMEOUT");
    const long s = v != nullptr ? std::atol(v) : 0;
    return std::chrono::nanoseconds(std::chrono::seconds(s > 0 ? s : 600));
  }();
  return t;
}

// THAW_PRELOAD_ATTACH=1: the first managed model the engine opens, it runs attached to a
// prewarmed slot of (if thawd has one), with the memory budget thawd grants.
void attach_once(const std::string& model) {
  static std::atomic<bool> tried{false};
  const char* v = std::getenv("THAW_PRELOAD_ATTACH");
  if (v == nullptr || std::string_view(v) != "1" || tried.exchange(true)) return;
  if (auto slot = daemon_attach_slot(model)) {
    grant_memory_budget(slot->budget_bytes);
    debug("attached to slot {} of {}: cuMemGetInfo answers a budget of {} bytes", slot->slot, model,
          slot->budget_bytes);
    debug("slot {} holds {} of its layout's bytes in a {} layout ({} pages)", slot->slot,
          slot->grant.resident_bytes, slot->grant.layout_kind, slot->grant.pages.size());
    install_injector(std::move(slot->grant));
  } else {
    notice_once("attach", "THAW_PRELOAD_ATTACH: no prewarmed slot of " + model +
                              " to attach to; cuMemGetInfo answers the driver's numbers");
  }
}

bool path_exists(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

std::shared_ptr<ManagedFile> classify(int dirfd, const char* path) {
  if (path == nullptr) return nullptr;
  fs::path full(path);
  if (full.is_relative()) {
    // Relative to the working directory or to dirfd.
    std::error_code ec;
    fs::path base = dirfd == AT_FDCWD
                        ? fs::current_path(ec)
                        : fs::read_symlink("/proc/self/fd/" + std::to_string(dirfd), ec);
    if (ec) return nullptr;
    full = base / full;
  }
  full = full.lexically_normal();
  // <root>/<key>/<relative path>: find the ancestor holding the cache marker.
  std::vector<fs::path> parts(full.begin(), full.end());
  for (std::size_t i = parts.size() >= 3 ? parts.size() - 2 : 0; i >= 1 && i < parts.size(); --i) {
    fs::path root;
    for (std::size_t j = 0; j < i; ++j) root /= parts[j];
    if (!path_exists(root / ".thaw-cache")) continue;
    if (i + 1 >= parts.size()) return nullptr;  // the model directory itself
    const fs::path key = parts[i];
    fs::path relative;
    for (std::size_t j = i + 1; j < parts.size(); ++j) relative /= parts[j];
    if (relative.begin()->string() == ".thaw") return nullptr;
    // The readiness map from thawd when it runs (it may be the only one allowed to open the
    // cache's files), else straight from the cache.
    UniqueFd fd;
    const char* source = "thawd";
    if (auto from_daemon = daemon_readiness_fd(key.string(), relative.string())) {
      fd = std::move(*from_daemon);
    } else {
      source = "the cache";
      const fs::path map = root / key / ".thaw" / "ready" / relative;
      fd.reset(::open(map.c_str(), O_RDONLY | O_CLOEXEC));
    }
    if (!fd) return nullptr;
    auto readiness = store::ChunkReadiness::open_reader(std::move(fd), relative.string());
    if (!readiness) {
      debug("{}: readiness map unusable ({}); reads pass through", full.string(),
            readiness.error().message);
      return nullptr;
    }
    if (LayoutRecorder* recorder = recorder_instance()) recorder->model_opened(key.string());
    attach_once(key.string());
    const bool complete = readiness->state() == store::FillState::complete;
    auto file = std::make_shared<ManagedFile>(ManagedFile{full.string(), readiness->file_size(),
                                                          std::move(*readiness), key.string(),
                                                          relative.string(), complete});
    if (complete) return file;
    debug("{}: streamed ({} bytes, {} of {} chunks in; readiness from {})", file->path, file->size,
          file->readiness.verified_chunks(), file->readiness.chunk_count(), source);
    return file;
  }
  return nullptr;
}

// Every read and close asks; most processes never have a managed file.
std::atomic<std::size_t> g_tracked{0};

void track(int fd, std::shared_ptr<ManagedFile> file) {
  std::unique_lock lock(table_mutex());
  table()[fd] = std::move(file);
  g_tracked.store(table().size(), std::memory_order_release);
}

std::shared_ptr<ManagedFile> tracked(int fd) {
  if (g_tracked.load(std::memory_order_acquire) == 0) return nullptr;
  std::shared_lock lock(table_mutex());
  auto it = table().find(fd);
  return it == table().end() ? nullptr : it->second;
}

void untrack(int fd) {
  std::shared_ptr<ManagedFile> last;  // destroyed after the lock is released: its readiness
                                      // map's close() comes back through the close hook
  std::unique_lock lock(table_mutex());
  auto it = table().find(fd);
  if (it == table().end()) return;
  last = std::move(it->second);
  table().erase(it);
  g_tracked.store(table().size(), std::memory_order_release);
}

bool wait_readable(ManagedFile& file, std::uint64_t offset, std::uint64_t length) {
  if (offset >= file.size || length == 0) return true;
  length = std::min(length, file.size - offset);
  if (file.readiness.is_ready(offset, length)) return true;
  counters().reads_waited.fetch_add(1, std::memory_order_relaxed);
  const auto w = file.readiness.wait_ready(offset, length, read_timeout());
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

}  // namespace thaw::preload
