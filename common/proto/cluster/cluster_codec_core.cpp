#include "common/proto/cluster/cluster_codec_core.hpp"

#include <fmt/format.h>

#include <bitset>
#include <cmath>
#include <limits>

// protobuf (up to 3.x) writes its own line to stderr for some malformed input (a string field
// that is not UTF-8); the caller already logs one line naming the peer, so that one is muted.
// Newer protobuf (abseil logging) has no LogSilencer and writes nothing here.
#if __has_include(<google/protobuf/stubs/logging.h>)
#include <google/protobuf/stubs/logging.h>
#define THAW_CLUSTER_HAVE_LOG_SILENCER 1
#endif

namespace thaw::cluster {
namespace core {
namespace {

constexpr std::size_t kMaxNodeIdBytes = 64;  // it becomes part of unit names and log fields
constexpr std::size_t kMaxNameBytes = 256;
constexpr std::uint32_t kMaxGpus = 64;
constexpr int kMaxListed = 4096;  // cached models, slots or tasks in one registration
constexpr std::uint32_t kMaxStages = 64;
constexpr std::uint32_t kMaxLayers = 100'000;
constexpr std::uint32_t kMaxColdStartsPerNode = 4096;
constexpr int kTrafficClasses = 4;  // bpf/traffic_class.h's THAW_CLASS_COUNT

template <typename Message>
std::string parse(std::string_view bytes, std::size_t limit, std::string_view what, Message& out) {
  out.Clear();
  // Checked before parsing: the size is the one thing known about a message that does not
  // parse, and a peer must not make us allocate for a body we would refuse anyway.
  if (bytes.size() > limit) {
    return fmt::format("{} of {} bytes is over the {} byte limit", what, bytes.size(), limit);
  }
  bool parsed = false;
  {
#ifdef THAW_CLUSTER_HAVE_LOG_SILENCER
    google::protobuf::LogSilencer quiet;
#endif
    parsed = out.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  }
  if (!parsed) {
    out.Clear();
    return fmt::format("{} of {} bytes does not parse (malformed, truncated or not UTF-8)", what,
                       bytes.size());
  }
  if (out.version() != kProtocolVersion) {
    const std::uint32_t version = out.version();
    out.Clear();
    return fmt::format("{} has protocol version {}; this build speaks {}", what, version,
                       kProtocolVersion);
  }
  return {};
}

// Wraps a decoder's checks: on failure `out` is cleared, so no caller can act on a message
// that was refused.
template <typename Message>
std::string refuse(Message& out, std::string error) {
  out.Clear();
  return error;
}

bool finite_non_negative(double v) {
  return std::isfinite(v) && v >= 0;
}

// The offending byte of a name, for a message.
std::string byte_name(unsigned char c) {
  if (c == ' ') return "a space";
  if (c < 0x21 || c >= 0x7f) return fmt::format("byte 0x{:02x}", c);
  return fmt::format("'{}'", static_cast<char>(c));
}

std::string validate_name(std::string_view name, std::string_view what) {
  if (name.empty()) return fmt::format("{} is empty", what);
  if (name.size() > kMaxNameBytes) {
    return fmt::format("{} {} is {} bytes long (at most {})", what, quoted(name), name.size(),
                       kMaxNameBytes);
  }
  for (unsigned char c : name) {
    // Bytes >= 0x80 are allowed: the string parsed, so they are UTF-8.
    if (c < 0x21 || c == 0x7f) {
      return fmt::format("{} {} contains {} (no spaces or control characters)", what, quoted(name),
                         byte_name(c));
    }
  }
  return {};
}

// A route table a gateway acts on: every URL is one it may connect to (http://, bounded, no
// spaces), every model named.
std::string validate_routes(const v1::RouteTable& table) {
  if (table.models_size() > kMaxListed) {
    return fmt::format("{} models (at most {})", table.models_size(), kMaxListed);
  }
  for (const v1::ModelRoute& m : table.models()) {
    if (auto e = validate_name(m.model(), "model name"); !e.empty()) return e;
    if (m.workers_size() > kMaxListed) {
      return fmt::format("model {}: {} workers (at most {})", quoted(m.model()), m.workers_size(),
                         kMaxListed);
    }
    for (const v1::WorkerRoute& w : m.workers()) {
      if (!v1::WorkerState_IsValid(w.state()) || w.state() == v1::WORKER_STATE_UNSPECIFIED) {
        return fmt::format("model {}: a worker without a state", quoted(m.model()));
      }
      if (w.url().empty()) {
        if (w.state() != v1::WORKER_COLD_STARTING) {
          return fmt::format("model {}: a serving or draining worker without a URL",
                             quoted(m.model()));
        }
        continue;
      }
      if (auto e = validate_name(w.url(), "worker URL"); !e.empty()) return e;
      if (!w.url().starts_with("http://")) {
        return fmt::format("model {}: worker URL {} is not http://", quoted(m.model()),
                           quoted(w.url()));
      }
    }
  }
  return {};
}

std::string validate_status(const v1::TaskStatus& status) {
  if (auto e = validate_task(status.task()); !e.empty()) return e;
  if (status.state() == v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(status.state())) {
    return fmt::format("task {}: state not set (got {})", quoted(status.task().id()),
                       static_cast<int>(status.state()));
  }
  if (status.bytes_total() != 0 && status.bytes_done() > status.bytes_total()) {
    return fmt::format("task {}: {} bytes done of {} in total", quoted(status.task().id()),
                       status.bytes_done(), status.bytes_total());
  }
  return {};
}

// A node's GPUs, in a registration or a heartbeat's resource update.
std::string validate_gpus(const google::protobuf::RepeatedPtrField<v1::GpuInfo>& gpus) {
  if (gpus.size() > static_cast<int>(kMaxGpus)) {
    return fmt::format("{} GPUs listed (at most {})", gpus.size(), kMaxGpus);
  }
  std::bitset<kMaxGpus> seen;
  for (const v1::GpuInfo& g : gpus) {
    // Tasks name GPUs by index, so an index must be in the range a task may carry and unique.
    if (g.index() >= kMaxGpus) {
      return fmt::format("GPU index {} (at most {})", g.index(), kMaxGpus - 1);
    }
    if (seen.test(g.index())) return fmt::format("GPU {} is listed twice", g.index());
    seen.set(g.index());
    if (g.free_bytes() > g.memory_bytes()) {
      return fmt::format("GPU {} has more free bytes ({}) than memory ({})", g.index(),
                         g.free_bytes(), g.memory_bytes());
    }
    if (!finite_non_negative(g.pcie_bytes_per_s())) {
      return fmt::format("GPU {} PCIe bandwidth {} is not a non-negative number", g.index(),
                         g.pcie_bytes_per_s());
    }
  }
  return {};
}

// Averages the coordinator feeds into Alg. 1: finite, non-negative, under a day.
std::string validate_startup(const v1::StartupCosts& c) {
  for (double v :
       {c.process_start_s(), c.cuda_init_s(), c.weights_s(), c.engine_init_s(), c.ready_s()}) {
    if (!finite_non_negative(v) || v > 86400) {
      return fmt::format("start-up phase of {} s (0 to 86400)", v);
    }
  }
  return {};
}

std::string validate_heartbeat(const v1::Heartbeat& h) {
  if (auto e = validate_startup(h.startup()); !e.empty()) return e;
  if (!h.resources_changed() && (h.gpus_size() > 0 || h.slots_size() > 0)) {
    return "GPUs or slots listed without resources_changed";
  }
  if (auto e = validate_gpus(h.gpus()); !e.empty()) return e;
  if (h.slots_size() > kMaxListed) {
    return fmt::format("{} slots listed (at most {})", h.slots_size(), kMaxListed);
  }
  return {};
}

std::string validate_register(const v1::Register& r) {
  if (auto e = validate_node_id(r.node_id()); !e.empty()) return e;
  if (auto e = validate_gpus(r.gpus()); !e.empty()) return e;
  if (!finite_non_negative(r.network_bytes_per_s())) {
    return fmt::format("network bandwidth {} is not a non-negative number",
                       r.network_bytes_per_s());
  }
  if (!r.worker_host().empty()) {
    if (auto e = validate_name(r.worker_host(), "worker host"); !e.empty()) return e;
  }
  if (auto e = validate_startup(r.startup()); !e.empty()) return e;
  if (r.cache_size() > kMaxListed || r.slots_size() > kMaxListed || r.tasks_size() > kMaxListed) {
    return fmt::format("{} cached models, {} slots, {} tasks listed (at most {} each)",
                       r.cache_size(), r.slots_size(), r.tasks_size(), kMaxListed);
  }
  // A restarted coordinator rebuilds its plans from these, so they must hold what a progress
  // report must.
  for (const v1::TaskStatus& t : r.tasks()) {
    if (auto e = validate_status(t); !e.empty()) return e;
  }
  return {};
}

}  // namespace

std::string quoted(std::string_view s) {
  constexpr std::size_t kShown = 64;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += s.size() > kShown ? "\"..." : "\"";
  return out;
}

std::string validate_node_id(std::string_view id) {
  if (id.empty()) return "node id is empty";
  if (id.size() > kMaxNodeIdBytes) {
    return fmt::format("node id {} is {} bytes (at most {})", quoted(id), id.size(),
                       kMaxNodeIdBytes);
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) {
      return fmt::format("node id {} contains {} (only letters, digits, '-', '_' and '.')",
                         quoted(id), byte_name(static_cast<unsigned char>(c)));
    }
  }
  return {};
}

std::string validate_model_spec(const v1::ModelSpec& spec) {
  if (auto e = validate_name(spec.name(), "model name"); !e.empty()) return e;
  const std::pair<std::string_view, double> numbers[] = {{"TTFT SLO", spec.slo_ttft_s()},
                                                         {"TPOT SLO", spec.slo_tpot_s()},
                                                         {"prefill time", spec.prefill_s()},
                                                         {"decode time", spec.decode_s()}};
  for (const auto& [what, v] : numbers) {
    if (!finite_non_negative(v)) {
      return fmt::format("model {}: {} {} is not a non-negative number", quoted(spec.name()), what,
                         v);
    }
  }
  if (spec.layers() > kMaxLayers) {
    return fmt::format("model {}: {} layers (at most {})", quoted(spec.name()), spec.layers(),
                       kMaxLayers);
  }
  return {};
}

std::string validate_task(const v1::Task& task) {
  if (auto e = validate_name(task.id(), "task id"); !e.empty()) return e;
  const std::string id = quoted(task.id());
  if (auto e = validate_name(task.plan_id(), "plan id"); !e.empty()) {
    return fmt::format("task {}: {}", id, e);
  }
  if (auto e = validate_model_spec(task.model()); !e.empty()) {
    return fmt::format("task {}: {}", id, e);
  }
  switch (task.kind()) {
    case v1::TASK_FETCH:
    case v1::TASK_PREWARM:
    case v1::TASK_EVICT:
    case v1::TASK_LAUNCH_WORKER:
    case v1::TASK_STOP_WORKER:
    case v1::TASK_ACTIVATE:
      break;
    default:
      return fmt::format("task {}: unknown kind {}", id, static_cast<int>(task.kind()));
  }
  if (task.stages() < 1 || task.stages() > kMaxStages) {
    return fmt::format("task {}: {} stages (1 to {})", id, task.stages(), kMaxStages);
  }
  if (task.stage() >= task.stages()) {
    return fmt::format("task {}: stage {} of {} stages (stages count from 0)", id, task.stage(),
                       task.stages());
  }
  if (task.gpu() >= kMaxGpus) {
    return fmt::format("task {}: GPU {} (at most {})", id, task.gpu(), kMaxGpus - 1);
  }
  // Pipeline wiring: the worker command gets these verbatim, so each is checked here.
  if (task.peers_size() != 0 && task.peers_size() != static_cast<int>(task.stages())) {
    return fmt::format("task {}: {} peer addresses for {} stages", id, task.peers_size(),
                       task.stages());
  }
  for (const std::string& peer : task.peers()) {
    if (auto e = validate_name(peer, "peer address"); !e.empty()) {
      return fmt::format("task {}: {}", id, e);
    }
    if (peer.find(':') == std::string::npos || peer.find(',') != std::string::npos) {
      return fmt::format("task {}: peer address {} is not host:port", id, quoted(peer));
    }
  }
  if (task.http_port() > 65535) {
    return fmt::format("task {}: HTTP port {} (at most 65535)", id, task.http_port());
  }
  if (task.layer_begin() > task.layer_end() ||
      (task.model().layers() > 0 && task.layer_end() > task.model().layers())) {
    return fmt::format("task {}: layers [{}, {}) of a {}-layer model", id, task.layer_begin(),
                       task.layer_end(), task.model().layers());
  }
  return {};
}

std::string validate_class_rates(const v1::ClassRates& r) {
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!finite_nonneg(r.link_bytes_per_s()) || !finite_nonneg(r.per_cold_start_bytes_per_s())) {
    return "link and per-cold-start rates must be finite and >= 0";
  }
  if (r.cold_starts() > kMaxColdStartsPerNode) {
    return fmt::format("{} cold starts (at most {})", r.cold_starts(), kMaxColdStartsPerNode);
  }
  if (r.classes_size() == 0) return {};
  if (r.classes_size() != kTrafficClasses) {
    return fmt::format("{} classes (0 or {})", r.classes_size(), kTrafficClasses);
  }
  if (!(r.link_bytes_per_s() > 0)) return "class rates without a link rate";
  double sum = 0;
  for (int i = 0; i < r.classes_size(); ++i) {
    const v1::ClassRate& c = r.classes(i);
    if (!finite_nonneg(c.rate_bytes_per_s()) || !finite_nonneg(c.ceil_bytes_per_s()) ||
        c.rate_bytes_per_s() > c.ceil_bytes_per_s() ||
        c.ceil_bytes_per_s() > r.link_bytes_per_s()) {
      return fmt::format("class {}: rate {} and ceiling {} must satisfy 0 <= rate <= ceiling <= "
                         "link {}",
                         i, c.rate_bytes_per_s(), c.ceil_bytes_per_s(), r.link_bytes_per_s());
    }
    sum += c.rate_bytes_per_s();
  }
  // A relative tolerance: the coordinator's four doubles add up to B up to rounding.
  if (sum > r.link_bytes_per_s() * (1 + 1e-9)) {
    return fmt::format("guaranteed rates sum to {}, above the link {}", sum, r.link_bytes_per_s());
  }
  return {};
}

