#include "coordinator/server/coordinator_server.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <syslog.h>

#include <zmq_addon.hpp>

#include <algorithm>
#include <array>
#include <cmath>

#include "common/proto/cluster/cluster_codec.hpp"

namespace thaw::coordinator {
namespace {

// What a ROUTER shows of a peer's routing id in a log line: printable, or hex.
std::string printable_id(const zmq::message_t& id) {
  const std::string_view s(static_cast<const char*>(id.data()), id.size());
  if (cluster::validate_node_id(s)) return std::string(s);
  std::string hex;
  for (unsigned char c : s.substr(0, 16)) hex += fmt::format("{:02x}", c);
  return "0x" + hex;
}

// Where a message came from, for log lines: "from 10.0.0.7" over TCP ("" over ipc://).
std::string peer_of(zmq::message_t& frame) {  // gets() is not const in cppzmq
  try {
    if (const char* address = frame.gets("Peer-Address"); address != nullptr && *address != 0) {
      return fmt::format(" from {}", address);
    }
  } catch (const zmq::error_t&) {
  }
  return "";
}

}  // namespace

CoordinatorServer::CoordinatorServer(ServerOptions options)
    : options_(std::move(options)),
      state_(options_.cluster),
      class_rates_(options_.cluster.class_reserve) {}

std::expected<std::unique_ptr<CoordinatorServer>, std::string> CoordinatorServer::start(
    ServerOptions options) {
  if (auto ok = zmqx::curve_available(); !ok) return std::unexpected(ok.error());
  auto allow = NodeAllowList::open(options.allowed_nodes);
  if (!allow) return std::unexpected(allow.error());
  if (!options.log) options.log = [](int, const std::string&) {};
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer(std::move(options)));
  s->allow_ = std::make_unique<NodeAllowList>(std::move(*allow));
  for (const std::string& skipped : s->allow_->scan()) s->options_.log(LOG_WARNING, skipped);
  try {
    s->zap_ = std::make_unique<ZapHandler>(s->context_, *s->allow_, s->options_.log);
    s->nodes_ = zmq::socket_t(s->context_, zmq::socket_type::router);
    s->nodes_.set(zmq::sockopt::linger, 0);
    s->nodes_.set(zmq::sockopt::curve_server, true);
    s->nodes_.set(zmq::sockopt::curve_secretkey, s->options_.key.secret_z85);
    s->nodes_.set(zmq::sockopt::router_handover, true);
    s->nodes_.set(zmq::sockopt::router_mandatory, true);
    // ZMTP heartbeats only to notice dead TCP connections (a kernel would take minutes);
    // liveness is the application's. Rarely: libzmq 4.3's timer cancel walks every timer of
    // its I/O thread, so at the application's rate 1,000 peers cost the coordinator a third
    // more CPU (bench/coordinator/heartbeat_bench.cpp).
    s->nodes_.set(zmq::sockopt::heartbeat_ivl, kZmtpHeartbeatMs);
    s->nodes_.set(zmq::sockopt::heartbeat_timeout, 3 * kZmtpHeartbeatMs);
    try {
      s->nodes_.bind(s->options_.node_endpoint);
    } catch (const zmq::error_t& e) {
      return std::unexpected(
          fmt::format("node endpoint {}: {}", s->options_.node_endpoint, e.what()));
    }
    s->node_endpoint_ = s->nodes_.get(zmq::sockopt::last_endpoint);
    s->frontend_ = zmq::socket_t(s->context_, zmq::socket_type::router);
    s->frontend_.set(zmq::sockopt::linger, 0);
    try {
      s->frontend_.bind(s->options_.frontend_endpoint);
    } catch (const zmq::error_t& e) {
      return std::unexpected(fmt::format(
          "frontend endpoint {}: {}{}", s->options_.frontend_endpoint, e.what(),
          s->options_.frontend_endpoint.starts_with("ipc://") ? " (does its directory exist?)"
                                                              : ""));
    }
    s->frontend_endpoint_ = s->frontend_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return std::unexpected(fmt::format("ZeroMQ: {}", e.what()));
  }
  return s;
}

CoordinatorServer::~CoordinatorServer() {
  nodes_.close();
  frontend_.close();
  context_.shutdown();  // the ZAP thread's recv returns ETERM
  zap_.reset();
  context_.close();
}

double CoordinatorServer::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

