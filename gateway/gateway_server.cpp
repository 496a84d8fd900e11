#include "gateway/gateway_server.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "gateway/connection_pool.hpp"

namespace thaw::gateway {
namespace {

using json = nlohmann::json;

// cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
// library): a burst of new connections overflows it, the kernel drops their SYNs and clients
// resend them a second later (300 connects at once: median 1.02 s with it, 0 ms widened). A
// second listen() on the bound socket widens the queue; the socket is a protected member.
template <class Base>
class WideBacklogServer final : public Base {
 public:
  using Base::Base;
  bool widen_backlog() { return ::listen(this->svr_sock_, SOMAXCONN) == 0; }
};

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code) {
  res.status = status;
  res.set_content(error_body(message, type, code), "application/json");
}

std::pair<std::string, int> split_url(const std::string& url) {
  // http://host:port (what the codec and the --route parser admit)
  std::string rest = url.substr(url.find("://") + 3);
  if (auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, 80};
  return {rest.substr(0, colon), std::atoi(rest.c_str() + colon + 1)};
}

std::unique_ptr<httplib::Client> upstream_client(const std::string& url, const GatewayOptions& o) {
  auto [host, port] = split_url(url);
  auto client = std::make_unique<httplib::Client>(host, port);
  client->set_connection_timeout(o.upstream_connect_timeout);
  client->set_read_timeout(o.upstream_timeout);
  client->set_write_timeout(o.upstream_timeout);
  client->set_keep_alive(false);
  return client;
}

// The events of a whole (non-streamed) completion, for a client that asked for a stream: one
// event per choice with its text and tokens, then [DONE] — what a streaming engine would send,
// only all at once.
std::string events_from_completion(const std::string& body) {
  json whole = json::parse(body, nullptr, false);
  if (whole.is_discarded() || !whole.is_object() || !whole.contains("choices") ||
      !whole["choices"].is_array()) {
    return fmt::format("data: {}\n\ndata: [DONE]\n\n",
                       error_body("the worker's answer is not a completion", "upstream_error",
                                  "bad_upstream_answer"));
  }
  std::string out;
  for (const json& choice : whole["choices"]) {
    json event{{"id", whole.value("id", "")},
               {"object", "text_completion"},
               {"created", whole.value("created", 0)},
               {"model", whole.value("model", "")},
               {"choices", json::array({choice})}};
    out += "data: " + event.dump() + "\n\n";
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type,
                       const std::string& code) {
  return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}}
      .dump();
}

bool nesting_exceeds(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

GatewayServer::GatewayServer(GatewayOptions options, Router& router, ControlPlane& control)
    : options_(std::move(options)), router_(router), control_(control) {}

std::expected<std::unique_ptr<GatewayServer>, std::string> GatewayServer::start(
    GatewayOptions options, Router& router, ControlPlane& control) {
  if (options.threads == 0) return std::unexpected("--threads must be at least 1");
  if (options.max_connections < options.threads) {
    return std::unexpected(fmt::format("--max-connections ({}) must be at least --threads ({})",
                                       options.max_connections, options.threads));
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return std::unexpected("give both --tls-cert and --tls-key, or neither");
  }
  std::unique_ptr<GatewayServer> s(new GatewayServer(std::move(options), router, control));
  std::function<bool()> widen_backlog;
  if (!s->options_.tls_cert.empty()) {
    auto tls = std::make_unique<WideBacklogServer<httplib::SSLServer>>(s->options_.tls_cert.c_str(),
                                                                       s->options_.tls_key.c_str());
    widen_backlog = [p = tls.get()] { return p->widen_backlog(); };
    if (!tls->is_valid()) {
      return std::unexpected(fmt::format(
          "cannot use --tls-cert {} with --tls-key {}: unreadable, not PEM, an encrypted key, "
          "or a key that does not match the certificate",
          s->options_.tls_cert, s->options_.tls_key));
    }
    s->server_ = std::move(tls);
  } else {
    auto plain = std::make_unique<WideBacklogServer<httplib::Server>>();
    widen_backlog = [p = plain.get()] { return p->widen_backlog(); };
    s->server_ = std::move(plain);
  }
  const ConnectionPool::Limits limits{.ready = s->options_.threads,
                                      .max_connections = s->options_.max_connections,
                                      .overflow_threads = 2,
                                      .overflow_queue = s->options_.pending_connections};
  s->server_->new_task_queue = [limits] { return new ConnectionPool(limits); };
  s->server_->set_payload_max_length(s->options_.max_body_bytes);
  s->server_->set_read_timeout(s->options_.client_timeout);
  s->server_->set_write_timeout(s->options_.client_timeout);
  s->server_->set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(s->options_.keep_alive_timeout).count()));
  s->server_->set_keep_alive_max_count(
      std::max<std::size_t>(1, s->options_.keep_alive_max_requests));
  s->install_handlers();
  if (s->options_.port == 0) {
    s->port_ = s->server_->bind_to_any_port(s->options_.host);
    if (s->port_ <= 0) return std::unexpected(fmt::format("cannot listen on {}", s->options_.host));
  } else {
    if (!s->server_->bind_to_port(s->options_.host, s->options_.port)) {
      return std::unexpected(
          fmt::format("cannot listen on {}:{} (in use, or not an address of "
                      "this host?)",
                      s->options_.host, s->options_.port));
    }
    s->port_ = s->options_.port;
  }
  if (!widen_backlog()) {
    return std::unexpected(
        fmt::format("listen() on {}:{}: {}", s->options_.host, s->port_, std::strerror(errno)));
  }
  s->reporter_ = std::thread([p = s.get()] { p->report_loop(); });
  return s;
}

