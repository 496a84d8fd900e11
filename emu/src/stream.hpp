// Streams and events. Each stream executes its queue in order on its own worker
// thread; an operation may wait on positions in other streams (events, legacy
// default-stream rules) and takes the time the timing model gives it.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "timing.hpp"

namespace emu {

class StreamCore;
struct CaptureSession;

// A position in a stream: done once the stream has completed `seq` operations.
struct StreamPoint {
  std::shared_ptr<StreamCore> stream;
  std::uint64_t seq = 0;
};

struct StreamOp {
  std::vector<StreamPoint> waits;
  // The effect. Returns an error (e.g. CUDA_ERROR_ILLEGAL_ADDRESS) that becomes the
  // context's sticky error, as a fault on a GPU does.
  std::function<CUresult()> work;
  nanoseconds model{0};           // modelled duration, launch latency included
  CopyEngine* engine = nullptr;   // the link it occupies, if any
  bool runs_user_code = false;    // host functions and callbacks
  bool runs_after_fault = false;  // stream callbacks run (and get the error) after a fault
};

// The sticky error of a context, shared with its streams' workers.
using StickyError = std::shared_ptr<std::atomic<int>>;

class StreamCore : public std::enable_shared_from_this<StreamCore> {
 public:
  enum class Kind { kUser, kLegacy, kPerThread };

  StreamCore(std::uint64_t ctx, int device, Kind kind, unsigned flags, int priority,
             StickyError sticky, bool timing);

  std::uint64_t ctx() const { return ctx_; }
  int device() const { return device_; }
  Kind kind() const { return kind_; }
  unsigned flags() const { return flags_; }
  int priority() const { return priority_; }
  std::uint64_t id() const { return id_; }
  const StickyError& sticky() const { return sticky_; }
  // Synchronises with the legacy default stream (everything but NON_BLOCKING streams).
  bool blocking() const { return kind_ != Kind::kLegacy && !(flags_ & CU_STREAM_NON_BLOCKING); }

  // Stream capture (guarded by driver().mu): the session this stream records into,
  // and the nodes its next operation will depend on.
  std::shared_ptr<CaptureSession> capture;
  std::vector<std::uint64_t> capture_deps;

  // All of the following take the scheduler lock themselves.
  std::uint64_t enqueue(StreamOp op);  // returns the op's position
  StreamPoint tail();                  // position after everything enqueued so far
  bool idle();                         // nothing pending
  void shutdown();                     // drain, then let the worker exit

 private:
  friend struct Scheduler;
  friend void wait_point(const StreamPoint& p);
  friend bool point_done(const StreamPoint& p);
  friend bool record_done(const struct EventRecord& r);
  void run();

  std::uint64_t ctx_;
  int device_;
  Kind kind_;
  unsigned flags_;
  int priority_;
  std::uint64_t id_;
  StickyError sticky_;
  bool timing_;
  // Guarded by the scheduler lock.
  std::deque<StreamOp> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool worker_started_ = false;
  bool stopping_ = false;
};

// Blocks the calling host thread until `p` is done.
void wait_point(const StreamPoint& p);
bool point_done(const StreamPoint& p);

// True while this thread runs a host function or stream callback: CUDA calls from
// there are not permitted.
bool in_user_callback();

struct EventRecord {
  StreamPoint point;
  Clock::time_point time{};  // set when the record executes (scheduler lock)
  bool executed = false;
};

struct Event {
  std::uint64_t ctx = 0;
  unsigned flags = 0;
  std::shared_ptr<EventRecord> last;  // null until first recorded
  // Last recorded in a capturing stream: the capture position it marks (fork/join).
  std::shared_ptr<CaptureSession> capture;
  std::vector<std::uint64_t> capture_deps;
};

bool record_done(const EventRecord& r);
Clock::time_point record_time(const EventRecord& r);

}  // namespace emu
