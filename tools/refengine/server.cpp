#include "server.hpp"

#include <httplib.h>
#include <signal.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "kv_transfer_server.hpp"
#include "server_stream.hpp"

namespace refengine {
namespace {

httplib::Server* g_server = nullptr;  // for the signal handler only
std::atomic<bool> g_stop_requested{false};
void on_signal(int) {
  g_stop_requested = true;
  if (g_server != nullptr) g_server->stop();
}

nlohmann::json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}}}};
}

}  // namespace

bool stop_requested() {
  return g_stop_requested;
}

std::expected<Completion, std::string> wait_completion(std::future<Completion>& f) {
  // The server joins its threads before serve() returns: a handler must not wait on a request
  // the scheduler (paused, or about to stop) may never finish.
  while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready)
    if (stop_requested()) return std::unexpected("the engine is stopping: retry on another worker");
  return f.get();
}

int error_status(const std::string& error) {
  return error.starts_with("the engine failed")        ? 500
         : error.starts_with("the engine is draining") ? 503
                                                       : 400;
}

// The whole answer of a request released with "to", from that full worker's /kv/result. Not
// cut short by a stop request: a stopping stage 0 still hands its callers their answers (the
// full worker runs the request; this only waits), within kForwardDeadline.
std::expected<void, std::string> fetch_migrated(Completion& c) {
  constexpr auto kForwardDeadline = std::chrono::minutes(10);
  httplib::Client worker(c.migrated_to);
  worker.set_read_timeout(std::chrono::seconds(70));
  const auto until = std::chrono::steady_clock::now() + kForwardDeadline;
  const std::string path = fmt::format("/kv/result?request_id={}&timeout_ms=60000", c.request_id);
  while (std::chrono::steady_clock::now() < until) {
    auto r = worker.Get(path.c_str());
    if (!r)
      return std::unexpected(fmt::format("the request moved to {}, which did not answer: {}",
                                         c.migrated_to, httplib::to_string(r.error())));
    if (r->status == 202) continue;
    if (r->status != 200)
      return std::unexpected(fmt::format("the request moved to {}, which answered HTTP {}: {}",
                                         c.migrated_to, r->status, r->body));
    try {
      const auto j = nlohmann::json::parse(r->body);
      c.tokens = j.at("token_ids").get<std::vector<std::int32_t>>();
      c.finish_reason = j.at("finish_reason").get<std::string>();
      c.error = j.value("error", "");
    } catch (const std::exception& e) {
      return std::unexpected(
          fmt::format("the request moved to {}, whose answer is not "
                      "understood: {}",
                      c.migrated_to, e.what()));
    }
    return {};
  }
  return std::unexpected(fmt::format("the request moved to {} did not finish within {} min",
                                     c.migrated_to, kForwardDeadline.count()));
}