GatewayServer::~GatewayServer() {
  stop();
  if (reporter_.joinable()) reporter_.join();
}

void GatewayServer::run() {
  server_->listen_after_bind();
}

void GatewayServer::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.notify_all();
  router_.stop();                // held requests answer 503 at once
  if (server_) server_->stop();  // null when start() failed before making it
}

std::shared_ptr<Lease> GatewayServer::another_worker(const std::string& model,
                                                     const std::string& refused_url) {
  router_.mark_unreachable(refused_url, options_.unreachable_pause);
  // Not held again: a request that already waited for a worker fails now rather than twice.
  auto lease = router_.acquire(model, std::chrono::steady_clock::now());
  if (!lease || (*lease)->url() == refused_url) return nullptr;
  return std::move(*lease);
}

void GatewayServer::report_loop() {
  std::unique_lock lock(mutex_);
  while (!stop_cv_.wait_for(lock, options_.report_interval, [&] { return stopping_; })) {
    lock.unlock();
    control_.report_load(router_.take_window(std::chrono::steady_clock::now()));
    lock.lock();
  }
}

void GatewayServer::install_handlers() {
  httplib::Server& server = *server_;
  // Bodies httplib refuses itself (413, 400 on a bad request line) or paths nobody serves get
  // the same JSON errors as the handlers' own.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, 404, fmt::format("no such endpoint: {} {}", req.method, req.path),
                 "invalid_request_error", "not_found");
    } else if (res.status == 413) {
      send_error(res, 413, "the request body is over the gateway's limit (--max-body)",
                 "invalid_request_error", "request_too_large");
    } else if (res.status == 400) {
      send_error(res, 400,
                 "the request could not be read: malformed HTTP, or a chunked body over the "
                 "gateway's limit (--max-body)",
                 "invalid_request_error", "bad_request");
    } else {
      send_error(res, res.status, fmt::format("HTTP {}", res.status), "invalid_request_error",
                 "bad_request");
    }
  });
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                  std::exception_ptr e) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
    send_error(res, 500, fmt::format("the gateway failed: {}", what), "server_error", "internal");
  });

  // cpp-httplib 0.11 reads a chunked request body to its end whatever its size
  // (set_payload_max_length bounds only a Content-Length body): such bodies are refused before
  // the server reads them. OpenAI clients send Content-Length.
  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A connection past --max-connections: 503 at once, and closed.
    if (ConnectionPool::over_limit()) {
      res.set_header("Retry-After", std::to_string(options_.retry_after_s));
      res.set_header("Connection", "close");
      send_error(res, 503,
                 fmt::format("the gateway is serving its limit of {} connections "
                             "(--max-connections); try again shortly",
                             options_.max_connections),
                 "server_error", "too_many_connections");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_keys && req.path != "/health" && req.path != "/ready" &&
        !options_.api_keys->accepts(req.get_header_value("Authorization"))) {
      res.set_header("WWW-Authenticate", "Bearer");
      // The body is not read: the connection cannot carry another request (its bytes would
      // be taken for one), so the client is told to close it.
      res.set_header("Connection", "close");
      send_error(res, 401,
                 req.has_header("Authorization")
                     ? "incorrect API key: send Authorization: Bearer KEY with a key of this "
                       "gateway's --api-key-file"
                     : "this gateway needs an API key: send Authorization: Bearer KEY",
                 "invalid_request_error", "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.get_header_value("Transfer-Encoding").find("chunked") == std::string::npos) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("Connection", "close");  // the body is not read (as for a 401)
    send_error(res, 411,
               "chunked request bodies are not accepted: send the body with a Content-Length",
               "invalid_request_error", "length_required");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    if (router_.has_table()) {
      res.set_content(R"({"status":"ready"})", "application/json");
    } else {
      send_error(res, 503, "no route table yet (is the coordinator reachable?)", "server_error",
                 "not_ready");
      res.set_header("Retry-After", std::to_string(options_.retry_after_s));
    }
  });
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const std::string& m : router_.models()) {
      data.push_back({{"id", m}, {"object", "model"}, {"created", 0}, {"owned_by", "thaw"}});
    }
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });
  server.Get("/gateway/routes", [this](const httplib::Request&, httplib::Response& res) {
    json out = json::object();
    for (const auto& [model, workers] : router_.routes()) {
      json list = json::array();
      for (const WorkerRoute& w : workers) {
        list.push_back({{"url", w.url},
                        {"state", to_string(w.state)},
                        {"plan", w.plan_id},
                        {"stage", w.stage},
                        {"node", w.node_id},
                        {"outstanding", router_.outstanding(w.url)}});
      }
      out[model] = list;
    }
    res.set_content(out.dump(), "application/json");
  });

  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (nesting_exceeds(req.body, 64)) {
      return send_error(res, 400, "the request body nests deeper than 64 levels",
                        "invalid_request_error", "invalid_json");
    }
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      return send_error(res, 400, "the request body is not JSON", "invalid_request_error",
                        "invalid_json");
    }
    if (!body.is_object()) {
      return send_error(res, 400, "the request body must be a JSON object", "invalid_request_error",
                        "invalid_json");
    }
    if (!body.contains("model") || !body["model"].is_string() ||
        body["model"].get_ref<const std::string&>().empty()) {
      return send_error(res, 400, "the request needs \"model\": the name of a deployed model",
                        "invalid_request_error", "missing_model");
    }
    bool stream = false;
    if (body.contains("stream")) {
      if (!body["stream"].is_boolean()) {
        return send_error(res, 400, "\"stream\" must be true or false", "invalid_request_error",
                          "invalid_stream");
      }
      stream = body["stream"].get<bool>();
    }
    const std::string model = body["model"].get<std::string>();
    auto in_flight = std::make_shared<Router::InFlight>(router_, model);
    auto lease = router_.acquire(model);
    if (!lease) {
      switch (lease.error().kind) {
        case RouteError::Kind::unknown_model:
          return send_error(res, 404, lease.error().message, "invalid_request_error",
                            "model_not_found");
        case RouteError::Kind::queue_full:
        case RouteError::Kind::deadline:
        case RouteError::Kind::stopping:
        case RouteError::Kind::cold_start_refused:
          res.set_header("Retry-After", std::to_string(options_.retry_after_s));
          return send_error(res, 503, lease.error().message, "server_error",
                            lease.error().kind == RouteError::Kind::queue_full ? "queue_full"
                            : lease.error().kind == RouteError::Kind::cold_start_refused
                                ? "cold_start_refused"
                                : "model_not_ready");
      }
    }
    std::shared_ptr<Lease> worker = std::move(*lease);
    if (!stream) {
      std::string answer;
      int status = 0;
      std::string content_type = "application/json";
      bool too_big = false;
      httplib::Error error = httplib::Error::Success;
      bool ok = false;
      bool resent = false;
      for (int attempt = 0; attempt < 3; ++attempt) {
        auto client = upstream_client(worker->url(), options_);
        answer.clear();
        status = 0;
        httplib::Request up;
        up.method = "POST";
        up.path = "/v1/completions";
        up.body = req.body;
        up.set_header("Content-Type", "application/json");
        up.response_handler = [&](const httplib::Response& r) {
          status = r.status;
          if (r.has_header("Content-Type")) content_type = r.get_header_value("Content-Type");
          return true;
        };
        up.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
          if (answer.size() + n > options_.max_upstream_bytes) {
            too_big = true;
            return false;
          }
          answer.append(data, n);
          return true;
        };
        httplib::Response up_res;
        ok = client->send(up, up_res, error);
        if (ok || too_big) break;
        // A refused connection sent nothing: another worker may take the request.
        if (error == httplib::Error::Connection) {
          if (auto other = another_worker(model, worker->url())) {
            worker = std::move(other);
            continue;
          }
          break;
        }
        // The worker took the request and failed before answering (it crashed: a pipeline
        // stage dying mid-migration, say). The client has seen nothing, so the request is sent
        // again from its prompt to a serving worker — held for one if need be — once: the
        // client gets one answer (greedy decoding gives the same tokens).
        if (resent) break;
        resent = true;
        router_.mark_unreachable(worker->url(), options_.unreachable_pause);
        auto again = router_.acquire(model);
        if (!again) break;
        worker = std::move(*again);
      }
      if (too_big) {
        return send_error(
            res, 502,
            fmt::format("the worker's answer is over {} bytes", options_.max_upstream_bytes),
            "upstream_error", "upstream_too_large");
      }
      if (!ok) {
        return send_error(
            res, 502,
            fmt::format("worker {} did not answer: {}", worker->url(), httplib::to_string(error)),
            "upstream_error", "upstream_unavailable");
      }
      res.status = status;
      res.set_content(answer, content_type);
      return;
    }
    // Streaming: the worker's events are relayed one by one as they arrive (whole events
    // only, so an error event never lands inside a half-written one). The lease and the
    // in-flight count live as long as the provider (until the last event is written).
    const GatewayOptions options = options_;
    const std::string request_body = req.body;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, worker, in_flight, options,
                                                           request_body,
                                                           model](std::size_t,
                                                                  httplib::DataSink& sink) mutable {
      bool resent = false;
      for (int attempt = 0;; ++attempt) {
        auto client = upstream_client(worker->url(), options);
        int status = 0;
        bool relay = false;  // the worker streams: its events go through as they come
        bool client_gone = false;
        std::size_t relayed = 0;  // events written to the client
        std::string partial;      // the worker's bytes after its last whole event
        std::string whole;
        httplib::Request up;
        up.method = "POST";
        up.path = "/v1/completions";
        up.body = request_body;
        up.set_header("Content-Type", "application/json");
        up.set_header("Accept", "text/event-stream");
        up.response_handler = [&](const httplib::Response& r) {
          status = r.status;
          relay =
              status == 200 && r.get_header_value("Content-Type").starts_with("text/event-stream");
          return true;
        };
        up.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
          if (!relay) {
            if (whole.size() + n > options.max_upstream_bytes) return false;
            whole.append(data, n);
            return true;
          }
          partial.append(data, n);
          std::size_t end = 0;
          for (std::size_t at; (at = partial.find("\n\n", end)) != std::string::npos;) {
            end = at + 2;
          }
          if (end > 0) {
            if (!sink.write(partial.data(), end)) {
              client_gone = true;  // a slow or gone client: stop reading the worker
              return false;
            }
            ++relayed;
            partial.erase(0, end);
          }
          // An event is small (one token); a worker sending megabytes without a blank line is
          // not speaking SSE.
          return partial.size() <= options.max_upstream_bytes;
        };
        httplib::Response up_res;
        httplib::Error error = httplib::Error::Success;
        const bool ok = client->send(up, up_res, error);
        if (client_gone) return false;
        if (!ok && relayed == 0) {
          // Nothing reached the client yet: the request may go to another worker, as a
          // non-streamed one would. A refused connection sent nothing (another worker at
          // once); a worker that took the request and failed (crashed) is retried once.
          if (error == httplib::Error::Connection && attempt == 0) {
            if (auto other = another_worker(model, worker->url())) {
              worker = std::move(other);
              continue;
            }
          }
          if (!resent && error != httplib::Error::Connection) {
            resent = true;
            router_.mark_unreachable(worker->url(), options.unreachable_pause);
            if (auto again = router_.acquire(model)) {
              worker = std::move(*again);
              continue;
            }
          }
        }
        std::string tail;
        if (!ok && relayed == 0) {
          tail = fmt::format("data: {}\n\ndata: [DONE]\n\n",
                             error_body(fmt::format("worker {} did not answer: {}", worker->url(),
                                                    httplib::to_string(error)),
                                        "upstream_error", "upstream_unavailable"));
        } else if (!ok) {
          // Tokens went out: a retry would repeat them. The client sees this event and no
          // [DONE] (docs/GATEWAY.md).
          tail = fmt::format("data: {}\n\n",
                             error_body(fmt::format("worker {} stopped mid-stream: {}",
                                                    worker->url(), httplib::to_string(error)),
                                        "upstream_error", "upstream_interrupted"));
        } else if (!relay && status != 200) {
          json err = json::parse(whole, nullptr, false);
          tail = fmt::format("data: {}\n\ndata: [DONE]\n\n",
                             err.is_object() && err.contains("error")
                                 ? err.dump()
                                 : error_body(fmt::format("the worker answered HTTP {}", status),
                                              "upstream_error", "upstream_status"));
        } else if (!relay) {
          tail = events_from_completion(whole);
        } else {
          tail = partial;  // a worker's last event without its blank line
        }
        if (!tail.empty() && !sink.write(tail.data(), tail.size())) return false;
        sink.done();
        return true;
      }
    });
  });
}

}  // namespace thaw::gateway
