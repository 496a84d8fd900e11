// ConnectionPool: the task queue cpp-httplib's server runs its connections on, one thread per
// connection (cpp-httplib 0.11 cannot serve more connections than it has threads: an idle
// keep-alive connection, a silent one or one dripping its headers holds its thread for a
// keep-alive or read timeout each time, and a fixed pool makes everyone else wait behind them).
//
// So the pool grows: `ready` threads wait for connections, more are started as they come, up
// to `max_connections` served at once; a thread above `ready` ends after `idle_exit` without
// work. Past the limit a connection goes to an overflow lane (`overflow_threads`, at most
// `overflow_queue` waiting): there over_limit() is true, and the server's pre-routing handler
// answers 503 and closes. When even that queue is full the acceptor blocks, and the kernel's
// listen queue holds the rest. Memory is bounded by the limits (a thread costs its stack's
// touched pages, ~100 KiB here), not by the number of clients.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace thaw::gateway {

class ConnectionPool final : public httplib::TaskQueue {
 public:
  struct Limits {
    std::size_t ready = 16;
    std::size_t max_connections = 1024;
    std::size_t overflow_threads = 2;
    std::size_t overflow_queue = 256;
    std::chrono::milliseconds idle_exit{10'000};
  };
  explicit ConnectionPool(Limits limits);
  ~ConnectionPool() override;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  // Whether the calling thread serves a connection past the limit (the overflow lane).
  static bool over_limit();

  struct Counts {
    std::size_t threads, busy, overflow_waiting;
  };
  Counts counts();

 private:
  void serve(std::list<std::thread>::iterator self);
  void overflow_lane();
  void reap_locked();

  const Limits limits_;
  std::mutex mutex_;
  std::condition_variable work_, overflow_work_, overflow_space_;
  std::deque<std::function<void()>> jobs_, overflow_jobs_;
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> finished_;  // ended idle, not joined yet
  std::vector<std::thread> overflow_;
  std::size_t running_ = 0;  // threads serving a connection
  bool shutdown_ = false;
};

}  // namespace thaw::gateway
