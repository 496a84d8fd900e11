#include "coordinator/kv_migration/kv_migrate.hpp"

#include <httplib.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include <nlohmann/json.hpp>

namespace thaw::kv_migration {
namespace {

using json = nlohmann::json;

struct Http {
  httplib::Client client;
  std::string base;
  Http(const std::string& url, int timeout_ms) : client(url), base(url) {
    const auto t = std::chrono::milliseconds(timeout_ms);
    client.set_connection_timeout(t);
    client.set_read_timeout(t);
    client.set_write_timeout(t);
  }
};

// The body of a 2xx answer, or an error naming the call, the status and the server's message.
std::expected<std::string, std::string> checked(const httplib::Result& r, const std::string& what,
                                                const std::string& base) {
  if (!r)
    return std::unexpected(fmt::format("{} on {}: {}", what, base, httplib::to_string(r.error())));
  if (r->status < 200 || r->status >= 300) {
    std::string msg = r->body;
    try {
      msg = json::parse(r->body).at("error").at("message").get<std::string>();
    } catch (...) {
    }
    return std::unexpected(fmt::format("{} on {}: HTTP {}: {}", what, base, r->status, msg));
  }
  return r->body;
}

std::expected<json, std::string> get_json(Http& h, const std::string& path) {
  auto body = checked(h.client.Get(path.c_str()), "GET " + path, h.base);
  if (!body) return std::unexpected(body.error());
  try {
    return json::parse(*body);
  } catch (const std::exception& e) {
    return std::unexpected(fmt::format("GET {} on {}: not JSON: {}", path, h.base, e.what()));
  }
}

std::expected<json, std::string> post_json(Http& h, const std::string& path, const json& body) {
  auto r =
      checked(h.client.Post(path.c_str(), body.dump(), "application/json"), "POST " + path, h.base);
  if (!r) return std::unexpected(r.error());
  try {
    return r->empty() ? json::object() : json::parse(*r);
  } catch (const std::exception& e) {
    return std::unexpected(fmt::format("POST {} on {}: not JSON: {}", path, h.base, e.what()));
  }
}

// Gathers request `r`'s blocks from every stage into the target; the first failure, if any.
std::expected<void, std::string> gather(const MigrationPlan& plan, std::vector<Http>& stages,
                                        Http& target, const json& r) {
  const std::uint64_t id = r.at("request_id").get<std::uint64_t>();
  const json ask{{"request_id", id}, {"blocks", r.at("blocks")}, {"kv_tokens", r.at("kv_tokens")}};
  // A half-done import left by an interrupted migration would refuse the layers it holds.
  (void)post_json(target, "/kv/abort", {{"request_id", id}});
  for (std::size_t k = 0; k < stages.size(); ++k) {
    if (plan.before_export) plan.before_export(int(k), id);
    // The full worker fetches stage k's blocks itself: the bytes go straight to it.
    json pull = ask;
    pull["from"] = stages[k].base;
    // Shorter than the call itself: the worker reports a stalled stage before we give up on it.
    pull["timeout_ms"] = std::max(1, plan.timeout_ms * 3 / 4);
    if (auto r = post_json(target, "/kv/pull", pull); !r)
      return std::unexpected(
          fmt::format("gathering stage {}'s blocks of request {}: {}", k, id, r.error()));
  }
  return {};
}

}  // namespace

std::expected<std::vector<MovedRequest>, std::string> migrate(const MigrationPlan& plan) {
  if (plan.stages.empty()) return std::unexpected("no pipeline stages given");
  std::vector<Http> stages;
  for (const auto& s : plan.stages) stages.emplace_back(s, plan.timeout_ms);
  Http target(plan.target, plan.timeout_ms);
  auto tinfo = get_json(target, "/kv/info");
  if (!tinfo) return std::unexpected("the full worker: " + tinfo.error());
  if (tinfo->value("pp_size", 0) != 1)
    return std::unexpected(fmt::format("{} is a pipeline stage, not a full worker", plan.target));
  // Stage 0 schedules: pausing it stills the pipeline, and its list is the truth.
  if (auto p = post_json(stages[0], "/kv/pause", json::object()); !p)
    return std::unexpected("pausing stage 0: " + p.error());
  auto listed = get_json(stages[0], "/kv/requests");
  if (!listed) return std::unexpected("listing stage 0's requests: " + listed.error());
  // The stages must cover the target's layers exactly once, in order.
  std::string cover_error;
  int next_layer = 0;
  for (std::size_t k = 0; k < stages.size() && cover_error.empty(); ++k) {
    auto info = get_json(stages[k], "/kv/info");
    if (!info) {
      cover_error = info.error();
      break;
    }
    const auto layers = info->value("layers", std::vector<int>{});
    if (layers.size() != 2 || layers[0] != next_layer)
      cover_error = fmt::format("stage {} holds layers {} where layer {} comes next", k,
                                info->value("layers", json::array()).dump(), next_layer);
    else
      next_layer = layers[1];
  }
  if (cover_error.empty() && next_layer != tinfo->value("n_layer", -1))
    cover_error = fmt::format("the stages hold {} layers, the full worker's model {}", next_layer,
                              tinfo->value("n_layer", -1));

  std::vector<MovedRequest> out;
  bool any_stayed = false;
  for (const json& r : listed->at("requests")) {
    MovedRequest m;
    m.request_id = r.at("request_id").get<std::uint64_t>();
    m.prompt = r.at("prompt").get<std::vector<std::int32_t>>();
    m.generated_before = r.at("generated").get<std::vector<std::int32_t>>();
    const bool has_kv = r.at("state") == "running" && r.at("kv_tokens").get<int>() > 0;
    json resume{{"request_id", m.request_id},
                {"prompt", m.prompt},
                {"max_tokens", r.at("max_tokens")},
                {"ignore_eos", r.at("ignore_eos")}};
    std::string why;
    // A migration begun before (the coordinator restarted): the nodes hold the state. A request
    // the full worker resumed already needs only stage 0's release; a half-done import of one
    // it did not is dropped and gathered again.
    if (auto known =
            target.client.Get(fmt::format("/kv/result?request_id={}", m.request_id).c_str());
        known && (known->status == 200 || known->status == 202)) {
      m.how = "earlier";
      m.why = "resumed on the full worker by an earlier migration";
    } else if (!has_kv) {
      why = "it had not started: nothing to migrate";
    } else if (!cover_error.empty()) {
      why = cover_error;
    } else if (auto g = gather(plan, stages, target, r); !g) {
      why = g.error();
    } else {
      resume["generated"] = m.generated_before;
      resume["kv_tokens"] = r.at("kv_tokens");
      if (auto ok = post_json(target, "/kv/resume", resume); ok) {
        m.how = "kv";
      } else {
        why = ok.error();
      }
    }
    if (m.how.empty()) {
      // The retry policy: the blocks did not all arrive, so start again from the prompt.
      (void)post_json(target, "/kv/abort", {{"request_id", m.request_id}});
      resume["generated"] = json::array();
      resume["kv_tokens"] = 0;
      if (auto ok = post_json(target, "/kv/resume", resume); ok) {
        m.how = "prompt";
        m.why = why;
      } else {
        m.how = "stayed";
        m.why = why + "; retrying from the prompt: " + ok.error();
        any_stayed = true;
      }
    }
    if (m.how != "stayed" && plan.after_resume) plan.after_resume(m.request_id);
    if (m.how != "stayed") {
      json release{{"request_id", m.request_id}};
      if (plan.forward_answers) release["to"] = target.base;
      m.released = post_json(stages[0], "/kv/release", release).has_value();
    }
    out.push_back(std::move(m));
  }
  // Whatever could not move finishes where it is (drain); otherwise stage 0 stays paused,
  // empty, until the coordinator stops the stages.
  if (any_stayed) (void)post_json(stages[0], "/kv/unpause", json::object());
  return out;
}

std::expected<void, std::string> wait_results(const std::string& target_url,
                                              std::vector<MovedRequest>& moved, int timeout_ms) {
  Http target(target_url, timeout_ms + 10000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (MovedRequest& m : moved) {
    if (m.how == "stayed") continue;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0)
        return std::unexpected(
            fmt::format("request {} did not finish within {} ms", m.request_id, timeout_ms));
      auto r = get_json(target, fmt::format("/kv/result?request_id={}&timeout_ms={}", m.request_id,
                                            std::min<long>(left, 60000)));
      if (!r) return std::unexpected(r.error());
      if (!r->value("done", false)) continue;
      m.tokens = r->value("token_ids", std::vector<std::int32_t>{});
      m.finish_reason = r->value("finish_reason", "");
      m.error = r->value("error", "");
      break;
    }
  }
  return {};
}

std::expected<void, std::string> drain(const std::string& stage0, int timeout_ms) {
  Http h(stage0, timeout_ms + 10000);
  if (auto r = post_json(h, "/kv/drain", {{"timeout_ms", timeout_ms}}); !r)
    return std::unexpected(r.error());
  return {};
}

}  // namespace thaw::kv_migration