void CoordinatorServer::send(const std::vector<Outbound>& out) {
  for (const Outbound& o : out) {
    const std::string payload = cluster::encode(o.message);
    try {
      std::array<zmq::const_buffer, 2> frames = {zmq::buffer(o.node_id), zmq::buffer(payload)};
      if (!zmq::send_multipart(nodes_, frames, zmq::send_flags::dontwait)) {
        options_.log(LOG_WARNING,
                     fmt::format("node {}: send queue full, message dropped", o.node_id));
      }
    } catch (const zmq::error_t& e) {
      // Not connected right now (EHOSTUNREACH): its heartbeats stop and liveness decides.
      options_.log(LOG_DEBUG, fmt::format("node {}: not connected ({})", o.node_id, e.what()));
    }
  }
}

void CoordinatorServer::on_node_frames() {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(nodes_, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
  counters_.node_messages.fetch_add(1, std::memory_order_relaxed);
  if (frames.size() != 2) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING, fmt::format("node {}{}: a message of {} frames (expected 1), dropped",
                                          printable_id(frames.at(0)), peer_of(frames.back()),
                                          frames.size() - 1));
    return;
  }
  const std::string routing_id = frames[0].to_string();
  std::string key_node;
  try {
    key_node = frames[1].gets("User-Id");
  } catch (const zmq::error_t&) {
  }
  if (key_node.empty() || key_node != routing_id) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING,
                 fmt::format("node {}{}: its key belongs to node \"{}\"; message dropped",
                             printable_id(frames[0]), peer_of(frames[1]), key_node));
    return;
  }
  auto message = cluster::decode_node_message(frames[1].to_string_view());
  if (!message) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING, fmt::format("node {}: {}; dropped", routing_id, message.error()));
    return;
  }
  if (message->body_case() == v1::NodeMessage::kRegister &&
      message->register_().node_id() != key_node) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING, fmt::format("node {}: registers as \"{}\"; dropped", routing_id,
                                          message->register_().node_id()));
    return;
  }
  const bool known = state_.nodes().contains(routing_id);
  if (message->body_case() == v1::NodeMessage::kRegister) {
    options_.log(LOG_NOTICE,
                 fmt::format("node {} {}: {} GPU(s), {} task(s)", routing_id,
                             known ? "registered again" : "registered",
                             message->register_().gpus_size(), message->register_().tasks_size()));
  } else if (message->body_case() == v1::NodeMessage::kProgress) {
    const v1::TaskStatus& p = message->progress();
    if (p.state() != v1::TASK_RUNNING) {
      options_.log(LOG_INFO, fmt::format("node {}: task {} {}{}", routing_id, p.task().id(),
                                         cluster::task_state_name(p.state()),
                                         p.error().empty() ? "" : ": " + p.error()));
    }
  }
  send(state_.on_node_message(routing_id, *message, now()));
}

