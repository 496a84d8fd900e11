#include "common/proto/cluster/cluster_codec.hpp"

#include <fmt/format.h>

#include <cmath>

namespace thaw::cluster {
namespace {

using std::unexpected;

constexpr std::size_t kMaxNameBytes = 256;
constexpr int kMaxGpus = 64;
constexpr int kMaxListed = 4096;  // cached models, slots or tasks in one registration

template <typename Message>
std::expected<Message, std::string> parse(std::string_view bytes, std::string_view what) {
  if (bytes.size() > kMaxInboundBytes) {
    return unexpected(fmt::format("{} of {} bytes is over the {} byte limit", what, bytes.size(),
                                  kMaxInboundBytes));
  }
  Message m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return unexpected(fmt::format("{} of {} bytes does not parse", what, bytes.size()));
  }
  if (m.version() != kProtocolVersion) {
    return unexpected(fmt::format("{} has protocol version {}; this build speaks {}", what,
                                  m.version(), kProtocolVersion));
  }
  return m;
}

bool finite_non_negative(double v) { return std::isfinite(v) && v >= 0; }

std::expected<void, std::string> validate_name(std::string_view name, std::string_view what) {
  if (name.empty()) return unexpected(fmt::format("{} is empty", what));
  if (name.size() > kMaxNameBytes) {
    return unexpected(fmt::format("{} is {} bytes long (at most {})", what, name.size(),
                                  kMaxNameBytes));
  }
  for (unsigned char c : name) {
    if (c < 0x21 || c == 0x7f) {
      return unexpected(fmt::format("{} contains a space or control character", what));
    }
  }
  return {};
}

std::expected<void, std::string> validate_register(const v1::Register& r) {
  if (auto ok = validate_node_id(r.node_id()); !ok) return ok;
  if (r.gpus_size() > kMaxGpus) {
    return unexpected(fmt::format("register lists {} GPUs (at most {})", r.gpus_size(), kMaxGpus));
  }
  for (const v1::GpuInfo& g : r.gpus()) {
    if (g.free_bytes() > g.memory_bytes()) {
      return unexpected(fmt::format("GPU {} has more free bytes ({}) than memory ({})", g.index(),
                                    g.free_bytes(), g.memory_bytes()));
    }
    if (!finite_non_negative(g.pcie_bytes_per_s())) {
      return unexpected(fmt::format("GPU {} PCIe bandwidth is not a non-negative number",
                                    g.index()));
    }
  }
  if (!finite_non_negative(r.network_bytes_per_s())) {
    return unexpected("network bandwidth is not a non-negative number");
  }
  if (r.cache_size() > kMaxListed || r.slots_size() > kMaxListed || r.tasks_size() > kMaxListed) {
    return unexpected(fmt::format("register lists too much (at most {} each)", kMaxListed));
  }
  for (const v1::TaskStatus& t : r.tasks()) {
    if (auto ok = validate_task(t.task()); !ok) {
      return unexpected(fmt::format("task {}: {}", t.task().id(), ok.error()));
    }
  }
  return {};
}

}  // namespace

std::expected<void, std::string> validate_node_id(std::string_view id) {
  if (id.empty()) return unexpected("node id is empty");
  if (id.size() > 64) return unexpected(fmt::format("node id is {} bytes (at most 64)", id.size()));
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return unexpected("node id may only contain letters, digits, '-', '_' and '.'");
  }
  return {};
}

std::expected<void, std::string> validate_model_spec(const v1::ModelSpec& spec) {
  if (auto ok = validate_name(spec.name(), "model name"); !ok) return ok;
  for (double v : {spec.slo_ttft_s(), spec.slo_tpot_s(), spec.prefill_s(), spec.decode_s()}) {
    if (!finite_non_negative(v)) {
      return unexpected(fmt::format("model {}: an SLO or cost is not a non-negative number",
                                    spec.name()));
    }
  }
  if (spec.layers() > 100'000) {
    return unexpected(fmt::format("model {}: {} layers", spec.name(), spec.layers()));
  }
  return {};
}

std::expected<void, std::string> validate_task(const v1::Task& task) {
  if (auto ok = validate_name(task.id(), "task id"); !ok) return ok;
  if (auto ok = validate_name(task.plan_id(), "plan id"); !ok) return ok;
  if (auto ok = validate_model_spec(task.model()); !ok) return ok;
  switch (task.kind()) {
    case v1::TASK_FETCH:
    case v1::TASK_PREWARM:
    case v1::TASK_EVICT:
    case v1::TASK_LAUNCH_WORKER:
    case v1::TASK_STOP_WORKER:
      break;
    default:
      return unexpected(fmt::format("task {} has no known kind ({})", task.id(),
                                    static_cast<int>(task.kind())));
  }
  if (task.stages() < 1 || task.stages() > 64) {
    return unexpected(fmt::format("task {}: {} stages (1 to 64)", task.id(), task.stages()));
  }
  if (task.stage() >= task.stages()) {
    return unexpected(
        fmt::format("task {}: stage {} of {} stages", task.id(), task.stage(), task.stages()));
  }
  if (task.gpu() >= static_cast<std::uint32_t>(kMaxGpus)) {
    return unexpected(fmt::format("task {}: GPU {}", task.id(), task.gpu()));
  }
  return {};
}

