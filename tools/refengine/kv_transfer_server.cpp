#include "kv_transfer_server.hpp"

#include <httplib.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "kernels.h"
#include "kv_transfer_format.hpp"

namespace refengine {
namespace {

using json = nlohmann::json;

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  const char* type = status == 400   ? "invalid_request_error"
                     : status == 404 ? "not_found"
                     : status == 409 ? "conflict"
                     : status == 413 ? "too_large"
                     : status == 422 ? "incompatible"
                     : status == 503 ? "unavailable"
                                     : "internal_error";
  res.set_content(json{{"error", {{"message", message}, {"type", type}}}}.dump(),
                  "application/json");
}

void reply(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// A JSON object body, or the reason it is not one.
std::expected<json, std::string> object_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  try {
    json j = json::parse(req.body);
    if (!j.is_object()) return std::unexpected("the body must be a JSON object");
    return j;
  } catch (const std::exception& e) {
    return std::unexpected(fmt::format("the body is not JSON: {}", e.what()));
  }
}

// An integer of T's range, exactly: no fractions, no silent truncation of large values.
template <class T>
std::optional<T> exact_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u <= std::uint64_t(std::numeric_limits<T>::max())) return T(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if constexpr (std::is_signed_v<T>) {
      if (i >= std::int64_t(std::numeric_limits<T>::min()) &&
          i <= std::int64_t(std::numeric_limits<T>::max()))
        return T(i);
    } else if (i >= 0 && std::uint64_t(i) <= std::uint64_t(std::numeric_limits<T>::max())) {
      return T(i);
    }
  }
  return std::nullopt;
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

// A field of a given JSON kind (integers and integer lists exactly, see exact_int), or an error
// naming it.
template <class T>
std::expected<T, std::string> field(const json& j, const char* name) {
  if (!j.contains(name)) return std::unexpected(fmt::format("\"{}\" is missing", name));
  const json& v = j.at(name);
  auto wrong = [&] { return std::unexpected(fmt::format("\"{}\" has the wrong type", name)); };
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    auto i = exact_int<T>(v);
    if (!i)
      return std::unexpected(fmt::format("\"{}\" must be an integer in {}..{}", name,
                                         std::numeric_limits<T>::min(),
                                         std::numeric_limits<T>::max()));
    return *i;
  } else if constexpr (is_vector<T>::value) {
    using E = typename T::value_type;
    if (!v.is_array()) return wrong();
    T out;
    out.reserve(v.size());
    for (const json& e : v) {
      auto i = exact_int<E>(e);
      if (!i)
        return std::unexpected(fmt::format("\"{}\" must list integers in {}..{}", name,
                                           std::numeric_limits<E>::min(),
                                           std::numeric_limits<E>::max()));
      out.push_back(*i);
    }
    return out;
  } else {
    try {
      return v.get<T>();
    } catch (const std::exception&) {
      return wrong();
    }
  }
}

// An optional integer field within [lo, hi], `fallback` when absent.
std::expected<int, std::string> int_or(const json& j, const char* name, int fallback, int lo,
                                       int hi) {
  if (!j.contains(name)) return fallback;
  auto i = exact_int<int>(j.at(name));
  if (!i || *i < lo || *i > hi)
    return std::unexpected(fmt::format("\"{}\" must be an integer in {}..{}", name, lo, hi));
  return *i;
}

json completion_json(std::uint64_t id, const Completion& c) {
  json j{{"request_id", id}, {"token_ids", c.tokens}, {"finish_reason", c.finish_reason}};
  if (!c.error.empty()) j["error"] = c.error;
  return j;
}

std::expected<std::uint64_t, std::string> query_id(const httplib::Request& req) {
  if (!req.has_param("request_id")) return std::unexpected("the query needs ?request_id=");
  const std::string v = req.get_param_value("request_id");
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), id);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty())
    return std::unexpected(fmt::format("request_id '{}' is not an unsigned integer", v));
  return id;
}

constexpr std::size_t kMaxPending = 256;   // imports under way
constexpr std::size_t kMaxResults = 4096;  // resumed requests remembered for /kv/result

}  // namespace

KvTransfer::~KvTransfer() {
  // Blocks of imports never resumed go back (the scheduler outlives this object in serve()).
  if (scheduler_ != nullptr)
    for (auto& [id, p] : pending_) scheduler_->free_blocks(p.blocks);
}

