#include "pipeline.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace refengine {
namespace {

std::pair<std::string, std::string> split_host_port(const std::string& hp) {
  const auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size())
    throw std::runtime_error(fmt::format("--pp-peers entry '{}' is not host:port", hp));
  return {hp.substr(0, colon), hp.substr(colon + 1)};
}

addrinfo* resolve(const std::string& hp, bool passive) {
  auto [host, port] = split_host_port(hp);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); e != 0)
    throw std::runtime_error(fmt::format("pipeline peer {}: {}", hp, gai_strerror(e)));
  return res;
}

void write_all(int fd, const void* p, std::size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw std::runtime_error(
          fmt::format("pipeline: sending to the next stage failed: {}", std::strerror(errno)));
    c += w;
    n -= std::size_t(w);
  }
}

void read_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("pipeline: the previous stage closed the connection");
    if (r < 0)
      throw std::runtime_error(fmt::format("pipeline: receiving from the previous stage failed: {}",
                                           std::strerror(errno)));
    c += r;
    n -= std::size_t(r);
  }
}

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put_vec(const std::vector<T>& v) {
    put<std::uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <class T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, s_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    const auto n = get<std::uint64_t>();
    // Counted in elements first: n * sizeof(T) of a hostile n could wrap past the check.
    if (n > (s_.size() - at_) / sizeof(T)) need(s_.size() - at_ + 1);
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n != 0) std::memcpy(v.data(), s_.data() + at_, n * sizeof(T));  // data() may be null
    at_ += n * sizeof(T);
    return v;
  }

 private:
  void need(std::size_t n) {
    if (at_ + n > s_.size()) throw std::runtime_error("pipeline: malformed message (truncated)");
  }
  const std::string& s_;
  std::size_t at_ = 0;
};

constexpr std::uint32_t kMagic = 0x52455050;  // "PPER"

}  // namespace

