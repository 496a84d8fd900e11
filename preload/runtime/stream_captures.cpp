#include "preload/runtime/stream_captures.hpp"

#include <algorithm>
#include <new>

namespace thaw::preload {

void StreamCaptures::began(std::uint64_t id, CUstreamCaptureMode mode) {
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return;  // restricts no one
  std::lock_guard lock(mutex_);
  // A capture id the driver reuses belongs to a capture whose end went unseen.
  std::erase_if(captures_, [&](const Capture& c) { return c.id == id; });
  captures_.push_back({id, mode, std::this_thread::get_id()});
  count_.store(captures_.size(), std::memory_order_release);
}

void StreamCaptures::ended(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  std::erase_if(captures_, [&](const Capture& c) { return c.id == id; });
  count_.store(captures_.size(), std::memory_order_release);
}

bool StreamCaptures::restricts(CUstreamCaptureMode thread_mode) const {
  if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  const std::thread::id me = std::this_thread::get_id();
  std::lock_guard lock(mutex_);
  return std::any_of(captures_.begin(), captures_.end(), [&](const Capture& c) {
    return c.thread == me || (c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                              thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
  });
}

void StreamCaptures::after_fork_in_child() {
  // The forking thread held the lock: the child's copy is re-initialised, not unlocked.
  new (&mutex_) std::mutex();
  captures_.clear();
  count_.store(0, std::memory_order_release);
}

}  // namespace thaw::preload
