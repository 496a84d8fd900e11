// MetricsServer: serves GET /metrics (OpenMetrics text) on a loopback address, from its
// own thread (cpp-httplib), so a slow scraper never holds up the event loop.
#pragma once

#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace thaw::daemon {

class MetricsServer {
 public:
  // `listen`: "127.0.0.1:PORT" or "[::1]:PORT" (metrics.listen, validated by the config).
  // Returns once the server accepts connections, so destroying it at any moment after
  // (SIGTERM right after READY=1) stops it: the destructor never waits on a listener that
  // has not seen the stop.
  static std::expected<std::unique_ptr<MetricsServer>, std::string> start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace thaw::daemon
