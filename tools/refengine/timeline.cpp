#include "timeline.hpp"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace refengine {

std::uint64_t Timeline::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1'000'000'000ull + std::uint64_t(ts.tv_nsec);
}

std::uint64_t Timeline::process_start_ns() {
  // Field 22 of /proc/self/stat: start time in clock ticks after boot. Boot-relative time is
  // CLOCK_BOOTTIME; convert with the current BOOTTIME - MONOTONIC offset (time suspended).
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return now_ns();
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  const std::uint64_t start_boot_ns =
      std::stoull(field) * (1'000'000'000ull / std::uint64_t(ticks));
  timespec boot{}, mono{};
  clock_gettime(CLOCK_BOOTTIME, &boot);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  const std::int64_t offset = (std::int64_t(boot.tv_sec) - mono.tv_sec) * 1'000'000'000ll +
                              (std::int64_t(boot.tv_nsec) - mono.tv_nsec);
  return std::uint64_t(std::int64_t(start_boot_ns) - offset);
}

Timeline::Timeline(const std::string& path) {
  if (path.empty()) {
    out_ = stderr;
  } else {
    out_ = std::fopen(path.c_str(), "we");
    if (out_ == nullptr)
      throw std::runtime_error(fmt::format("--timeline {}: cannot open for writing", path));
    owns_ = true;
  }
  start_ns_ = process_start_ns();
  nlohmann::json start{{"event", "process_start"},
                       {"t_ns", start_ns_},
                       {"since_start_ms", 0.0},
                       {"pid", ::getpid()}};
  std::fputs((start.dump() + "\n").c_str(), out_);
  std::fflush(out_);
}

Timeline::~Timeline() {
  if (owns_) std::fclose(out_);
}

void Timeline::mark(std::string_view event, nlohmann::json fields) {
  const std::uint64_t t = now_ns();
  nlohmann::json line{
      {"event", event}, {"t_ns", t}, {"since_start_ms", double(t - start_ns_) / 1e6}};
  for (auto& [k, v] : fields.items()) line[k] = v;
  std::lock_guard lock(mu_);
  std::fputs((line.dump() + "\n").c_str(), out_);
  std::fflush(out_);
}

}  // namespace refengine