void KvTransfer::import_body(const std::string& body, httplib::Response& res) {
  const GPT2Config& cfg = engine_.config();
  const int head_dim = int(cfg.n_embd / cfg.n_head);
  auto blob = parse_kv_blob(body, kKvMaxBodyBytes);
  if (!blob)
    return reply_error(res, blob.error().find("exceed") != std::string::npos ? 413 : 400,
                       blob.error());
  const KvBlobHeader& h = blob->header;
  if (h.n_layer != std::uint32_t(cfg.n_layer) || h.n_head != std::uint32_t(cfg.n_head) ||
      h.head_dim != std::uint32_t(head_dim) || h.block_size != std::uint32_t(kBlockSize))
    return reply_error(
        res, 422,
        fmt::format("the blocks are of a model with {} layers, {} heads of {}, block size {}; "
                    "this worker's has {}, {} of {}, {}",
                    h.n_layer, h.n_head, h.head_dim, h.block_size, cfg.n_layer, cfg.n_head,
                    head_dim, kBlockSize));
  if (int(h.token_count) > engine_.options().limits.max_model_len)
    return reply_error(res, 422,
                       fmt::format("{} positions exceed this worker's --max-model-len {}",
                                   h.token_count, engine_.options().limits.max_model_len));
  std::lock_guard lock(mu_);
  auto it = pending_.find(h.request_id);
  if (it == pending_.end()) {
    if (results_.contains(h.request_id))
      return reply_error(res, 409, fmt::format("request {} was resumed already", h.request_id));
    if (pending_.size() >= kMaxPending)
      return reply_error(res, 503, fmt::format("{} imports are under way already", kMaxPending));
    auto blocks = scheduler_->reserve_blocks(int(h.num_blocks));
    if (!blocks) return reply_error(res, 503, blocks.error());
    Pending p;
    p.blocks = std::move(*blocks);
    p.token_count = h.token_count;
    p.layers.assign(std::size_t(cfg.n_layer), false);
    it = pending_.emplace(h.request_id, std::move(p)).first;
  }
  Pending& p = it->second;
  if (p.token_count != h.token_count)
    return reply_error(res, 409,
                       fmt::format("request {}: these blocks hold {} positions, earlier ones {}",
                                   h.request_id, h.token_count, p.token_count));
  for (std::uint32_t l = h.layer_begin; l < h.layer_end; ++l)
    if (p.layers[l])
      return reply_error(res, 409,
                         fmt::format("request {}: layer {} was imported already", h.request_id, l));
  const auto t0 = Timeline::now_ns();
  try {
    std::lock_guard step(engine_.step_mutex());
    engine_.bind_thread();
    for (std::uint32_t l = h.layer_begin; l < h.layer_end; ++l)
      engine_.runner().write_kv(
          int(l), p.blocks,
          reinterpret_cast<const std::byte*>(blob->payload.data() + h.offset(l, false, 0)));
  } catch (const std::exception& e) {
    return reply_error(res, 500, fmt::format("writing the KV cache failed: {}", e.what()));
  }
  for (std::uint32_t l = h.layer_begin; l < h.layer_end; ++l) p.layers[l] = true;
  const auto missing = std::count(p.layers.begin(), p.layers.end(), false);
  engine_.timeline().mark("kv_imported", {{"request_id", h.request_id},
                                          {"layers", {h.layer_begin, h.layer_end}},
                                          {"kv_tokens", h.token_count},
                                          {"bytes", body.size()},
                                          {"ms", double(Timeline::now_ns() - t0) / 1e6}});
  reply(res, {{"request_id", h.request_id},
              {"token_count", h.token_count},
              {"layers_missing", missing},
              {"complete", missing == 0}});
}

