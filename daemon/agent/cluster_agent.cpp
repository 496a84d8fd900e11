#include "daemon/agent/cluster_agent.hpp"

#include <fmt/format.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cmath>
#include <zmq.hpp>

#include "common/proto/cluster/cluster_codec.hpp"
#include "daemon/log/log.hpp"

namespace thaw::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<long>(std::ceil(seconds * 1000)));
}

// ZMTP heartbeats: as the coordinator's (coordinator/server/coordinator_server.hpp).
constexpr int kZmtpHeartbeatMs = 30'000;

// Progress is looked at this often between heartbeats (a fetch's bytes move fast).
constexpr double kProgressPeriod = 0.25;

}  // namespace

std::expected<std::unique_ptr<ClusterAgent>, std::string> ClusterAgent::start(
    AgentConfig config, NodeService& service, TaskRunner& tasks, WorkerLauncher& workers) {
  if (auto ok = zmqx::curve_available(); !ok) return std::unexpected(ok.error());
  if (auto ok = cluster::validate_node_id(config.node_id); !ok) {
    return std::unexpected(fmt::format("node id \"{}\": {}; set node.id in /etc/thaw/thawd.toml",
                                       config.node_id, ok.error()));
  }
  if (auto ok = zmqx::check_z85_key(config.coordinator_public_z85); !ok) {
    return std::unexpected("the coordinator's public key: " + ok.error());
  }
  std::unique_ptr<ClusterAgent> agent(new ClusterAgent(std::move(config), service, tasks, workers));
  agent->stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!agent->stop_) return std::unexpected("cannot create an eventfd");
  agent->thread_ = std::thread([a = agent.get()] { a->run(); });
  return agent;
}

ClusterAgent::ClusterAgent(AgentConfig config, NodeService& service, TaskRunner& tasks,
                           WorkerLauncher& workers)
    : config_(std::move(config)), service_(service), tasks_(tasks), workers_(workers) {}

