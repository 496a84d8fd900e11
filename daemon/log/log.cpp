#include "daemon/log/log.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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
  std::string line = fmt::format("thawd: {}: {}", level_name(level), message);
  for (const auto& [key, value] : fields) line += fmt::format(" {}={}", key, value);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace thaw::daemon
