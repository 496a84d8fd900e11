#include "preload/daemon/daemon_client.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>

#include "common/proto/seqpacket.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

std::string socket_path() {
  const char* v = std::getenv("THAW_SOCKET");
  return v != nullptr && *v != '\0' ? v : "/run/thaw/thawd.sock";
}

// The program's name and command line: what the daemon logs and will key artifacts by.
std::string engine_name() {
  std::ifstream in("/proc/self/cmdline");
  std::string first;
  std::getline(in, first, '\0');
  const auto slash = first.rfind('/');
  return slash == std::string::npos ? first : first.substr(slash + 1);
}

class Connection {
 public:
  static Connection& get() {
    static auto* c = new Connection();  // never destroyed: used during exit
    return *c;
  }

  std::optional<proto::Received> request(proto::Message m) {
    std::lock_guard lock(mutex_);
    if (!connect_locked()) return std::nullopt;
    m.request_id = ++next_id_;
    if (auto sent = proto::send_message(fd_.get(), m); !sent) return drop_locked(sent.error());
    auto in = proto::receive_message(fd_.get());
    if (!in) return drop_locked(in.error().message);
    return std::move(*in);
  }

 private:
  bool connect_locked() {
    if (fd_) return true;
    if (given_up_) return false;
    const std::string path = socket_path();
    auto fd = proto::connect_seqpacket(path);
    if (!fd) {
      given_up_ = true;
      notice_once("no-thawd", fmt::format("thawd not reachable at {} ({}): model files stream from "
                                          "the cache's own readiness maps",
                                          path, fd.error()));
      return false;
    }
    fd_ = std::move(*fd);
    proto::Message hello;
    hello.type = proto::MessageType::hello;
    hello.request_id = ++next_id_;
    hello.body = {{"client", "thaw-preload"}, {"engine", engine_name()}, {"pid", ::getpid()}};
    auto sent = proto::send_message(fd_.get(), hello);
    auto reply = sent ? proto::receive_message(fd_.get())
                      : std::unexpected(proto::ReceiveError{proto::ReceiveErrc::io, sent.error()});
    if (!reply || reply->message.type != proto::MessageType::hello_ok) {
      const std::string why = !reply ? reply.error().message
                                     : reply->message.body.value("message", std::string("refused"));
      fd_.reset();
      given_up_ = true;
      notice_once("thawd-hello", fmt::format("thawd at {} did not accept the shim ({}); going on "
                                             "without it",
                                             path, why));
      return false;
    }
    debug("connected to thawd at {} (protocol {})", path, reply->message.body.value("protocol", 0));
    return true;
  }

  std::nullopt_t drop_locked(const std::string& why) {
    fd_.reset();
    given_up_ = true;
    notice_once("thawd-lost", "lost thawd (" + why + "); going on without it");
    return std::nullopt;
  }

  std::mutex mutex_;
  UniqueFd fd_;
  bool given_up_ = false;
  std::uint32_t next_id_ = 0;
};

}  // namespace

std::optional<UniqueFd> daemon_readiness_fd(const std::string& model_key,
                                            const std::string& relative_path) {
  proto::Message m;
  m.type = proto::MessageType::open_file;
  m.body = {{"model", model_key}, {"path", relative_path}};
  auto reply = Connection::get().request(std::move(m));
  if (!reply) return std::nullopt;
  if (reply->message.type != proto::MessageType::file || reply->fds.size() != 2) {
    debug("thawd has no {} of {}: {}", relative_path, model_key, reply->message.body.dump());
    return std::nullopt;
  }
  return std::move(reply->fds[1]);
}

}  // namespace thaw::preload
