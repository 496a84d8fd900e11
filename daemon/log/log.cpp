#include "daemon/log/log.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

namespace thaw::daemon {

namespace {

// systemd's own rule: the journal is ours when $JOURNAL_STREAM names stderr's device:inode.
bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  struct stat st {};
  if (stream == nullptr || ::fstat(STDERR_FILENO, &st) != 0) return false;
  return fmt::format("{}:{}", st.st_dev, st.st_ino) == stream;
}

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warning:
      return "warning";
    case LogLevel::notice:
      return "notice";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "info";
}

// "2025-01-31T17:04:05.123+0100": local time as date(1) and journalctl print it, to the
// millisecond (a fetch's or a prewarm's steps are milliseconds apart), with its offset.
std::string timestamp() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  ::localtime_r(&now.tv_sec, &local);
  char date[32];
  char zone[8];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &local);
  std::strftime(zone, sizeof(zone), "%z", &local);
  return fmt::format("{}.{:03}{}", date, now.tv_nsec / 1'000'000, zone);
}

}  // namespace

void log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields) {
  static const bool journal = stderr_is_journal();
  if (journal) {
    std::vector<std::string> lines;
    lines.push_back(fmt::format("MESSAGE={}", message));
    lines.push_back(fmt::format("PRIORITY={}", static_cast<int>(level)));
    lines.push_back("SYSLOG_IDENTIFIER=thawd");
    for (const auto& [key, value] : fields) lines.push_back(fmt::format("{}={}", key, value));
    std::vector<iovec> iov;
    for (auto& l : lines) iov.push_back(iovec{l.data(), l.size()});
    (void)sd_journal_sendv(iov.data(), static_cast<int>(iov.size()));
    return;
  }
  // The journal stamps its entries itself; a terminal or a redirected file has no clock.
  std::string line = fmt::format("{} thawd: {}: {}", timestamp(), level_name(level), message);
  for (const auto& [key, value] : fields) line += fmt::format(" {}={}", key, value);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace thaw::daemon
