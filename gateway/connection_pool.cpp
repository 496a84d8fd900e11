#include "gateway/connection_pool.hpp"

#include <system_error>

namespace thaw::gateway {
namespace {

thread_local bool t_over_limit = false;

}  // namespace

bool ConnectionPool::over_limit() {
  return t_over_limit;
}

ConnectionPool::ConnectionPool(Limits limits) : limits_(limits) {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < limits_.ready; ++i) {
    auto it = threads_.emplace(threads_.end());
    *it = std::thread(&ConnectionPool::serve, this, it);
  }
  for (std::size_t i = 0; i < std::max<std::size_t>(1, limits_.overflow_threads); ++i) {
    overflow_.emplace_back(&ConnectionPool::overflow_lane, this);
  }
}

ConnectionPool::~ConnectionPool() {
  shutdown();
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::unique_lock lock(mutex_);
  reap_locked();
  if (running_ + jobs_.size() < limits_.max_connections) {
    jobs_.push_back(std::move(fn));
    // Every live thread is serving, waiting, or starting up to wait: one more is needed when
    // they are fewer than the connections (served and queued). Counting idle threads instead
    // would miss those still starting and grow past the limit. If the system refuses a
    // thread, the connection waits for the next one to come free.
    if (threads_.size() - finished_.size() < running_ + jobs_.size()) {
      try {
        auto it = threads_.emplace(threads_.end());
        try {
          *it = std::thread(&ConnectionPool::serve, this, it);
        } catch (const std::system_error&) {
          threads_.erase(it);
        }
      } catch (const std::bad_alloc&) {
      }
    }
    work_.notify_one();
    return;
  }
  // Every connection slot is taken: the overflow lane answers 503. Waiting for room there
  // blocks the acceptor, which leaves further connections in the kernel's listen queue.
  overflow_space_.wait(lock, [&] { return overflow_jobs_.size() < limits_.overflow_queue; });
  overflow_jobs_.push_back(std::move(fn));
  overflow_work_.notify_one();
}

void ConnectionPool::serve(std::list<std::thread>::iterator self) {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait_for(lock, limits_.idle_exit, [&] { return !jobs_.empty() || shutdown_; });
    if (jobs_.empty()) {
      if (shutdown_) return;
      // Idle for idle_exit: above the ready threads, this one ends (joined by the acceptor's
      // next enqueue, or by shutdown()).
      if (threads_.size() - finished_.size() > limits_.ready) {
        finished_.push_back(self);
        return;
      }
      continue;
    }
    // Jobs queued at shutdown still run: httplib's server socket is closed by then, so each
    // closes its connection at once.
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    lock.unlock();
    fn();
    fn = nullptr;
    lock.lock();
    --running_;
  }
}

void ConnectionPool::overflow_lane() {
  t_over_limit = true;
  std::unique_lock lock(mutex_);
  for (;;) {
    overflow_work_.wait(lock, [&] { return !overflow_jobs_.empty() || shutdown_; });
    if (overflow_jobs_.empty()) return;
    std::function<void()> fn = std::move(overflow_jobs_.front());
    overflow_jobs_.pop_front();
    overflow_space_.notify_one();
    lock.unlock();
    fn();
    fn = nullptr;
    lock.lock();
  }
}

void ConnectionPool::reap_locked() {
  for (auto it : finished_) {
    it->join();  // it has left serve(): the join does not wait for the lock we hold
    threads_.erase(it);
  }
  finished_.clear();
}

void ConnectionPool::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  work_.notify_all();
  overflow_work_.notify_all();
  overflow_space_.notify_all();
  // No thread is added after shutdown_ (enqueue runs on the acceptor, which called us), so
  // the list is stable; threads that ended idle are joined here too.
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  for (auto& t : overflow_) t.join();
  std::lock_guard lock(mutex_);
  finished_.clear();
}

ConnectionPool::Counts ConnectionPool::counts() {
  std::lock_guard lock(mutex_);
  return {threads_.size() - finished_.size(), running_, overflow_jobs_.size()};
}

}  // namespace thaw::gateway
