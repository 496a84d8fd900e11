// The engine's start-up timeline: one JSON line per phase, on stderr or in --timeline <file>,
//   {"event":"weights_file_loaded","t_ns":123456789,"since_start_ms":812.4,"file":"...",...}
// t_ns is CLOCK_MONOTONIC (comparable across processes on the node, so a benchmark can line
// up the engine's phases with a fetcher's); since_start_ms counts from process start as the
// kernel records it (/proc/self/stat starttime), so dynamic loading before main() is included.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace refengine {

class Timeline {
 public:
  // Writes to `path` (truncated), or stderr when empty. Records "process_start" at once.
  explicit Timeline(const std::string& path = {});
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Records `event` now, with extra fields.
  void mark(std::string_view event, nlohmann::json fields = nlohmann::json::object());

  static std::uint64_t now_ns();
  // CLOCK_MONOTONIC time at which this process started (exec), from /proc/self/stat.
  static std::uint64_t process_start_ns();

 private:
  std::FILE* out_ = nullptr;
  bool owns_ = false;
  std::uint64_t start_ns_ = 0;
  std::mutex mu_;
};

}  // namespace refengine
