#include "nginx_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace thaw::store::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::uint16_t free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

bool accepts_connections(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// How many requests nginx has taken since it started (stub_status's "requests"; this query
// included), or nullopt if it does not answer.
std::optional<std::uint64_t> requests_taken(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string reply;
  const std::string query =
      fmt::format("GET {} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", NginxServer::kStatusPath);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, query.data(), query.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(query.size())) {
    char buf[1024];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, n);
  }
  ::close(fd);
  // "...\nserver accepts handled requests\n A H R \n..."
  const auto at = reply.find("requests\n");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream numbers(reply.substr(at + 9));
  std::uint64_t accepted = 0, handled = 0, requests = 0;
  if (!(numbers >> accepted >> handled >> requests)) return std::nullopt;
  return requests;
}

}  // namespace

NginxServer::NginxServer(NginxOptions options) : options_(std::move(options)) {
  fs::create_directories(dir_.path() / "tmp");
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = free_loopback_port();
    write_config();
    if (try_start()) return;
  }
  throw std::runtime_error("nginx did not start; see " + (dir_.path() / "error.log").string());
}

NginxServer::~NginxServer() {
  stop();
}

std::string NginxServer::base_url() const {
  return fmt::format("http://127.0.0.1:{}", port_);
}

void NginxServer::write_config() const {
  const std::string dir = dir_.path().string();
  std::ofstream conf(dir_.path() / "nginx.conf");
  conf << fmt::format(R"(
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  types {{ application/json json; }}
  default_type application/octet-stream;
  log_format thaw '$request_method $uri "$http_range" $status $body_bytes_sent';
  access_log {dir}/access.log thaw;
  client_body_temp_path {dir}/tmp/body;
  proxy_temp_path {dir}/tmp/proxy;
  fastcgi_temp_path {dir}/tmp/fastcgi;
  uwsgi_temp_path {dir}/tmp/uwsgi;
  scgi_temp_path {dir}/tmp/scgi;
  keepalive_timeout 60s;
  keepalive_requests 100000;
  sendfile on;
  server {{
    listen 127.0.0.1:{port};
    root {root};
    location / {{
      autoindex on;
      autoindex_format json;
    }}
    location = {status} {{
      stub_status;
      access_log off;
    }}
    {extra}
  }}
}}
)",
                      fmt::arg("dir", dir), fmt::arg("port", port_),
                      fmt::arg("root", options_.root.string()), fmt::arg("status", kStatusPath),
                      fmt::arg("extra", options_.server_extra));
}

void NginxServer::start() {
  if (running()) return;
  // The port stays ours: nginx listens with SO_REUSEADDR, so a restart can take it back
  // while old connections linger in TIME_WAIT.
  if (!try_start()) {
    throw std::runtime_error("nginx did not restart; see " + (dir_.path() / "error.log").string());
  }
}

bool NginxServer::try_start() {
  const std::string conf = (dir_.path() / "nginx.conf").string();
  const std::string prefix = dir_.path().string() + "/";
  const std::string error_log = (dir_.path() / "error.log").string();
  std::vector<std::string> args = {"/usr/sbin/nginx",
                                   "-p",
                                   prefix,
                                   "-e",
                                   error_log,
                                   "-c",
                                   conf,
                                   "-g",
                                   "daemon off; master_process off;"};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // Dies with the test even if the test crashes before stop().
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      ::dup2(null_fd, 0);
      ::dup2(null_fd, 1);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  status_queries_ = 0;
  log_lines_at_start_ = read_access_log().size();
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    if (accepts_connections(port_)) return true;
    std::this_thread::sleep_for(5ms);
  }
  stop();
  return false;
}

void NginxServer::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  pid_ = -1;
}

std::vector<std::string> NginxServer::access_log() const {
  // nginx writes a request's line after it sent the answer, so a client that has its answer
  // can be quicker than the line: wait until every request nginx has taken is logged.
  if (!running()) return read_access_log();
  const auto taken = requests_taken(port_);
  if (!taken) return read_access_log();
  ++status_queries_;  // not logged (access_log off), but counted by nginx
  const std::size_t expected = log_lines_at_start_ + (*taken - status_queries_);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    auto lines = read_access_log();
    // A request still being answered (a stalled or rate-limited transfer) is logged only
    // when it ends: after the deadline, what is there is the answer.
    if (lines.size() >= expected || std::chrono::steady_clock::now() > deadline) return lines;
    std::this_thread::sleep_for(2ms);
  }
}

std::vector<std::string> NginxServer::read_access_log() const {
  std::vector<std::string> lines;
  std::ifstream in(dir_.path() / "access.log");
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace thaw::store::testing
