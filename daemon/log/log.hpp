// thawd's log: to the journal with structured fields (MODEL=, SLOT=, GPU=) when stderr is
// the journal (systemd sets $JOURNAL_STREAM to its device:inode), otherwise one line per
// message on stderr, starting with the local time to the millisecond, fields appended as
// key=value: "2025-01-31T17:04:05.123+0100 thawd: notice: ready: ...".
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

namespace thaw::daemon {

enum class LogLevel { error = 3, warning = 4, notice = 5, info = 6, debug = 7 };

using LogField = std::pair<std::string_view, std::string_view>;  // e.g. {"MODEL", "gpt2"}

void log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields = {});

}  // namespace thaw::daemon