void CoordinatorServer::on_frontend_frames() {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(frontend_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    return;
  }
  counters_.frontend_requests.fetch_add(1, std::memory_order_relaxed);
  // A REQ client's envelope: routing id, empty delimiter, body.
  if (frames.size() != 3 || frames[1].size() != 0) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING,
                 fmt::format("frontend{}: a message of {} frames, not a REQ request; dropped",
                             peer_of(frames.back()), frames.size()));
    return;
  }
  v1::FrontendReply reply;
  std::vector<Outbound> out;
  auto request = cluster::decode_frontend_request(frames[2].to_string_view());
  if (!request) {
    counters_.dropped.fetch_add(1);
    options_.log(LOG_WARNING,
                 fmt::format("frontend{}: {}; refused", peer_of(frames[2]), request.error()));
    reply.set_error(request.error());
  } else if (request->body_case() == v1::FrontendRequest::kGatewayHello) {
    if (gateways_.hello(frames[0].to_string(), request->gateway_hello(), now())) {
      options_.log(LOG_NOTICE,
                   fmt::format("gateway {}{} subscribed to routes",
                               request->gateway_hello().gateway_id(), peer_of(frames[2])));
    }
    gateways_.update(GatewayHub::routes(state_.plans(), deployed_));
    *reply.mutable_routes() = gateways_.current();
    // (Queued before the reply is sent, but only orders a drain that run() starts after.)
    state_.on_routes_delivered(now(), out);
  } else {
    reply = state_.on_frontend_request(*request, now(), out);
    if (request->body_case() == v1::FrontendRequest::kLoad) {
      gateways_.load(request->load(), now());
      // HydraServe §6.1's window on the model's load summed over the live gateways.
      if (request->load().window_s() > 0 && reply.error().empty()) {
        const auto loads = gateways_.loads(now());
        if (auto l = loads.find(request->load().model()); l != loads.end()) {
          GatewayDemand demand;
          demand.queue_length = static_cast<std::uint32_t>(
              std::min<std::uint64_t>(l->second.queue_length, UINT32_MAX));
          demand.concurrent_requests = l->second.concurrent_requests;
          demand.arrivals = l->second.arrivals;
          state_.on_gateway_demand(l->first, demand, now(), out);
        }
      }
    } else if (request->body_case() == v1::FrontendRequest::kDeploy && reply.error().empty()) {
      deployed_.insert(request->deploy().model().name());
    }
    if (request->body_case() == v1::FrontendRequest::kColdStart) {
      reply.set_model(request->cold_start().model());
      options_.log(
          LOG_NOTICE,
          reply.error().empty()
              ? fmt::format("cold start of {}: plan {}, {} stage(s)", reply.plan().model(),
                            reply.plan().id(), reply.plan().stages())
              : fmt::format("cold start of {}: {}", request->cold_start().model(), reply.error()));
    }
  }
  const std::string payload = cluster::encode(std::move(reply));
  std::array<zmq::const_buffer, 3> answer = {zmq::buffer(frames[0].data(), frames[0].size()),
                                             zmq::const_buffer(), zmq::buffer(payload)};
  try {
    (void)zmq::send_multipart(frontend_, answer, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
  send(out);
}

void CoordinatorServer::push_routes() {
  const std::vector<std::string> subscribers = gateways_.subscribers(now());
  if (subscribers.empty()) return;
  auto table = gateways_.update(GatewayHub::routes(state_.plans(), deployed_));
  if (!table) return;
  v1::FrontendReply push;
  *push.mutable_routes() = std::move(*table);
  const std::string payload = cluster::encode(std::move(push));
  for (const std::string& id : subscribers) {
    std::array<zmq::const_buffer, 3> frames = {zmq::buffer(id), zmq::const_buffer(),
                                               zmq::buffer(payload)};
    try {
      (void)zmq::send_multipart(frontend_, frames, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      // Gone: it stops saying hello and expires.
    }
  }
  std::vector<Outbound> out;
  state_.on_routes_delivered(now(), out);
  send(out);
}

void CoordinatorServer::run_handovers() {
  for (MigrationOrder& order : state_.take_migrations()) {
    options_.log(LOG_NOTICE,
                 fmt::format("plan {}: hand-over by {} from {} to {}", order.plan_id,
                             order.drain ? "drain" : "KV migration", order.from_url, order.to_url));
    handovers_.start(std::move(order));
  }
  for (const HandoverResult& r : handovers_.finished()) {
    options_.log(r.ok ? LOG_NOTICE : LOG_WARNING,
                 fmt::format("plan {}: hand-over {}{}{}", r.plan_id, r.ok ? "done" : "failed",
                             r.error.empty() ? "" : ": " + r.error,
                             r.detail.empty() ? "" : " (" + r.detail + ")"));
    std::vector<Outbound> out;
    state_.on_migration_result(r.plan_id, r.ok, r.error, now(), out);
    send(out);
  }
}

void CoordinatorServer::run(int stop_fd) {
  double next_tick = 0;
  for (;;) {
    // ClusterState's timers are walked at most every 10 ms (1,000 nodes' messages must not
    // each cost a walk over 1,000 nodes).
    if (const double t = now(); t >= next_tick) {
      std::vector<std::string> died;
      send(state_.tick(t, &died));
      send(class_rates_.updates(state_.nodes(), t));
      for (const std::string& node : died) {
        options_.log(LOG_WARNING, fmt::format("node {} missed {} heartbeats: declared dead, its "
                                              "stages re-planned",
                                              node, options_.cluster.liveness));
      }
      next_tick = t + std::max(state_.next_deadline(t), 0.01);
    }
    const auto wait = std::chrono::milliseconds(
        static_cast<long>(std::ceil(std::max(next_tick - now(), 0.0) * 1000)));
    zmq::pollitem_t items[] = {{nodes_.handle(), 0, ZMQ_POLLIN, 0},
                               {frontend_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, stop_fd, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, wait);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (items[2].revents & ZMQ_POLLIN) return;
    // Drain both sockets: ZeroMQ's descriptors are edge-triggered.
    for (int i = 0; i < 1000 && (nodes_.get(zmq::sockopt::events) & ZMQ_POLLIN); ++i) {
      on_node_frames();
    }
    for (int i = 0; i < 100 && (frontend_.get(zmq::sockopt::events) & ZMQ_POLLIN); ++i) {
      on_frontend_frames();
    }
    run_handovers();
    // Plans, workers and deployments change only through the messages and ticks above.
    push_routes();
  }
}

}  // namespace thaw::coordinator
