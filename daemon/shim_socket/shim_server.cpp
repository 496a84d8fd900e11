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
    // Decided before any byte is read: a refused peer's messages are never decoded.
    c->allowed = s->access_->allows(c->peer);
    if (!c->allowed) s->counters_.connections_refused.fetch_add(1);
    if (s->connections_.size() >= kMaxConnections) {
      // Told why (request id 0: it has asked nothing yet), then closed with `c`.
      s->counters_.connections_dropped.fetch_add(1);
      (void)proto::send(client, 0,
                        proto::Error::make(error_name::kLimit,
                                           fmt::format("thawd serves at most {} shim connections "
                                                       "at once; retry once engines have exited",
                                                       kMaxConnections)));
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
  auto in = proto::receive_packet(fd);
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
  // The frame only: magic, length, version, request id. Nothing of the body yet.
  proto::FrameHeader header;
  proto::FrameErrc frame;
  if (auto bad = proto::read_frame_header(in->bytes, header, frame); !bad.empty()) {
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id, "bad message: " + bad);
    return 0;
  }
  if (!c->allowed) {
    (void)s->reply_error(
        *c, header.request_id,
        ServiceError{error_name::kAccessDenied,
                     fmt::format("thawd's shim socket serves {} (this process runs as uid {}); "
                                 "see shim.allow_groups",
                                 s->access_->describe(), c->peer.uid)});
    s->close_connection(c->id, "refused by the allow rule");
    return 0;
  }
  if (header.version != proto::kProtocolVersion) {
    (void)s->send(*c, header.request_id,
                  proto::Error::make("org.thaw.Error.ProtocolVersion",
                                     fmt::format("protocol version {} is not spoken here; thawd "
                                                 "speaks version {} (upgrade the shim or thawd)",
                                                 header.version, proto::kProtocolVersion)));
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id, fmt::format("protocol version {}", header.version));
    return 0;
  }
  proto::Envelope message;
  bool value_error = false;
  if (auto bad = proto::decode_message(in->bytes, std::move(in->fds), message, &value_error);
      !bad.empty()) {
    if (value_error && c->greeted) {  // a request with a number out of range: it fails
      s->counters_.requests.fetch_add(1);
      (void)s->reply_error(*c, header.request_id,
                           ServiceError{error_name::kInvalidArgument, std::move(bad)});
      return 0;
    }
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(c->id, "bad message: " + bad);
    return 0;
  }
  s->counters_.requests.fetch_add(1);
  const proto::MessageType type = proto::type_of(message.message);
  if (!s->handle(*c, message)) {
    s->counters_.connections_dropped.fetch_add(1);
    s->close_connection(
        c->id, fmt::format("{} message out of order or not a request", proto::to_string(type)));
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
    conn->allowed = access.allows(conn->peer);
    if (!conn->allowed && conn->greeted) refused.push_back(id);
  }
  // Un-greeted peers no longer allowed are told so at their first message, as at accept.
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

bool ShimServer::send(Connection& c, std::uint32_t id, proto::ShimMessage reply) {
  auto ok = proto::send(c.fd.get(), id, reply);
  if (!ok) {
    log(LogLevel::warning, fmt::format("shim client {}: {}", c.owner, ok.error()));
    return false;
  }
  return true;
}

bool ShimServer::reply_error(Connection& c, std::uint32_t id, const ServiceError& error) {
  counters_.request_errors.fetch_add(1);
  return send(c, id, proto::Error::make(error.name, error.message));
}

