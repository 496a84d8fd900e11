// ShimServer: thawd's end of the shim socket (common/proto/shim_protocol.hpp for the
// protocol), on the daemon's sd-event loop.
//
// - Listens on shim.socket (AF_UNIX SOCK_SEQPACKET, mode 0666: who may talk is decided by
//   the allow rule, not by file permissions). A stale socket file left by a crashed thawd is
//   replaced; one a live thawd answers on is not, nor anything that is not a socket (start
//   fails, saying so).
// - Each connection's peer is taken from SO_PEERCRED and SO_PEERGROUPS at accept, and the
//   AccessPolicy decides there whether it may talk. A refused peer's first packet has only
//   its header read (the request id, for the reply): it gets error AccessDenied and the
//   close, and no byte it sends ever reaches the JSON parser.
// - Allowed peers' packets go through the shim codec (common/proto/shim_messages.hpp): a
//   malformed, oversized or out-of-order message closes that connection only; a failed
//   request gets an `error` reply and the connection stays.
// - When a connection closes (the engine exited or died), everything it held — slot
//   exports not yet confirmed, slot ownership — is given back (NodeService::release_owner).
// - What any client can make thawd hold is bounded: at most kMaxConnections connections
//   (more are told so and closed), at most kMaxUngreeted that have not said hello (a new
//   one pushes out the oldest, so a storm of silent connections cannot lock engines out),
//   each of those closed kHelloDeadline after accept, and IpcExports' caps on descriptors.
// - A reload (set_access) applies the new allow rule to the connections already open: the
//   ones whose peer it no longer allows are closed.
#pragma once

#include <sys/types.h>
#include <systemd/sd-event.h>

#include <atomic>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/fd/unique_fd.hpp"
#include "common/proto/seqpacket.hpp"
#include "daemon/artifacts/artifact_store.hpp"
#include "daemon/service/access_policy.hpp"
#include "daemon/service/node_service.hpp"
#include "daemon/shim_socket/ipc_exports.hpp"

namespace thaw::daemon {

// thawd's statistics of its shim socket (connections, requests, artifacts, IPC), plus the sums
// of what engines' shims report at exit. Not the shim's own counters (preload's ShimCounters):
// those live in each engine process and arrive here only as proto::EngineCounters.
struct ShimSocketCounters {
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::uint64_t> connections_refused{0};  // by the allow rule
  std::atomic<std::uint64_t> connections_dropped{0};  // malformed or oversized messages
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> request_errors{0};
  std::atomic<std::uint64_t> artifacts_reported{0};  // stored
  std::atomic<std::uint64_t> artifacts_served{0};
  std::atomic<std::uint64_t> ipc_exports{0};
  std::atomic<std::uint64_t> ipc_imports{0};
  // The totals engines' shims report when they exit (report_counters), summed.
  std::atomic<std::uint64_t> engine_reports{0};
  std::atomic<std::uint64_t> engine_calls_intercepted{0};
  std::atomic<std::uint64_t> engine_deterministic_allocations{0};
  std::atomic<std::uint64_t> engine_layout_divergences{0};
  std::atomic<std::uint64_t> engine_files_streamed{0};
  std::atomic<std::uint64_t> engine_reads_waited{0};
  std::atomic<std::uint64_t> engine_bytes_streamed{0};
  std::atomic<std::uint64_t> engine_graph_records_stored{0};
  std::atomic<std::uint64_t> engine_graphs_restored{0};
  std::atomic<std::uint64_t> engine_graph_restore_fallbacks{0};
  std::atomic<std::uint64_t> engine_kv_restores{0};
  std::atomic<std::uint64_t> engine_kv_restore_fallbacks{0};
};

class ShimServer {
 public:
  static std::expected<std::unique_ptr<ShimServer>, std::string> start(
      const std::filesystem::path& socket_path, NodeService& service, ArtifactStore& artifacts,
      const AccessPolicy& access, std::string node_id, sd_event* event);
  // Closes every connection (giving back what they held) and removes the socket file.
  ~ShimServer();
  ShimServer(const ShimServer&) = delete;
  ShimServer& operator=(const ShimServer&) = delete;

