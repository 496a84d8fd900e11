#include "stream.hpp"

#include <thread>

namespace emu {

// One lock and one condition variable for all streams: cross-stream waits are
// frequent and stream counts small, so simplicity wins. Leaked on purpose: worker
// threads may still wait on it while the process exits.
struct Scheduler {
  std::mutex mu;
  std::condition_variable cv;
};

namespace {
Scheduler& sched() {
  static auto* s = new Scheduler();
  return *s;
}
thread_local bool t_in_user_callback = false;
std::atomic<std::uint64_t> g_next_stream_id{1};
}  // namespace

bool in_user_callback() {
  return t_in_user_callback;
}

StreamCore::StreamCore(std::uint64_t ctx, int device, Kind kind, unsigned flags, int priority,
                       StickyError sticky, bool timing)
    : ctx_(ctx),
      device_(device),
      kind_(kind),
      flags_(flags),
      priority_(priority),
      id_(g_next_stream_id.fetch_add(1)),
      sticky_(std::move(sticky)),
      timing_(timing) {}

std::uint64_t StreamCore::enqueue(StreamOp op) {
  auto& s = sched();
  std::lock_guard lock(s.mu);
  queue_.push_back(std::move(op));
  std::uint64_t seq = ++enqueued_;
  if (!worker_started_) {
    worker_started_ = true;
    // The worker owns a reference: a destroyed stream still finishes its work.
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }
  s.cv.notify_all();
  return seq;
}

StreamPoint StreamCore::tail() {
  std::lock_guard lock(sched().mu);
  return {shared_from_this(), enqueued_};
}

bool StreamCore::idle() {
  std::lock_guard lock(sched().mu);
  return completed_ == enqueued_;
}

void StreamCore::shutdown() {
  auto& s = sched();
  std::lock_guard lock(s.mu);
  stopping_ = true;
  s.cv.notify_all();
}

void StreamCore::run() {
  auto& s = sched();
  std::unique_lock lock(s.mu);
  for (;;) {
    s.cv.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping and drained
    StreamOp& op = queue_.front();
    s.cv.wait(lock, [&] {
      for (const auto& w : op.waits) {
        if (w.stream->completed_ < w.seq) return false;
      }
      return true;
    });
    lock.unlock();

    auto start = Clock::now();
    if (op.engine != nullptr && timing_) start = op.engine->reserve(start, op.model);
    CUresult r = CUDA_SUCCESS;
    // After a fault the context is unusable: queued work is discarded, as on a GPU.
    if ((sticky_->load() == CUDA_SUCCESS || op.runs_after_fault) && op.work) {
      t_in_user_callback = op.runs_user_code;
      r = op.work();
      t_in_user_callback = false;
    }
    if (timing_) wait_until(start + op.model);

    lock.lock();
    if (r != CUDA_SUCCESS) {
      int expected = CUDA_SUCCESS;
      sticky_->compare_exchange_strong(expected, r);
    }
    queue_.pop_front();
    ++completed_;
    s.cv.notify_all();
  }
}

bool point_done(const StreamPoint& p) {
  if (!p.stream) return true;
  std::lock_guard lock(sched().mu);
  return p.stream->completed_ >= p.seq;
}

void wait_point(const StreamPoint& p) {
  if (!p.stream) return;
  auto& s = sched();
  std::unique_lock lock(s.mu);
  s.cv.wait(lock, [&] { return p.stream->completed_ >= p.seq; });
}

bool record_done(const EventRecord& r) {
  std::lock_guard lock(sched().mu);
  return r.point.stream->completed_ >= r.point.seq;
}

Clock::time_point record_time(const EventRecord& r) {
  std::lock_guard lock(sched().mu);
  return r.time;
}

}  // namespace emu