std::string decode_node_message(std::string_view bytes, v1::NodeMessage& out) {
  if (auto e = parse(bytes, kMaxInboundBytes, "node message", out); !e.empty()) return e;
  switch (out.body_case()) {
    case v1::NodeMessage::kRegister:
      if (auto e = validate_register(out.register_()); !e.empty()) {
        return refuse(out, "register: " + e);
      }
      break;
    case v1::NodeMessage::kHeartbeat:
      if (auto e = validate_heartbeat(out.heartbeat()); !e.empty()) {
        return refuse(out, "heartbeat: " + e);
      }
      break;
    case v1::NodeMessage::kProgress:
      if (auto e = validate_status(out.progress()); !e.empty()) {
        return refuse(out, "progress: " + e);
      }
      break;
    default:
      return refuse(out, "node message has no body");
  }
  return {};
}

std::string decode_coordinator_message(std::string_view bytes, v1::CoordinatorMessage& out) {
  if (auto e = parse(bytes, kMaxInboundBytes, "coordinator message", out); !e.empty()) return e;
  switch (out.body_case()) {
    case v1::CoordinatorMessage::kWelcome: {
      const v1::Welcome& w = out.welcome();
      if (w.heartbeat_interval_ms() < 10 || w.heartbeat_interval_ms() > 600'000) {
        return refuse(out, fmt::format("welcome: heartbeat interval {} ms (10 to 600000)",
                                       w.heartbeat_interval_ms()));
      }
      if (w.liveness() < 1 || w.liveness() > 100) {
        return refuse(out, fmt::format("welcome: liveness {} (1 to 100)", w.liveness()));
      }
      break;
    }
    case v1::CoordinatorMessage::kHeartbeat:
    case v1::CoordinatorMessage::kReRegister:
      break;
    case v1::CoordinatorMessage::kTask:
      if (auto e = validate_task(out.task()); !e.empty()) return refuse(out, "task: " + e);
      break;
    case v1::CoordinatorMessage::kClassRates:
      if (auto e = validate_class_rates(out.class_rates()); !e.empty()) {
        return refuse(out, "class rates: " + e);
      }
      break;
    default:
      return refuse(out, "coordinator message has no body");
  }
  return {};
}