bool ShimServer::handle(Connection& c, proto::Envelope& in) {
  const bool hello = std::holds_alternative<proto::Hello>(in.message);
  if (c.greeted == hello) return false;  // hello first, and only once
  return std::visit(
      [&](auto& m) {
        if constexpr (requires { serve(c, in.request_id, m); }) {
          return serve(c, in.request_id, m);
        } else {
          return false;  // replies are not requests
        }
      },
      in.message);
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::Hello& m) {
  c.greeted = true;
  // (Peer strings escaped: a name with a line break must not forge a log line.)
  log(LogLevel::info, fmt::format("shim client {}: engine {} ({})", c.owner,
                                  proto::printable(m.engine), proto::printable(m.client)));
  return send(c, id, proto::HelloOk{proto::kProtocolVersion, node_id_, THAW_VERSION});
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::OpenFile& m) {
  auto file = service_.open_file(m.model, m.path);
  if (!file) return reply_error(c, id, file.error());
  return send(c, id,
              proto::File{file->size, file->complete, UniqueFd(file->data_fd),
                          UniqueFd(file->readiness_fd)});
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::AttachSlot& m) {
  auto slot = service_.attach(m.model, c.owner);
  if (!slot) return reply_error(c, id, slot.error());
  // The pages' descriptors are ours from here: owned before anything can fail.
  std::vector<UniqueFd> pages;
  for (const auto& p : slot->pages.pages) pages.emplace_back(p.fd);
  auto refuse = [&](const std::string& why) {
    service_.release_owner(c.owner, slot->slot);
    return reply_error(c, id, ServiceError{error_name::kState, why});
  };
  proto::Slot reply;
  reply.layout_kind = slot->layout_kind;
  // The layout of a big model exceeds a message: it goes as a memfd.
  std::vector<proto::LayoutRow> rows;
  rows.reserve(slot->layout.size());
  for (const auto& piece : slot->layout) {
    rows.push_back({piece.slot_offset, piece.file, piece.file_offset, piece.bytes});
  }
  std::string layout_text;
  if (auto bad = proto::encode_slot_layout(rows, layout_text); !bad.empty()) return refuse(bad);
  auto layout_fd = proto::document_memfd("thaw-slot-layout", layout_text);
  if (!layout_fd) return refuse(layout_fd.error());
  const std::size_t total = pages.size();
  reply.slot = slot->slot;
  reply.token = slot->token;
  reply.budget_bytes = slot->budget_bytes;
  reply.resident_bytes = slot->resident_bytes;
  reply.page_bytes = slot->page_bytes;
  reply.record_fingerprint = slot->record_fingerprint;
  reply.layout_bytes = layout_text.size();
  reply.page_messages =
      static_cast<std::uint32_t>((total + proto::kMaxFdsPerMessage - 1) / proto::kMaxFdsPerMessage);
  reply.layout = std::move(*layout_fd);
  if (!send(c, id, std::move(reply))) return false;
  for (std::size_t first = 0; first < total; first += proto::kMaxFdsPerMessage) {
    const std::size_t end = std::min(total, first + proto::kMaxFdsPerMessage);
    proto::SlotPages message;
    for (std::size_t i = first; i < end; ++i) {
      message.offsets.push_back(slot->pages.pages[i].slot_offset);
      message.pages.push_back(std::move(pages[i]));
    }
    if (!send(c, id, std::move(message))) return false;
  }
  return true;
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::FreePages& m) {
  auto freed = service_.free_pages(c.owner, m.slot, m.offsets);
  if (!freed) return reply_error(c, id, freed.error());
  return send(c, id, proto::Ok{});
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::LeaseMemory& m) {
  auto lease = service_.lease_memory(c.owner, m.gpu_uuid);
  if (!lease) return reply_error(c, id, lease.error());
  return send(c, id, proto::MemoryLease{lease->bytes});
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::Imported& m) {
  if (auto ok = service_.confirm_import(c.owner, m.slot, m.token); !ok) {
    return reply_error(c, id, ok.error());
  }
  return send(c, id, proto::Ok{});
}

bool ShimServer::serve(Connection& c, std::uint32_t id, const proto::Release& m) {
  if (service_.release_owner(c.owner, m.slot, m.handback) == 0) {
    return reply_error(
        c, id,
        ServiceError{error_name::kUnknownSlot,
                     fmt::format("this connection holds no slot {}", proto::quoted(m.slot))});
  }
  return send(c, id, proto::Ok{});
}

}  // namespace thaw::daemon
