// NodeService's records of running work (private to daemon/service).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "daemon/service/node_service.hpp"

namespace thaw::daemon {

// Joins a worker that has finished (or detaches it when the last reference to its record
// is dropped on that very thread), so destroying a record never meets a joinable thread.
inline void retire(std::thread& t) {
  if (!t.joinable()) return;
  if (t.get_id() == std::this_thread::get_id()) {
    t.detach();
  } else {
    t.join();
  }
}

// One run of a model's fetch. The thread sets `finished` last, so reap() can join it
// without waiting.
struct NodeService::FetchJob {
  std::string name;
  std::string key;
  std::unique_ptr<store::Registry> registry;
  std::unique_ptr<store::ModelFetch> fetch;  // after registry: it refers to it
  std::thread thread;
  ~FetchJob() { retire(thread); }

  bool done() const {
    std::lock_guard lock(mutex);
    return finished;
  }
  std::string error() const {
    std::lock_guard lock(mutex);
    return failure;
  }
  void mark_plan_known() {
    std::lock_guard lock(mutex);
    plan_known = true;
    cv.notify_all();
  }
  void finish(std::string why) {
    std::lock_guard lock(mutex);
    failure = std::move(why);
    finished = true;
    cv.notify_all();
  }
  // Until the model's headers are in (a layout can be computed) or the fetch ended;
  // returns the fetch's error if it ended without them.
  std::string wait_for_plan() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return plan_known || finished; });
    return plan_known ? std::string() : failure;
  }

  mutable std::mutex mutex;
  std::condition_variable cv;
  bool plan_known = false;
  bool finished = false;
  std::string failure;
};

struct NodeService::SlotRecord {
  std::string id;
  std::uint32_t gpu = 0;
  vmm::SlotId slot = vmm::kNoSlot;
  std::string key;
  std::thread thread;  // the prewarm, later the check of a hand-back
  ~SlotRecord() { retire(thread); }
  // Guarded by NodeService::mutex_:
  bool prewarming = true;
  bool thread_finished = false;
  bool evicting = false;
  std::string error;
  std::string owner;
  // Exports of its pages to the owner not yet confirmed, by the token the owner was given
  // (random: see NodeService::attach) → the GPU memory manager's own token.
  std::map<std::uint64_t, std::uint64_t> exports;
  std::vector<vmm::LayoutPiece> layout;
  std::uint64_t weight_bytes = 0;
  std::optional<int> layers;                      // partial prewarm
  std::optional<layout::LayoutKind> layout_kind;  // once the prewarm chose (and succeeded)
  std::string record_fingerprint;                 // engine layout: which record
  bool pages_freed = false;  // the owner gave pages back: no hand-back possible
  bool verifying = false;    // handed back: its bytes are being checked (`thread`)
};

}  // namespace thaw::daemon
