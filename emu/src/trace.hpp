// THAW_EMU_TRACE: one JSON line per driver call, for tests and for debugging a shim.
#pragma once

#include <cuda.h>

#include <cstring>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace emu {

class Trace {
 public:
  // Opens (appends to) `path`; an empty path leaves tracing off.
  void open(const std::string& path);
  bool on() const { return fd_ >= 0; }
  // Writes one line with a single write(2), so lines of concurrent callers and
  // processes sharing the file never interleave.
  void write_line(std::string line);
  std::uint64_t lines() const { return lines_.load(); }

 private:
  int fd_ = -1;
  std::atomic<std::uint64_t> lines_{0};
};

Trace& trace();

void append_json_string(std::string& out, std::string_view s);

// The record of one API call: arguments in, values out. Cheap when tracing is off.
class Call {
 public:
  explicit Call(const char* name);
  const char* name() const { return name_; }

  template <class T>
  Call& arg(const char* key, const T& v) {
    if (on_) append(args_, key, v);
    return *this;
  }
  Call& ptr(const char* key, std::uint64_t v) {
    if (on_) append_hex(args_, key, v);
    return *this;
  }
  template <class T>
  Call& out(const char* key, const T& v) {
    if (on_) append(out_, key, v);
    return *this;
  }
  Call& out_ptr(const char* key, std::uint64_t v) {
    if (on_) append_hex(out_, key, v);
    return *this;
  }
  void finish(CUresult result);

 private:
  template <class T>
  static void append(std::string& s, const char* key, const T& v) {
    open_key(s, key);
    if constexpr (std::is_same_v<T, bool>) {
      s += v ? "true" : "false";
    } else if constexpr (std::is_enum_v<T>) {
      std::underlying_type_t<T> bits;  // may hold a value outside the enum
      std::memcpy(&bits, &v, sizeof bits);
      s += std::to_string(static_cast<long long>(bits));
    } else if constexpr (std::is_integral_v<T>) {
      s += std::to_string(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      s += std::to_string(v);
    } else if constexpr (std::is_pointer_v<T> && !std::is_convertible_v<T, const char*>) {
      append_hex_value(s, reinterpret_cast<std::uintptr_t>(v));
    } else {
      append_json_string(s, v == nullptr ? std::string_view("(null)") : std::string_view(v));
    }
  }
  static void open_key(std::string& s, const char* key);
  static void append_hex(std::string& s, const char* key, std::uint64_t v);
  static void append_hex_value(std::string& s, std::uint64_t v);

  const char* name_;
  bool on_;
  std::string args_;
  std::string out_;
};

}  // namespace emu
