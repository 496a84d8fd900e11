// `"stream": true` on refengine's /v1/completions (issue 25), end to end on the emulator:
//  - a worker sends each token as an event when it is decoded (the first event long before the
//    last token; the tokens equal the non-streamed answer's), then finish_reason and [DONE];
//  - errors before the first token are plain HTTP errors; a client that goes away ends its
//    request (the batch slot is freed, not decoded to max_tokens);
//  - a PP=2 pipeline streams from stage 0 what one worker answers;
//  - a request moved mid-stream by KV migration with forward_answers: the stream goes on, even
//    as stage 0 is stopped right after the move, and ends with the single worker's tokens; the
//    tokens decoded on the full worker are relayed as they are decoded (/kv/result?tokens_after).
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <future>

#include "coordinator/kv_migration/kv_migrate.hpp"
#include "serve_process.hpp"

namespace {

using namespace refengine_test;
using json = nlohmann::json;
using Tokens = std::vector<std::int32_t>;
using Clock = std::chrono::steady_clock;

json complete(const std::string& url, const json& body) {
  httplib::Client c(url);
  c.set_read_timeout(std::chrono::seconds(300));
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"transport_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body);
  j["status"] = r->status;
  return j;
}

struct Streamed {
  int status = 0;
  std::string content_type, body;  // body: the whole answer when it is not a stream
  std::vector<json> events;        // the data of each event but [DONE]
  std::vector<double> at_ms;       // when each arrived, from the request's start
  bool done = false;               // [DONE] came
  double total_ms = 0;
  // Per choice: the tokens and text of its events, and its finish_reason.
  std::map<int, Tokens> tokens;
  std::map<int, std::string> text, finish;
  int token_events = 0;
};

// Posts `body` with "stream": true; reads events as they arrive. `stop_after` > 0: the client
// hangs up after that many events.
Streamed stream(const std::string& url, json body, int stop_after = 0) {
  body["stream"] = true;
  Streamed s;
  httplib::Client c(url);
  c.set_read_timeout(std::chrono::seconds(300));
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  const auto start = Clock::now();
  req.response_handler = [&](const httplib::Response& r) {
    s.status = r.status;
    s.content_type = r.get_header_value("Content-Type");
    return true;
  };
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    if (s.content_type != "text/event-stream") {
      s.body.append(data, n);
      return true;
    }
    buffer.append(data, n);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string data_line = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      EXPECT_TRUE(data_line.starts_with("data: ")) << data_line;
      const std::string payload = data_line.substr(6);
      EXPECT_FALSE(s.done) << "an event after [DONE]: " << payload;
      if (payload == "[DONE]") {
        s.done = true;
        continue;
      }
      s.at_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      json e = json::parse(payload);
      if (e.contains("choices")) {
        const json& ch = e["choices"][0];
        const int i = ch["index"];
        for (int t : ch["token_ids"]) s.tokens[i].push_back(t);
        if (!ch["token_ids"].empty()) ++s.token_events;
        s.text[i] += ch["text"].get<std::string>();
        if (!ch["finish_reason"].is_null()) s.finish[i] = ch["finish_reason"];
      }
      s.events.push_back(std::move(e));
      if (stop_after > 0 && int(s.events.size()) >= stop_after) return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error;
  c.send(req, res, error);
  s.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return s;
}

const Tokens kPrompt = {1, 2, 3, 4, 5, 6, 7};

TEST(RefengineStreaming, AWorkerSendsEachTokenWhenItIsDecoded) {
  constexpr int kTokens = 24, kStepMs = 40;
  Serve worker({"--step-delay-ms", std::to_string(kStepMs)}, 0);
  ASSERT_TRUE(worker.ready()) << worker.log();
  const json body{{"prompt", kPrompt}, {"max_tokens", kTokens}, {"ignore_eos", true}};
  const json whole = complete(worker.url(), body);
  ASSERT_EQ(whole.value("status", 0), 200) << whole.dump();
  const Streamed s = stream(worker.url(), body);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.content_type, "text/event-stream");
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.tokens.at(0), whole["choices"][0]["token_ids"].get<Tokens>());
  EXPECT_EQ(s.text.at(0), whole["choices"][0]["text"]);
  EXPECT_EQ(s.finish.at(0), "length");
  ASSERT_EQ(s.token_events, kTokens);  // one event per token
  EXPECT_EQ(s.events.size(), std::size_t(kTokens) + 1);
  EXPECT_TRUE(s.events.back()["choices"][0]["token_ids"].empty());
  for (const json& e : s.events) EXPECT_EQ(e["object"], "text_completion");
  // Each token as it is decoded: the first arrives about one step in, the last about kTokens
  // steps later (a stream made from the whole answer would bring them all at the end).
  const double first = s.at_ms.front(), last_token = s.at_ms[kTokens - 1];
  RecordProperty("first_event_ms", std::to_string(first));
  RecordProperty("total_ms", std::to_string(s.total_ms));
  std::printf(
      "streamed %d tokens, %d ms steps: first event %.0f ms, last token %.0f ms, total %.0f ms\n",
      kTokens, kStepMs, first, last_token, s.total_ms);
  EXPECT_LT(first, s.total_ms / 4);
  EXPECT_GT(last_token - first, 0.7 * (kTokens - 1) * kStepMs);
}

