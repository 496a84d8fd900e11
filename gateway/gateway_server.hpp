// GatewayServer: thaw-gateway's HTTP side (cpp-httplib), the OpenAI-compatible front door.
//
//   POST /v1/completions   routed to a serving worker of body.model (Router), proxied;
//                          "stream": true answers as server-sent events: the worker's
//                          relayed event by event as they come (the reference engine sends
//                          one per token), or made from its whole answer when it does not
//                          stream. A worker failing before its first event: the request goes
//                          to another worker; after: an error event, no [DONE]
//                          (docs/GATEWAY.md, Streaming)
//   GET  /v1/models        the models the gateway routes
//   GET  /health           the process answers
//   GET  /ready            a route table is loaded (static, or the coordinator's first)
//   GET  /gateway/routes   the table with each worker's state and outstanding requests
//
// Errors are OpenAI-style bodies {"error": {"message", "type", "param", "code"}}: 400 for a
// malformed request, 404 for an unknown model or path, 413 for a body over --max-body, 503
// with Retry-After when no worker became ready within the hold deadline or the hold queue is
// full, 502 when the worker fails.
//
// Bounded by construction: at most max_connections connections served at once, each on a
// thread of its own (ConnectionPool: idle and slow connections cannot stall the others), 503
// past that, a body limit, read, write and keep-alive timeouts against slow or idle clients,
// and a cap on a non-streaming worker answer. Optional: HTTPS (tls_cert/tls_key) and bearer
// keys (api_keys: 401 with an OpenAI-style body without one).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <expected>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "gateway/api_keys.hpp"
#include "gateway/control_plane.hpp"
#include "gateway/router.hpp"

namespace httplib {
class Server;
}

namespace thaw::gateway {

struct GatewayOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() tells which)
  std::size_t max_body_bytes = 1u << 20;
  std::size_t max_upstream_bytes = 64u << 20;  // a worker's non-streaming answer
  // One thread serves one connection (cpp-httplib). `threads` are kept ready; more are
  // started as connections come, up to `max_connections`, and end after a while idle. A
  // connection past the limit is answered 503 (too_many_connections) by an overflow lane of
  // its own, `pending_connections` of them at most waiting for it (then the acceptor blocks
  // and the kernel's listen queue holds the rest).
  std::size_t threads = 64;
  std::size_t max_connections = 1024;
  std::size_t pending_connections = 256;
  std::chrono::milliseconds client_timeout{10'000};  // reading a request, writing an answer
  // How long a connection may sit without a request (before its first one too): whole
  // seconds, at least 1 (cpp-httplib's unit). Up to `keep_alive_max_requests` per connection.
  std::chrono::milliseconds keep_alive_timeout{5'000};
  std::size_t keep_alive_max_requests = 100;
  // HTTPS when both are set (PEM files; the key unencrypted), plain HTTP when neither is.
  std::string tls_cert, tls_key;
  // When set, /v1/* and /gateway/* need "Authorization: Bearer KEY" (401 otherwise);
  // /health and /ready stay open.
  std::optional<ApiKeys> api_keys;
  std::chrono::milliseconds upstream_connect_timeout{5'000};
  std::chrono::milliseconds upstream_timeout{300'000};  // a worker's answer (or its next event)
  std::chrono::milliseconds report_interval{1'000};     // load reports to the control plane
  int retry_after_s = 5;                                // Retry-After on 503
  // A worker that refused a connection is passed over this long (the request itself is
  // retried once on another worker: nothing reached the refusing one).
  std::chrono::milliseconds unreachable_pause{2'000};
};

class GatewayServer {
 public:
  static std::expected<std::unique_ptr<GatewayServer>, std::string> start(GatewayOptions options,
                                                                          Router& router,
                                                                          ControlPlane& control);
  ~GatewayServer();
  GatewayServer(const GatewayServer&) = delete;
  GatewayServer& operator=(const GatewayServer&) = delete;

  // Serves until stop() (from any thread, e.g. a signal watcher).
  void run();
  void stop();
  int port() const { return port_; }

 private:
  GatewayServer(GatewayOptions options, Router& router, ControlPlane& control);
  void install_handlers();
  void report_loop();
  // After `refused_url` refused a connection: a lease on another serving worker of `model`,
  // or null.
  std::shared_ptr<Lease> another_worker(const std::string& model, const std::string& refused_url);

  GatewayOptions options_;
  Router& router_;
  ControlPlane& control_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread reporter_;
};

// An OpenAI-style error body.
std::string error_body(const std::string& message, const std::string& type,
                       const std::string& code);

// Whether `text` nests arrays/objects deeper than `limit` (checked before parsing: a body of
// a million '[' must not reach the parser). Strings are skipped.
bool nesting_exceeds(std::string_view text, int limit);

}  // namespace thaw::gateway
