#include "preload/thawd_client/thawd_client.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
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

// A typed reply, when it is of type `Reply`; any other reply (an error names what thawd did
// not like) is logged and gives nullopt.
template <typename Reply>
std::optional<Reply> reply_as(proto::Envelope& in, proto::MessageType sent) {
  if (auto* r = std::get_if<Reply>(&in.message)) return std::move(*r);
  if (const auto* e = std::get_if<proto::Error>(&in.message)) {
    debug("thawd answered {} with {}: {}", proto::to_string(sent), e->name, e->message);
  } else {
    debug("thawd answered {} with {}, not {}", proto::to_string(sent),
          proto::to_string(proto::type_of(in.message)), proto::to_string(Reply::kType));
  }
  return std::nullopt;
}

class Connection {
 public:
  static Connection& get() {
    static auto* c = new Connection();  // never destroyed: used during exit
    return *c;
  }

  // Sends `m` and returns thawd's reply of type `Reply` (nullopt: no thawd, or another
  // reply, logged).
  template <typename Reply, typename Request>
  std::optional<Reply> call(Request m) {
    std::lock_guard lock(mutex_);
    auto in = exchange_locked(std::move(m));
    if (!in) return std::nullopt;
    return reply_as<Reply>(*in, Request::kType);
  }

  // The reply whatever its type (nullopt: no thawd).
  std::optional<proto::Envelope> exchange(const proto::ShimMessage& m) {
    std::lock_guard lock(mutex_);
    return exchange_locked(m);
  }