PipelineLink::PipelineLink(const PipelineConfig& c) : config_(c) {
  if (c.size < 2) throw std::invalid_argument("PipelineLink needs at least two stages");
  if (int(c.peers.size()) != c.size)
    throw std::runtime_error(
        fmt::format("--pp-peers lists {} addresses for --pp-size {}", c.peers.size(), c.size));
  // Listen.
  addrinfo* self = resolve(c.peers[c.rank], true);
  for (addrinfo* a = self; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 4) == 0) {
      listen_fd_ = fd;
    } else {
      ::close(fd);
    }
  }
  freeaddrinfo(self);
  if (listen_fd_ < 0)
    throw std::runtime_error(fmt::format("pipeline stage {}: cannot listen on {}: {}", c.rank,
                                         c.peers[c.rank], std::strerror(errno)));
  // Connect to the next stage, retrying while it starts.
  const std::string& next = c.peers[(c.rank + 1) % c.size];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(c.connect_timeout_s);
  while (next_fd_ < 0) {
    addrinfo* peer = resolve(next, false);
    for (addrinfo* a = peer; a != nullptr && next_fd_ < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        next_fd_ = fd;
      } else {
        ::close(fd);
      }
    }
    freeaddrinfo(peer);
    if (next_fd_ >= 0) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error(
          fmt::format("pipeline stage {}: could not connect to stage {} at {} within {} s", c.rank,
                      (c.rank + 1) % c.size, next, c.connect_timeout_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  setsockopt(next_fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Accept the previous stage.
  pollfd p{listen_fd_, POLLIN, 0};
  const int left_ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count());
  if (::poll(&p, 1, std::max(left_ms, 1000)) <= 0)
    throw std::runtime_error(fmt::format("pipeline stage {}: stage {} did not connect to {}",
                                         c.rank, (c.rank + c.size - 1) % c.size, c.peers[c.rank]));
  prev_fd_ = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (prev_fd_ < 0)
    throw std::runtime_error(
        fmt::format("pipeline stage {}: accept: {}", c.rank, std::strerror(errno)));
}

PipelineLink::~PipelineLink() {
  for (int fd : {listen_fd_, next_fd_, prev_fd_})
    if (fd >= 0) ::close(fd);
}

void PipelineLink::send(Kind kind, const std::string& payload) {
  const std::uint32_t head[2] = {kMagic, std::uint32_t(kind)};
  const std::uint64_t len = payload.size();
  write_all(next_fd_, head, sizeof head);
  write_all(next_fd_, &len, sizeof len);
  write_all(next_fd_, payload.data(), payload.size());
}

int PipelineLink::agree_num_blocks(int own_blocks, const std::string& signature) {
  auto hello = [&](int blocks) {
    Writer w;
    w.put<std::int32_t>(blocks);
    w.put_vec(std::vector<char>(signature.begin(), signature.end()));
    send(Kind::kHello, w.out);
  };
  auto receive_hello = [&] {
    std::uint32_t head[2];
    std::uint64_t len = 0;
    read_all(prev_fd_, head, sizeof head);
    read_all(prev_fd_, &len, sizeof len);
    std::string payload(len, '\0');
    read_all(prev_fd_, payload.data(), len);
    if (head[0] != kMagic || head[1] != std::uint32_t(Kind::kHello))
      throw std::runtime_error("pipeline: expected the start-up handshake from the previous stage");
    Reader r(payload);
    const int blocks = r.get<std::int32_t>();
    auto sig = r.get_vec<char>();
    if (std::string(sig.begin(), sig.end()) != signature)
      throw std::runtime_error(fmt::format(
          "pipeline: the stages were started with different models or settings ('{}' vs '{}')",
          std::string(sig.begin(), sig.end()), signature));
    return blocks;
  };
  if (config_.rank == 0) {
    hello(own_blocks);
    return receive_hello();  // the minimum over the ring
  }
  const int upstream = receive_hello();
  hello(std::min(upstream, own_blocks));
  return std::min(upstream, own_blocks);
}

void PipelineLink::send_step(const StepBatch& b, const std::vector<float>& hidden) {
  Writer w;
  w.put<std::int32_t>(b.num_tokens);
  w.put<std::int32_t>(b.num_seqs);
  w.put<std::int32_t>(b.graph_size);
  w.put<std::int32_t>(b.logits_rows_mode);
  w.put<std::int32_t>(b.want_logits ? 1 : 0);
  w.put_vec(b.tokens);
  w.put_vec(b.positions);
  w.put_vec(b.slots);
  w.put_vec(b.query_seq);
  w.put_vec(b.context_lens);
  w.put_vec(b.block_tables);
  w.put_vec(b.last_rows);
  w.put_vec(hidden);
  send(Kind::kStep, w.out);
}

void PipelineLink::send_result(const StepResult& r) {
  Writer w;
  w.put_vec(r.next_tokens);
  w.put<std::int32_t>(r.logits_rows);
  w.put_vec(r.logits);
  send(Kind::kResult, w.out);
}

void PipelineLink::send_shutdown() {
  send(Kind::kShutdown, {});
}

PipelineLink::Kind PipelineLink::receive(StepBatch* b, std::vector<float>* hidden, StepResult* r) {
  std::uint32_t head[2];
  std::uint64_t len = 0;
  read_all(prev_fd_, head, sizeof head);
  if (head[0] != kMagic) throw std::runtime_error("pipeline: malformed message (bad magic)");
  read_all(prev_fd_, &len, sizeof len);
  if (len > (std::uint64_t(1) << 34)) throw std::runtime_error("pipeline: message too large");
  std::string payload(len, '\0');
  read_all(prev_fd_, payload.data(), len);
  Reader rd(payload);
  const auto kind = Kind(head[1]);
  switch (kind) {
    case Kind::kStep:
      b->num_tokens = rd.get<std::int32_t>();
      b->num_seqs = rd.get<std::int32_t>();
      b->graph_size = rd.get<std::int32_t>();
      b->logits_rows_mode = rd.get<std::int32_t>();
      b->want_logits = rd.get<std::int32_t>() != 0;
      b->tokens = rd.get_vec<std::int32_t>();
      b->positions = rd.get_vec<std::int32_t>();
      b->slots = rd.get_vec<std::int32_t>();
      b->query_seq = rd.get_vec<std::int32_t>();
      b->context_lens = rd.get_vec<std::int32_t>();
      b->block_tables = rd.get_vec<std::int32_t>();
      b->last_rows = rd.get_vec<std::int32_t>();
      *hidden = rd.get_vec<float>();
      return kind;
    case Kind::kResult:
      r->next_tokens = rd.get_vec<std::int32_t>();
      r->logits_rows = rd.get<std::int32_t>();
      r->logits = rd.get_vec<float>();
      return kind;
    case Kind::kShutdown:
      return kind;
    default:
      throw std::runtime_error(fmt::format("pipeline: unexpected message kind {}", head[1]));
  }
}

}  // namespace refengine
