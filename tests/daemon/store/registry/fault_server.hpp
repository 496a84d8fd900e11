// A tiny HTTP/1.1 server for fault injection: serves byte ranges of one buffer at any
// path (206 with Content-Range, keep-alive), and misbehaves on request: a status code,
// a connection reset (RST) or a clean close after K body bytes, a stall after K bytes,
// a 200 that ignores Range, or a truthful but short 206. Faults queued with push() apply
// to the next requests in order; when the queue is empty, `fallback` applies.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace thaw::store::testing {

struct ServerFault {
  enum class Kind { none, status, reset_after, close_after, stall_after, ignore_range, short_206 };
  Kind kind = Kind::none;
  int status = 503;         // Kind::status
  std::uint64_t after = 0;  // body bytes sent before the fault (short_206: bytes served)

  static ServerFault ok() { return {}; }
  static ServerFault http(int code) { return {Kind::status, code, 0}; }
  static ServerFault reset(std::uint64_t k) { return {Kind::reset_after, 0, k}; }
  static ServerFault close_early(std::uint64_t k) { return {Kind::close_after, 0, k}; }
  static ServerFault stall(std::uint64_t k) { return {Kind::stall_after, 0, k}; }
  static ServerFault whole_body() { return {Kind::ignore_range, 0, 0}; }
  static ServerFault short_range(std::uint64_t k) { return {Kind::short_206, 0, k}; }
};

struct ServedRequest {
  std::string path;
  std::optional<std::uint64_t> range_first;
  std::optional<std::uint64_t> range_last;
  ServerFault::Kind fault = ServerFault::Kind::none;
  std::uint64_t body_bytes_sent = 0;  // meant to be sent; 0 once a send failed
};

class FaultServer {
 public:
  explicit FaultServer(std::vector<std::byte> content);
  ~FaultServer();
  FaultServer(const FaultServer&) = delete;
  FaultServer& operator=(const FaultServer&) = delete;

  std::string url(const std::string& path = "/model.bin") const;
  void push(ServerFault fault);
  void set_fallback(ServerFault fault);
  std::vector<ServedRequest> requests() const;
  std::size_t connections_accepted() const { return connections_.load(); }

 private:
  void accept_loop();
  void serve(int fd);
  ServerFault next_fault();
  bool wait_readable(int fd) const;  // false when stopping or the peer is gone
  // Before the answer is sent (see serve()); returns its index for correct_body_bytes.
  std::size_t record(ServedRequest request);
  void correct_body_bytes(std::size_t index, std::uint64_t sent);

  std::vector<std::byte> content_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: readable once stopping
  std::uint16_t port_ = 0;
  std::atomic<std::size_t> connections_{0};

  mutable std::mutex mutex_;
  std::deque<ServerFault> faults_;
  ServerFault fallback_;
  std::vector<ServedRequest> requests_;
  std::vector<std::thread> workers_;
  std::thread acceptor_;
};

}  // namespace thaw::store::testing