ClusterAgent::~ClusterAgent() {
  const std::uint64_t one = 1;
  if (stop_) (void)::write(stop_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

AgentStatus ClusterAgent::status() const {
  return {connected_.load(), registrations_.load(), reconnects_.load(), dropped_.load()};
}

v1::Register ClusterAgent::registration() const {
  v1::Register r = resources();
  r.set_node_id(config_.node_id);
  r.set_thaw_version(THAW_VERSION);
  r.set_network_bytes_per_s(static_cast<double>(config_.network_bytes_per_s));
  r.set_shapes_traffic(config_.shapes_traffic);
  r.set_worker_host(config_.worker_host);
  *r.mutable_startup() = tasks_.startup_costs();
  for (const ModelStatus& m : service_.models()) {
    v1::CachedModel* c = r.add_cache();
    c->set_key(m.key);
    c->set_state(std::string(to_string(m.state)));
    c->set_fetched_bytes(m.fetched_bytes);
    c->set_total_bytes(m.total_bytes);
  }
  for (const v1::TaskStatus& t : tasks_.held()) *r.add_tasks() = t;
  return r;
}

v1::Register ClusterAgent::resources() const {
  v1::Register r;
  const std::vector<std::uint32_t> busy = workers_.busy_gpus();
  for (const GpuStatus& g : service_.gpus()) {
    v1::GpuInfo* gpu = r.add_gpus();
    gpu->set_index(g.index);
    gpu->set_memory_bytes(g.pool_bytes);
    gpu->set_free_bytes(std::min(g.free_bytes, g.pool_bytes));
    gpu->set_pcie_bytes_per_s(static_cast<double>(config_.pcie_bytes_per_s));
    gpu->set_runs_worker(std::ranges::find(busy, g.index) != busy.end());
  }
  for (const SlotStatus& s : service_.slots()) {
    v1::SlotInfo* slot = r.add_slots();
    slot->set_id(s.id);
    slot->set_gpu(s.gpu);
    slot->set_model(s.model);
    slot->set_state(s.state);
    slot->set_resident_bytes(s.resident_bytes);
  }
  return r;
}

void ClusterAgent::run() {
  zmq::context_t context(1);
  double interval = config_.heartbeat_interval_s;
  int liveness = config_.liveness;
  double backoff = 1;
  std::uint64_t sequence = 0;
  bool stopping = false;

  auto send = [&](zmq::socket_t& socket, v1::NodeMessage message) {
    const std::string payload = cluster::encode(std::move(message));
    try {
      (void)socket.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  };
  std::string last_resources;         // serialised GPUs and slots as last reported
  std::uint32_t reported_starts = 0;  // worker starts in the last reported averages
  auto send_registration = [&](zmq::socket_t& socket) {
    v1::NodeMessage m;
    *m.mutable_register_() = registration();
    last_resources = resources().SerializeAsString();
    reported_starts = m.register_().startup().samples();
    send(socket, std::move(m));
    registrations_.fetch_add(1);
  };
  // Sleeps `seconds` unless told to stop; returns false when stopping.
  auto pause = [&](double seconds) {
    zmq::pollitem_t item{nullptr, stop_.get(), ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, millis(seconds));
    return (item.revents & ZMQ_POLLIN) == 0;
  };

  while (!stopping) {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::routing_id, config_.node_id);
    socket.set(zmq::sockopt::curve_serverkey, config_.coordinator_public_z85);
    socket.set(zmq::sockopt::curve_publickey, config_.node_key.public_z85);
    socket.set(zmq::sockopt::curve_secretkey, config_.node_key.secret_z85);
    // Transport heartbeats only drop a dead TCP connection; liveness is the application's
    // (see kZmtpHeartbeatMs on the coordinator's side: they cost it CPU per peer).
    socket.set(zmq::sockopt::heartbeat_ivl, kZmtpHeartbeatMs);
    socket.set(zmq::sockopt::heartbeat_timeout, 3 * kZmtpHeartbeatMs);
    try {
      socket.connect(config_.endpoint);
    } catch (const zmq::error_t& e) {
      log(LogLevel::error, fmt::format("coordinator.endpoint {}: {}", config_.endpoint, e.what()));
      return;
    }
    send_registration(socket);
    bool welcomed = false;
    auto heard = Clock::now();
    auto next_heartbeat = Clock::now() + millis(interval);
    auto next_progress = Clock::now() + millis(kProgressPeriod);
    bool silent = false;

    try {
      while (!stopping) {
        const auto wake = std::min(next_heartbeat, next_progress);
        zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                   {nullptr, stop_.get(), ZMQ_POLLIN, 0}};
        zmq::poll(
            items, 2,
            std::max(std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()),
                     std::chrono::milliseconds(0)));
        if (items[1].revents & ZMQ_POLLIN) {
          stopping = true;
          break;
        }
        while (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) {
          zmq::message_t frame;
          if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
          auto message = cluster::decode_coordinator_message(frame.to_string_view());
          if (!message) {
            dropped_.fetch_add(1);
            log(LogLevel::warning,
                fmt::format("coordinator {}: {}; dropped", config_.endpoint, message.error()));
            continue;
          }
          heard = Clock::now();
          backoff = 1;
          switch (message->body_case()) {
            case v1::CoordinatorMessage::kWelcome:
              interval = message->welcome().heartbeat_interval_ms() / 1000.0;
              liveness = static_cast<int>(message->welcome().liveness());
              next_heartbeat = std::min(next_heartbeat, Clock::now() + millis(interval));
              if (!connected_.exchange(true) || silent) {
                log(LogLevel::notice,
                    fmt::format("registered with the coordinator at {}", config_.endpoint));
              }
              silent = false;
              welcomed = true;
              break;
            case v1::CoordinatorMessage::kReRegister:
              log(LogLevel::notice, fmt::format("coordinator asks to register again: {}",
                                                message->re_register().reason()));
              send_registration(socket);
              break;
            case v1::CoordinatorMessage::kTask: {
              v1::NodeMessage progress;
              *progress.mutable_progress() = tasks_.start(message->task());
              send(socket, std::move(progress));
              break;
            }
            case v1::CoordinatorMessage::kClassRates:
              if (config_.on_class_rates) config_.on_class_rates(message->class_rates());
              break;
            default:
              break;  // a heartbeat: being heard is all it says
          }
        }
        const auto now = Clock::now();
        if (now >= next_progress) {
          for (v1::TaskStatus& status : tasks_.poll()) {
            v1::NodeMessage progress;
            *progress.mutable_progress() = std::move(status);
            send(socket, std::move(progress));
          }
          next_progress = now + millis(kProgressPeriod);
        }
        if (now >= next_heartbeat) {
          if (now - heard > millis(interval * liveness)) {
            connected_ = false;
            silent = true;
            break;  // reconnect
          }
          if (welcomed) {
            v1::NodeMessage beat;
            v1::Heartbeat* h = beat.mutable_heartbeat();
            h->set_sequence(++sequence);
            // GPU pools and slots ride along when they changed since the last report.
            v1::Register now_have = resources();
            std::string text = now_have.SerializeAsString();
            if (text != last_resources) {
              h->set_resources_changed(true);
              *h->mutable_gpus() = now_have.gpus();
              *h->mutable_slots() = now_have.slots();
              last_resources = std::move(text);
            }
            // Start-up averages when a worker became ready since the last beat.
            const v1::StartupCosts costs = tasks_.startup_costs();
            if (costs.samples() != reported_starts) {
              *h->mutable_startup() = costs;
              reported_starts = costs.samples();
            }
            send(socket, std::move(beat));
          } else {
            // Not welcomed yet: a registration sent before the handshake succeeded (say the
            // coordinator had not read our key yet) may be lost, so the heartbeat is one.
            send_registration(socket);
          }
          next_heartbeat = now + millis(interval);
        }
      }
    } catch (const zmq::error_t& e) {
      // Not expected (signals are blocked in thawd's threads); start over on a new socket.
      log(LogLevel::error, fmt::format("coordinator link: {}", e.what()));
    }
    if (stopping) break;
    log(LogLevel::warning,
        welcomed ? fmt::format("coordinator {} silent for {} heartbeats; reconnecting in {:.0f} s",
                               config_.endpoint, liveness, backoff)
                 : fmt::format("no answer from the coordinator at {}: is it running, and is this "
                               "node's public key in its allow directory as {}.pub? (its log "
                               "says \"refused\" if not); trying again in {:.0f} s",
                               config_.endpoint, config_.node_id, backoff));
    reconnects_.fetch_add(1);
    socket.close();
    if (!pause(backoff)) break;
    backoff = std::min(backoff * 2, config_.max_backoff_s);
  }
  connected_ = false;
}

}  // namespace thaw::daemon