  // attach_slot (+ the layout's memfd), its page messages (+ the pages' fds), then
  // `imported` — one exchange under the lock, so no other request interleaves.
  std::optional<AttachedSlot> attach(const std::string& model) {
    std::lock_guard lock(mutex_);
    auto in = exchange_locked(proto::AttachSlot{model});
    if (!in) return std::nullopt;
    auto slot = reply_as<proto::Slot>(*in, proto::MessageType::attach_slot);
    if (!slot) return std::nullopt;
    AttachedSlot out;
    out.slot = slot->slot;
    out.budget_bytes = slot->budget_bytes;
    SlotGrant& g = out.grant;
    g.slot = slot->slot;
    g.model = model;
    g.layout_kind = slot->layout_kind;
    g.record_fingerprint = slot->record_fingerprint;
    g.page_bytes = slot->page_bytes;
    g.resident_bytes = slot->resident_bytes;
    // A layout that does not read leaves the grant without pieces: the injector then copies
    // nothing from the slot (every copy is the driver's), which is slower, never wrong.
    std::vector<proto::LayoutRow> rows;
    auto text = proto::read_document(slot->layout.get(), slot->layout_bytes);
    std::string why = text ? proto::decode_slot_layout(*text, rows) : text.error();
    if (!why.empty()) notice_once("slot-layout", "slot " + g.slot + ": layout unusable: " + why);
    for (auto& r : rows) {
      g.pieces.push_back(SlotPiece{r.slot_offset, std::move(r.file), r.file_offset, r.bytes});
    }
    for (std::uint32_t i = 0; i < slot->page_messages; ++i) {
      auto in_pages = proto::receive(fd_.get());
      if (!in_pages) return drop_locked(in_pages.error().message);
      auto* pages = std::get_if<proto::SlotPages>(&in_pages->message);
      if (pages == nullptr) {
        return drop_locked(fmt::format("{} where slot_pages were due",
                                       proto::to_string(proto::type_of(in_pages->message))));
      }
      for (std::size_t k = 0; k < pages->offsets.size(); ++k) {
        // A page not at a page boundary, or twice, is not one the injector can map: its
        // descriptor is closed and the slot's bytes there are copied from the file instead.
        if (pages->offsets[k] % g.page_bytes != 0 || g.pages.contains(pages->offsets[k])) {
          notice_once("slot-page", fmt::format("slot {}: page at {:#x} ignored (misaligned or "
                                               "repeated)",
                                               g.slot, pages->offsets[k]));
          continue;
        }
        g.pages[pages->offsets[k]] = std::move(pages->pages[k]);
      }
    }
    auto ok = exchange_locked(proto::Imported{out.slot, slot->token});
    if (!ok) return std::nullopt;
    (void)reply_as<proto::Ok>(*ok, proto::MessageType::imported);
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
  // One request and its reply, connecting first if need be. nullopt: no thawd (then the
  // connection is dropped and not retried).
  std::optional<proto::Envelope> exchange_locked(const proto::ShimMessage& m) {
    if (!connect_locked()) return std::nullopt;
    // A message the codec refuses (a field out of its rules) is this request's problem, not
    // the connection's: it stays.
    std::vector<std::byte> bytes;
    std::vector<int> fds;
    if (auto bad = proto::encode_message(++next_id_, m, bytes, fds); !bad.empty()) {
      debug("not sent to thawd: {}", bad);
      return std::nullopt;
    }
    if (auto sent = proto::send_packet(fd_.get(), bytes, fds); !sent) {
      return drop_locked(sent.error());
    }
    auto in = proto::receive(fd_.get());
    if (!in) return drop_locked(in.error().message);
    return std::move(*in);
  }

  bool connect_locked() {
    if (fd_) return true;
    if (given_up_) return false;
    const std::string& path = socket_path();
    auto fd = proto::connect_seqpacket(path);
    if (!fd) {
      given_up_ = true;
      notice_once("no-thawd", fmt::format("thawd not reachable at {} ({}): model files stream from "
                                          "the cache's own readiness maps",
                                          path, fd.error()));
      return false;
    }
    fd_ = std::move(*fd);
    // (the engine's fingerprint goes with each artifact, not here; thawd knows the pid
    // from the socket's credentials)
    std::string engine = engine_name().substr(0, proto::kMaxNameBytes);
    for (char& c : engine)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    auto sent = proto::send(fd_.get(), ++next_id_, proto::Hello{"thaw-preload", engine});
    auto reply = sent ? proto::receive(fd_.get())
                      : std::unexpected(proto::ReceiveError{proto::ReceiveErrc::io, sent.error()});
    const auto* ok = reply ? std::get_if<proto::HelloOk>(&reply->message) : nullptr;
    if (ok == nullptr) {
      const auto* error = reply ? std::get_if<proto::Error>(&reply->message) : nullptr;
      const std::string why = !reply             ? reply.error().message
                              : error != nullptr ? error->message
                                                 : "refused";
      fd_.reset();
      given_up_ = true;
      notice_once("thawd-hello", fmt::format("thawd at {} did not accept the shim ({}); going on "
                                             "without it",
                                             path, why));
      return false;
    }
    debug("connected to thawd {} on node {} at {} (protocol {})", ok->version, ok->node_id, path,
          ok->protocol);
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
                                            const std::string& relative_path,
                                            const std::string& opened_path) {
  auto file = Connection::get().call<proto::File>(proto::OpenFile{model_key, relative_path});
  if (!file) return std::nullopt;
  // The readiness map describes thawd's file: only worth anything if the engine opened that
  // same file (not, say, a copy of the cache elsewhere).
  struct stat ours {
  }, thawds{};
  if (::stat(opened_path.c_str(), &ours) != 0 || ::fstat(file->data.get(), &thawds) != 0 ||
      ours.st_dev != thawds.st_dev || ours.st_ino != thawds.st_ino) {
    debug("thawd's {} of {} is not the file at {}: using the cache's own readiness map",
          relative_path, model_key, opened_path);
    return std::nullopt;
  }
  return std::move(file->readiness);
}

PendingFileState daemon_pending_file(const std::string& model_key,
                                     const std::string& relative_path) {
  auto in = Connection::get().exchange(proto::OpenFile{model_key, relative_path});
  if (!in) return {};
  if (const auto* file = std::get_if<proto::File>(&in->message)) {
    return {PendingFileState::present, file->size};
  }
  // NotReady is thawd's word for "a fetch of this model runs and has not created the file".
  const auto* e = std::get_if<proto::Error>(&in->message);
  if (e != nullptr && e->name == "org.thaw.Error.NotReady") return {PendingFileState::fetching};
  if (e != nullptr)
    debug("thawd answered open_file {} of {} with {}: {}", relative_path, model_key, e->name,
          e->message);
  return {};
}

std::optional<std::string> daemon_get_artifact(proto::ArtifactKind kind,
                                               const proto::ArtifactIdentity& identity) {
  auto reply = Connection::get().call<proto::Artifact>(proto::GetArtifact{kind, identity});
  if (!reply) return std::nullopt;
  auto text = proto::read_document(reply->document.get(), reply->bytes);
  if (!text) {
    debug("thawd's {} artifact could not be read: {}", proto::to_string(kind), text.error());
    return std::nullopt;
  }
  return std::move(*text);
}

bool daemon_report_artifact(proto::ArtifactKind kind, const proto::ArtifactIdentity& identity,
                            const std::string& document) {
  auto memfd = proto::document_memfd("thaw-artifact", document);
  if (!memfd) return false;
  proto::ReportArtifact m{kind, identity, document.size(), std::move(*memfd)};
  return Connection::get().call<proto::Ok>(std::move(m)).has_value();
}

void daemon_report_counters(const proto::EngineCounters& counters) {
  if (!Connection::get().connected()) return;
  // Bounded on the wire (kMaxCounter); a total past that is reported as the bound.
  proto::EngineCounters c = counters;
  for (std::uint64_t* v :
       {&c.calls_intercepted, &c.deterministic_allocations, &c.layout_divergences,
        &c.files_streamed, &c.reads_waited, &c.bytes_streamed}) {
    *v = std::min(*v, proto::kMaxCounter);
  }
  (void)Connection::get().call<proto::Ok>(proto::ReportCounters{c});
}

std::optional<std::uint64_t> daemon_export_ipc(int fd, std::uint64_t bytes) {
  // Sent with a duplicate: the message owns what it carries, the caller keeps `fd`.
  proto::ExportIpc m{bytes, UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))};
  if (!m.handle) return std::nullopt;
  auto reply = Connection::get().call<proto::IpcExported>(std::move(m));
  if (!reply) return std::nullopt;
  return reply->token;
}

