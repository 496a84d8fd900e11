#include "daemon/shim_socket/shim_server.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "common/proto/document_fd.hpp"
#include "daemon/log/log.hpp"

namespace thaw::daemon {

namespace {

using proto::Message;
using proto::MessageType;

std::string errno_text(std::string_view what) {
  return fmt::format("{}: {}", what, std::strerror(errno));
}

// Whether a live process answers on `path` (then it is not ours to replace).
bool someone_listens(const std::filesystem::path& path) {
  auto fd = proto::connect_seqpacket(path.string());
  return fd.has_value();
}

// Makes room for the listening socket at `path`. Only a socket nobody answers on (left by a
// thawd that crashed) is removed: a mistyped shim.socket naming a regular file, a directory
// or a symlink must never cost anyone that file.
std::expected<void, std::string> clear_stale_socket(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return std::unexpected(errno_text(fmt::format("shim.socket {}", path.string())));
  }
  if (!S_ISSOCK(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)   ? "a directory"
                       : S_ISLNK(st.st_mode) ? "a symbolic link"
                       : S_ISREG(st.st_mode) ? "a regular file"
                                             : "not a socket";
    return std::unexpected(
        fmt::format("shim.socket {}: is {}, not a socket; thawd replaces only a stale socket "
                    "it left behind — move that away or set shim.socket to a new path",
                    path.string(), what));
  }
  if (someone_listens(path)) {
    return std::unexpected(fmt::format(
        "shim.socket {}: another process (a second thawd?) is listening on it", path.string()));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return std::unexpected(
        errno_text(fmt::format("shim.socket {}: removing the stale socket", path.string())));
  }
  return {};
}

PeerIdentity peer_of(int fd) {
  PeerIdentity peer;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  }
  std::vector<gid_t> groups(64);
  len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  int r = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len);
  if (r != 0 && errno == ERANGE) {
    groups.resize(len / sizeof(gid_t));
    r = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len);
  }
  if (r == 0) {
    groups.resize(len / sizeof(gid_t));
    peer.groups = std::move(groups);
  }
  return peer;
}

