#include "preload/thawd_client/thawd_client.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <vector>

#include "common/proto/document_fd.hpp"
#include "common/proto/seqpacket.hpp"
#include "preload/shim/shim_state.hpp"

namespace thaw::preload {

namespace {

const std::string& socket_path() {
  return config().socket_path;  // $THAW_SOCKET
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

  std::optional<proto::Received> request(proto::Message m, const std::vector<int>& fds = {}) {
    std::lock_guard lock(mutex_);
    if (!connect_locked()) return std::nullopt;
    m.request_id = ++next_id_;
    if (auto sent = proto::send_message(fd_.get(), m, fds); !sent) return drop_locked(sent.error());
    auto in = proto::receive_message(fd_.get());
    if (!in) return drop_locked(in.error().message);
    return std::move(*in);
  }

  // attach_slot (+ the layout's memfd), its page messages (+ the pages' fds), then
  // `imported` — one exchange under the lock, so no other request interleaves.
  std::optional<AttachedSlot> attach(const std::string& model) {
    std::lock_guard lock(mutex_);
    if (!connect_locked()) return std::nullopt;
    proto::Message m;
    m.type = proto::MessageType::attach_slot;
    m.request_id = ++next_id_;
    m.body = {{"model", model}};
    if (auto sent = proto::send_message(fd_.get(), m); !sent) return drop_locked(sent.error());
    auto in = proto::receive_message(fd_.get());
    if (!in) return drop_locked(in.error().message);
    if (in->message.type != proto::MessageType::slot) {
      debug("no slot of {} to attach to: {}", model, in->message.body.dump());
      return std::nullopt;
    }
    const nlohmann::json& body = in->message.body;
    AttachedSlot out;
    out.slot = body.value("slot", std::string());
    out.budget_bytes = body.value("budget_bytes", std::uint64_t{0});
    SlotGrant& g = out.grant;
    g.slot = out.slot;
    g.model = model;
    g.layout_kind = body.value("layout_kind", std::string());
    g.record_fingerprint = body.value("record_fingerprint", std::string());
    g.page_bytes = body.value("page_bytes", std::uint64_t{0});
    g.resident_bytes = body.value("resident_bytes", std::uint64_t{0});
    if (in->fds.size() == 1) {
      auto text =
          proto::read_document(in->fds[0].get(), body.value("layout_bytes", std::uint64_t{0}));
      auto rows = text ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
      if (rows.is_array()) {
        for (const auto& r : rows) {
          if (!r.is_array() || r.size() < 4 || !r[1].is_string()) continue;
          g.pieces.push_back(SlotPiece{r[0].get<std::uint64_t>(), r[1].get<std::string>(),
                                       r[2].get<std::uint64_t>(), r[3].get<std::uint64_t>()});
        }
      }
    }
    const std::uint64_t token = body.value("token", std::uint64_t{0});
    for (std::uint64_t i = 0, n = body.value("page_messages", std::uint64_t{0}); i < n; ++i) {
      auto pages = proto::receive_message(fd_.get());
      if (!pages) return drop_locked(pages.error().message);
      const nlohmann::json list = pages->message.body.value("pages", nlohmann::json::array());
      for (std::size_t k = 0; k < list.size() && k < pages->fds.size(); ++k) {
        g.pages[list[k].value("slot_offset", std::uint64_t{0})] = std::move(pages->fds[k]);
      }
    }
    proto::Message imported;
    imported.type = proto::MessageType::imported;
    imported.request_id = ++next_id_;
    imported.body = {{"slot", out.slot}, {"token", token}};
    if (auto sent = proto::send_message(fd_.get(), imported); !sent)
      return drop_locked(sent.error());
    auto ok = proto::receive_message(fd_.get());
    if (!ok) return drop_locked(ok.error().message);
    return out;
  }

  bool connected() {
    std::lock_guard lock(mutex_);
    return static_cast<bool>(fd_);
  }

  void after_fork_in_child() {
    new (&mutex_) std::mutex();  // another thread of the parent may have held it
    fd_.reset();
    given_up_ = false;
    next_id_ = 0;
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
    // (the engine's fingerprint goes with each artifact, not here)
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

namespace {

// The reply to `m`, when it is of type `want`; other replies are logged (an error names
// what thawd did not like) and give nullopt.
std::optional<proto::Received> expect_reply(proto::Message m, proto::MessageType want,
                                            const std::vector<int>& fds = {}) {
  const proto::MessageType sent = m.type;
  auto reply = Connection::get().request(std::move(m), fds);
  if (!reply) return std::nullopt;
  if (reply->message.type != want) {
    debug("thawd answered {} with {}: {}", proto::to_string(sent),
          proto::to_string(reply->message.type), reply->message.body.dump());
    return std::nullopt;
  }
  return reply;
}

}  // namespace

std::optional<std::string> daemon_get_artifact(const std::string& kind,
                                               const nlohmann::json& identity) {
  proto::Message m;
  m.type = proto::MessageType::get_artifact;
  m.body = {{"kind", kind}, {"identity", identity}};
  auto reply = expect_reply(std::move(m), proto::MessageType::artifact);
  if (!reply || reply->fds.size() != 1) return std::nullopt;
  const std::uint64_t bytes = reply->message.body.value("bytes", std::uint64_t{0});
  auto text = proto::read_document(reply->fds[0].get(), bytes);
  if (!text) return std::nullopt;
  return std::move(*text);
}

bool daemon_report_artifact(const std::string& kind, const nlohmann::json& identity,
                            const std::string& document) {
  auto memfd = proto::document_memfd("thaw-artifact", document);
  if (!memfd) return false;
  proto::Message m;
  m.type = proto::MessageType::report_artifact;
  m.body = {{"kind", kind}, {"identity", identity}, {"bytes", document.size()}};
  return expect_reply(std::move(m), proto::MessageType::ok, {memfd->get()}).has_value();
}

void daemon_report_counters(const nlohmann::json& counters) {
  if (!Connection::get().connected()) return;
  proto::Message m;
  m.type = proto::MessageType::report_counters;
  m.body = {{"counters", counters}};
  (void)expect_reply(std::move(m), proto::MessageType::ok);
}

std::optional<std::uint64_t> daemon_export_ipc(int fd, std::uint64_t bytes) {
  proto::Message m;
  m.type = proto::MessageType::export_ipc;
  m.body = {{"bytes", bytes}};
  auto reply = expect_reply(std::move(m), proto::MessageType::ok, {fd});
  if (!reply) return std::nullopt;
  auto token = reply->message.body.find("token");
  if (token == reply->message.body.end() || !token->is_number_unsigned()) return std::nullopt;
  return token->get<std::uint64_t>();
}

std::optional<UniqueFd> daemon_import_ipc(std::uint64_t token) {
  proto::Message m;
  m.type = proto::MessageType::import_ipc;
  m.body = {{"token", token}};
  auto reply = expect_reply(std::move(m), proto::MessageType::ipc);
  if (!reply || reply->fds.size() != 1) return std::nullopt;
  return std::move(reply->fds[0]);
}

std::optional<AttachedSlot> daemon_attach_slot(const std::string& model) {
  return Connection::get().attach(model);
}

std::optional<std::uint64_t> daemon_lease_memory(const std::string& gpu_uuid) {
  proto::Message m;
  m.type = proto::MessageType::lease_memory;
  m.body = {{"gpu_uuid", gpu_uuid}};
  auto reply = expect_reply(std::move(m), proto::MessageType::ok);
  if (!reply) return std::nullopt;
  auto bytes = reply->message.body.find("budget_bytes");
  if (bytes == reply->message.body.end() || !bytes->is_number_unsigned()) return std::nullopt;
  return bytes->get<std::uint64_t>();
}

void daemon_after_fork_in_child() {
  Connection::get().after_fork_in_child();
}

void daemon_free_pages(const std::string& slot, const std::vector<std::uint64_t>& offsets) {
  proto::Message m;
  m.type = proto::MessageType::free_pages;
  m.body = {{"slot", slot}, {"offsets", offsets}};
  (void)expect_reply(std::move(m), proto::MessageType::ok);
}

void daemon_release_slot(const std::string& slot, bool handback) {
  if (!Connection::get().connected()) return;
  proto::Message m;
  m.type = proto::MessageType::release;
  m.body = {{"slot", slot}, {"handback", handback}};
  (void)expect_reply(std::move(m), proto::MessageType::ok);
}

}  // namespace thaw::preload
