// The shim socket's record keeping: artifacts engines record and read back, the counters
// their shims report at exit, and CUDA IPC exports of deterministic-layout memory.
#include <fmt/format.h>

#include <array>
#include <fstream>
#include <iterator>
#include <span>
#include <utility>

#include "daemon/log/log.hpp"
#include "daemon/shim_socket/shim_server.hpp"
#include "daemon/store/fetch/sha256.hpp"

namespace thaw::daemon {

namespace {

using proto::Message;
using proto::MessageType;

std::optional<std::uint64_t> unsigned_field(const nlohmann::json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<std::uint64_t>();
}

const nlohmann::json& field_or_null(const nlohmann::json& body, const char* name) {
  static const nlohmann::json null;
  auto it = body.find(name);
  return it == body.end() ? null : *it;
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

}  // namespace

bool ShimServer::handle_report_artifact(Connection& c, proto::Received& in) {
  const Message& m = in.message;
  auto bytes = unsigned_field(m.body, "bytes");
  if (!bytes) return false;
  auto id =
      parse_artifact_identity(field_or_null(m.body, "kind"), field_or_null(m.body, "identity"));
  if (!id) return reply_error(c, m, id.error());
  auto put =
      artifacts_.put(c.peer.uid, *id, in.fds.front().get(), *bytes, engine_config(c.peer.pid));
  if (!put) {
    log(LogLevel::warning,
        fmt::format("shim client {}: {} artifact for {} not stored: {}", c.owner, id->kind,
                    id->model, put.error().message),
        {{"MODEL", id->model}});
    return reply_error(c, m, put.error());
  }
  counters_.artifacts_reported.fetch_add(1);
  log(LogLevel::info,
      fmt::format("shim client {}: stored its {} artifact for {} on {} ({} bytes, {}): {}", c.owner,
                  id->kind, id->model, id->gpu, *bytes, put->key, to_string(put->outcome)),
      {{"MODEL", id->model}});
  return send(c, proto::reply_to(m, MessageType::ok, {{"key", put->key}}));
}

bool ShimServer::handle_get_artifact(Connection& c, const Message& m) {
  auto id =
      parse_artifact_identity(field_or_null(m.body, "kind"), field_or_null(m.body, "identity"));
  if (!id) return reply_error(c, m, id.error());
  auto found = artifacts_.get(c.peer.uid, *id, engine_config(c.peer.pid));
  if (!found) return reply_error(c, m, found.error());
  counters_.artifacts_served.fetch_add(1);
  return send(
      c, proto::reply_to(m, MessageType::artifact, {{"key", found->key}, {"bytes", found->bytes}}),
      {found->fd.get()});
}

bool ShimServer::handle_report_counters(Connection& c, const Message& m) {
  auto it = m.body.find("counters");
  if (it == m.body.end() || !it->is_object()) return false;
  // Names this thawd sums; others (from a newer shim) are ignored.
  const std::array<std::pair<const char*, std::atomic<std::uint64_t>*>, 6> known = {{
      {"calls_intercepted", &counters_.engine_calls_intercepted},
      {"deterministic_allocations", &counters_.engine_deterministic_allocations},
      {"layout_divergences", &counters_.engine_layout_divergences},
      {"files_streamed", &counters_.engine_files_streamed},
      {"reads_waited", &counters_.engine_reads_waited},
      {"bytes_streamed", &counters_.engine_bytes_streamed},
  }};
  for (const auto& [name, total] : known) {
    auto v = it->find(name);
    if (v != it->end() && v->is_number_unsigned()) total->fetch_add(v->get<std::uint64_t>());
  }
  counters_.engine_reports.fetch_add(1);
  log(LogLevel::debug, fmt::format("shim client {}: counters {}", c.owner, it->dump()));
  return send(c, proto::reply_to(m, MessageType::ok, nlohmann::json::object()));
}

bool ShimServer::handle_export_ipc(Connection& c, proto::Received& in) {
  const Message& m = in.message;
  auto bytes = unsigned_field(m.body, "bytes");
  if (!bytes) return false;
  auto token = ipc_exports_.add(c.id, std::move(in.fds.front()), *bytes);
  if (!token) return reply_error(c, m, token.error());
  counters_.ipc_exports.fetch_add(1);
  return send(c, proto::reply_to(m, MessageType::ok, {{"token", *token}}));
}

bool ShimServer::handle_import_ipc(Connection& c, const Message& m) {
  auto token = unsigned_field(m.body, "token");
  if (!token) return false;
  auto found = ipc_exports_.find(*token);
  if (!found) return reply_error(c, m, found.error());
  counters_.ipc_imports.fetch_add(1);
  return send(c, proto::reply_to(m, MessageType::ipc, {{"bytes", found->bytes}}), {found->fd});
}

}  // namespace thaw::daemon
