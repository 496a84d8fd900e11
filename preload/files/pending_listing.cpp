#include "preload/files/pending_listing.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>

#include "preload/files/listing_wait.hpp"
#include "preload/files/pending_files.hpp"
#include "preload/runtime/shim_config.hpp"
#include "preload/shim/shim_state.hpp"
#include "preload/thawd_client/thawd_client.hpp"

namespace thaw::preload {

namespace {

namespace fs = std::filesystem;

bool has_marker(const fs::path& dir) {
  struct stat st {};
  return ::stat((dir / ".thaw-cache").c_str(), &st) == 0;
}

// `absolute` once the cheap check says it may be in a cache: the check is on its parent
// (a model directory's marker is there or above).
std::optional<ModelFilePath> classify_directory(const fs::path& absolute) {
  fs::path dir = absolute.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  if (dir == dir.root_path() || outside_every_cache(dir.parent_path().string())) {
    return std::nullopt;
  }
  return listed_model_directory(dir, has_marker);
}

bool shim_active() {
  return !ReentryGuard::inside() && !config().disabled;
}

void sleep_for(std::chrono::milliseconds d) {
  timespec ts{static_cast<time_t>(d.count() / 1000), static_cast<long>(d.count() % 1000) * 1000000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

std::optional<ModelFilePath> listing_candidate(int dirfd, const char* path) {
  if (path == nullptr || path[0] == '\0' || !shim_active()) return std::nullopt;
  ReentryGuard guard;  // the checks' stat and getcwd go straight to libc
  auto full = absolute_at(dirfd, path);
  if (!full) return std::nullopt;
  return classify_directory(*full);
}

std::optional<ModelFilePath> listing_candidate(int fd) {
  if (fd < 0 || !shim_active()) return std::nullopt;
  ReentryGuard guard;
  std::error_code ec;
  const fs::path full = fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  if (ec || !full.is_absolute()) return std::nullopt;  // e.g. "/x (deleted)" stays absolute
  return classify_directory(full);
}

void wait_until_listable(const ModelFilePath& where) {
  ReentryGuard guard;
  const int saved = errno;
  const auto start = std::chrono::steady_clock::now();
  const auto creating = [&] {
    return daemon_pending_file(where.model, kListingProbe).kind == PendingFileState::fetching;
  };
  const ListingWait result = wait_for_complete_listing(
      creating, sleep_for, config().read_timeout, [] { return std::chrono::steady_clock::now(); });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  switch (result) {
    case ListingWait::complete:
      break;
    case ListingWait::complete_waited:
      notice_once("pending-listing",
                  fmt::format("{} is listed once thawd's fetch of {} has created every file it "
                              "will (the engine lists model directories)",
                              where.full, where.model));
      debug("listing of {}: waited {:.3f} s for thawd's fetch to create every file", where.full,
            waited);
      break;
    case ListingWait::timed_out:
      notice_once("pending-listing-timeout:" + where.full,
                  fmt::format("{}: thawd's fetch of {} was still creating files after "
                              "THAW_PRELOAD_READ_TIMEOUT; the engine's listing may lack some",
                              where.full, where.model));
      break;
  }
  errno = saved;
}

}  // namespace thaw::preload
