#include "timing.hpp"

#include <thread>

namespace emu {

void wait_until(Clock::time_point deadline) {
  constexpr auto kSpin = std::chrono::microseconds(150);
  auto now = Clock::now();
  if (deadline <= now) return;
  if (deadline - now > kSpin) std::this_thread::sleep_until(deadline - kSpin);
  while (Clock::now() < deadline) {
    // Spinning is bounded by kSpin (plus sleep jitter).
  }
}

nanoseconds transfer_time(std::uint64_t bytes, double bytes_per_s) {
  return nanoseconds(static_cast<std::int64_t>(static_cast<double>(bytes) / bytes_per_s * 1e9));
}

Clock::time_point CopyEngine::reserve(Clock::time_point earliest, nanoseconds d) {
  std::lock_guard lock(mu_);
  auto start = std::max(earliest, free_at_);
  free_at_ = start + d;
  return start;
}

}  // namespace emu
