// The timing model: how long emulated work takes, and waiting for exactly that long.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace emu {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// Sleeps most of the way and spins the rest: the model charges microseconds
// (20 us per page, 5 us per launch) that nanosleep alone would overshoot by 50+ us.
void wait_until(Clock::time_point deadline);

nanoseconds transfer_time(std::uint64_t bytes, double bytes_per_s);

// A link that moves bytes one transfer at a time (a PCIe direction's copy engine).
// Transfers queue FIFO: the next one starts when the previous one's modelled time ends.
class CopyEngine {
 public:
  // Reserves `d` on the link no earlier than `earliest`; returns when it starts.
  Clock::time_point reserve(Clock::time_point earliest, nanoseconds d);

 private:
  std::mutex mu_;
  Clock::time_point free_at_{};
};

}  // namespace emu