std::string decode_frontend_request(std::string_view bytes, v1::FrontendRequest& out) {
  if (auto e = parse(bytes, kMaxInboundBytes, "frontend request", out); !e.empty()) return e;
  switch (out.body_case()) {
    case v1::FrontendRequest::kDeploy:
      if (auto e = validate_model_spec(out.deploy().model()); !e.empty()) {
        return refuse(out, "deploy: " + e);
      }
      if (out.deploy().model().size_bytes() == 0) {
        return refuse(out, fmt::format("deploy: model {} has size 0 (give its weight bytes)",
                                       quoted(out.deploy().model().name())));
      }
      break;
    case v1::FrontendRequest::kColdStart:
      if (auto e = validate_name(out.cold_start().model(), "model name"); !e.empty()) {
        return refuse(out, "cold start: " + e);
      }
      break;
    case v1::FrontendRequest::kLoad:
      if (auto e = validate_name(out.load().model(), "model name"); !e.empty()) {
        return refuse(out, "load: " + e);
      }
      if (!finite_non_negative(out.load().requests_per_s())) {
        return refuse(out, fmt::format("load: {} requests per second is not a non-negative number",
                                       out.load().requests_per_s()));
      }
      if (!finite_non_negative(out.load().concurrent_requests())) {
        return refuse(out, fmt::format("load: {} concurrent requests is not a non-negative number",
                                       out.load().concurrent_requests()));
      }
      if (!finite_non_negative(out.load().window_s())) {
        return refuse(out, fmt::format("load: a window of {} s is not a non-negative number",
                                       out.load().window_s()));
      }
      if (!out.load().gateway_id().empty()) {
        if (auto e = validate_name(out.load().gateway_id(), "gateway id"); !e.empty()) {
          return refuse(out, "load: " + e);
        }
      }
      break;
    case v1::FrontendRequest::kState:
      break;
    case v1::FrontendRequest::kGatewayHello:
      if (auto e = validate_name(out.gateway_hello().gateway_id(), "gateway id"); !e.empty()) {
        return refuse(out, "gateway hello: " + e);
      }
      if (!finite_non_negative(out.gateway_hello().report_interval_s()) ||
          out.gateway_hello().report_interval_s() > kMaxGatewayIntervalS) {
        return refuse(out,
                      fmt::format("gateway hello: report interval {} s (0 to {} s)",
                                  out.gateway_hello().report_interval_s(), kMaxGatewayIntervalS));
      }
      break;
    default:
      return refuse(out, "frontend request has no body");
  }
  return {};
}

