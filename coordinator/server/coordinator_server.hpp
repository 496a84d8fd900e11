// CoordinatorServer: thaw-coordinator's sockets around ClusterState.
//
//   nodes     ROUTER, CURVE server; each node agent is a DEALER whose routing id is its node id
//             and whose key the ZAP handler maps to that id. A message whose routing id or
//             registered node_id differs from its key's node is dropped with a log line.
//             ROUTER_HANDOVER: a reconnecting agent takes over its id from a dead connection.
//             ZMTP heartbeats are on only to drop dead TCP; liveness is the application's
//             (ClusterState's Paranoid Pirate heartbeats).
//   frontend  ROUTER for REQ clients (thawctl cluster, serving frontends): deploy, cold start,
//             load reports, state. Not encrypted: bind it to loopback or an ipc:// path whose
//             directory permissions decide who may use it. thaw-gateway connects a DEALER
//             here: its GatewayHello subscribes it to the route table, which is pushed to it
//             (unsolicited replies) whenever it changes (gateway_hub.hpp).
//
// One thread: run() polls both sockets and a stop descriptor, decodes and validates every
// message (cluster_codec), hands it to ClusterState and sends what that returns; bad input is
// logged with the peer and dropped, never fatal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <zmq.hpp>

#include "common/zmq/curve_keys.hpp"
#include "coordinator/cluster/class_rate_dispatch.hpp"
#include "coordinator/cluster/cluster_state.hpp"
#include "coordinator/server/gateway_hub.hpp"
#include "coordinator/server/handover_runner.hpp"
#include "coordinator/server/node_allow_list.hpp"
#include "coordinator/server/zap_handler.hpp"

namespace thaw::coordinator {

// ZMTP (transport-level) heartbeats on the node endpoint, both sides: they only drop dead TCP
// connections, so they are far apart; node liveness is ClusterState's heartbeats.
inline constexpr int kZmtpHeartbeatMs = 30'000;

struct ServerOptions {
  std::string node_endpoint = "tcp://*:5570";
  std::string frontend_endpoint = "ipc:///run/thaw-coordinator/frontend.sock";
  zmqx::CurveKeyPair key;               // the coordinator's
  std::filesystem::path allowed_nodes;  // <node-id>.pub files
  ClusterConfig cluster;
  ZapHandler::Logger log;
};

struct ServerCounters {
  std::atomic<std::uint64_t> node_messages{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> frontend_requests{0};
};

class CoordinatorServer {
 public:
  static std::expected<std::unique_ptr<CoordinatorServer>, std::string> start(
      ServerOptions options);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Serves until `stop_fd` becomes readable (a signalfd or an eventfd).
  void run(int stop_fd);

  // The endpoints as bound (a "tcp://127.0.0.1:*" becomes its port).
  const std::string& node_endpoint() const { return node_endpoint_; }
  const std::string& frontend_endpoint() const { return frontend_endpoint_; }
  const ServerCounters& counters() const { return counters_; }
  // Gateways' subscriptions and load reports (HydraServe §6.1's window inputs: loads()).
  const GatewayHub& gateways() const { return gateways_; }

 private:
  explicit CoordinatorServer(ServerOptions options);
  void on_node_frames();
  void on_frontend_frames();
  void send(const std::vector<Outbound>& out);
  double now() const;
  // Pushes the route table to every live gateway when it changed.
  void push_routes();
  // Starts the hand-overs ClusterState ordered and feeds back those that ended.
  void run_handovers();

  ServerOptions options_;
  ClusterState state_;
  ClassRateDispatch class_rates_;  // nodes' traffic-class rates, after each tick
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::unique_ptr<NodeAllowList> allow_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // bound before the node socket
  zmq::socket_t nodes_;
  zmq::socket_t frontend_;
  std::string node_endpoint_;
  std::string frontend_endpoint_;
  ServerCounters counters_;
  GatewayHub gateways_;
  HandoverRunner handovers_;
  std::set<std::string> deployed_;  // models deployed in this run (plans() has the rebuilt ones)
};

}  // namespace thaw::coordinator
