#include "fault_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace thaw::store::testing {

namespace {

bool send_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<std::uint64_t> number(std::string_view text) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

FaultServer::FaultServer(std::vector<std::byte> content) : content_(std::move(content)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("fault server: cannot listen");
  }
  port_ = ntohs(addr.sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  acceptor_ = std::thread([this] { accept_loop(); });
}

FaultServer::~FaultServer() {
  std::uint64_t one = 1;
  (void)::write(stop_fd_, &one, sizeof one);
  acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mutex_);
    workers.swap(workers_);
  }
  for (auto& worker : workers) worker.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

std::string FaultServer::url(const std::string& path) const {
  return fmt::format("http://127.0.0.1:{}{}", port_, path);
}

void FaultServer::push(ServerFault fault) {
  std::lock_guard lock(mutex_);
  faults_.push_back(fault);
}

void FaultServer::set_fallback(ServerFault fault) {
  std::lock_guard lock(mutex_);
  fallback_ = fault;
}

std::vector<ServedRequest> FaultServer::requests() const {
  std::lock_guard lock(mutex_);
  return requests_;
}

ServerFault FaultServer::next_fault() {
  std::lock_guard lock(mutex_);
  if (faults_.empty()) return fallback_;
  ServerFault fault = faults_.front();
  faults_.pop_front();
  return fault;
}

std::size_t FaultServer::record(ServedRequest request) {
  std::lock_guard lock(mutex_);
  requests_.push_back(std::move(request));
  return requests_.size() - 1;
}

void FaultServer::correct_body_bytes(std::size_t index, std::uint64_t sent) {
  std::lock_guard lock(mutex_);
  requests_[index].body_bytes_sent = sent;
}

bool FaultServer::wait_readable(int fd) const {
  pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (fds[1].revents != 0) return false;
    return fds[0].revents != 0;
  }
}

void FaultServer::accept_loop() {
  for (;;) {
    if (!wait_readable(listen_fd_)) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ++connections_;
    std::lock_guard lock(mutex_);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void FaultServer::serve(int fd) {
  std::string buffer;
  bool keep_open = true;
  while (keep_open) {
    // Read one request head.
    std::size_t head_end;
    while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
      if (!wait_readable(fd)) {
        ::close(fd);
        return;
      }
      char chunk[4096];
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) {
        ::close(fd);
        return;
      }
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
    std::string head = buffer.substr(0, head_end);
    buffer.erase(0, head_end + 4);

    ServedRequest request;
    std::size_t sp1 = head.find(' ');
    std::size_t sp2 = head.find(' ', sp1 + 1);
    std::string method = head.substr(0, sp1);
    request.path = head.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string lower = head;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (std::size_t at = lower.find("\r\nrange: bytes="); at != std::string::npos) {
      std::size_t start = at + 15;
      std::size_t end = head.find("\r\n", start);
      std::string spec = head.substr(start, end == std::string::npos ? end : end - start);
      std::size_t dash = spec.find('-');
      request.range_first = number(spec.substr(0, dash));
      if (dash + 1 < spec.size()) request.range_last = number(spec.substr(dash + 1));
    }
    const std::uint64_t size = content_.size();
    ServerFault fault = next_fault();
    request.fault = fault.kind;

    // Every request is recorded before the first byte of its answer leaves: a client that
    // has its answer may finish (and its test read requests()) at once, so a record made
    // after the send could be missing then.
    if (fault.kind == ServerFault::Kind::status) {
      std::string body = fmt::format("status {}\n", fault.status);
      std::string answer = fmt::format("HTTP/1.1 {} Injected\r\nContent-Length: {}\r\n\r\n{}",
                                       fault.status, body.size(), body);
      record(std::move(request));
      keep_open = send_all(fd, answer.data(), answer.size());
      continue;
    }
    std::uint64_t first = 0;
    std::uint64_t last = size - 1;
    bool partial = request.range_first.has_value() && fault.kind != ServerFault::Kind::ignore_range;
    if (partial) {
      first = *request.range_first;
      last = std::min(request.range_last.value_or(size - 1), size - 1);
      if (first >= size || last < first) {
        std::string answer = fmt::format(
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{}\r\n"
            "Content-Length: 0\r\n\r\n",
            size);
        record(std::move(request));
        keep_open = send_all(fd, answer.data(), answer.size());
        continue;
      }
      if (fault.kind == ServerFault::Kind::short_206) {
        last = std::min(last, first + std::max<std::uint64_t>(fault.after, 1) - 1);
      }
    }
    const std::uint64_t length = last - first + 1;
    std::string answer =
        partial ? fmt::format(
                      "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {}-{}/{}\r\n"
                      "Content-Length: {}\r\n\r\n",
                      first, last, size, length)
                : fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", length);
    std::uint64_t to_send = method == "HEAD" ? 0 : length;
    bool cut = fault.kind == ServerFault::Kind::reset_after ||
               fault.kind == ServerFault::Kind::close_after ||
               fault.kind == ServerFault::Kind::stall_after;
    if (cut) to_send = std::min(to_send, fault.after);
    request.body_bytes_sent = to_send;  // corrected below if the send fails
    const std::size_t index = record(std::move(request));
    if (!send_all(fd, answer.data(), answer.size())) {
      correct_body_bytes(index, 0);
      break;
    }
    if (method == "HEAD") continue;
    bool sent = send_all(fd, content_.data() + first, static_cast<std::size_t>(to_send));
    if (!sent) {
      correct_body_bytes(index, 0);
      break;
    }
    if (fault.kind == ServerFault::Kind::reset_after) {
      linger hard{1, 0};  // close() then sends RST instead of FIN
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
      break;
    }
    if (fault.kind == ServerFault::Kind::close_after) {
      ::shutdown(fd, SHUT_RDWR);
      break;
    }
    if (fault.kind == ServerFault::Kind::stall_after) {
      // Hold the connection silent until the client gives up on it (or we stop).
      char sink[4096];
      while (wait_readable(fd) && ::recv(fd, sink, sizeof sink, 0) > 0) {
      }
      break;
    }
  }
  ::close(fd);
}

}  // namespace thaw::store::testing
