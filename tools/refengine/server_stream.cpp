#include "server_stream.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server.hpp"

namespace refengine {

std::size_t complete_utf8_prefix(const std::string& text) {
  // Look back at most 3 bytes for the lead byte of a sequence that is not finished yet.
  const std::size_t n = text.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: its lead is further back
    const std::size_t len = (c & 0xE0) == 0xC0   ? 2
                            : (c & 0xF0) == 0xE0 ? 3
                            : (c & 0xF8) == 0xF0 ? 4
                                                 : 1;
    return len > back ? n - back : n;
  }
  return n;
}

StreamState::StreamState(std::shared_ptr<TokenStream> s, std::vector<std::future<Completion>>&& f,
                         const Tokenizer* t, std::string i, std::string m)
    : stream(std::move(s)),
      futures(std::make_move_iterator(f.begin()), std::make_move_iterator(f.end())),
      tokenizer(t),
      id(std::move(i)),
      model(std::move(m)),
      created(std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count()),
      tokens(f.size()),
      held(f.size()) {}

StreamState::~StreamState() {
  // Finished requests ignore it; running ones stop at their next step.
  stream->abandon();
}

namespace {

using json = nlohmann::json;
constexpr auto kPoll = std::chrono::milliseconds(100);

std::string event(const json& j) {
  // A byte-level BPE answer may hold bytes that are not UTF-8 (random weights, or a stream
  // cut short): replaced, not thrown on.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string error_event(const std::string& message, const std::string& type) {
  return event({{"error", {{"message", message}, {"type", type}}}});
}

class Writer {
 public:
  Writer(StreamState& s, httplib::DataSink& sink) : s_(s), sink_(sink) {}

  // One chunk of choice `choice`: its new tokens (their text as far as it is whole UTF-8), or
  // its end (finish_reason set: the text held back goes out as it is).
  bool chunk(int choice, const std::vector<std::int32_t>& new_tokens,
             const std::optional<std::string>& finish_reason, std::uint64_t request_id = 0) {
    std::string& held = s_.held[std::size_t(choice)];
    auto& sent = s_.tokens[std::size_t(choice)];
    sent.insert(sent.end(), new_tokens.begin(), new_tokens.end());
    if (s_.tokenizer) held += s_.tokenizer->decode(new_tokens);
    const std::size_t whole = finish_reason ? held.size() : complete_utf8_prefix(held);
    json c{{"index", choice},
           {"text", held.substr(0, whole)},
           {"token_ids", new_tokens},
           {"logprobs", nullptr},
           {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}};
    held.erase(0, whole);
    // Moved to another worker without forwarding: the rest comes from its /kv/result.
    if (finish_reason && *finish_reason == "migrated") c["request_id"] = request_id;
    return write(event({{"id", s_.id},
                        {"object", "text_completion"},
                        {"created", s_.created},
                        {"model", s_.model},
                        {"choices", json::array({c})}}));
  }
  bool write(const std::string& text) { return sink_.write(text.data(), text.size()); }
  // Ends the stream after an error event: no [DONE], so a client cannot take it for whole.
  bool fail(const std::string& message, const std::string& type) {
    if (!write(error_event(message, type))) return false;
    return end();
  }
  bool finish() {
    if (!write("data: [DONE]\n\n")) return false;
    return end();
  }
  bool ended() const { return ended_; }