// A string field of a request body; nullopt when missing or not a string.
std::optional<std::string> text_field(const nlohmann::json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

std::expected<std::unique_ptr<ShimServer>, std::string> ShimServer::start(
    const std::filesystem::path& socket_path, NodeService& service, ArtifactStore& artifacts,
    const AccessPolicy& access, std::string node_id, sd_event* event) {
  std::unique_ptr<ShimServer> s(new ShimServer(service, artifacts, access, std::move(node_id)));
  s->event_ = event;
  std::error_code ec;
  std::filesystem::create_directories(socket_path.parent_path(), ec);
  if (ec) {
    return std::unexpected(fmt::format("shim.socket {}: cannot create its directory: {}",
                                       socket_path.string(), ec.message()));
  }
  if (auto ok = clear_stale_socket(socket_path); !ok) return std::unexpected(ok.error());
  s->listener_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listener_) return std::unexpected(errno_text("shim socket"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.size() >= sizeof(addr.sun_path)) {
    return std::unexpected(fmt::format("shim.socket {}: longer than a socket path may be ({})",
                                       path, sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::bind(s->listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return std::unexpected(errno_text(fmt::format("shim.socket {}: bind", path)));
  }
  s->path_ = socket_path;
  if (struct stat st{}; ::lstat(path.c_str(), &st) == 0) s->inode_ = {st.st_dev, st.st_ino};
  ::chmod(path.c_str(), 0666);
  if (::listen(s->listener_.get(), 128) != 0) {
    return std::unexpected(errno_text(fmt::format("shim.socket {}: listen", path)));
  }
  if (int r = sd_event_add_io(event, &s->accept_source_, s->listener_.get(), EPOLLIN,
                              &ShimServer::on_accept, s.get());
      r < 0) {
    return std::unexpected(fmt::format("shim socket: event loop: {}", std::strerror(-r)));
  }
  return s;
}

ShimServer::~ShimServer() {
  if (accept_source_ != nullptr) sd_event_source_disable_unref(accept_source_);
  while (!connections_.empty()) close_connection(connections_.begin()->first, "thawd stopping");
  // Only the socket this thawd bound: whatever replaced it since is someone else's.
  struct stat st {};
  if (!path_.empty() && ::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      std::pair{st.st_dev, st.st_ino} == inode_) {
    ::unlink(path_.c_str());
  }
}

int ShimServer::on_accept(sd_event_source*, int fd, uint32_t, void* self) {
  auto* s = static_cast<ShimServer*>(self);
  for (;;) {
    const int client = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        log(LogLevel::warning, errno_text("shim socket: accept"));
      }
      return 0;
    }
    auto c = std::make_unique<Connection>();
    c->id = s->next_id_++;
    c->fd.reset(client);
    c->peer = peer_of(client);
    c->owner = fmt::format("pid {} (connection {})", c->peer.pid, c->id);
    if (s->connections_.size() >= kMaxConnections) {
      // Told why (request id 0: it has asked nothing yet), then closed with `c`.
      s->counters_.connections_dropped.fetch_add(1);
      Message refusal;
      refusal.type = MessageType::error;
      refusal.body = {{"name", error_name::kLimit},
                      {"message", fmt::format("thawd serves at most {} shim connections at "
                                              "once; retry once engines have exited",
                                              kMaxConnections)}};
      (void)proto::send_message(client, refusal);
      if (!s->at_connection_limit_) {
        log(LogLevel::warning, fmt::format("shim socket: {} connections, the limit; refusing "
                                           "new ones until some close",
                                           kMaxConnections));
      }
      s->at_connection_limit_ = true;
      continue;
    }
    s->at_connection_limit_ = false;
    s->limit_ungreeted();
    if (sd_event_add_io(s->event_, &c->source, client, EPOLLIN, &ShimServer::on_readable, s) < 0) {
      continue;  // closes `client`
    }
    sd_event_source_set_description(c->source, "shim-connection");
    // Until the hello: a connection that never says it is held for kHelloDeadlineUsec only.
    if (sd_event_add_time_relative(s->event_, &c->hello_deadline, CLOCK_MONOTONIC,
                                   kHelloDeadlineUsec, 0, &ShimServer::on_hello_deadline, s) < 0) {
      sd_event_source_disable_unref(c->source);
      continue;
    }
    s->counters_.connections_accepted.fetch_add(1);
    s->connections_[c->id] = std::move(c);
  }
}

int ShimServer::on_readable(sd_event_source* source, int fd, uint32_t events, void* self) {
  auto* s = static_cast<ShimServer*>(self);
  Connection* c = nullptr;
  for (auto& [id, conn] : s->connections_) {
    if (conn->source == source) c = conn.get();
  }
  if (c == nullptr) return 0;
  (void)events;
  auto in = proto::receive_message(fd);
  if (!in) {
    if (in.error().code == proto::ReceiveErrc::io && (errno == EAGAIN || errno == EINTR)) return 0;
    if (in.error().code == proto::ReceiveErrc::closed) {
      s->close_connection(c->id, "closed by the client");
      return 0;
    }
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id, "bad message: " + in.error().message);
    return 0;
  }
  if (in->message.version != proto::kProtocolVersion) {
    Message reply;
    reply.type = MessageType::error;
    reply.request_id = in->message.request_id;
    reply.body = {{"name", "org.thaw.Error.ProtocolVersion"},
                  {"message", fmt::format("protocol version {} is not spoken here; thawd speaks "
                                          "version {} (upgrade the shim or thawd)",
                                          in->message.version, proto::kProtocolVersion)}};
    (void)proto::send_message(fd, reply);
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id, fmt::format("protocol version {}", in->message.version));
    return 0;
  }
  s->counters_.requests.fetch_add(1);
  if (!s->handle(*c, *in)) {
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id,
                        fmt::format("malformed {} message", proto::to_string(in->message.type)));
    return 0;
  }
  if (c->greeted && c->hello_deadline != nullptr) {
    c->hello_deadline = sd_event_source_disable_unref(c->hello_deadline);
  }
  return 0;
}

int ShimServer::on_hello_deadline(sd_event_source* source, uint64_t, void* self) {
  auto* s = static_cast<ShimServer*>(self);
  for (auto& [id, conn] : s->connections_) {
    if (conn->hello_deadline == source) {
      s->counters_.connections_dropped.fetch_add(1);
      s->close_connection(id, fmt::format("no hello within {} s", kHelloDeadlineUsec / 1'000'000));
      break;
    }
  }
  return 0;
}

void ShimServer::limit_ungreeted() {
  std::size_t ungreeted = 0;
  std::uint64_t oldest = 0;
  for (const auto& [id, conn] : connections_) {
    if (conn->greeted) continue;
    if (ungreeted++ == 0) oldest = id;  // the map is in accept order
  }
  if (ungreeted < kMaxUngreeted) return;
  // The oldest goes rather than the newest: a storm of silent connections then cannot keep
  // an engine that connects during it from getting its hello in.
  counters_.connections_dropped.fetch_add(1);
  close_connection(oldest, fmt::format("{} connections had not said hello", ungreeted));
}

