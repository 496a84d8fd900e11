#include "gateway/coordinator_link.hpp"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <syslog.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/proto/cluster/cluster_codec.hpp"

namespace thaw::gateway {

RouteMap route_map_from(const v1::RouteTable& table) {
  RouteMap out;
  for (const v1::ModelRoute& m : table.models()) {
    std::vector<WorkerRoute>& workers = out[m.model()];
    for (const v1::WorkerRoute& w : m.workers()) {
      WorkerRoute r;
      r.url = w.url();
      switch (w.state()) {
        case v1::WORKER_SERVING:
          r.state = WorkerState::serving;
          break;
        case v1::WORKER_DRAINING:
          r.state = WorkerState::draining;
          break;
        default:
          r.state = WorkerState::cold_starting;
      }
      r.plan_id = w.plan_id();
      r.stage = w.stage();
      r.node_id = w.node_id();
      workers.push_back(std::move(r));
    }
  }
  return out;
}

RouteMap RouteTableTracker::accept(const v1::RouteTable& table,
                                   std::chrono::steady_clock::time_point now) {
  RouteMap routes = route_map_from(table);
  if (last_generation_ != 0 && table.generation() < last_generation_) {
    ++restarts_;
    grace_until_ = now + grace_;
  } else if (now >= grace_until_) {
    known_.clear();
  }
  last_generation_ = table.generation();
  if (now < grace_until_) {
    for (const std::string& model : known_) routes.try_emplace(model);
  }
  for (const auto& [model, workers] : routes) known_.insert(model);
  return routes;
}

CoordinatorLink::CoordinatorLink(CoordinatorLinkOptions options, Router& router)
    : options_(std::move(options)), router_(router), tracker_(options_.restart_grace) {
  if (!options_.log) options_.log = [](int, const std::string&) {};
}

std::expected<std::unique_ptr<CoordinatorLink>, std::string> CoordinatorLink::start(
    CoordinatorLinkOptions options, Router& router) {
  if (options.endpoint.empty()) return std::unexpected("no coordinator endpoint given");
  if (auto ok = cluster::validate_node_id(options.gateway_id); !ok) {
    return std::unexpected(fmt::format("gateway id: {}", ok.error()));
  }
  std::unique_ptr<CoordinatorLink> link(new CoordinatorLink(std::move(options), router));
  link->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (link->wake_fd_ < 0) return std::unexpected(fmt::format("eventfd: {}", strerror(errno)));
  link->report_load({});  // the first hello: the coordinator answers with the table
  // The socket is made on the thread that uses it; a bad endpoint is reported from there too,
  // so check its form here, where the caller can still refuse to start.
  if (!link->options_.endpoint.starts_with("tcp://") &&
      !link->options_.endpoint.starts_with("ipc://")) {
    return std::unexpected(
        fmt::format("coordinator endpoint {}: expected tcp://HOST:PORT or "
                    "ipc://PATH (thaw-coordinator serve --frontend)",
                    link->options_.endpoint));
  }
  link->thread_ = std::thread([l = link.get()] { l->run(); });
  return link;
}

CoordinatorLink::~CoordinatorLink() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  const std::uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void CoordinatorLink::enqueue(v1::FrontendRequest request) {
  std::string bytes = cluster::encode(std::move(request));
  {
    std::lock_guard lock(mutex_);
    // A coordinator that is away for long must not make the gateway grow: the oldest reports
    // go first (newer ones carry the same kind of news).
    if (outbox_.size() >= kMaxOutbox) outbox_.pop_front();
    outbox_.push_back(std::move(bytes));
  }
  const std::uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void CoordinatorLink::request_cold_start(const std::string& model) {
  v1::FrontendRequest r;
  r.mutable_cold_start()->set_model(model);
  options_.log(LOG_INFO, fmt::format("asking the coordinator for a cold start of {}", model));
  enqueue(std::move(r));
}

void CoordinatorLink::report_load(const std::vector<ModelLoadSample>& samples) {
  v1::FrontendRequest hello;
  hello.mutable_gateway_hello()->set_gateway_id(options_.gateway_id);
  hello.mutable_gateway_hello()->set_report_interval_s(
      std::chrono::duration<double>(options_.report_interval).count());
  enqueue(std::move(hello));
  for (const ModelLoadSample& s : samples) {
    v1::FrontendRequest r;
    v1::LoadReport* l = r.mutable_load();
    l->set_model(s.model);
    l->set_concurrent_requests(static_cast<double>(s.concurrent));
    l->set_requests_per_s(s.window_s > 0 ? static_cast<double>(s.arrivals) / s.window_s : 0);
    l->set_active_instances(s.active_instances);
    l->set_queue_length(
        static_cast<std::uint32_t>(std::min<std::uint64_t>(s.queue_length, UINT32_MAX)));
    l->set_arrivals(s.arrivals);
    l->set_window_s(s.window_s);
    l->set_gateway_id(options_.gateway_id);
    enqueue(std::move(r));
  }
}

void CoordinatorLink::run() {
  zmq::context_t context;
  zmq::socket_t socket;
  try {
    socket = zmq::socket_t(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndhwm, 1000);
    socket.set(zmq::sockopt::reconnect_ivl, 200);
    socket.set(zmq::sockopt::reconnect_ivl_max, 2000);
    socket.connect(options_.endpoint);
  } catch (const zmq::error_t& e) {
    options_.log(LOG_ERR, fmt::format("coordinator {}: {}; running on the last routes only",
                                      options_.endpoint, e.what()));
    return;
  }
  for (;;) {
    std::deque<std::string> out;
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      out.swap(outbox_);
    }
    for (const std::string& bytes : out) {
      // A DEALER talking to a ROUTER that expects REQ envelopes: an empty delimiter first.
      std::array<zmq::const_buffer, 2> frames = {zmq::const_buffer(), zmq::buffer(bytes)};
      try {
        if (!zmq::send_multipart(socket, frames, zmq::send_flags::dontwait)) {
          options_.log(LOG_DEBUG, "coordinator not reachable: a report was dropped");
        }
      } catch (const zmq::error_t& e) {
        options_.log(LOG_WARNING, fmt::format("coordinator send: {}", e.what()));
      }
    }
    zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(1000));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      options_.log(LOG_ERR, fmt::format("coordinator poll: {}", e.what()));
      return;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      std::uint64_t n;
      (void)!read(wake_fd_, &n, sizeof n);
    }
    while (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        break;
      }
      if (frames.size() != 2 || frames[0].size() != 0) {
        options_.log(LOG_WARNING,
                     fmt::format("coordinator: a message of {} frames; dropped", frames.size()));
        continue;
      }
      auto reply = cluster::decode_frontend_reply(frames[1].to_string_view());
      if (!reply) {
        options_.log(LOG_WARNING, fmt::format("coordinator: {}; dropped", reply.error()));
        continue;
      }
      if (reply->body_case() == v1::FrontendReply::kRoutes) {
        const std::uint64_t restarts = tracker_.restarts();
        router_.replace(tracker_.accept(reply->routes(), std::chrono::steady_clock::now()));
        if (tracker_.restarts() != restarts) {
          options_.log(LOG_NOTICE,
                       "the coordinator restarted: keeping the models it does not "
                       "list yet for the restart grace period");
        }
        tables_.fetch_add(1);
        options_.log(LOG_DEBUG,
                     fmt::format("route table {} ({} models)", reply->routes().generation(),
                                 reply->routes().models_size()));
      } else if (reply->body_case() == v1::FrontendReply::kPlan) {
        options_.log(LOG_NOTICE,
                     fmt::format("cold start of {}: plan {}, {} stage(s)", reply->plan().model(),
                                 reply->plan().id(), reply->plan().stages()));
      } else if (!reply->error().empty()) {
        options_.log(LOG_WARNING, fmt::format("coordinator: {}", reply->error()));
        // A refused cold start (load replies carry no model): its held requests fail now.
        if (!reply->model().empty()) router_.cold_start_refused(reply->model(), reply->error());
      }
    }
  }
}

}  // namespace thaw::gateway