 private:
  bool end() {
    sink_.done();
    ended_ = true;
    return true;
  }
  StreamState& s_;
  httplib::DataSink& sink_;
  bool ended_ = false;
};

// A choice released with "to" (KV migration): the tokens decoded here went out as they came;
// the rest are relayed as the full worker decodes them (/kv/result?tokens_after=N answers as
// soon as it has more than N tokens), then `c` gets its whole answer. Not cut short by a stop
// request (a stopping stage 0 still hands its callers their answers), within 10 min. False:
// the client is gone; w.ended(): the stream was ended with an error.
bool relay_migrated(StreamState& s, Writer& w, int choice, Completion& c) {
  constexpr auto kForwardDeadline = std::chrono::minutes(10);
  httplib::Client worker(c.migrated_to);
  worker.set_read_timeout(std::chrono::seconds(70));
  const auto& sent = s.tokens[std::size_t(choice)];
  const auto until = std::chrono::steady_clock::now() + kForwardDeadline;
  while (std::chrono::steady_clock::now() < until) {
    const std::string path = fmt::format(
        "/kv/result?request_id={}&timeout_ms=60000&tokens_after={}", c.request_id, sent.size());
    auto r = worker.Get(path.c_str());
    if (!r)
      return w.fail(fmt::format("the request moved to {}, which did not answer: {}", c.migrated_to,
                                httplib::to_string(r.error())),
                    "upstream_error");
    if (r->status != 200 && r->status != 202)
      return w.fail(fmt::format("the request moved to {}, which answered HTTP {}: {}",
                                c.migrated_to, r->status, r->body),
                    "upstream_error");
    std::vector<std::int32_t> tokens;
    try {
      const auto j = json::parse(r->body);
      if (r->status == 200) {
        c.tokens = j.at("token_ids").get<std::vector<std::int32_t>>();
        c.finish_reason = j.at("finish_reason").get<std::string>();
        c.error = j.value("error", "");
        return true;
      }
      // (A worker without tokens_after answers 202 with no tokens: the rest come at the end.)
      if (j.contains("token_ids")) tokens = j["token_ids"].get<std::vector<std::int32_t>>();
    } catch (const std::exception& e) {
      return w.fail(fmt::format("the request moved to {}, whose answer is not understood: {}",
                                c.migrated_to, e.what()),
                    "upstream_error");
    }
    if (tokens.size() <= sent.size()) continue;
    if (!std::equal(sent.begin(), sent.end(), tokens.begin()))
      return w.fail("the moved request's tokens differ from those streamed", "server_error");
    for (std::size_t i = sent.size(); i < tokens.size();)
      if (!w.chunk(choice, {tokens[i++]}, std::nullopt)) return false;
  }
  return w.fail(fmt::format("the request moved to {} did not finish within {} min", c.migrated_to,
                            kForwardDeadline.count()),
                "upstream_error");
}

// The end of choice `choice`: its Completion is in its future by now. False: the client is
// gone; w.ended(): the stream is over.
bool end_choice(StreamState& s, Writer& w, int choice) {
  Completion c = s.futures[std::size_t(choice)].get();
  if (c.finish_reason == "migrated" && !c.migrated_to.empty()) {
    if (!relay_migrated(s, w, choice, c)) return false;
    if (w.ended()) return true;
  }
  if (c.finish_reason == "error") return w.fail(c.error, "server_error");
  const auto& sent = s.tokens[std::size_t(choice)];
  if (c.tokens.size() < sent.size() || !std::equal(sent.begin(), sent.end(), c.tokens.begin()))
    return w.fail("the answer's tokens differ from those streamed", "server_error");
  for (std::size_t i = sent.size(); i < c.tokens.size(); ++i)
    if (!w.chunk(choice, {c.tokens[i]}, std::nullopt)) return false;
  if (!w.chunk(choice, {}, c.finish_reason, c.request_id)) return false;
  if (++s.choices_done == s.futures.size()) return w.finish();
  return true;
}

}  // namespace

void stream_completion(httplib::Response& res, std::shared_ptr<StreamState> state) {
  // Until the first event, nothing is sent: an error then is an ordinary HTTP answer.
  while (state->pending.empty()) {
    state->stream->wait_after(0, kPoll, state->pending);
    if (state->pending.empty() && stop_requested()) {
      res.status = 503;
      res.set_content(
          nlohmann::json{{"error",
                          {{"message", "the engine is stopping: retry on another worker"},
                           {"type", "unavailable"}}}}
              .dump(),
          "application/json");
      return;
    }
  }
  state->next_event = state->pending.size();
  const TokenStream::Event& first = state->pending.front();
  if (first.end) {
    const Completion& c = state->futures[std::size_t(first.choice)].get();
    if (c.finish_reason == "error") {
      res.status = error_status(c.error);
      res.set_content(
          nlohmann::json{{"error", {{"message", c.error}, {"type", "invalid_request_error"}}}}
              .dump(),
          "application/json");
      return;
    }
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [state](std::size_t, httplib::DataSink& sink) {
        std::vector<TokenStream::Event> events;
        events.swap(state->pending);
        if (events.empty()) {
          state->stream->wait_after(state->next_event, kPoll, events);
          state->next_event += events.size();
        }
        Writer w(*state, sink);
        if (events.empty() && stop_requested())
          return w.fail("the engine stopped before the answer was complete", "unavailable");
        // Consecutive tokens of one choice go out one event each: a client counts tokens by
        // events (TPOT), as with OpenAI's streams.
        for (const auto& e : events) {
          if (!e.end) {
            if (!w.chunk(e.choice, {e.token}, std::nullopt)) return false;
            continue;
          }
          if (!end_choice(*state, w, e.choice)) return false;
          if (w.ended()) return true;
        }
        return true;
      });
}

}  // namespace refengine