std::optional<UniqueFd> daemon_import_ipc(std::uint64_t token, std::uint64_t bytes) {
  auto reply = Connection::get().call<proto::Ipc>(proto::ImportIpc{token});
  if (!reply) return std::nullopt;
  if (bytes != 0 && reply->bytes != bytes) {
    // The token names another export than the handle describes: mapping it would map the
    // wrong memory, or past its end.
    debug("thawd's IPC export {:#x} is {} bytes; the handle says {}", token, reply->bytes, bytes);
    return std::nullopt;
  }
  return std::move(reply->handle);
}

std::optional<AttachedSlot> daemon_attach_slot(const std::string& model) {
  return Connection::get().attach(model);
}

std::optional<std::uint64_t> daemon_lease_memory(const std::string& gpu_uuid) {
  auto reply = Connection::get().call<proto::MemoryLease>(proto::LeaseMemory{gpu_uuid});
  if (!reply) return std::nullopt;
  return reply->budget_bytes;
}

void daemon_after_fork_in_child() {
  Connection::get().after_fork_in_child();
}

void daemon_free_pages(const std::string& slot, const std::vector<std::uint64_t>& offsets) {
  // In messages of at most kMaxFreePagesPerMessage offsets, which always fit one packet.
  for (std::size_t at = 0; at < offsets.size(); at += proto::kMaxFreePagesPerMessage) {
    const std::size_t end = std::min(offsets.size(), at + proto::kMaxFreePagesPerMessage);
    proto::FreePages m{slot,
                       std::vector<std::uint64_t>(offsets.begin() + at, offsets.begin() + end)};
    if (!Connection::get().call<proto::Ok>(std::move(m))) return;
  }
}

void daemon_release_slot(const std::string& slot, bool handback) {
  if (!Connection::get().connected()) return;
  (void)Connection::get().call<proto::Ok>(proto::Release{slot, handback});
}

}  // namespace thaw::preload
