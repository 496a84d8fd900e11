#include "preload/shim/shim_state.hpp"

#include <unistd.h>

#include <mutex>
#include <set>
#include <string>

namespace thaw::preload {

thread_local int ReentryGuard::depth_ = 0;

namespace {

// Never destroyed: notices are said during exit too.
std::mutex& notice_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::set<std::string, std::less<>>& notices_said() {
  static auto* said = new std::set<std::string, std::less<>>();
  return *said;
}

}  // namespace

void log_line(std::string_view message) {
  // One write per line so that lines of many threads and processes do not interleave.
  const std::string line = fmt::format("thaw-preload[{}]: {}\n", ::getpid(), message);
  ssize_t ignored = ::write(config().log_fd, line.data(), line.size());
  (void)ignored;
}

void notice_once(std::string_view key, std::string_view message) {
  {
    std::lock_guard lock(notice_mutex());
    if (!notices_said().emplace(key).second) return;
  }
  log_line(message);
}

void notices_before_fork() {
  notice_mutex().lock();
}

void notices_after_fork_in_parent() {
  notice_mutex().unlock();
}

void notices_after_fork_in_child() {
  new (&notice_mutex()) std::mutex();
}

}  // namespace thaw::preload
