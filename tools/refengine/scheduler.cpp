#include "scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "kernels.h"

namespace refengine {

void TokenStream::push(Event e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(e);
  }
  cv_.notify_all();
}

void TokenStream::wait_after(std::size_t from, std::chrono::milliseconds timeout,
                             std::vector<Event>& out) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return events_.size() > from; });
  for (std::size_t i = from; i < events_.size(); ++i) out.push_back(events_[i]);
}

void TokenStream::abandon() {
  std::lock_guard lock(mu_);
  abandoned_ = true;
}

bool TokenStream::abandoned() const {
  std::lock_guard lock(mu_);
  return abandoned_;
}

Scheduler::Scheduler(Engine& engine) : engine_(engine) {
  for (int b = engine.num_blocks() - 1; b >= 0; --b) free_list_.push_back(b);
}

std::future<Completion> Scheduler::submit(Request request) {
  auto s = std::make_unique<Sequence>();
  s->request = std::move(request);
  s->tokens = s->request.prompt;
  s->submitted_ns = Timeline::now_ns();
  auto future = s->promise.get_future();
  {
    std::lock_guard lock(mu_);
    s->id = next_id_++;
    s->completion.request_id = s->id;
  }
  const auto& lim = engine_.options().limits;
  const int need = int(s->tokens.size()) + s->request.max_tokens;
  std::string error;
  if (s->tokens.empty()) {
    error = "the prompt is empty";
  } else if (need > lim.max_model_len) {
    error = fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds --max-model-len {}",
                        s->tokens.size(), s->request.max_tokens, lim.max_model_len);
  } else if (int(s->tokens.size()) > lim.max_num_batched_tokens) {
    error = fmt::format("the prompt ({} tokens) exceeds --max-num-batched-tokens {}",
                        s->tokens.size(), lim.max_num_batched_tokens);
  } else if (s->request.max_tokens < 1) {
    error = "max_tokens must be at least 1";
  } else if (s->request.all_positions && !lim.all_positions_logits) {
    error = "logits of all positions need --all-positions";
  } else {
    for (std::int32_t t : s->tokens)
      if (t < 0 || t >= engine_.config().vocab_size) {
        error = fmt::format("token id {} is outside the vocabulary (0..{})", t,
                            engine_.config().vocab_size - 1);
        break;
      }
  }
  if (!error.empty()) {
    finish(s, "error", error);
    return future;
  }
  {
    std::lock_guard lock(mu_);
    if (!failed_.empty()) {
      finish(s, "error", "the engine failed: " + failed_);
      return future;
    }
    if (draining_) {
      finish(s, "error", "the engine is draining: send new requests to another worker");
      return future;
    }
    waiting_.push_back(std::move(s));
  }
  cv_.notify_all();
  return future;
}

void Scheduler::finish(std::unique_ptr<Sequence>& s, std::string reason, std::string error) {
  for (int b : s->blocks) free_list_.push_back(b);
  s->blocks.clear();
  s->completion.finish_reason = std::move(reason);
  s->completion.error = std::move(error);
  s->promise.set_value(std::move(s->completion));
  if (s->request.stream) s->request.stream->push({s->request.stream_choice, -1, true});
  idle_cv_.notify_all();
}

int Scheduler::slot_of(const Sequence& s, int position) const {
  return s.blocks[position / kBlockSize] * kBlockSize + position % kBlockSize;
}

void Scheduler::fill_block_table(StepBatch& b, int row, const Sequence& s) const {
  const int width = engine_.max_blocks_per_seq();
  for (std::size_t i = 0; i < s.blocks.size(); ++i) b.block_tables[row * width + i] = s.blocks[i];
}

