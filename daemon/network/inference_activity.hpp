// Whether inference traffic runs on the node's link now, from samples of the classifier's
// inference packet counter (TrafficShaper::class_packets). thawd clamps fetch windows only
// while it does (daemon/network/fetch_window.hpp, ClampWhen::contended).
//
// Active from the first sample that shows new inference packets until `hold` passes without
// any: requests come in bursts with think time between them, and releasing a fetch's window
// between two requests only to clamp it again at the next would let each burst's first
// packets wait behind a full upstream queue.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace thaw::network {

class InferenceActivity {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kDefaultHold{2000};

  explicit InferenceActivity(std::chrono::milliseconds hold = kDefaultHold) : hold_(hold) {}

  // The counter's value at `now`; returns whether inference is active. The first sample
  // only sets the baseline; a counter that went back (the classifier restarted) does too.
  bool sample(std::uint64_t packets, Clock::time_point now) {
    if (last_packets_ && packets > *last_packets_) last_seen_ = now;
    last_packets_ = packets;
    return active(now);
  }
  bool active(Clock::time_point now) const { return last_seen_ && now - *last_seen_ < hold_; }

 private:
  std::chrono::milliseconds hold_;
  std::optional<std::uint64_t> last_packets_;
  std::optional<Clock::time_point> last_seen_;
};

}  // namespace thaw::network
