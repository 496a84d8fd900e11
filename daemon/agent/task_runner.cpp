#include "daemon/agent/task_runner.hpp"

#include <fmt/format.h>

#include "common/proto/cluster/cluster_codec.hpp"
#include "daemon/log/log.hpp"

namespace thaw::daemon {
namespace {

void set_state(v1::TaskStatus& status, v1::TaskState state, std::string error = "") {
  status.set_state(state);
  status.set_error(std::move(error));
}

}  // namespace

TaskRunner::TaskRunner(NodeService& service, WorkerLauncher& workers, WorkerSettings settings)
    : service_(service), workers_(workers), settings_(std::move(settings)) {}

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
      auto key = NodeService::key_for(model);
      WorkerSpec spec;
      spec.unit = WorkerLauncher::unit_name(task.plan_id(), task.stage());
      spec.gpu = task.gpu();
      spec.argv =
          expand_worker_command(settings_.command, {{"model", model},
                                                    {"key", key ? *key : model},
                                                    {"stage", std::to_string(task.stage())},
                                                    {"stages", std::to_string(task.stages())},
                                                    {"gpu", std::to_string(task.gpu())},
                                                    {"plan", task.plan_id()}});
      spec.env = {"LD_PRELOAD=" + settings_.preload,
                  "THAW_SOCKET=" + settings_.thawd_socket,
                  "CUDA_VISIBLE_DEVICES=" + std::to_string(task.gpu()),
                  "THAW_PLAN=" + task.plan_id(),
                  "THAW_STAGE=" + std::to_string(task.stage()),
                  "THAW_STAGES=" + std::to_string(task.stages())};
      if (auto ok = workers_.launch(spec); !ok) {
        return set_state(held.status, v1::TASK_FAILED, ok.error());
      }
      held.unit = spec.unit;
      break;
    }
    case v1::TASK_STOP_WORKER: {
      held.unit = WorkerLauncher::unit_name(task.plan_id(), task.stage());
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
      const WorkerStatus w = workers_.status(held.unit);
      if (w.state == WorkerState::exited) set_state(held.status, v1::TASK_DONE);
      if (w.state == WorkerState::failed) {
        set_state(held.status, v1::TASK_FAILED, fmt::format("worker {}: {}", held.unit, w.detail));
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
