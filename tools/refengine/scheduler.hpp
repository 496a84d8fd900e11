// Continuous batching on stage 0, in the manner of vLLM's scheduler (simplified): waiting
// requests are admitted in arrival order when their whole KV need (prompt + max_tokens) fits
// the free blocks, prefilled together in one step, then decoded together one token per step,
// each decode step replaying the smallest captured CUDA graph that holds the batch. Requests
// may be submitted from any thread while run() or run_until_idle() drives the engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <expected>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine.hpp"

namespace refengine {

// The tokens of one streamed HTTP request as the engine decodes them (its prompts are choices
// 0..n-1): the engine thread appends, the server's handler waits. Each choice ends with an
// `end` event, pushed after its Completion is in the future (so the future is ready by then).
class TokenStream {
 public:
  struct Event {
    int choice = 0;
    std::int32_t token = -1;  // the decoded token (when !end)
    bool end = false;
  };
  void push(Event e);
  // Waits up to `timeout` for events after the first `from` of them; appends them to `out`.
  void wait_after(std::size_t from, std::chrono::milliseconds timeout, std::vector<Event>& out);
  // The client went away: the scheduler ends the request ("abort") instead of decoding on.
  void abandon();
  bool abandoned() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
  bool abandoned_ = false;
};

struct Request {
  std::vector<std::int32_t> prompt;
  int max_tokens = 16;
  bool ignore_eos = false;
  bool want_logits = false;             // keep the logits of every generated token
  bool all_positions = false;           // ... and of every prompt position (needs --all-positions)
  std::shared_ptr<TokenStream> stream;  // streamed: every token is pushed as it is decoded
  int stream_choice = 0;                // the request's choice index in `stream`
};

struct Completion {
  std::vector<std::int32_t> tokens;  // generated tokens
  std::string finish_reason;         // "length", "stop", "error", "migrated" or "abort"
  std::string error;
  // When want_logits: one row per scored position (prompt positions first if all_positions).
  std::vector<std::vector<float>> logits;
  double time_to_first_token_ms = 0;
  std::uint64_t request_id = 0;  // the scheduler's id (KV transfer names requests by it)
  // finish_reason "migrated": the full worker that continues it, when its caller should get the
  // whole answer from there (POST /kv/release with "to"); empty: the caller fetches it.
  std::string migrated_to;
};

// A request as KV transfer sees it (Scheduler::snapshot, docs/KV-TRANSFER.md).
struct SequenceInfo {
  std::uint64_t request_id = 0;
  bool running = false;  // admitted (has KV blocks); else waiting
  std::vector<std::int32_t> prompt, generated;
  int max_tokens = 0;
  bool ignore_eos = false;
  std::vector<int> blocks;  // physical KV blocks, in sequence order
  int kv_tokens = 0;        // positions whose KV is in the blocks (prompt + generated - 1)
};

// A request moved in from another worker with its KV already in `blocks` (Scheduler::adopt).
struct AdoptedRequest {
  std::vector<std::int32_t> prompt, generated;
  int max_tokens = 0;
  bool ignore_eos = false;
  std::vector<int> blocks;              // hold the KV of prompt + generated - 1 positions
  std::shared_ptr<TokenStream> stream;  // each token decoded here is pushed (choice 0)
};

class Scheduler {
 public:
  explicit Scheduler(Engine& engine);

  std::future<Completion> submit(Request request);
  // Runs steps until nothing is waiting or running.
  void run_until_idle();
  // Runs steps until stop() (for serve), on the calling thread. If a step fails, every
  // pending request completes with the error, later ones are refused, and run() rethrows.
  void run();
  void stop();

  std::uint64_t steps() const { return steps_; }

  // --- KV transfer (HydraServe §6.2; kv_transfer_server.cpp) ---
  // Stops scheduling and returns once no step is in flight: the KV cache is then still.
  void pause();
  void unpause();
  bool paused();
  // Refuses new requests, waits up to `timeout_ms` for every accepted one to finish; true when
  // all did. unpause() does not undo it: a drained engine is about to stop.
  bool drain(int timeout_ms);
  std::vector<SequenceInfo> snapshot();
  // Ends a request that moved to another worker: its caller gets finish_reason "migrated" and
  // the tokens so far. Only while paused (the request's KV must not advance after export).
  std::expected<void, std::string> release(std::uint64_t request_id,
                                           const std::string& migrated_to = {});
  // KV blocks for an import, and back.
  std::expected<std::vector<int>, std::string> reserve_blocks(int n);
  void free_blocks(const std::vector<int>& blocks);
  // Continues a moved request: decodes from its last generated token over the imported KV.
  // Takes ownership of r.blocks (and reserves what the rest of the request needs); on error
  // the blocks are still the caller's.
  std::expected<std::future<Completion>, std::string> adopt(AdoptedRequest r);
  // For tests of migration mid-generation: sleep this long after every step.
  void set_step_delay_ms(int ms) { step_delay_ms_ = ms; }

 private:
  struct Sequence {
    Request request;
    std::promise<Completion> promise;
    Completion completion;
    std::vector<std::int32_t> tokens;  // prompt + generated
    std::vector<int> blocks;
    std::uint64_t submitted_ns = 0;
    std::uint64_t id = 0;
  };

  bool step_once();  // false when idle
  void finish(std::unique_ptr<Sequence>& s, std::string reason, std::string error = {});
  int slot_of(const Sequence& s, int position) const;
  void fill_block_table(StepBatch& b, int row, const Sequence& s) const;

  Engine& engine_;
  int eos_ = -1;
  int free_blocks_ = 0;
  std::vector<int> free_list_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  bool stop_ = false;
  std::string failed_;  // set when a step threw: the engine is unusable
  bool first_token_marked_ = false;
  std::uint64_t steps_ = 0;
  std::uint64_t next_id_ = 1;
  bool paused_ = false, in_step_ = false, draining_ = false;
  std::condition_variable idle_cv_;  // in_step_ cleared, or a request finished
  int step_delay_ms_ = 0;
};

}  // namespace refengine