TEST(RefengineStreaming, ErrorsBeforeTheFirstTokenAreHttpErrors) {
  Serve worker({}, 0);
  ASSERT_TRUE(worker.ready()) << worker.log();
  const Streamed too_long = stream(worker.url(), {{"prompt", kPrompt}, {"max_tokens", 1000}});
  EXPECT_EQ(too_long.status, 400);
  EXPECT_EQ(too_long.content_type, "application/json");
  EXPECT_NE(too_long.body.find("--max-model-len"), std::string::npos) << too_long.body;
  const json bad = complete(worker.url(), {{"prompt", kPrompt}, {"stream", "yes"}});
  EXPECT_EQ(bad.value("status", 0), 400) << bad.dump();
}

TEST(RefengineStreaming, AClientThatHangsUpEndsItsRequest) {
  constexpr int kStepMs = 50, kTokens = 100;  // 5 s to decode all of it
  Serve worker({"--step-delay-ms", std::to_string(kStepMs)}, 0);
  ASSERT_TRUE(worker.ready()) << worker.log();
  const Streamed s =
      stream(worker.url(), {{"prompt", kPrompt}, {"max_tokens", kTokens}, {"ignore_eos", true}}, 2);
  ASSERT_EQ(s.events.size(), 2u);
  const auto hung_up = Clock::now();
  httplib::Client c(worker.url());
  bool empty = false;
  while (!empty && Clock::now() - hung_up < std::chrono::seconds(10)) {
    auto r = c.Get("/kv/requests");
    ASSERT_TRUE(r && r->status == 200);
    empty = json::parse(r->body)["requests"].empty();
    if (!empty) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(empty);
  EXPECT_LT(Clock::now() - hung_up, std::chrono::milliseconds(kTokens * kStepMs / 2))
      << "the request decoded on after its client left";
}

TEST(RefengineStreaming, APipelineStreamsFromStage0WhatOneWorkerAnswers) {
  Serve one({}, 4);
  Pipeline pp(2, {"--step-delay-ms", "10"});
  ASSERT_TRUE(one.ready()) << one.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const json body{
      {"prompt", {Tokens{100, 2000, 31, 7}, kPrompt}}, {"max_tokens", 16}, {"ignore_eos", true}};
  const json whole = complete(one.url(), body);
  ASSERT_EQ(whole.value("status", 0), 200) << whole.dump();
  const Streamed s = stream(pp.stages[0]->url(), body);
  ASSERT_EQ(s.status, 200) << s.body << pp.logs();
  EXPECT_TRUE(s.done);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(s.tokens.at(i), whole["choices"][i]["token_ids"].get<Tokens>()) << i;
    EXPECT_EQ(s.finish.at(i), "length");
  }
  EXPECT_EQ(s.token_events, 32);
}

TEST(RefengineStreaming, AStreamMovedByKvMigrationEndsWithTheSingleWorkersTokens) {
  constexpr int kTokens = 40;
  Serve target({"--step-delay-ms", "20"}, 5);
  Pipeline pp(2, {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const json body{{"prompt", kPrompt}, {"max_tokens", kTokens}, {"ignore_eos", true}};
  const json whole = complete(target.url(), body);
  ASSERT_EQ(whole.value("status", 0), 200) << whole.dump();
  const std::string s0 = pp.stages[0]->url();
  auto client = std::async(std::launch::async, [&] { return stream(s0, body); });
  // Moved once a few tokens have been streamed from the pipeline.
  const auto until = Clock::now() + std::chrono::seconds(120);
  bool generating = false;
  std::string listed;
  while (!generating && Clock::now() < until) {
    httplib::Client c(s0);
    auto r = c.Get("/kv/requests");
    listed = r ? r->body : httplib::to_string(r.error());
    const json l = r && r->status == 200 ? json::parse(r->body) : json::object();
    for (const json& q : l.value("requests", json::array()))
      generating = generating || (q["state"] == "running" && q["generated"].size() >= 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(generating) << listed << pp.logs();
  thaw::kv_migration::MigrationPlan plan{pp.urls(), target.url(), 20000, {}, {}};
  plan.forward_answers = true;
  auto moved = thaw::kv_migration::migrate(plan);
  ASSERT_TRUE(moved) << moved.error();
  ASSERT_EQ(moved->size(), 1u);
  EXPECT_EQ((*moved)[0].how, "kv");
  pp.stages[0]->terminate();  // the coordinator stops the pipeline at once
  ASSERT_EQ(client.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const Streamed s = client.get();
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.tokens.at(0), whole["choices"][0]["token_ids"].get<Tokens>());
  EXPECT_EQ(s.finish.at(0), "length");
  EXPECT_EQ(s.token_events, kTokens);
  // The tokens decoded on the full worker are relayed as it decodes them (20 ms a step), not
  // all at once when it finishes: the last 10 (at least 30 were decoded there) span >= 90 ms.
  std::vector<double> token_at;
  for (std::size_t i = 0; i < s.events.size(); ++i)
    if (s.events[i].contains("choices") && !s.events[i]["choices"][0]["token_ids"].empty())
      token_at.push_back(s.at_ms[i]);
  ASSERT_GE(token_at.size(), 10u);
  EXPECT_GE(token_at.back() - token_at[token_at.size() - 10], 90.0)
      << "the moved request's last tokens arrived together";
  EXPECT_EQ(pp.stages[0]->wait_exit(30000), 0) << pp.logs();
}

}  // namespace
