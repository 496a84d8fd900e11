// CoordinatorLink: the ZeroMQ ControlPlane. A DEALER on the coordinator's frontend endpoint
// (coordinator/server/coordinator_server.hpp; cluster.proto's gateway section): GatewayHello
// at start and every report interval (which keeps the subscription alive), a LoadReport per
// model per interval, ColdStart on demand; each RouteTable the coordinator sends (as a reply
// or pushed on change) replaces the Router's table.
//
// One thread owns the socket (ZeroMQ sockets are not thread-safe); callers queue messages and
// wake it through an eventfd.
#pragma once

#include <chrono>
#include <deque>
#include <expected>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/proto/cluster/cluster.pb.h"
#include "gateway/control_plane.hpp"

namespace thaw::gateway {

namespace v1 = thaw::cluster::v1;

// The route table as the Router takes it (exposed for tests).
RouteMap route_map_from(const v1::RouteTable& table);

// Turns the coordinator's tables into the Router's, across a coordinator restart: a restarted
// coordinator (its generation starts again) knows only the models its nodes' tasks name until
// frontends deploy the others again. For `grace` after a restart, models the gateway knew are
// kept, with no workers: their requests are held and answered 503 + Retry-After (try again),
// not 404 (no such model).
class RouteTableTracker {
 public:
  explicit RouteTableTracker(std::chrono::milliseconds grace) : grace_(grace) {}
  RouteMap accept(const v1::RouteTable& table, std::chrono::steady_clock::time_point now);
  std::uint64_t restarts() const { return restarts_; }

 private:
  std::chrono::milliseconds grace_;
  std::uint64_t last_generation_ = 0;
  std::uint64_t restarts_ = 0;
  std::set<std::string> known_;  // models of the last table before the restart
  std::chrono::steady_clock::time_point grace_until_{};
};

struct CoordinatorLinkOptions {
  std::string endpoint;  // the coordinator's --frontend endpoint
  std::string gateway_id;
  std::chrono::milliseconds report_interval{1000};
  std::function<void(int priority, const std::string&)> log;
  std::chrono::milliseconds restart_grace{30'000};  // RouteTableTracker
};

inline constexpr std::size_t kMaxOutbox = 4096;

class CoordinatorLink final : public ControlPlane {
 public:
  // Connects (ZeroMQ connects lazily: a coordinator that is not up yet is fine), says hello
  // and starts the link's thread; route tables received go to `router`. The caller reports
  // load every interval (report_load also says hello again).
  static std::expected<std::unique_ptr<CoordinatorLink>, std::string> start(
      CoordinatorLinkOptions options, Router& router);
  ~CoordinatorLink() override;

  void request_cold_start(const std::string& model) override;
  void report_load(const std::vector<ModelLoadSample>& samples) override;

  std::uint64_t tables_received() const { return tables_.load(); }

 private:
  CoordinatorLink(CoordinatorLinkOptions options, Router& router);
  void run();
  void enqueue(v1::FrontendRequest request);

  CoordinatorLinkOptions options_;
  Router& router_;
  int wake_fd_ = -1;
  std::mutex mutex_;
  std::deque<std::string> outbox_;  // encoded requests, at most kMaxOutbox
  bool stop_ = false;
  std::atomic<std::uint64_t> tables_{0};
  RouteTableTracker tracker_{std::chrono::milliseconds(0)};  // set in the constructor
  std::thread thread_;
};

}  // namespace thaw::gateway