bool Scheduler::step_once() {
  const auto& lim = engine_.options().limits;
  const int width = engine_.max_blocks_per_seq();
  std::vector<Sequence*> batch_seqs;
  StepBatch b;
  bool prefill = false;
  {
    std::lock_guard lock(mu_);
    if (paused_) return false;
    // Admit waiting sequences whose whole KV need fits, up to the token and sequence limits.
    int tokens = 0;
    while (!waiting_.empty()) {
      Sequence& s = *waiting_.front();
      const int len = int(s.tokens.size());
      const int need = (len + s.request.max_tokens + kBlockSize - 1) / kBlockSize;
      if (int(running_.size()) + int(batch_seqs.size()) >= lim.max_num_seqs) break;
      if (tokens + len > lim.max_num_batched_tokens) break;
      if (need > int(free_list_.size())) break;
      // A sequence scored at every prompt position is prefilled alone (rows = its positions).
      if (!batch_seqs.empty() && (s.request.all_positions || batch_seqs[0]->request.all_positions))
        break;
      for (int i = 0; i < need; ++i) {
        s.blocks.push_back(free_list_.back());
        free_list_.pop_back();
      }
      tokens += len;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      batch_seqs.push_back(running_.back().get());
    }
    if (!batch_seqs.empty()) {
      prefill = true;
    } else {
      for (auto& s : running_) batch_seqs.push_back(s.get());
    }
    if (batch_seqs.empty()) {
      if (!waiting_.empty() && running_.empty()) {
        // Nothing runs and the head of the queue still does not fit: it never will.
        auto s = std::move(waiting_.front());
        waiting_.pop_front();
        finish(s, "error",
               fmt::format("the request needs more KV-cache blocks than the engine has ({})",
                           engine_.num_blocks()));
        return true;
      }
      return false;
    }
    in_step_ = true;
  }
  // pause() waits for this step to end, however it ends.
  struct StepEnd {
    Scheduler* s;
    ~StepEnd() {
      {
        std::lock_guard lock(s->mu_);
        s->in_step_ = false;
      }
      s->idle_cv_.notify_all();
    }
  } step_end{this};

  const int n = int(batch_seqs.size());
  if (prefill) {
    for (int i = 0; i < n; ++i) {
      const Sequence& s = *batch_seqs[i];
      const int len = int(s.tokens.size());
      for (int p = 0; p < len; ++p) {
        b.tokens.push_back(s.tokens[p]);
        b.positions.push_back(p);
        b.slots.push_back(slot_of(s, p));
        b.query_seq.push_back(i);
      }
      b.context_lens.push_back(len);
      b.last_rows.push_back(int(b.tokens.size()) - 1);
      b.want_logits = b.want_logits || s.request.want_logits;
    }
    b.num_seqs = n;
    b.num_tokens = int(b.tokens.size());
    b.block_tables.assign(std::size_t(n) * width, 0);
    for (int i = 0; i < n; ++i) fill_block_table(b, i, *batch_seqs[i]);
    // Scoring every prompt position: one sequence at a time (rows map to positions).
    if (n == 1 && batch_seqs[0]->request.all_positions) b.logits_rows_mode = 1;
  } else {
    const auto sizes = engine_.graph_sizes();
    auto fit = std::lower_bound(sizes.begin(), sizes.end(), n);
    const int padded = fit == sizes.end() ? n : *fit;
    b.graph_size = fit == sizes.end() ? 0 : padded;
    b.num_seqs = padded;
    b.num_tokens = padded;
    b.block_tables.assign(std::size_t(padded) * width, 0);
    for (int i = 0; i < padded; ++i) {
      if (i < n) {
        const Sequence& s = *batch_seqs[i];
        const int pos = int(s.tokens.size()) - 1;
        b.tokens.push_back(s.tokens.back());
        b.positions.push_back(pos);
        b.slots.push_back(slot_of(s, pos));
        b.context_lens.push_back(pos + 1);
        fill_block_table(b, i, s);
        b.want_logits = b.want_logits || s.request.want_logits;
      } else {  // padding: no KV write, attends to nothing
        b.tokens.push_back(0);
        b.positions.push_back(0);
        b.slots.push_back(-1);
        b.context_lens.push_back(0);
      }
      b.query_seq.push_back(i);
      b.last_rows.push_back(i);
    }
  }

  StepResult r = engine_.step(b);
  ++steps_;
  if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
  const int V = int(engine_.config().vocab_size);
  std::lock_guard lock(mu_);
  for (int i = 0; i < n; ++i) {
    Sequence& s = *batch_seqs[i];
    const int row = b.logits_rows_mode == 1 ? b.last_rows[i] : i;
    if (s.request.want_logits) {
      if (b.logits_rows_mode == 1) {
        for (int p = 0; p <= row; ++p)
          s.completion.logits.emplace_back(r.logits.begin() + long(p) * V,
                                           r.logits.begin() + long(p + 1) * V);
      } else {
        s.completion.logits.emplace_back(r.logits.begin() + long(row) * V,
                                         r.logits.begin() + long(row + 1) * V);
      }
    }
    const std::int32_t next = r.next_tokens[row];
    if (s.completion.tokens.empty()) {
      s.completion.time_to_first_token_ms = double(Timeline::now_ns() - s.submitted_ns) / 1e6;
      if (!first_token_marked_) {
        engine_.timeline().mark("first_token", {{"token", next}});
        first_token_marked_ = true;
      }
    }
    s.completion.tokens.push_back(next);
    s.tokens.push_back(next);
    if (s.request.stream) s.request.stream->push({s.request.stream_choice, next, false});
  }
  // Retire finished sequences.
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence& s = **it;
    const bool eos = !s.request.ignore_eos && !s.completion.tokens.empty() &&
                     s.completion.tokens.back() == engine_.config().eos_token_id;
    if (eos || int(s.completion.tokens.size()) >= s.request.max_tokens) {
      finish(*it, eos ? "stop" : "length");
      it = running_.erase(it);
    } else if (s.request.stream && s.request.stream->abandoned()) {
      finish(*it, "abort");  // nobody reads the rest: free the batch slot and the blocks
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return true;
}

void Scheduler::run_until_idle() {
  while (step_once()) {
  }
}

void Scheduler::run() {
  engine_.bind_thread();
  try {
    for (;;) {
      if (step_once()) continue;
      std::unique_lock lock(mu_);
      cv_.wait(lock,
               [&] { return stop_ || (!paused_ && (!waiting_.empty() || !running_.empty())); });
      if (stop_) return;
    }
  } catch (const std::exception& e) {
    std::lock_guard lock(mu_);
    failed_ = e.what();
    for (auto& s : running_) finish(s, "error", "the engine failed: " + failed_);
    running_.clear();
    for (auto& s : waiting_) finish(s, "error", "the engine failed: " + failed_);
    waiting_.clear();
    throw;
  }
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void Scheduler::pause() {
  std::unique_lock lock(mu_);
  paused_ = true;
  idle_cv_.wait(lock, [&] { return !in_step_; });
}

void Scheduler::unpause() {
  {
    std::lock_guard lock(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

bool Scheduler::paused() {
  std::lock_guard lock(mu_);
  return paused_;
}

bool Scheduler::drain(int timeout_ms) {
  std::unique_lock lock(mu_);
  draining_ = true;
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return (waiting_.empty() && running_.empty()) || !failed_.empty();
  }) && failed_.empty();
}

std::vector<SequenceInfo> Scheduler::snapshot() {
  std::lock_guard lock(mu_);
  std::vector<SequenceInfo> out;
  auto add = [&](const Sequence& s, bool running) {
    SequenceInfo i;
    i.request_id = s.id;
    i.running = running;
    i.prompt = s.request.prompt;
    i.generated = s.completion.tokens;
    i.max_tokens = s.request.max_tokens;
    i.ignore_eos = s.request.ignore_eos;
    if (running) {
      i.blocks = s.blocks;
      // The last sampled token has not been through the model yet: its KV is not written.
      i.kv_tokens = int(s.tokens.size()) - 1;
      // Only the blocks that hold those positions travel.
      i.blocks.resize(std::size_t((i.kv_tokens + kBlockSize - 1) / kBlockSize));
    }
    out.push_back(std::move(i));
  };
  for (const auto& s : running_) add(*s, true);
  for (const auto& s : waiting_) add(*s, false);
  return out;
}

std::expected<void, std::string> Scheduler::release(std::uint64_t id,
                                                    const std::string& migrated_to) {
  std::lock_guard lock(mu_);
  if (!paused_) return std::unexpected("release needs a paused engine (POST /kv/pause first)");
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if ((*it)->id == id) {
      (*it)->completion.migrated_to = migrated_to;
      finish(*it, "migrated");
      running_.erase(it);
      return {};
    }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      (*it)->completion.migrated_to = migrated_to;
      finish(*it, "migrated");
      waiting_.erase(it);
      return {};
    }
  return std::unexpected(fmt::format("no request {} is waiting or running here", id));
}

std::expected<std::vector<int>, std::string> Scheduler::reserve_blocks(int n) {
  std::lock_guard lock(mu_);
  if (n < 0 || n > int(free_list_.size()))
    return std::unexpected(fmt::format("{} KV blocks are needed and {} of {} are free", n,
                                       free_list_.size(), engine_.num_blocks()));
  std::vector<int> out(free_list_.end() - n, free_list_.end());
  free_list_.resize(free_list_.size() - std::size_t(n));
  return out;
}

void Scheduler::free_blocks(const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  free_list_.insert(free_list_.end(), blocks.begin(), blocks.end());
}

std::expected<std::future<Completion>, std::string> Scheduler::adopt(AdoptedRequest r) {
  const auto& lim = engine_.options().limits;
  const int len = int(r.prompt.size() + r.generated.size());
  if (r.prompt.empty() || r.generated.empty())
    return std::unexpected("a moved request needs its prompt and at least one generated token");
  if (int(r.generated.size()) > r.max_tokens)
    return std::unexpected(
        fmt::format("{} tokens generated of max_tokens {}", r.generated.size(), r.max_tokens));
  if (int(r.prompt.size()) + r.max_tokens > lim.max_model_len)
    return std::unexpected(
        fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds --max-model-len {}",
                    r.prompt.size(), r.max_tokens, lim.max_model_len));
  for (std::int32_t t : r.prompt)
    if (t < 0 || t >= engine_.config().vocab_size)
      return std::unexpected(fmt::format("token id {} is outside the vocabulary", t));
  for (std::int32_t t : r.generated)
    if (t < 0 || t >= engine_.config().vocab_size)
      return std::unexpected(fmt::format("token id {} is outside the vocabulary", t));
  const int have = (len - 1 + kBlockSize - 1) / kBlockSize;
  if (int(r.blocks.size()) != have)
    return std::unexpected(
        fmt::format("{} KV blocks for {} positions: expected {}", r.blocks.size(), len - 1, have));
  const int need = (int(r.prompt.size()) + r.max_tokens + kBlockSize - 1) / kBlockSize;
  auto s = std::make_unique<Sequence>();
  s->request = Request{r.prompt, r.max_tokens, r.ignore_eos, false, false, r.stream, 0};
  s->tokens = r.prompt;
  s->tokens.insert(s->tokens.end(), r.generated.begin(), r.generated.end());
  s->completion.tokens = r.generated;
  s->submitted_ns = Timeline::now_ns();
  auto future = s->promise.get_future();
  {
    std::lock_guard lock(mu_);
    if (!failed_.empty()) return std::unexpected("the engine failed: " + failed_);
    if (draining_) return std::unexpected("the engine is draining");
    if (int(running_.size()) >= lim.max_num_seqs)
      return std::unexpected(
          fmt::format("the worker already runs --max-num-seqs {} sequences", lim.max_num_seqs));
    if (need - have > int(free_list_.size()))
      return std::unexpected(fmt::format("{} more KV blocks are needed and {} are free",
                                         need - have, free_list_.size()));
    s->id = next_id_++;
    s->completion.request_id = s->id;
    s->blocks = std::move(r.blocks);
    for (int i = have; i < need; ++i) {
      s->blocks.push_back(free_list_.back());
      free_list_.pop_back();
    }
    const bool eos = !r.ignore_eos && r.generated.back() == engine_.config().eos_token_id;
    if (eos || int(r.generated.size()) >= r.max_tokens) {
      finish(s, eos ? "stop" : "length");  // the source would have retired it: nothing to do
    } else {
      running_.push_back(std::move(s));
    }
  }
  cv_.notify_all();
  return future;
}

}  // namespace refengine
