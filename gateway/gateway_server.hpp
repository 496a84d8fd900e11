// GatewayServer: thaw-gateway's HTTP side (cpp-httplib), the OpenAI-compatible front door.
//
//   POST /v1/completions   routed to a serving worker of body.model (Router), proxied;
//                          "stream": true answers as server-sent events: relayed as they come
//                          when the worker streams, or made from its whole answer when it
//                          does not (the reference engine does not stream: then the first
//                          event comes with the last token)
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
// Bounded by construction: a fixed number of handler threads, a bounded accept backlog behind
// them (the acceptor blocks, the kernel's listen queue holds the rest), a body limit, read
// and write timeouts against slow clients, and a cap on a non-streaming worker answer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <expected>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

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
  std::size_t threads = 64;
  std::size_t pending_connections = 256;             // accepted, waiting for a thread
  std::chrono::milliseconds client_timeout{10'000};  // reading a request, writing an answer
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