std::expected<v1::NodeMessage, std::string> decode_node_message(std::string_view bytes) {
  auto m = parse<v1::NodeMessage>(bytes, "node message");
  if (!m) return m;
  switch (m->body_case()) {
    case v1::NodeMessage::kRegister:
      if (auto ok = validate_register(m->register_()); !ok) {
        return unexpected("register: " + ok.error());
      }
      break;
    case v1::NodeMessage::kHeartbeat:
      break;
    case v1::NodeMessage::kProgress: {
      const v1::TaskStatus& p = m->progress();
      if (auto ok = validate_task(p.task()); !ok) return unexpected("progress: " + ok.error());
      if (p.state() == v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(p.state())) {
        return unexpected("progress: task state not set");
      }
      if (p.bytes_done() > p.bytes_total() && p.bytes_total() != 0) {
        return unexpected("progress: more bytes done than in total");
      }
      break;
    }
    default:
      return unexpected("node message has no body");
  }
  return m;
}

std::expected<v1::CoordinatorMessage, std::string> decode_coordinator_message(
    std::string_view bytes) {
  auto m = parse<v1::CoordinatorMessage>(bytes, "coordinator message");
  if (!m) return m;
  switch (m->body_case()) {
    case v1::CoordinatorMessage::kWelcome:
      if (m->welcome().heartbeat_interval_ms() < 10 || m->welcome().heartbeat_interval_ms() > 600'000 ||
          m->welcome().liveness() < 1 || m->welcome().liveness() > 100) {
        return unexpected("welcome: heartbeat interval or liveness out of range");
      }
      break;
    case v1::CoordinatorMessage::kHeartbeat:
    case v1::CoordinatorMessage::kReRegister:
      break;
    case v1::CoordinatorMessage::kTask:
      if (auto ok = validate_task(m->task()); !ok) return unexpected("task: " + ok.error());
      break;
    default:
      return unexpected("coordinator message has no body");
  }
  return m;
}

std::expected<v1::FrontendRequest, std::string> decode_frontend_request(std::string_view bytes) {
  auto m = parse<v1::FrontendRequest>(bytes, "frontend request");
  if (!m) return m;
  switch (m->body_case()) {
    case v1::FrontendRequest::kDeploy:
      if (auto ok = validate_model_spec(m->deploy().model()); !ok) {
        return unexpected("deploy: " + ok.error());
      }
      if (m->deploy().model().size_bytes() == 0) {
        return unexpected("deploy: model size is 0 (give the model's weight bytes)");
      }
      break;
    case v1::FrontendRequest::kColdStart:
      if (auto ok = validate_name(m->cold_start().model(), "model name"); !ok) {
        return unexpected("cold start: " + ok.error());
      }
      break;
    case v1::FrontendRequest::kLoad:
      if (auto ok = validate_name(m->load().model(), "model name"); !ok) {
        return unexpected("load: " + ok.error());
      }
      if (!finite_non_negative(m->load().requests_per_s())) {
        return unexpected("load: requests per second is not a non-negative number");
      }
      break;
    case v1::FrontendRequest::kState:
      break;
    default:
      return unexpected("frontend request has no body");
  }
  return m;
}

std::expected<v1::FrontendReply, std::string> decode_frontend_reply(std::string_view bytes) {
  v1::FrontendReply m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return unexpected(fmt::format("reply of {} bytes does not parse", bytes.size()));
  }
  if (m.version() != kProtocolVersion) {
    return unexpected(fmt::format("reply has protocol version {}; this build speaks {}",
                                  m.version(), kProtocolVersion));
  }
  return m;
}

template <typename Message>
std::string encode_versioned(Message& m) {
  m.set_version(kProtocolVersion);
  return m.SerializeAsString();
}

std::string encode(v1::NodeMessage m) { return encode_versioned(m); }
std::string encode(v1::CoordinatorMessage m) { return encode_versioned(m); }
std::string encode(v1::FrontendRequest m) { return encode_versioned(m); }
std::string encode(v1::FrontendReply m) { return encode_versioned(m); }

std::string_view task_kind_name(v1::TaskKind kind) {
  switch (kind) {
    case v1::TASK_FETCH: return "fetch";
    case v1::TASK_PREWARM: return "prewarm";
    case v1::TASK_EVICT: return "evict";
    case v1::TASK_LAUNCH_WORKER: return "launch-worker";
    case v1::TASK_STOP_WORKER: return "stop-worker";
    default: return "unknown";
  }
}

std::string_view task_state_name(v1::TaskState state) {
  switch (state) {
    case v1::TASK_RUNNING: return "running";
    case v1::TASK_DONE: return "done";
    case v1::TASK_FAILED: return "failed";
    default: return "unknown";
  }
}

}  // namespace thaw::cluster
