// A rate limit shared by every transfer of one fetch class. Bytes are taken as whole
// deliveries (libcurl hands a buffer at a time and can only take all of it or pause), so
// the bucket may go into debt; a transfer pauses while the bucket is empty or in debt and
// resumes once it refills.
#pragma once

#include <chrono>
#include <cstdint>

namespace thaw::store {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  TokenBucket() = default;  // unlimited
  TokenBucket(std::uint64_t bytes_per_s, std::uint64_t burst_bytes, Clock::time_point now);

  bool limited() const { return rate_ > 0; }

  // Takes `bytes` if the bucket holds any tokens (possibly going into debt); false means
  // "empty: pause".
  bool try_take(std::uint64_t bytes, Clock::time_point now);

  // True when a paused transfer may resume.
  bool has_tokens(Clock::time_point now);

  // How long until the bucket holds at least `bytes` tokens (zero if it does now).
  std::chrono::nanoseconds time_until(std::uint64_t bytes, Clock::time_point now);

 private:
  void refill(Clock::time_point now);

  double rate_ = 0;  // bytes per second; 0 = unlimited
  double burst_ = 0;
  double tokens_ = 0;
  Clock::time_point last_{};
};

}  // namespace thaw::store
