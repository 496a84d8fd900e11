// ClusterAgent: thawd's link to thaw-coordinator, on its own thread.
//
// A ZeroMQ DEALER whose routing id is the node id, encrypted with CURVE (the node's key pair,
// the coordinator's public key). On connect it registers (GPUs, link and PCIe bandwidth,
// cache, slots, every task it holds); then it heartbeats every interval (the coordinator's
// Welcome sets interval and liveness) and reports task progress as it changes.
//
// Paranoid Pirate, node side: any message from the coordinator proves it alive. After
// liveness × interval of silence the agent drops the socket and connects again after a
// backoff (1 s, doubling to 32 s; reset by the next message), then registers afresh — so a
// restarted coordinator rebuilds its state from the nodes. A ReRegister (the coordinator
// does not know this node) is answered with a registration at once.
//
// Nothing the coordinator says is trusted beyond decode-and-validate (cluster_codec); a bad
// message is logged and dropped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/fd/unique_fd.hpp"
#include "common/proto/cluster/cluster.pb.h"
#include "common/zmq/curve_keys.hpp"
#include "daemon/agent/task_runner.hpp"

namespace thaw::daemon {

struct AgentConfig {
  std::string endpoint;
  std::string node_id;
  zmqx::CurveKeyPair node_key;
  std::string coordinator_public_z85;
  std::uint64_t network_bytes_per_s = 0;
  std::uint64_t pcie_bytes_per_s = 0;
  // thawd's shaper runs and applies the coordinator's ClassRates (Register.shapes_traffic).
  bool shapes_traffic = false;
  double heartbeat_interval_s = 1.0;  // until the coordinator's Welcome says otherwise
  int liveness = 3;
  double max_backoff_s = 32;
  // The coordinator's rates for this node's traffic classes (ClassRates), on the agent's
  // thread; unset: ignored.
  std::function<void(const v1::ClassRates&)> on_class_rates;
  // Where the other stages of a pipeline and the gateways reach this node's workers (an
  // address of this node); "" : the coordinator cannot wire pipelines across nodes to it.
  std::string worker_host;
};

struct AgentStatus {
  bool connected = false;  // registered and hearing the coordinator
  std::uint64_t registrations = 0;
  std::uint64_t reconnects = 0;
  std::uint64_t dropped = 0;  // invalid messages from the coordinator
};

class ClusterAgent {
 public:
  // Fails on a bad key or endpoint; the connection itself is retried forever.
  static std::expected<std::unique_ptr<ClusterAgent>, std::string> start(AgentConfig config,
                                                                         NodeService& service,
                                                                         TaskRunner& tasks,
                                                                         WorkerLauncher& workers);
  ~ClusterAgent();  // stops the thread
  ClusterAgent(const ClusterAgent&) = delete;
  ClusterAgent& operator=(const ClusterAgent&) = delete;

  AgentStatus status() const;

 private:
  ClusterAgent(AgentConfig config, NodeService& service, TaskRunner& tasks,
               WorkerLauncher& workers);
  void run();
  v1::Register registration() const;
  v1::Register resources() const;  // GPUs and slots only (what heartbeats carry when changed)

  AgentConfig config_;
  NodeService& service_;
  TaskRunner& tasks_;
  WorkerLauncher& workers_;
  UniqueFd stop_;  // eventfd
  std::atomic<bool> connected_{false};
  std::atomic<std::uint64_t> registrations_{0}, reconnects_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace thaw::daemon
