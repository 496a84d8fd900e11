#include "daemon/store/registry/token_bucket.hpp"

#include <algorithm>

namespace thaw::store {

TokenBucket::TokenBucket(std::uint64_t bytes_per_s, std::uint64_t burst_bytes,
                         Clock::time_point now)
    : rate_(static_cast<double>(bytes_per_s)), last_(now) {
  if (burst_bytes == 0) burst_bytes = std::max<std::uint64_t>(bytes_per_s / 10, 256u << 10);
  burst_ = static_cast<double>(burst_bytes);
  tokens_ = burst_;
}

void TokenBucket::refill(Clock::time_point now) {
  if (now <= last_) return;
  double elapsed = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
  last_ = now;
}

bool TokenBucket::try_take(std::uint64_t bytes, Clock::time_point now) {
  if (!limited()) return true;
  refill(now);
  if (tokens_ <= 0) return false;
  tokens_ -= static_cast<double>(bytes);
  return true;
}

bool TokenBucket::has_tokens(Clock::time_point now) {
  if (!limited()) return true;
  refill(now);
  return tokens_ > 0;
}

std::chrono::nanoseconds TokenBucket::time_until(std::uint64_t bytes, Clock::time_point now) {
  if (!limited()) return std::chrono::nanoseconds(0);
  refill(now);
  double missing = static_cast<double>(bytes) - tokens_;
  if (missing <= 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(static_cast<std::int64_t>(missing / rate_ * 1e9) + 1);
}

}  // namespace thaw::store