void ShimServer::set_access(const AccessPolicy& access) {
  access_ = &access;
  std::vector<std::uint64_t> refused;
  for (auto& [id, conn] : connections_) {
    if (conn->greeted && !access.allows(conn->peer)) refused.push_back(id);
  }
  // Un-greeted peers are checked at their hello, against the new rule.
  for (std::uint64_t id : refused) {
    const std::string owner = connections_[id]->owner;
    counters_.connections_refused.fetch_add(1);
    close_connection(id, "no longer allowed by shim.allow_groups");
    log(LogLevel::notice,
        fmt::format("shim client {}: disconnected, its peer is not allowed by the reloaded "
                    "shim.allow_groups ({})",
                    owner, access.describe()));
  }
}

void ShimServer::close_connection(std::uint64_t id, const std::string& why) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = *it->second;
  if (c.source != nullptr) sd_event_source_disable_unref(c.source);
  if (c.hello_deadline != nullptr) sd_event_source_disable_unref(c.hello_deadline);
  const std::size_t released = service_.release_owner(c.owner);
  (void)ipc_exports_.drop_connection(c.id);
  if (released > 0) {
    log(LogLevel::info, fmt::format("shim client {} went away ({}); gave back {} slot(s) it held",
                                    c.owner, why, released));
  }
  connections_.erase(it);
}

bool ShimServer::send(Connection& c, Message reply, const std::vector<int>& fds) {
  auto ok = proto::send_message(c.fd.get(), reply, fds);
  if (!ok) {
    log(LogLevel::warning, fmt::format("shim client {}: {}", c.owner, ok.error()));
    return false;
  }
  return true;
}

bool ShimServer::reply_error(Connection& c, const Message& request, const ServiceError& error) {
  counters_.request_errors.fetch_add(1);
  Message reply;
  reply.type = MessageType::error;
  reply.request_id = request.request_id;
  reply.body = {{"name", error.name}, {"message", error.message}};
  return send(c, std::move(reply));
}

