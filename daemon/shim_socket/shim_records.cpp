// The shim socket's record keeping: artifacts engines record and read back, the counters
// their shims report at exit, and CUDA IPC exports of deterministic-layout memory.
#include <fcntl.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include <array>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <utility>

#include "daemon/log/log.hpp"
#include "daemon/shim_socket/shim_server.hpp"
#include "daemon/store/fetch/sha256.hpp"

namespace thaw::daemon {

namespace {

void add_saturating(std::atomic<std::uint64_t>& total, std::uint64_t n) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t now = total.load();
  while (!total.compare_exchange_weak(now, now > kMax - n ? kMax : now + n)) {
  }
}

// What tells one configuration of an engine binary from another: its command line
// (`generate` and `serve`, another batch size...), hashed. Read from /proc while the engine
// is connected (it is alive: it reports at exit, before it is gone). "" when unreadable:
// then records are shared by every configuration, as before configurations existed.
std::string engine_config(pid_t pid) {
  if (pid <= 0) return {};
  std::ifstream in(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (cmdline.empty()) return {};
  return "cmdline " + store::sha256_hex(std::as_bytes(std::span(cmdline))).substr(0, 32);
}

ArtifactIdentity identity_of(proto::ArtifactKind kind, const proto::ArtifactIdentity& id) {
  return ArtifactIdentity{std::string(proto::to_string(kind)), id.engine, id.model, id.gpu,
                          id.driver};
}

}  // namespace

bool ShimServer::serve(Connection& c, std::uint32_t request, proto::ReportArtifact& m) {
  const ArtifactIdentity id = identity_of(m.kind, m.identity);
  auto put = artifacts_.put(c.peer.uid, id, m.document.get(), m.bytes, engine_config(c.peer.pid));
  if (!put) {
    log(LogLevel::warning,
        fmt::format("shim client {}: {} artifact for {} not stored: {}", c.owner, id.kind,
                    proto::printable(id.model), put.error().message),
        {{"MODEL", id.model}});
    return reply_error(c, request, put.error());
  }
  counters_.artifacts_reported.fetch_add(1);
  log(LogLevel::info,
      fmt::format("shim client {}: stored its {} artifact for {} on {} ({} bytes, {}): {}", c.owner,
                  id.kind, proto::printable(id.model), proto::printable(id.gpu), m.bytes, put->key,
                  to_string(put->outcome)),
      {{"MODEL", id.model}});
  return send(c, request, proto::Ok{});
}

bool ShimServer::serve(Connection& c, std::uint32_t request, const proto::GetArtifact& m) {
  auto found =
      artifacts_.get(c.peer.uid, identity_of(m.kind, m.identity), engine_config(c.peer.pid));
  if (!found) return reply_error(c, request, found.error());
  counters_.artifacts_served.fetch_add(1);
  return send(c, request, proto::Artifact{found->bytes, std::move(found->fd)});
}

bool ShimServer::serve(Connection& c, std::uint32_t request, const proto::ReportCounters& m) {
  // Each value is at most kMaxCounter (the codec's bound), so no report can wrap a total;
  // the totals saturate besides, as 2048 such reports would (a counter that goes backwards
  // reads as a reset to Prometheus).
  const proto::EngineCounters& r = m.counters;
  add_saturating(counters_.engine_calls_intercepted, r.calls_intercepted);
  add_saturating(counters_.engine_deterministic_allocations, r.deterministic_allocations);
  add_saturating(counters_.engine_layout_divergences, r.layout_divergences);
  add_saturating(counters_.engine_files_streamed, r.files_streamed);
  add_saturating(counters_.engine_reads_waited, r.reads_waited);
  add_saturating(counters_.engine_bytes_streamed, r.bytes_streamed);
  add_saturating(counters_.engine_graph_records_stored, r.graph_records_stored);
  add_saturating(counters_.engine_graphs_restored, r.graphs_restored);
  add_saturating(counters_.engine_graph_restore_fallbacks, r.graph_restore_fallbacks);
  add_saturating(counters_.engine_kv_restores, r.kv_restores);
  add_saturating(counters_.engine_kv_restore_fallbacks, r.kv_restore_fallbacks);
  counters_.engine_reports.fetch_add(1);
  log(LogLevel::debug,
      fmt::format("shim client {}: counters: {} calls intercepted, {} deterministic allocations, "
                  "{} layout divergences, {} files streamed, {} reads waited, {} bytes streamed, "
                  "{} graph records stored, {} graphs restored, {} graph restore fallbacks, "
                  "{} KV-cache restores, {} KV-cache restore fallbacks",
                  c.owner, r.calls_intercepted, r.deterministic_allocations, r.layout_divergences,
                  r.files_streamed, r.reads_waited, r.bytes_streamed, r.graph_records_stored,
                  r.graphs_restored, r.graph_restore_fallbacks, r.kv_restores,
                  r.kv_restore_fallbacks));
  return send(c, request, proto::Ok{});
}

bool ShimServer::serve(Connection& c, std::uint32_t request, proto::ExportIpc& m) {
  auto token = ipc_exports_.add(c.id, std::move(m.handle), m.bytes);
  if (!token) return reply_error(c, request, token.error());
  counters_.ipc_exports.fetch_add(1);
  return send(c, request, proto::IpcExported{*token});
}

bool ShimServer::serve(Connection& c, std::uint32_t request, const proto::ImportIpc& m) {
  auto found = ipc_exports_.find(m.token);
  if (!found) return reply_error(c, request, found.error());
  // The registry keeps its descriptor; the reply carries (and then closes) a duplicate.
  UniqueFd handle(::fcntl(found->fd, F_DUPFD_CLOEXEC, 0));
  if (!handle) {
    return reply_error(
        c, request,
        ServiceError{error_name::kState,
                     fmt::format("duplicating the export's descriptor: {}", std::strerror(errno))});
  }
  counters_.ipc_imports.fetch_add(1);
  return send(c, request, proto::Ipc{found->bytes, std::move(handle)});
}

}  // namespace thaw::daemon
