#include "trace.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>

#include "errors.hpp"
#include "timing.hpp"

namespace emu {

Trace& trace() {
  static Trace t;
  return t;
}

void Trace::open(const std::string& path) {
  if (path.empty() || fd_ >= 0) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    std::fprintf(stderr, "thaw-emu: cannot open THAW_EMU_TRACE='%s': %m; tracing is off\n",
                 path.c_str());
  }
}

void Trace::write_line(std::string line) {
  line += '\n';
  if (::write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
    lines_.fetch_add(1);
  }
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

Call::Call(const char* name) : name_(name), on_(trace().on()) {}

void Call::open_key(std::string& s, const char* key) {
  if (!s.empty()) s += ',';
  append_json_string(s, key);
  s += ':';
}

void Call::append_hex(std::string& s, const char* key, std::uint64_t v) {
  open_key(s, key);
  append_hex_value(s, v);
}

void Call::append_hex_value(std::string& s, std::uint64_t v) {
  s += fmt::format("\"0x{:x}\"", v);
}

void Call::finish(CUresult result) {
  if (!on_) return;
  auto text = error_text(static_cast<int>(result));
  auto t = std::chrono::duration_cast<nanoseconds>(Clock::now().time_since_epoch()).count();
  std::string line = fmt::format(R"({{"t_ns":{},"pid":{},"tid":{},"call":)", t, getpid(),
                                 static_cast<long>(syscall(SYS_gettid)));
  append_json_string(line, name_);
  line += R"(,"args":{)" + args_ + R"(},"result":)";
  append_json_string(line, text ? text->name : "CUDA_ERROR_UNKNOWN");
  line += fmt::format(R"(,"code":{},"out":{{{}}}}})", static_cast<int>(result), out_);
  trace().write_line(std::move(line));
}

}  // namespace emu