bool ShimServer::handle(Connection& c, proto::Received& in) {
  const Message& m = in.message;
  // Descriptors come only with an artifact or an IPC export (exactly one).
  const bool carries_fd =
      m.type == MessageType::report_artifact || m.type == MessageType::export_ipc;
  if (in.fds.size() != (carries_fd ? 1u : 0u)) return false;
  auto reply_of = [&](MessageType type, nlohmann::json body) {
    return proto::reply_to(m, type, std::move(body));
  };
  if (!c.greeted && m.type != MessageType::hello) return false;
  switch (m.type) {
    case MessageType::hello: {
      if (c.greeted) return false;
      if (!access_->allows(c.peer)) {
        counters_.connections_refused.fetch_add(1);
        (void)reply_error(c, m,
                          ServiceError{error_name::kAccessDenied,
                                       fmt::format("thawd's shim socket serves {} (this process "
                                                   "runs as uid {}); see shim.allow_groups",
                                                   access_->describe(), c.peer.uid)});
        return false;
      }
      c.greeted = true;
      if (auto engine = text_field(m.body, "engine")) {
        log(LogLevel::info, fmt::format("shim client {}: engine {}", c.owner, *engine));
      }
      return send(c, reply_of(MessageType::hello_ok, {{"protocol", proto::kProtocolVersion},
                                                      {"node_id", node_id_},
                                                      {"version", THAW_VERSION}}));
    }
    case MessageType::open_file: {
      auto model = text_field(m.body, "model");
      auto path = text_field(m.body, "path");
      if (!model || !path) return false;
      auto file = service_.open_file(*model, *path);
      if (!file) return reply_error(c, m, file.error());
      UniqueFd data(file->data_fd), ready(file->readiness_fd);
      return send(c,
                  reply_of(MessageType::file, {{"size", file->size},
                                               {"chunk_size", file->chunk_size},
                                               {"chunk_count", file->chunk_count},
                                               {"complete", file->complete}}),
                  {data.get(), ready.get()});
    }
    case MessageType::attach_slot: {
      auto model = text_field(m.body, "model");
      if (!model) return false;
      auto slot = service_.attach(*model, c.owner);
      if (!slot) return reply_error(c, m, slot.error());
      std::vector<UniqueFd> owned;
      for (const auto& p : slot->pages.pages) owned.emplace_back(p.fd);
      const std::size_t total = slot->pages.pages.size();
      const std::size_t messages =
          (total + proto::kMaxFdsPerMessage - 1) / proto::kMaxFdsPerMessage;
      // The layout of a big model exceeds a message: it goes as a memfd.
      nlohmann::json layout = nlohmann::json::array();
      for (const auto& piece : slot->layout) {
        layout.push_back(
            {piece.slot_offset, piece.file, piece.file_offset, piece.bytes, piece.layer});
      }
      const std::string layout_text = layout.dump();
      auto layout_fd = proto::document_memfd("thaw-slot-layout", layout_text);
      if (!layout_fd) {
        service_.release_owner(c.owner, slot->slot);
        return reply_error(c, m, ServiceError{error_name::kState, layout_fd.error()});
      }
      nlohmann::json body = {{"slot", slot->slot},
                             {"gpu", slot->gpu},
                             {"weight_bytes", slot->weight_bytes},
                             {"resident_bytes", slot->resident_bytes},
                             {"page_bytes", slot->page_bytes},
                             {"layout_kind", slot->layout_kind},
                             {"record_fingerprint", slot->record_fingerprint},
                             {"token", slot->token},
                             {"page_messages", messages},
                             {"layout_bytes", layout_text.size()},
                             {"budget_bytes", slot->budget_bytes}};
      if (!send(c, reply_of(MessageType::slot, std::move(body)), {layout_fd->get()})) return false;
      for (std::size_t first = 0; first < total; first += proto::kMaxFdsPerMessage) {
        const std::size_t end = std::min(total, first + proto::kMaxFdsPerMessage);
        nlohmann::json pages = nlohmann::json::array();
        std::vector<int> fds;
        for (std::size_t i = first; i < end; ++i) {
          pages.push_back({{"slot_offset", slot->pages.pages[i].slot_offset},
                           {"bytes", slot->pages.pages[i].bytes}});
          fds.push_back(owned[i].get());
        }
        if (!send(c, reply_of(MessageType::slot_pages, {{"pages", std::move(pages)}}), fds)) {
          return false;
        }
      }
      return true;
    }
    case MessageType::free_pages: {
      auto slot = text_field(m.body, "slot");
      auto offsets = m.body.find("offsets");
      if (!slot || offsets == m.body.end() || !offsets->is_array()) return false;
      std::vector<std::uint64_t> list;
      for (const auto& o : *offsets) {
        if (!o.is_number_unsigned()) return false;
        list.push_back(o.get<std::uint64_t>());
      }
      auto freed = service_.free_pages(c.owner, *slot, list);
      if (!freed) return reply_error(c, m, freed.error());
      return send(c, reply_of(MessageType::ok, {{"freed", *freed}}));
    }
    case MessageType::lease_memory: {
      auto uuid = text_field(m.body, "gpu_uuid");
      if (!uuid) return false;
      auto lease = service_.lease_memory(c.owner, *uuid);
      if (!lease) return reply_error(c, m, lease.error());
      return send(c,
                  reply_of(MessageType::ok, {{"gpu", lease->gpu}, {"budget_bytes", lease->bytes}}));
    }
    case MessageType::imported: {
      auto slot = text_field(m.body, "slot");
      auto token = m.body.find("token");
      if (!slot || token == m.body.end() || !token->is_number_unsigned()) return false;
      if (auto ok = service_.confirm_import(c.owner, *slot, token->get<std::uint64_t>()); !ok) {
        return reply_error(c, m, ok.error());
      }
      return send(c, reply_of(MessageType::ok, nlohmann::json::object()));
    }
    case MessageType::release: {
      auto slot = text_field(m.body, "slot");
      if (!slot) return false;
      auto handback = m.body.find("handback");
      const bool keep = handback != m.body.end() && handback->is_boolean() && handback->get<bool>();
      if (service_.release_owner(c.owner, *slot, keep) == 0) {
        return reply_error(c, m,
                           ServiceError{error_name::kUnknownSlot,
                                        fmt::format("this connection holds no slot {}", *slot)});
      }
      return send(c, reply_of(MessageType::ok, nlohmann::json::object()));
    }
    case MessageType::report_artifact:
      return handle_report_artifact(c, in);
    case MessageType::get_artifact:
      return handle_get_artifact(c, m);
    case MessageType::report_counters:
      return handle_report_counters(c, m);
    case MessageType::export_ipc:
      return handle_export_ipc(c, in);
    case MessageType::import_ipc:
      return handle_import_ipc(c, m);
    default:
      return false;  // replies are not requests
  }
}

}  // namespace thaw::daemon