  static constexpr std::size_t kMaxConnections = 1024;
  static constexpr std::size_t kMaxUngreeted = 32;
  static constexpr std::uint64_t kHelloDeadlineUsec = 5'000'000;

  // A reload's allow rule: from now on, and for the connections already open (the ones no
  // longer allowed are closed). `access` must outlive its use (until the next set_access).
  void set_access(const AccessPolicy& access);
  std::size_t connection_count() const { return connections_.size(); }
  const ShimSocketCounters& counters() const { return counters_; }

 private:
  struct Connection {
    std::uint64_t id = 0;
    UniqueFd fd;
    sd_event_source* source = nullptr;
    PeerIdentity peer;
    bool allowed = false;  // by the allow rule, at accept
    std::string owner;     // "pid <n> (connection <id>)"
    bool greeted = false;
    sd_event_source* hello_deadline = nullptr;  // until the hello
  };

  ShimServer(NodeService& service, ArtifactStore& artifacts, const AccessPolicy& access,
             std::string node_id)
      : service_(service), artifacts_(artifacts), access_(&access), node_id_(std::move(node_id)) {}
  static int on_accept(sd_event_source* source, int fd, uint32_t events, void* self);
  static int on_readable(sd_event_source* source, int fd, uint32_t events, void* self);
  static int on_hello_deadline(sd_event_source* source, uint64_t usec, void* self);
  // Makes room for one more connection that has not said hello (closing the oldest).
  void limit_ungreeted();
  // Handles one decoded message; false closes the connection. Each request type has its
  // serve(); a message without one (a reply) is not a request.
  bool handle(Connection& c, proto::Envelope& in);
  bool serve(Connection& c, std::uint32_t id, const proto::Hello& m);
  bool serve(Connection& c, std::uint32_t id, const proto::OpenFile& m);
  bool serve(Connection& c, std::uint32_t id, const proto::AttachSlot& m);
  bool serve(Connection& c, std::uint32_t id, const proto::Imported& m);
  bool serve(Connection& c, std::uint32_t id, const proto::FreePages& m);
  bool serve(Connection& c, std::uint32_t id, const proto::LeaseMemory& m);
  bool serve(Connection& c, std::uint32_t id, const proto::Release& m);
  // shim_records.cpp: artifacts, counters, CUDA IPC exports.
  bool serve(Connection& c, std::uint32_t id, proto::ReportArtifact& m);
  bool serve(Connection& c, std::uint32_t id, const proto::GetArtifact& m);
  bool serve(Connection& c, std::uint32_t id, const proto::ReportCounters& m);
  bool serve(Connection& c, std::uint32_t id, proto::ExportIpc& m);
  bool serve(Connection& c, std::uint32_t id, const proto::ImportIpc& m);
  bool reply_error(Connection& c, std::uint32_t id, const ServiceError& error);
  // Sends `reply` to request `id` (the descriptors it carries closed here once sent).
  bool send(Connection& c, std::uint32_t id, proto::ShimMessage reply);
  void close_connection(std::uint64_t id, const std::string& why);

  NodeService& service_;
  ArtifactStore& artifacts_;
  IpcExports ipc_exports_;
  const AccessPolicy* access_;
  std::string node_id_;
  std::filesystem::path path_;
  std::pair<dev_t, ino_t> inode_{};  // of the socket bound at path_: the one ~ShimServer removes
  UniqueFd listener_;
  sd_event* event_ = nullptr;
  sd_event_source* accept_source_ = nullptr;
  std::map<std::uint64_t, std::unique_ptr<Connection>> connections_;
  std::uint64_t next_id_ = 1;
  bool at_connection_limit_ = false;  // said in the log once each time the limit is reached
  ShimSocketCounters counters_;
};

}  // namespace thaw::daemon
