// A few threads running jobs in submission order, each job told which worker runs it (so
// it can use that worker's scratch buffer). Used to verify chunks off the fetcher's
// thread: hashing a 4 MiB chunk takes milliseconds, which would stall every transfer if
// done in the libcurl loop.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace thaw::store {

class WorkerPool {
 public:
  using Job = std::function<void(unsigned worker)>;

  explicit WorkerPool(unsigned workers);  // at least one
  // Runs the jobs still queued, then joins.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(threads_.size()); }
  void submit(Job job);
  // Blocks until no job is queued or running.
  void drain();

 private:
  void loop(unsigned worker);

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<Job> queue_;
  unsigned running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace thaw::store
