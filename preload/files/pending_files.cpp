#include "preload/files/pending_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "preload/runtime/shim_config.hpp"
#include "preload/shim/shim_state.hpp"
#include "preload/thawd_client/thawd_client.hpp"

namespace thaw::preload {

namespace {

void sleep_for(std::chrono::milliseconds d) {
  timespec ts{static_cast<time_t>(d.count() / 1000), static_cast<long>(d.count() % 1000) * 1000000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Directories known to have no cache marker in themselves or above: a miss in one of them
// (Python's imports look up thousands of absent paths) then costs a hash, not a walk up the
// tree. Direct-mapped 64-bit hashes in atomics: no lock a fork could leave held. A marker
// made after a directory was remembered is not seen — thawd makes its root before engines run.
class NoCacheDirectories {
 public:
  static std::uint64_t hash(std::string_view dir) {
    std::uint64_t h = std::hash<std::string_view>{}(dir);
    return h == 0 ? 1 : h;
  }
  bool known(std::uint64_t h) const {
    return slots_[h % kSlots].load(std::memory_order_relaxed) == h;
  }
  void remember(std::uint64_t h) { slots_[h % kSlots].store(h, std::memory_order_relaxed); }

 private:
  static constexpr std::size_t kSlots = 1024;
  std::array<std::atomic<std::uint64_t>, kSlots> slots_{};
};

NoCacheDirectories& no_cache_directories() {
  static auto* d = new NoCacheDirectories();  // never destroyed: hooks run during exit
  return *d;
}

// Whether `dir` (absolute, normalised) or a directory above it holds a cache marker.
bool marker_at_or_above(const std::string& dir) {
  struct stat st {};
  std::string d = dir;
  for (;;) {
    if (::stat((d == "/" ? std::string("/.thaw-cache") : d + "/.thaw-cache").c_str(), &st) == 0) {
      return true;
    }
    if (d == "/" || d.empty()) return false;
    const auto slash = d.rfind('/');
    d = slash == 0 ? "/" : d.substr(0, slash);
  }
}

// <root>/<key> itself, the directory an engine is pointed at (and checks first: "--model:
// directory does not exist"); the cache creates it with the model's first file.
std::optional<ModelFilePath> model_directory(int dirfd, const char* path) {
  namespace fs = std::filesystem;
  auto absolute = absolute_at(dirfd, path);
  if (!absolute) return std::nullopt;
  fs::path full = absolute->lexically_normal();
  if (!full.has_filename()) full = full.parent_path();  // "<key>/"
  const std::string key = full.filename().string();
  if (key.empty() || key.front() == '.') return std::nullopt;
  struct stat st {};
  if (::stat((full.parent_path() / ".thaw-cache").c_str(), &st) != 0) return std::nullopt;
  return ModelFilePath{full.string(), full.parent_path().string(), key, ""};
}

}  // namespace

std::optional<std::filesystem::path> absolute_at(int dirfd, const char* path) {
  namespace fs = std::filesystem;
  fs::path full(path);
  if (full.is_absolute()) return full;
  std::error_code ec;
  const fs::path base = dirfd == AT_FDCWD
                            ? fs::current_path(ec)
                            : fs::read_symlink("/proc/self/fd/" + std::to_string(dirfd), ec);
  if (ec) return std::nullopt;
  return base / full;
}

std::optional<ModelFilePath> pending_candidate(int dirfd, const char* path, int err) {
  if (err != ENOENT || path == nullptr || ReentryGuard::inside() || config().disabled) {
    return std::nullopt;
  }
  ReentryGuard guard;  // classify stats the ancestors: those calls go straight to libc
  // The prefix check: an absolute path's directory, when known to be under no cache.
  if (dirfd == AT_FDCWD && path[0] == '/') {
    const std::string dir = std::filesystem::path(path).lexically_normal().parent_path().string();
    if (outside_every_cache(dir)) return std::nullopt;
  }
  if (auto file = classify(dirfd, path)) return file;
  return model_directory(dirfd, path);
}

bool outside_every_cache(const std::string& dir) {
  const std::uint64_t h = NoCacheDirectories::hash(dir);
  if (no_cache_directories().known(h)) return true;
  if (marker_at_or_above(dir)) return false;
  no_cache_directories().remember(h);
  return true;
}

bool wait_until_created(const ModelFilePath& where) {
  ReentryGuard guard;
  const int saved = errno;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + config().read_timeout;
  // Polled: thawd has no "tell me when it exists" message; the window is the fetch's
  // listing and small files (milliseconds to a few seconds), so 5..50 ms steps cost nothing.
  std::chrono::milliseconds step(5);
  bool waited = false;
  const auto there = [&] {
    struct stat st {};
    if (::stat(where.full.c_str(), &st) != 0) return false;
    if (waited) {
      const double s_waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      debug("{}: created by thawd's fetch after {:.3f} s; the engine goes on", where.full,
            s_waited);
    }
    return true;
  };
  for (;;) {
    if (waited && there()) {
      errno = saved;
      return true;
    }
    // For the model's directory: whether thawd fetches the model, asked through the file
    // every model has and every fetch creates first.
    const bool directory = where.relative.empty();
    const PendingFileState s =
        daemon_pending_file(where.model, directory ? "config.json" : where.relative);
    if (s.kind == PendingFileState::present) {
      // thawd's cache may not be the one this path is in (another root with a marker): then
      // the file is still not here, and waiting would not change that.
      const bool ok = there();
      errno = saved;
      return ok;
    }
    if (s.kind == PendingFileState::unknown) {
      errno = saved;
      return false;
    }
    if (!waited) {
      waited = true;
      counters().reads_waited.fetch_add(1, std::memory_order_relaxed);
      notice_once("pending", fmt::format("{} is not in the cache yet: thawd is fetching {}; "
                                         "model files the engine looks for wait for the fetch "
                                         "to create them",
                                         where.full, where.model));
      debug("{}: waiting for thawd's fetch to create it", where.full);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      notice_once("pending-timeout:" + where.full,
                  fmt::format("{}: thawd's fetch did not create it within "
                              "THAW_PRELOAD_READ_TIMEOUT; the engine sees it missing",
                              where.full));
      errno = saved;
      return false;
    }
    sleep_for(step);
    step = std::min(step * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace thaw::preload