int serve(Engine& engine, Scheduler& scheduler, const std::optional<Tokenizer>& tokenizer,
          const ServeOptions& options) {
  httplib::Server server;
  const std::string model = options.model_name;
  std::atomic<std::uint64_t> next_id{1};
  // KV transfer (docs/KV-TRANSFER.md): the bodies are KV blocks, larger than any prompt.
  server.set_payload_max_length(kKvMaxBodyBytes + kKvHeaderBytes);
  scheduler.set_step_delay_ms(options.step_delay_ms);
  KvTransfer kv(engine, &scheduler);
  kv.add_routes(server);

  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    nlohmann::json body{
        {"object", "list"},
        {"data", {{{"id", model}, {"object", "model"}, {"owned_by", "refengine"}}}}};
    res.set_content(body.dump(), "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](int status, const std::string& message) {
      res.status = status;
      res.set_content(error_body(message, "invalid_request_error").dump(), "application/json");
    };
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(req.body);
    } catch (const std::exception& e) {
      return fail(400, fmt::format("request body is not JSON: {}", e.what()));
    }
    if (!body.is_object() || !body.contains("prompt"))
      return fail(400, "the request needs a \"prompt\"");
    if (body.contains("temperature") &&
        !(body["temperature"].is_number() && body["temperature"].get<double>() == 0.0))
      return fail(400, "only greedy decoding is supported: temperature must be 0");
    const int max_tokens = body.value("max_tokens", 16);
    const bool ignore_eos = body.value("ignore_eos", false);
    // Normalise the prompt forms to a list of token lists.
    std::vector<std::vector<std::int32_t>> prompts;
    auto add = [&](const nlohmann::json& p) -> bool {
      if (p.is_string()) {
        if (!tokenizer) return false;
        prompts.push_back(tokenizer->encode(p.get<std::string>()));
        return true;
      }
      if (p.is_array() &&
          std::all_of(p.begin(), p.end(), [](const auto& v) { return v.is_number_integer(); })) {
        prompts.push_back(p.get<std::vector<std::int32_t>>());
        return true;
      }
      return false;
    };
    const auto& p = body["prompt"];
    bool ok;
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      ok = std::all_of(p.begin(), p.end(), [&](const auto& e) { return add(e); });
    } else {
      ok = add(p);
    }
    if (!ok)
      return fail(400, tokenizer ? "\"prompt\" must be a string, a list of token ids, or a list of "
                                   "those"
                                 : "\"prompt\" must be token ids: the model directory has no "
                                   "tokenizer (vocab.json + merges.txt)");
    bool stream = false;
    if (body.contains("stream")) {
      if (!body["stream"].is_boolean()) return fail(400, "\"stream\" must be true or false");
      stream = body["stream"].get<bool>();
    }
    auto token_stream = stream ? std::make_shared<TokenStream>() : nullptr;
    std::vector<std::future<Completion>> futures;
    for (std::size_t i = 0; i < prompts.size(); ++i)
      futures.push_back(scheduler.submit(
          Request{prompts[i], max_tokens, ignore_eos, false, false, token_stream, int(i)}));
    if (stream)
      return stream_completion(
          res, std::make_shared<StreamState>(token_stream, std::move(futures),
                                             tokenizer ? &*tokenizer : nullptr,
                                             fmt::format("cmpl-{}", next_id++), model));
    nlohmann::json choices = nlohmann::json::array();
    std::size_t prompt_tokens = 0, completion_tokens = 0;
    for (std::size_t i = 0; i < futures.size(); ++i) {
      auto waited = wait_completion(futures[i]);
      if (!waited) {
        res.status = 503;
        res.set_content(error_body(waited.error(), "unavailable").dump(), "application/json");
        return;
      }
      Completion c = std::move(*waited);
      if (c.finish_reason == "migrated" && !c.migrated_to.empty()) {
        // Moved with "to": the caller gets the whole answer from the full worker, here.
        if (auto e = fetch_migrated(c); !e) {
          res.status = 502;
          res.set_content(error_body(e.error(), "upstream_error").dump(), "application/json");
          return;
        }
      }
      if (c.finish_reason == "error") return fail(error_status(c.error), c.error);
      prompt_tokens += prompts[i].size();
      completion_tokens += c.tokens.size();
      nlohmann::json choice{{"index", i},
                            {"token_ids", c.tokens},
                            {"finish_reason", c.finish_reason},
                            {"logprobs", nullptr}};
      // Moved to another worker (KV migration): the rest comes from its /kv/result.
      if (c.finish_reason == "migrated") choice["request_id"] = c.request_id;
      choice["text"] = tokenizer ? tokenizer->decode(c.tokens) : "";
      choices.push_back(choice);
    }
    nlohmann::json out{{"id", fmt::format("cmpl-{}", next_id++)},
                       {"object", "text_completion"},
                       {"created", std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count()},
                       {"model", model},
                       {"choices", choices},
                       {"usage",
                        {{"prompt_tokens", prompt_tokens},
                         {"completion_tokens", completion_tokens},
                         {"total_tokens", prompt_tokens + completion_tokens}}}};
    res.set_content(out.dump(), "application/json");
  });

  if (!server.bind_to_port(options.host, options.port)) {
    fmt::print(stderr, "refengine: cannot listen on {}:{}\n", options.host, options.port);
    return 1;
  }
  std::thread engine_loop([&] {
    try {
      scheduler.run();
    } catch (const std::exception& e) {
      fmt::print(stderr, "refengine: engine failed: {}\n", e.what());
      server.stop();
    }
  });
  g_server = &server;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  engine.timeline().mark("serving", {{"host", options.host}, {"port", options.port}});
  fmt::print(stderr, "refengine: serving {} on http://{}:{}\n", model, options.host, options.port);
  server.listen_after_bind();
  g_server = nullptr;
  scheduler.stop();
  engine_loop.join();
  return 0;
}

}  // namespace refengine