void KvTransfer::add_routes(httplib::Server& server) {
  const GPT2Config& cfg = engine_.config();
  const StageSpec stage = engine_.runner().stage();
  const int head_dim = int(cfg.n_embd / cfg.n_head);
  const bool full_worker = engine_.options().pipeline.size == 1;

  server.Get("/kv/info", [=, this](const httplib::Request&, httplib::Response& res) {
    reply(res, {{"version", kKvVersion},
                {"pp_rank", engine_.options().pipeline.rank},
                {"pp_size", engine_.options().pipeline.size},
                {"layers", {stage.layer_begin, stage.layer_end}},
                {"n_layer", cfg.n_layer},
                {"n_head", cfg.n_head},
                {"head_dim", head_dim},
                {"block_size", kBlockSize},
                {"dtype", "f32"},
                {"num_blocks", engine_.num_blocks()},
                {"schedules", scheduler_ != nullptr},
                {"paused", scheduler_ != nullptr && scheduler_->paused()}});
  });

  // Stages > 0 run only what stage 0 sends: pausing stage 0 stills the whole pipeline.
  server.Post("/kv/pause", [this](const httplib::Request&, httplib::Response& res) {
    const auto t0 = Timeline::now_ns();
    if (scheduler_ != nullptr) scheduler_->pause();
    engine_.timeline().mark("kv_paused", {{"wait_ms", double(Timeline::now_ns() - t0) / 1e6}});
    reply(res, {{"paused", true}, {"schedules", scheduler_ != nullptr}});
  });
  server.Post("/kv/unpause", [this](const httplib::Request&, httplib::Response& res) {
    if (scheduler_ != nullptr) scheduler_->unpause();
    reply(res, {{"paused", false}, {"schedules", scheduler_ != nullptr}});
  });

  server.Post("/kv/drain", [this](const httplib::Request& req, httplib::Response& res) {
    if (scheduler_ == nullptr) return reply_error(res, 409, "only stage 0 schedules: drain it");
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    const auto timeout = int_or(*body, "timeout_ms", 600000, 0, 3600000);
    if (!timeout) return reply_error(res, 400, timeout.error());
    const int timeout_ms = *timeout;
    if (scheduler_->paused())
      return reply_error(res, 409, "the engine is paused: a paused engine never drains");
    // In slices, so that a stop request (SIGTERM) is not held up by a long drain.
    bool drained = false;
    for (int left = timeout_ms; !drained && left >= 0 && !stop_requested(); left -= 200)
      drained = scheduler_->drain(std::min(left, 200));
    if (!drained)
      return reply_error(
          res, 503,
          fmt::format("requests still running after {} ms (or the engine failed)", timeout_ms));
    engine_.timeline().mark("kv_drained");
    reply(res, {{"drained", true}});
  });

  server.Get("/kv/requests", [this](const httplib::Request&, httplib::Response& res) {
    if (scheduler_ == nullptr)
      return reply_error(res, 409, "only stage 0 knows the requests: ask it");
    json list = json::array();
    for (const SequenceInfo& s : scheduler_->snapshot())
      list.push_back({{"request_id", s.request_id},
                      {"state", s.running ? "running" : "waiting"},
                      {"prompt", s.prompt},
                      {"generated", s.generated},
                      {"max_tokens", s.max_tokens},
                      {"ignore_eos", s.ignore_eos},
                      {"blocks", s.blocks},
                      {"kv_tokens", s.kv_tokens}});
    reply(res, {{"paused", scheduler_->paused()}, {"requests", list}});
  });

  server.Post("/kv/export", [=, this](const httplib::Request& req, httplib::Response& res) {
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    auto id = field<std::uint64_t>(*body, "request_id");
    if (!id) return reply_error(res, 400, id.error());
    std::vector<int> blocks;
    int kv_tokens = 0;
    if (body->contains("blocks") || scheduler_ == nullptr) {
      auto b = field<std::vector<int>>(*body, "blocks");
      auto t = field<int>(*body, "kv_tokens");
      if (!b) return reply_error(res, 400, b.error() + " (stages > 0 need stage 0's block table)");
      if (!t) return reply_error(res, 400, t.error());
      blocks = std::move(*b);
      kv_tokens = *t;
    } else {
      if (!scheduler_->paused())
        return reply_error(res, 409, "export needs a paused engine (POST /kv/pause first)");
      bool found = false;
      for (const SequenceInfo& s : scheduler_->snapshot())
        if (s.request_id == *id && s.running) {
          blocks = s.blocks;
          kv_tokens = s.kv_tokens;
          found = true;
        }
      if (!found) return reply_error(res, 404, fmt::format("no running request {} here", *id));
    }
    if (kv_tokens < 1 || kv_tokens > engine_.options().limits.max_model_len)
      return reply_error(res, 400,
                         fmt::format("kv_tokens {} is not in 1..--max-model-len {}", kv_tokens,
                                     engine_.options().limits.max_model_len));
    if (int(blocks.size()) != (kv_tokens + kBlockSize - 1) / kBlockSize)
      return reply_error(res, 400,
                         fmt::format("{} blocks for {} positions of block size {}", blocks.size(),
                                     kv_tokens, kBlockSize));
    for (int b : blocks)
      if (b < 0 || b >= engine_.num_blocks())
        return reply_error(res, 400,
                           fmt::format("block {} is not in 0..{}", b, engine_.num_blocks() - 1));
    KvBlobHeader h;
    h.request_id = *id;
    h.layer_begin = std::uint32_t(stage.layer_begin);
    h.layer_end = std::uint32_t(stage.layer_end);
    h.n_layer = std::uint32_t(cfg.n_layer);
    h.n_head = std::uint32_t(cfg.n_head);
    h.head_dim = std::uint32_t(head_dim);
    h.block_size = kBlockSize;
    h.token_count = std::uint32_t(kv_tokens);
    std::string out = encode_kv_header(h);
    out.resize(kKvHeaderBytes + h.payload_bytes);
    const auto t0 = Timeline::now_ns();
    try {
      std::lock_guard step(engine_.step_mutex());
      engine_.bind_thread();
      for (int l = stage.layer_begin; l < stage.layer_end; ++l)
        engine_.runner().read_kv(
            l - stage.layer_begin, blocks,
            reinterpret_cast<std::byte*>(out.data() + kKvHeaderBytes + h.offset(l, false, 0)));
    } catch (const std::exception& e) {
      return reply_error(res, 500, fmt::format("reading the KV cache failed: {}", e.what()));
    }
    engine_.timeline().mark("kv_exported", {{"request_id", *id},
                                            {"layers", {h.layer_begin, h.layer_end}},
                                            {"kv_tokens", kv_tokens},
                                            {"bytes", out.size()},
                                            {"ms", double(Timeline::now_ns() - t0) / 1e6}});
    res.set_content(std::move(out), "application/octet-stream");
  });

  server.Post("/kv/import", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!full_worker || scheduler_ == nullptr)
      return reply_error(res, 409, "only a full worker (--pp-size 1) imports KV");
    import_body(req.body, res);
  });

  // The full worker gathers a request's blocks itself, stage by stage: the bytes go from each
  // stage straight to it (HydraServe §6.2), not through the caller.
  server.Post("/kv/pull", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!full_worker || scheduler_ == nullptr)
      return reply_error(res, 409, "only a full worker (--pp-size 1) imports KV");
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    auto id = field<std::uint64_t>(*body, "request_id");
    auto blocks = field<std::vector<int>>(*body, "blocks");
    auto kv_tokens = field<int>(*body, "kv_tokens");
    auto from = field<std::string>(*body, "from");
    for (const std::string* e :
         {id ? nullptr : &id.error(), blocks ? nullptr : &blocks.error(),
          kv_tokens ? nullptr : &kv_tokens.error(), from ? nullptr : &from.error()})
      if (e != nullptr) return reply_error(res, 400, *e);
    if (!from->starts_with("http://") || from->size() > 256)
      return reply_error(res, 400, "\"from\" must be a stage's http://host:port");
    const auto timeout = int_or(*body, "timeout_ms", 60000, 1, 600000);
    if (!timeout) return reply_error(res, 400, timeout.error());
    const int timeout_ms = *timeout;
    httplib::Client stage(*from);
    stage.set_connection_timeout(std::chrono::milliseconds(timeout_ms));
    stage.set_read_timeout(std::chrono::milliseconds(timeout_ms));
    stage.set_write_timeout(std::chrono::milliseconds(timeout_ms));
    auto got =
        stage.Post("/kv/export",
                   json{{"request_id", *id}, {"blocks", *blocks}, {"kv_tokens", *kv_tokens}}.dump(),
                   "application/json");
    if (!got)
      return reply_error(res, 502,
                         fmt::format("the stage at {} did not answer: {}", *from,
                                     httplib::to_string(got.error())));
    if (got->status != 200)
      return reply_error(res, 502,
                         fmt::format("the stage at {} refused the export: HTTP {}: {}", *from,
                                     got->status, got->body));
    auto blob = parse_kv_blob(got->body, kKvMaxBodyBytes);
    if (blob && blob->header.request_id != *id)
      return reply_error(res, 502,
                         fmt::format("the stage at {} sent the blocks of request {}", *from,
                                     blob->header.request_id));
    import_body(got->body, res);
  });

  server.Post("/kv/abort", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    auto id = field<std::uint64_t>(*body, "request_id");
    if (!id) return reply_error(res, 400, id.error());
    std::lock_guard lock(mu_);
    auto it = pending_.find(*id);
    if (it == pending_.end())
      return reply_error(res, 404, fmt::format("no import of request {} is under way", *id));
    if (scheduler_ != nullptr) scheduler_->free_blocks(it->second.blocks);
    pending_.erase(it);
    reply(res, {{"aborted", *id}});
  });

  server.Post("/kv/resume", [=, this](const httplib::Request& req, httplib::Response& res) {
    if (!full_worker || scheduler_ == nullptr)
      return reply_error(res, 409, "only a full worker (--pp-size 1) resumes requests");
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    auto id = field<std::uint64_t>(*body, "request_id");
    auto prompt = field<std::vector<std::int32_t>>(*body, "prompt");
    auto generated = field<std::vector<std::int32_t>>(*body, "generated");
    auto max_tokens = field<int>(*body, "max_tokens");
    auto kv_tokens = field<int>(*body, "kv_tokens");
    for (const std::string* e :
         {id ? nullptr : &id.error(), prompt ? nullptr : &prompt.error(),
          generated ? nullptr : &generated.error(), max_tokens ? nullptr : &max_tokens.error(),
          kv_tokens ? nullptr : &kv_tokens.error()})
      if (e != nullptr) return reply_error(res, 400, *e);
    bool ignore_eos = false;
    if (body->contains("ignore_eos")) {
      if (!(*body)["ignore_eos"].is_boolean())
        return reply_error(res, 400, "\"ignore_eos\" has the wrong type");
      ignore_eos = (*body)["ignore_eos"].get<bool>();
    }
    std::lock_guard lock(mu_);
    if (results_.contains(*id))
      return reply_error(res, 409, fmt::format("request {} was resumed already", *id));
    if (results_.size() >= kMaxResults) {  // forget the oldest finished ones
      for (auto it = results_.begin(); it != results_.end() && results_.size() >= kMaxResults;)
        it = it->second.done.wait_for(std::chrono::seconds(0)) == std::future_status::ready
                 ? results_.erase(it)
                 : std::next(it);
      if (results_.size() >= kMaxResults)
        return reply_error(res, 503,
                           fmt::format("{} resumed requests are unfinished", kMaxResults));
    }
    std::future<Completion> f;
    std::string how;
    auto stream = std::make_shared<TokenStream>();
    if (*kv_tokens == 0) {
      // Retry from the prompt (no KV came, or a stage failed mid-migration): greedy decoding
      // gives the tokens the source would have given.
      if (!generated->empty())
        return reply_error(res, 400,
                           "without imported KV a request restarts from its prompt: "
                           "\"generated\" must be empty");
      if (pending_.contains(*id))
        return reply_error(res, 409,
                           fmt::format("request {} has an import under way: POST /kv/abort it "
                                       "before retrying from the prompt",
                                       *id));
      f = scheduler_->submit(Request{*prompt, *max_tokens, ignore_eos, false, false, stream, 0});
      how = "prompt";
    } else {
      auto it = pending_.find(*id);
      if (it == pending_.end())
        return reply_error(res, 409, fmt::format("no KV of request {} was imported", *id));
      Pending& p = it->second;
      const auto missing = std::count(p.layers.begin(), p.layers.end(), false);
      if (missing != 0)
        return reply_error(
            res, 409, fmt::format("request {}: {} layers have no imported KV yet", *id, missing));
      const std::size_t len = prompt->size() + generated->size();
      if (std::uint32_t(*kv_tokens) != p.token_count || len != std::size_t(*kv_tokens) + 1)
        return reply_error(
            res, 409,
            fmt::format("request {}: the imported KV holds {} positions, kv_tokens is {}, and "
                        "prompt + generated is {} tokens (must be kv_tokens + 1)",
                        *id, p.token_count, *kv_tokens, len));
      auto adopted = scheduler_->adopt(
          AdoptedRequest{*prompt, *generated, *max_tokens, ignore_eos, p.blocks, stream});
      if (!adopted) {
        const bool busy = adopted.error().find("free") != std::string::npos ||
                          adopted.error().find("runs") != std::string::npos;
        return reply_error(res, busy ? 503 : 400, adopted.error());
      }
      pending_.erase(it);  // the blocks are the scheduler's now
      f = std::move(*adopted);
      how = "kv";
    }
    results_.emplace(
        *id, Resumed{f.share(), how == "kv" ? *generated : std::vector<std::int32_t>{}, stream});
    engine_.timeline().mark("kv_resumed", {{"request_id", *id}, {"how", how}});
    reply(res, {{"request_id", *id}, {"resumed", how}}, 202);
  });

  server.Get("/kv/result", [this](const httplib::Request& req, httplib::Response& res) {
    auto id = query_id(req);
    if (!id) return reply_error(res, 400, id.error());
    int timeout_ms = 0;
    if (req.has_param("timeout_ms")) {
      const std::string v = req.get_param_value("timeout_ms");
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), timeout_ms);
      if (ec != std::errc() || end != v.data() + v.size() || timeout_ms < 0 || timeout_ms > 600000)
        return reply_error(res, 400, "timeout_ms must be an integer in 0..600000");
    }
    // tokens_after=N: answer (202, done false) as soon as the request has more than N tokens,
    // with all of them, so that a caller streams the answer as it is decoded here.
    std::optional<std::size_t> tokens_after;
    if (req.has_param("tokens_after")) {
      const std::string v = req.get_param_value("tokens_after");
      std::size_t n = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size())
        return reply_error(res, 400, "tokens_after must be a non-negative integer");
      tokens_after = n;
    }
    Resumed r;
    {
      std::lock_guard lock(mu_);
      auto it = results_.find(*id);
      if (it == results_.end())
        return reply_error(res, 404, fmt::format("request {} was not resumed here", *id));
      r = it->second;
    }
    // The tokens so far: those it came with, then those decoded here (the stream's events).
    auto so_far = [&] {
      std::vector<TokenStream::Event> events;
      r.stream->wait_after(0, std::chrono::milliseconds(0), events);
      std::vector<std::int32_t> tokens = r.generated_before;
      for (const auto& e : events)
        if (!e.end) tokens.push_back(e.token);
      return tokens;
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (r.done.wait_for(std::chrono::milliseconds(tokens_after ? 0 : 100)) !=
               std::future_status::ready &&
           std::chrono::steady_clock::now() < until && !stop_requested()) {
      if (!tokens_after) continue;
      if (so_far().size() > *tokens_after) break;
      // Wakes at the next decoded token (or the request's end event).
      const std::size_t decoded = so_far().size() - r.generated_before.size();
      std::vector<TokenStream::Event> next;
      r.stream->wait_after(decoded, std::chrono::milliseconds(100), next);
    }
    if (r.done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      json j{{"request_id", *id}, {"done", false}};
      if (tokens_after) j["token_ids"] = so_far();
      return reply(res, j, 202);
    }
    json j = completion_json(*id, r.done.get());
    j["done"] = true;
    reply(res, j);
  });

  server.Post("/kv/release", [this](const httplib::Request& req, httplib::Response& res) {
    if (scheduler_ == nullptr)
      return reply_error(res, 409, "only stage 0 holds requests: release them there");
    auto body = object_body(req);
    if (!body) return reply_error(res, 400, body.error());
    auto id = field<std::uint64_t>(*body, "request_id");
    if (!id) return reply_error(res, 400, id.error());
    std::string to;
    if (body->contains("to")) {
      auto t = field<std::string>(*body, "to");
      if (!t || !t->starts_with("http://") || t->size() > 256)
        return reply_error(res, 400, "\"to\" must be the full worker's http://host:port");
      to = *t;
    }
    if (auto r = scheduler_->release(*id, to); !r)
      return reply_error(res, scheduler_->paused() ? 404 : 409, r.error());
    engine_.timeline().mark("kv_released", {{"request_id", *id}});
    reply(res, {{"released", *id}});
  });
}

int serve_stage(Engine& engine, const ServeOptions& options) {
  httplib::Server server;
  server.set_payload_max_length(kKvMaxBodyBytes + kKvHeaderBytes);
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  KvTransfer kv(engine, nullptr);
  kv.add_routes(server);
  if (!server.bind_to_port(options.host, options.port)) {
    fmt::print(stderr, "refengine: cannot listen on {}:{}\n", options.host, options.port);
    return 1;
  }
  std::thread http([&] { server.listen_after_bind(); });
  engine.timeline().mark("serving", {{"host", options.host}, {"port", options.port}});
  fmt::print(stderr, "refengine: pipeline stage {} serving /health and /kv on http://{}:{}\n",
             engine.options().pipeline.rank, options.host, options.port);
  int status = 0;
  try {
    engine.run_worker();
  } catch (const std::exception& e) {
    fmt::print(stderr, "refengine: error: {}\n", e.what());
    status = 1;
  }
  server.stop();
  http.join();
  return status;
}

}  // namespace refengine
