#include "cluster_commands.hpp"

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include <zmq.hpp>

#include "bus_client.hpp"
#include "common/proto/cluster/cluster_codec.hpp"
#include "common/text/byte_size.hpp"

namespace thawctl {
namespace {

namespace v1 = thaw::cluster::v1;

v1::FrontendReply ask(const v1::FrontendRequest& request, const ClusterOptions& o) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::req);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, static_cast<int>(o.timeout_s * 1000));
  try {
    socket.connect(o.endpoint);
  } catch (const zmq::error_t& e) {
    fail(fmt::format("--coordinator {}: {}", o.endpoint, e.what()), kExitUsage);
  }
  const std::string payload = thaw::cluster::encode(request);
  (void)socket.send(zmq::buffer(payload), zmq::send_flags::none);
  zmq::message_t reply;
  if (!socket.recv(reply)) {
    fail(
        fmt::format("no reply from the coordinator at {} within {} s; is thaw-coordinator "
                    "running there? (--coordinator or $THAW_COORDINATOR)",
                    o.endpoint, o.timeout_s));
  }
  auto decoded = thaw::cluster::decode_frontend_reply(reply.to_string_view());
  if (!decoded) fail(fmt::format("the coordinator at {}: {}", o.endpoint, decoded.error()));
  return std::move(*decoded);
}

void print_json(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;  // every key present, for scripts
  (void)google::protobuf::util::MessageToJsonString(m, &text, options);
  fmt::print("{}\n", text);
}

// A refusal: JSON {"error": ...} on stdout with --json, the message on stderr, exit 1.
int refused(const v1::FrontendReply& reply, const ClusterOptions& o) {
  if (o.json) print_json(reply);
  fmt::print(stderr, "thawctl: {}\n", reply.error());
  return kExitThawd;
}

std::string bytes(std::uint64_t n) {
  return thaw::text::format_bytes(static_cast<double>(n));
}

void print_plan(const v1::Plan& plan) {
  if (plan.rebuilt()) {
    fmt::print(
        "plan {}: {} in {} stage(s) (rebuilt from node reports after a coordinator "
        "restart)\n",
        plan.id(), plan.model(), plan.stages());
  } else {
    fmt::print("plan {}: {} in {} stage(s), predicted TTFT {:.2f} s, TPOT {:.3f} s{}\n", plan.id(),
               plan.model(), plan.stages(), plan.predicted_ttft_s(), plan.predicted_tpot_s(),
               plan.meets_slo() ? "" : " (no scheme meets the SLOs: one full-memory worker)");
  }
  fmt::print("{:<6} {:<24} {:<4} {:<12} {:<8} {}\n", "STAGE", "NODE", "GPU", "WORKER", "FETCH",
             "BYTES");
  for (const v1::PlannedStage& s : plan.placement()) {
    fmt::print("{:<6} {:<24} {:<4} {:<12} {:<8} {}/{}{}\n", s.stage(), s.node_id(), s.gpu(),
               s.full_memory() ? "full-memory" : "low-memory",
               thaw::cluster::task_state_name(s.fetch_state()), bytes(s.bytes_done()),
               bytes(s.bytes_total()),
               s.replans() > 0 ? fmt::format(" (moved {}×)", s.replans()) : "");
  }
}

}  // namespace

int cluster_deploy(const v1::ModelSpec& model, const ClusterOptions& o) {
  v1::FrontendRequest request;
  *request.mutable_deploy()->mutable_model() = model;
  const v1::FrontendReply reply = ask(request, o);
  if (!reply.error().empty()) return refused(reply, o);
  if (o.json) {
    print_json(reply);
  } else {
    fmt::print("deployed {} ({}, {} layers)\n", reply.deployed().name(),
               bytes(reply.deployed().size_bytes()), reply.deployed().layers());
  }
  return kExitOk;
}

int cluster_cold_start(const std::string& model, const ClusterOptions& o) {
  v1::FrontendRequest request;
  request.mutable_cold_start()->set_model(model);
  const v1::FrontendReply reply = ask(request, o);
  if (!reply.error().empty()) return refused(reply, o);
  if (o.json) {
    print_json(reply);
  } else {
    print_plan(reply.plan());
  }
  return kExitOk;
}

int cluster_load(const std::string& model, double concurrent_requests, unsigned active_instances,
                 double requests_per_s, const ClusterOptions& o) {
  v1::FrontendRequest request;
  request.mutable_load()->set_model(model);
  request.mutable_load()->set_concurrent_requests(concurrent_requests);
  request.mutable_load()->set_active_instances(active_instances);
  request.mutable_load()->set_requests_per_s(requests_per_s);
  const v1::FrontendReply reply = ask(request, o);
  if (!reply.error().empty()) return refused(reply, o);
  if (o.json) print_json(reply);
  return kExitOk;
}

int cluster_state(const ClusterOptions& o) {
  v1::FrontendRequest request;
  request.mutable_state();
  const v1::FrontendReply reply = ask(request, o);
  if (!reply.error().empty()) return refused(reply, o);
  if (o.json) {
    print_json(reply.state());
    return kExitOk;
  }
  const v1::ClusterState& state = reply.state();
  fmt::print("{:<24} {:<6} {:>8} {:>5} {:>12} {:>6}\n", "NODE", "STATE", "HEARD", "GPUS",
             "GPU FREE", "TASKS");
  for (const v1::NodeState& n : state.nodes()) {
    std::uint64_t free = 0;
    for (const v1::GpuInfo& g : n.report().gpus()) free += g.free_bytes();
    fmt::print("{:<24} {:<6} {:>7.1f}s {:>5} {:>12} {:>6}\n", n.node_id(),
               n.alive() ? "alive" : "dead", n.seconds_since_heard(), n.report().gpus_size(),
               bytes(free), n.report().tasks_size());
  }
  if (state.models_size() > 0) fmt::print("\n");
  for (const v1::ModelSpec& m : state.models()) {
    fmt::print("model {}: {}, {} layers, TTFT SLO {} s, TPOT SLO {} s\n", m.name(),
               bytes(m.size_bytes()), m.layers(), m.slo_ttft_s(), m.slo_tpot_s());
  }
  for (const v1::Plan& p : state.plans()) {
    fmt::print("\n");
    print_plan(p);
  }
  if (state.loads_size() > 0) {
    fmt::print(
        "\nload per {:.0f} s window ({} prewarm round(s)):\n{:<24} {:>7} {:>9} {:>9} {:>9} "
        "{:>9} {:>4} {:>8}\n",
        state.window_s(), state.prewarm_rounds(), "MODEL", "WINDOWS", "LAST AVG", "LAST PEAK",
        "PRED AVG", "PRED PEAK", "K", "REPLICAS");
    for (const v1::ModelLoadState& l : state.loads()) {
      fmt::print("{:<24} {:>7} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>4} {:>8}\n", l.model(),
                 l.windows(), l.last_average(), l.last_peak(), l.predicted_average(),
                 l.predicted_peak(), l.active_instances(), l.replicas_wanted());
    }
  }
  return kExitOk;
}

}  // namespace thawctl
