// StreamCaptures: the stream captures in progress in this process that restrict
// "potentially unsafe" driver calls (cuMemAlloc, cuMemFree, synchronisation), as the driver
// applies them (cuThreadExchangeStreamCaptureMode):
//   - a thread whose own mode is RELAXED is never restricted;
//   - otherwise, a capture begun in GLOBAL or THREAD_LOCAL mode restricts the thread that
//     began it, and a GLOBAL one also every other thread whose mode is GLOBAL;
//   - RELAXED captures restrict no one (so they are not kept).
// The driver refuses a restricted call with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
// invalidates the capture. The layout's cuMemAlloc is made of VMM calls, which the driver
// does not restrict, so the hooks ask here first and, when a capture restricts the call,
// let the driver answer it (its refusal, its invalidation).
//
// The capture hooks (preload/hooks/capture_hooks.cpp) keep it: began() after a successful
// cuStreamBeginCapture, ended() once the driver says the capture is over. any() is the
// hot path of every allocation: one atomic load.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace thaw::preload {

class StreamCaptures {
 public:
  // Whether some capture that restricts unsafe calls may be in progress.
  bool any() const { return count_.load(std::memory_order_acquire) != 0; }
  // The calling thread began capture `id` (the driver's capture id) in `mode`.
  void began(std::uint64_t id, CUstreamCaptureMode mode);
  void ended(std::uint64_t id);
  // Whether the driver refuses a potentially unsafe call by the calling thread, whose own
  // capture interaction mode is `thread_mode`.
  bool restricts(CUstreamCaptureMode thread_mode) const;
  // Fork: the lock (a leaf: nothing is called under it) is held across fork(); in the child
  // the parent's captures are gone (only the forking thread exists there, and the child's
  // driver state is its own).
  void before_fork() { mutex_.lock(); }
  void after_fork_in_parent() { mutex_.unlock(); }
  void after_fork_in_child();

 private:
  struct Capture {
    std::uint64_t id;
    CUstreamCaptureMode mode;
    std::thread::id thread;
  };
  mutable std::mutex mutex_;
  std::vector<Capture> captures_;  // under mutex_
  std::atomic<std::size_t> count_{0};
};

}  // namespace thaw::preload
