// `refengine serve`: a minimal OpenAI-style HTTP API over the scheduler.
//   POST /v1/completions {"prompt": "text" | [ids] | ["text", ...] | [[ids], ...],
//                         "max_tokens": 16, "temperature": 0, "ignore_eos": false,
//                         "stream": false}   (true: server-sent events, server_stream.hpp)
//   GET  /health, GET /v1/models
// Decoding is greedy only (a temperature other than 0 is rejected). Concurrent requests are
// batched continuously by the scheduler.
#pragma once

#include <expected>
#include <future>
#include <optional>
#include <string>

#include "scheduler.hpp"
#include "tokenizer.hpp"

namespace refengine {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_name;
  int step_delay_ms = 0;  // tests of KV migration mid-generation: sleep after every step
};

// True once SIGINT/SIGTERM asked serve() to stop.
bool stop_requested();
// The request's completion, or an error once a stop was requested (so that a paused engine,
// whose requests wait, still stops).
std::expected<Completion, std::string> wait_completion(std::future<Completion>& f);

// The HTTP status of a request the scheduler ended with `error`.
int error_status(const std::string& error);
// Fills `c` (finish_reason "migrated", migrated_to set) with the whole answer from the full
// worker's /kv/result; waits up to 10 min, not cut short by a stop request.
std::expected<void, std::string> fetch_migrated(Completion& c);

// Serves until SIGINT/SIGTERM. Returns the process exit code.
int serve(Engine& engine, Scheduler& scheduler, const std::optional<Tokenizer>& tokenizer,
          const ServeOptions& options);

}  // namespace refengine