std::string decode_frontend_reply(std::string_view bytes, v1::FrontendReply& out) {
  if (auto e = parse(bytes, kMaxReplyBytes, "reply", out); !e.empty()) return e;
  // The coordinator answers every request with an error or a body; a reply with neither
  // would print as an empty success.
  switch (out.body_case()) {
    case v1::FrontendReply::kPlan:
      if (auto e = validate_name(out.plan().id(), "plan id"); !e.empty()) {
        return refuse(out, "reply: " + e);
      }
      if (auto e = validate_name(out.plan().model(), "model name"); !e.empty()) {
        return refuse(out, fmt::format("reply: plan {}: {}", quoted(out.plan().id()), e));
      }
      break;
    case v1::FrontendReply::kDeployed:
      if (auto e = validate_model_spec(out.deployed()); !e.empty()) {
        return refuse(out, "reply: " + e);
      }
      break;
    case v1::FrontendReply::kState:
      break;
    case v1::FrontendReply::kRoutes:
      if (auto e = validate_routes(out.routes()); !e.empty()) return refuse(out, "routes: " + e);
      break;
    default:
      if (out.error().empty()) return refuse(out, "reply has neither an error nor a body");
  }
  return {};
}

}  // namespace core

namespace {

template <typename Message>
std::string encode_versioned(Message& m) {
  m.set_version(kProtocolVersion);
  return m.SerializeAsString();
}

}  // namespace

std::string encode(v1::NodeMessage m) {
  return encode_versioned(m);
}
std::string encode(v1::CoordinatorMessage m) {
  return encode_versioned(m);
}
std::string encode(v1::FrontendRequest m) {
  return encode_versioned(m);
}
std::string encode(v1::FrontendReply m) {
  return encode_versioned(m);
}

std::string_view task_kind_name(v1::TaskKind kind) {
  switch (kind) {
    case v1::TASK_FETCH:
      return "fetch";
    case v1::TASK_PREWARM:
      return "prewarm";
    case v1::TASK_EVICT:
      return "evict";
    case v1::TASK_LAUNCH_WORKER:
      return "launch-worker";
    case v1::TASK_STOP_WORKER:
      return "stop-worker";
    case v1::TASK_ACTIVATE:
      return "activate";
    default:
      return "unknown";
  }
}

std::string_view task_state_name(v1::TaskState state) {
  switch (state) {
    case v1::TASK_RUNNING:
      return "running";
    case v1::TASK_DONE:
      return "done";
    case v1::TASK_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

}  // namespace thaw::cluster
