// `"stream": true` on /v1/completions: server-sent events in OpenAI's format, one event per
// token as the scheduler decodes it (single worker and pipeline stage 0 alike: stage 0's
// scheduler sees each decode step's tokens come back from the last stage):
//   data: {"id", "object": "text_completion", "created", "model",
//          "choices": [{"index", "text", "token_ids": [t], "finish_reason": null, "logprobs"}]}
//   ... one event per choice with "finish_reason" (and no token), then  data: [DONE]
// A request that fails before its first token is answered as a non-streamed one would be (an
// HTTP error with a JSON body), so a gateway can retry it elsewhere. Once events have gone out,
// a failure is an event {"error": {"message", "type"}} and the stream ends without [DONE].
#pragma once

#include <httplib.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "scheduler.hpp"
#include "tokenizer.hpp"

namespace refengine {

// The length of the longest prefix of `text` that does not end inside a UTF-8 sequence (a
// token of a byte-level BPE may hold half a character; its text waits for the next token).
std::size_t complete_utf8_prefix(const std::string& text);

// One streamed request, shared by the handler and httplib's content provider (which runs after
// the handler has returned). Dropping it (the client went away) abandons the request.
struct StreamState {
  StreamState(std::shared_ptr<TokenStream> s, std::vector<std::future<Completion>>&& f,
              const Tokenizer* t, std::string i, std::string m);
  ~StreamState();
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;

  std::shared_ptr<TokenStream> stream;
  std::vector<std::shared_future<Completion>> futures;  // by choice
  const Tokenizer* tokenizer;  // null: "text" is empty, as in the non-streamed answer
  std::string id, model;
  long created = 0;
  std::size_t next_event = 0;
  std::vector<std::vector<std::int32_t>> tokens;  // per choice, sent so far
  std::vector<std::string> held;  // per choice, decoded bytes not sent yet (half a character)
  std::size_t choices_done = 0;
  bool started = false;  // headers decided: the first event is in `pending`
  std::vector<TokenStream::Event> pending;
};

// Answers `res` for a streamed request: waits for its first event (an error before any token
// is an ordinary HTTP error), then streams.
void stream_completion(httplib::Response& res, std::shared_ptr<StreamState> state);

}  // namespace refengine
