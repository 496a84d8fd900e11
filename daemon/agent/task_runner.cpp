#include "daemon/agent/task_runner.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>

#include "common/proto/cluster/cluster_codec.hpp"
#include "daemon/log/log.hpp"

namespace thaw::daemon {
namespace {

void set_state(v1::TaskStatus& status, v1::TaskState state, std::string error = "") {
  status.set_state(state);
  status.set_error(std::move(error));
}

std::string join(const google::protobuf::RepeatedPtrField<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

}  // namespace

bool http_health_ok(std::uint16_t port) {
  httplib::Client client("127.0.0.1", port);
  // The agent's thread polls every worker in turn: a hung engine must not stall the others.
  client.set_connection_timeout(std::chrono::milliseconds(200));
  client.set_read_timeout(std::chrono::milliseconds(500));
  auto res = client.Get("/health");
  return res && res->status == 200;
}

std::string TaskRunner::unit_for(const v1::Task& task) {
  std::string unit = WorkerLauncher::unit_name(task.plan_id(), task.stage());
  if (task.generation() > 0) unit += fmt::format("-g{}", task.generation());
  return task.standalone() ? unit + "-full" : unit;
}

TaskRunner::TaskRunner(NodeService& service, WorkerLauncher& workers, WorkerSettings settings)
    : service_(service), workers_(workers), settings_(std::move(settings)) {
  if (!settings_.health_probe) settings_.health_probe = http_health_ok;
  if (settings_.timeline_dir.empty()) {
    std::error_code ec;
    settings_.timeline_dir = std::filesystem::temp_directory_path(ec);
  }
}

v1::TaskStatus TaskRunner::start(const v1::Task& task) {
  std::lock_guard lock(mutex_);
  if (auto it = tasks_.find(task.id()); it != tasks_.end()) {
    it->second.changed = true;  // report it again: the coordinator asked
    return it->second.status;
  }
  Held& held = tasks_[task.id()];
  *held.status.mutable_task() = task;
  set_state(held.status, v1::TASK_RUNNING);
  log(LogLevel::info,
      fmt::format("coordinator task {}: {} {} (stage {} of {}, GPU {})", task.id(),
                  cluster::task_kind_name(task.kind()), task.model().name(), task.stage() + 1,
                  task.stages(), task.gpu()),
      {{"MODEL", task.model().name()}});
  run_locked(held);
  if (held.status.state() == v1::TASK_FAILED) {
    log(LogLevel::warning,
        fmt::format("coordinator task {} failed: {}", task.id(), held.status.error()));
  }
  return held.status;
}

void TaskRunner::run_locked(Held& held) {
  const v1::Task& task = held.status.task();
  const std::string& model = task.model().name();
  switch (task.kind()) {
    case v1::TASK_FETCH: {
      std::optional<store::StageSpec> stage;
      if (task.stages() > 1) {
        stage = store::StageSpec{static_cast<int>(task.stage()), static_cast<int>(task.stages())};
      }
      auto key = service_.fetch(model, stage, task.consolidate());
      if (!key) return set_state(held.status, v1::TASK_FAILED, key.error().message);
      held.model_key = *key;
      break;
    }
    case v1::TASK_PREWARM: {
      std::optional<int> layers;
      if (task.layers() > 0) layers = static_cast<int>(task.layers());
      auto slot = service_.prewarm(model, task.gpu(), layers);
      if (!slot) return set_state(held.status, v1::TASK_FAILED, slot.error().message);
      held.slot = *slot;
      break;
    }
    case v1::TASK_EVICT: {
      auto key = NodeService::key_for(model);
      if (!key) return set_state(held.status, v1::TASK_FAILED, key.error().message);
      for (const SlotStatus& s : service_.slots()) {
        if (s.model != *key) continue;
        if (auto ok = service_.evict(s.id); !ok) {
          return set_state(held.status, v1::TASK_FAILED, ok.error().message);
        }
      }
      return set_state(held.status, v1::TASK_DONE);
    }
    case v1::TASK_ACTIVATE: {
      auto key = NodeService::key_for(model);
      if (!key) return set_state(held.status, v1::TASK_FAILED, key.error().message);
      for (const SlotStatus& s : service_.slots()) {
        if (s.model != *key || s.gpu != task.gpu() || s.state != "prewarmed") continue;
        auto ok = service_.activate(s.id, 0);
        return ok ? set_state(held.status, v1::TASK_DONE)
                  : set_state(held.status, v1::TASK_FAILED, ok.error().message);
      }
      return set_state(held.status, v1::TASK_FAILED,
                       fmt::format("no prewarmed slot of {} on GPU {}", model, task.gpu()));
    }
    case v1::TASK_LAUNCH_WORKER: {
      if (settings_.command.empty()) {
        return set_state(held.status, v1::TASK_FAILED,
                         "this node has no worker command: set coordinator.worker_command in "
                         "/etc/thaw/thawd.toml");
      }
      // Without the shim nothing holds the engine's reads until the bytes are in: such a
      // worker (e.g. a baseline run without thaw) starts once its stage's fetch has ended.
      if (settings_.preload.empty()) {
        for (const auto& [id, other] : tasks_) {
          const v1::Task& f = other.status.task();
          if (f.kind() == v1::TASK_FETCH && f.plan_id() == task.plan_id() &&
              f.stage() == task.stage() && other.status.state() == v1::TASK_RUNNING) {
            held.waiting_for = id;
            return;  // launched by refresh once the stage is in
          }
        }
      }
      launch_locked(held);
      break;
    }
    case v1::TASK_STOP_WORKER: {
      held.unit = unit_for(task);
      // A launch still waiting for its fetch is called off instead: it would start an engine
      // wired to peers that are gone.
      for (auto& [id, other] : tasks_) {
        if (other.status.task().kind() == v1::TASK_LAUNCH_WORKER && !other.waiting_for.empty() &&
            unit_for(other.status.task()) == held.unit) {
          other.waiting_for.clear();
          set_state(other.status, v1::TASK_DONE, "stopped before its launch");
          other.changed = true;
          return set_state(held.status, v1::TASK_DONE);
        }
      }
      if (auto ok = workers_.request_stop(held.unit); !ok) {
        return set_state(held.status, v1::TASK_FAILED, ok.error());
      }
      break;  // done once it has exited (refresh)
    }
    default:
      return set_state(held.status, v1::TASK_FAILED, "unknown task kind");
  }
  refresh_locked(held);
}

void TaskRunner::launch_locked(Held& held) {
  const v1::Task& task = held.status.task();
  const std::string& model = task.model().name();
  auto key = NodeService::key_for(model);
  WorkerSpec spec;
  spec.unit = unit_for(task);
  spec.gpu = task.gpu();
  const std::filesystem::path timeline = settings_.timeline_dir / (spec.unit + ".timeline");
  std::error_code ec;
  std::filesystem::remove(timeline, ec);  // a previous run's phases are not this one's
  // A standalone worker is a pipeline of one; the layer range is then the whole model.
  const bool alone = task.standalone() || task.stages() == 1;
  const std::uint32_t layer_end =
      alone ? task.model().layers() : std::max(task.layer_end(), task.layer_begin());
  spec.argv = expand_worker_command(
      settings_.command, {{"model", model},
                          {"key", key ? *key : model},
                          {"stage", std::to_string(task.stage())},
                          {"stages", std::to_string(task.stages())},
                          {"gpu", std::to_string(task.gpu())},
                          {"plan", task.plan_id()},
                          {"pp_rank", alone ? "0" : std::to_string(task.stage())},
                          {"pp_size", alone ? "1" : std::to_string(task.stages())},
                          {"peers", alone ? "" : join(task.peers())},
                          {"port", std::to_string(task.http_port())},
                          {"layer_begin", alone ? "0" : std::to_string(task.layer_begin())},
                          {"layer_end", std::to_string(layer_end)},
                          {"timeline", timeline.string()}});
  spec.env = {"LD_PRELOAD=" + settings_.preload,
              "THAW_SOCKET=" + settings_.thawd_socket,
              "CUDA_VISIBLE_DEVICES=" + std::to_string(task.gpu()),
              "THAW_PLAN=" + task.plan_id(),
              "THAW_STAGE=" + std::to_string(task.stage()),
              "THAW_STAGES=" + std::to_string(task.stages())};
  // Where it serves: the shaper classes packets arriving there as inference.
  if (task.http_port() > 0 && task.http_port() <= 65535) {
    spec.ports.push_back(static_cast<std::uint16_t>(task.http_port()));
  }
  if (!alone && task.stage() < static_cast<std::uint32_t>(task.peers_size())) {
    const std::string& own = task.peers(static_cast<int>(task.stage()));  // "host:port"
    const auto colon = own.rfind(':');
    unsigned port = 0;
    if (colon != std::string::npos && std::sscanf(own.c_str() + colon + 1, "%u", &port) == 1 &&
        port > 0 && port <= 65535) {
      spec.ports.push_back(static_cast<std::uint16_t>(port));
    }
  }
  held.launched_ns = monotonic_ns();
  held.timeline = timeline;
  if (auto ok = workers_.launch(spec); !ok) {
    return set_state(held.status, v1::TASK_FAILED, ok.error());
  }
  held.unit = spec.unit;
}

void TaskRunner::refresh_locked(Held& held) {
  if (held.status.state() != v1::TASK_RUNNING) return;
  const v1::TaskStatus before = held.status;
  switch (held.status.task().kind()) {
    case v1::TASK_FETCH: {
      auto m = service_.model(held.model_key);
      if (!m) break;
      held.status.set_bytes_done(m->fetched_bytes);
      held.status.set_bytes_total(std::max(m->total_bytes, m->fetched_bytes));
      if (m->state == ModelState::failed) {
        set_state(held.status, v1::TASK_FAILED, m->error);
      } else if (m->state != ModelState::fetching) {
        set_state(held.status, v1::TASK_DONE);  // complete, or the stage's part (partial)
      }
      break;
    }
    case v1::TASK_PREWARM: {
      auto s = service_.slot(held.slot);
      if (!s) {
        set_state(held.status, v1::TASK_FAILED, s.error().message);
        break;
      }
      held.status.set_bytes_done(s->resident_bytes);
      held.status.set_bytes_total(s->total_bytes);
      if (s->state == "failed") set_state(held.status, v1::TASK_FAILED, s->error);
      if (s->state == "prewarmed" || s->state == "active") set_state(held.status, v1::TASK_DONE);
      break;
    }
    case v1::TASK_STOP_WORKER:
      if (workers_.status(held.unit).state != WorkerState::running) {
        set_state(held.status, v1::TASK_DONE);
      }
      break;
    case v1::TASK_LAUNCH_WORKER: {
      if (!held.waiting_for.empty()) {
        auto fetch = tasks_.find(held.waiting_for);
        if (fetch != tasks_.end()) refresh_locked(fetch->second);
        const v1::TaskState st =
            fetch == tasks_.end() ? v1::TASK_DONE : fetch->second.status.state();
        if (st == v1::TASK_RUNNING) break;
        if (st == v1::TASK_FAILED) {
          set_state(held.status, v1::TASK_FAILED,
                    fmt::format("its stage's fetch failed: {}", fetch->second.status.error()));
          break;
        }
        held.waiting_for.clear();
        launch_locked(held);
        if (held.status.state() != v1::TASK_RUNNING) break;
      }
      const WorkerStatus w = workers_.status(held.unit);
      if (w.state == WorkerState::exited) set_state(held.status, v1::TASK_DONE);
      if (w.state == WorkerState::failed) {
        set_state(held.status, v1::TASK_FAILED, fmt::format("worker {}: {}", held.unit, w.detail));
      }
      const std::uint32_t port = held.status.task().http_port();
      if (w.state == WorkerState::running && !held.status.worker_ready() && port > 0 &&
          settings_.health_probe(static_cast<std::uint16_t>(port))) {
        held.status.set_worker_ready(true);
        const double ready_s = static_cast<double>(monotonic_ns() - held.launched_ns) / 1e9;
        meter_.record(phases_from_timeline(held.timeline, held.launched_ns, ready_s));
        log(LogLevel::info,
            fmt::format("worker {} ready after {:.2f} s (port {})", held.unit, ready_s, port));
      }
      break;
    }
    default:
      break;
  }
  if (held.status.SerializeAsString() != before.SerializeAsString()) held.changed = true;
}

std::vector<v1::TaskStatus> TaskRunner::poll() {
  std::lock_guard lock(mutex_);
  std::vector<v1::TaskStatus> out;
  for (auto& [id, held] : tasks_) {
    refresh_locked(held);
    if (held.changed) {
      out.push_back(held.status);
      held.changed = false;
    }
  }
  return out;
}

std::vector<v1::TaskStatus> TaskRunner::held() const {
  std::lock_guard lock(mutex_);
  std::vector<v1::TaskStatus> out;
  for (const auto& [id, held] : tasks_) out.push_back(held.status);
  return out;
}

}  // namespace thaw::daemon
