#include "preload/shim/shim_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace thaw::preload {

thread_local int ReentryGuard::depth_ = 0;

namespace {

ShimConfig read_config() {
  ShimConfig c;
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = env("THAW_PRELOAD_DISABLE")) c.disabled = std::strcmp(v, "0") != 0;
  if (const char* v = env("THAW_PRELOAD_DETERMINISTIC")) c.deterministic = std::strcmp(v, "0") != 0;
  if (const char* v = env("THAW_PRELOAD_VA_BASE")) {
    char* end = nullptr;
    const unsigned long long base = std::strtoull(v, &end, 0);
    if (end != nullptr && *end == '\0' && base != 0) c.va_base = base;
  }
  if (const char* v = env("THAW_PRELOAD_LOG")) {
    c.verbose = std::strcmp(v, "0") != 0;
    if (c.verbose && std::strcmp(v, "1") != 0 && std::strcmp(v, "stderr") != 0) {
      const int fd = ::open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) c.log_fd = fd;
    }
  }
  return c;
}

std::mutex& notice_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

const ShimConfig& config() {
  static const ShimConfig c = read_config();
  return c;
}

ShimCounters& counters() {
  static ShimCounters c;
  return c;
}

void log_line(std::string_view message) {
  // One write per line so that lines of many threads and processes do not interleave.
  const std::string line = fmt::format("thaw-preload[{}]: {}\n", ::getpid(), message);
  ssize_t ignored = ::write(config().log_fd, line.data(), line.size());
  (void)ignored;
}

void notice_once(std::string_view key, std::string_view message) {
  static std::set<std::string, std::less<>>* said = new std::set<std::string, std::less<>>();
  {
    std::lock_guard lock(notice_mutex());
    if (!said->emplace(key).second) return;
  }
  log_line(message);
}

}  // namespace thaw::preload
