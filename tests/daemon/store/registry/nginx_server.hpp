// A real nginx for the suites: started as a foreground single process
// (`daemon off; master_process off;`) with a generated config, its own prefix, pid file
// and logs, listening on 127.0.0.1 at a free port, serving `root` with autoindex JSON and
// keep-alive. stop() kills it (SIGTERM: connections drop mid-transfer); start() brings it
// back on the same port.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace thaw::store::testing {

struct NginxOptions {
  std::filesystem::path root;
  std::string server_extra;  // directives inside server { } (locations, limit_rate, …)
};

class NginxServer {
 public:
  explicit NginxServer(NginxOptions options);  // starts it; throws if it cannot
  ~NginxServer();
  NginxServer(const NginxServer&) = delete;
  NginxServer& operator=(const NginxServer&) = delete;

  void start();
  void stop();
  bool running() const { return pid_ > 0; }

  std::uint16_t port() const { return port_; }
  std::string base_url() const;  // http://127.0.0.1:<port>

  // access.log lines: "<method> <uri> "<Range header>" <status> <body bytes sent>", once
  // every request nginx has taken so far is in it (nginx logs after answering; a client can
  // be faster than that). Requests to kStatusPath are not logged.
  std::vector<std::string> access_log() const;

  // nginx's stub_status, which access_log() asks how many requests it has taken.
  static constexpr const char* kStatusPath = "/.thaw-test-nginx-status";

 private:
  void write_config() const;
  bool try_start();  // false if nginx exited at once (e.g. port taken)
  std::vector<std::string> read_access_log() const;

  NginxOptions options_;
  TempDir dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
  std::size_t log_lines_at_start_ = 0;        // the log outlives a restart, nginx's count does not
  mutable std::uint64_t status_queries_ = 0;  // since this start: counted by nginx, not logged
};

// A port nobody listens on right now.
std::uint16_t free_loopback_port();

}  // namespace thaw::store::testing
