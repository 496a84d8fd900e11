#include "daemon/metrics/metrics_server.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <charconv>
#include <chrono>

namespace thaw::daemon {

std::expected<std::unique_ptr<MetricsServer>, std::string> MetricsServer::start(
    const std::string& listen, std::function<std::string()> render) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return std::unexpected(fmt::format("metrics.listen \"{}\": expected HOST:PORT", listen));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = 0;
  const std::string port_text = listen.substr(colon + 1);
  std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  m->server_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "application/openmetrics-text; version=1.0.0; charset=utf-8");
  });
  if (!m->server_->bind_to_port(host.c_str(), port)) {
    return std::unexpected(
        fmt::format("metrics.listen {}: cannot listen there (port in use?)", listen));
  }
  auto listening_ended = std::make_shared<std::atomic<bool>>(false);
  m->thread_ = std::thread([server = m->server_.get(), listening_ended] {
    server->listen_after_bind();
    listening_ended->store(true);
  });
  // cpp-httplib's stop() does nothing until the listening thread has marked the server as
  // running, and that thread may not have been scheduled yet: a stop() in between is lost
  // and ~MetricsServer's join() waits forever (a SIGTERM right after READY=1 hung thawd).
  // So start() returns only once the server runs — or its thread already gave up — and
  // every later stop() takes effect. (httplib 0.11 has no wait_until_ready(); this is it.)
  while (!m->server_->is_running() && !listening_ended->load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace thaw::daemon
