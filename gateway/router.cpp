#include "gateway/router.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace thaw::gateway {

std::string_view to_string(WorkerState state) {
  switch (state) {
    case WorkerState::cold_starting:
      return "cold-starting";
    case WorkerState::serving:
      return "serving";
    case WorkerState::draining:
      return "draining";
  }
  return "unknown";
}

Lease::Lease(std::shared_ptr<Endpoint> endpoint) : endpoint_(std::move(endpoint)) {
  endpoint_->outstanding.fetch_add(1);
  endpoint_->served.fetch_add(1);
}

Lease::~Lease() {
  endpoint_->outstanding.fetch_sub(1);
}

Router::Router(RouterOptions options, ColdStartFn ask_cold_start)
    : options_(options), ask_cold_start_(std::move(ask_cold_start)) {}

void Router::replace(RouteMap routes) {
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, entry] : models_) entry.listed = false;
    for (auto& [name, workers] : routes) {
      ModelEntry& entry = models_[name];
      entry.listed = true;
      entry.serving.clear();
      for (const WorkerRoute& w : workers) {
        if (w.state != WorkerState::serving || w.url.empty()) continue;
        auto& endpoint = endpoints_[w.url];
        if (!endpoint) {
          endpoint = std::make_shared<Endpoint>();
          endpoint->url = w.url;
        }
        entry.serving.push_back(endpoint);
      }
      // A cold start the coordinator knows of (or serving workers) answers our last ask.
      if (!workers.empty()) entry.asked = false;
      entry.workers = std::move(workers);
    }
    // Unlisted models go once nothing of theirs is in flight; endpoints once no table or
    // lease refers to them.
    std::erase_if(models_, [](const auto& m) {
      return !m.second.listed && m.second.in_flight == 0 && m.second.held == 0;
    });
    for (auto& [name, entry] : models_) {
      if (!entry.listed) entry.serving.clear();
    }
    std::erase_if(endpoints_, [](const auto& e) { return e.second.use_count() == 1; });
    has_table_ = true;
  }
  changed_.notify_all();
}

bool Router::has_table() const {
  std::lock_guard lock(mutex_);
  return has_table_;
}

bool Router::cold_starting_locked(const ModelEntry& entry) const {
  return std::any_of(entry.workers.begin(), entry.workers.end(),
                     [](const WorkerRoute& w) { return w.state == WorkerState::cold_starting; });
}

std::unique_ptr<Lease> Router::pick_locked(ModelEntry& entry) {
  if (entry.serving.empty()) return nullptr;
  const std::size_t n = entry.serving.size();
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  // Workers that refused a connection lately are candidates only when all did.
  auto avoided = [&](std::size_t k) { return entry.serving[k]->avoid_until.load() > now; };
  const bool all_avoided = std::all_of(entry.serving.begin(), entry.serving.end(),
                                       [&](const auto& e) { return e->avoid_until.load() > now; });
  std::optional<std::size_t> best;
  // Starting at the round-robin cursor, so equal loads take turns.
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t k = (entry.next + i) % n;
    if (!all_avoided && avoided(k)) continue;
    if (!best) {
      best = k;
      if (options_.balance == Balance::round_robin) break;
    } else if (entry.serving[k]->outstanding.load() < entry.serving[*best]->outstanding.load()) {
      best = k;
    }
  }
  entry.next = *best + 1;
  return std::make_unique<Lease>(entry.serving[*best]);
}

void Router::mark_unreachable(const std::string& url, std::chrono::milliseconds for_how_long) {
  std::lock_guard lock(mutex_);
  if (auto it = endpoints_.find(url); it != endpoints_.end()) {
    it->second->avoid_until.store(
        (std::chrono::steady_clock::now() + for_how_long).time_since_epoch().count());
  }
}

std::expected<std::unique_ptr<Lease>, RouteError> Router::acquire(const std::string& model) {
  return acquire(model, std::chrono::steady_clock::now() + options_.hold_deadline);
}

std::expected<std::unique_ptr<Lease>, RouteError> Router::acquire(
    const std::string& model, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  auto it = models_.find(model);
  if (stopping_)
    return std::unexpected(RouteError{RouteError::Kind::stopping, "the gateway is stopping"});
  if (it == models_.end() || !it->second.listed) {
    return std::unexpected(RouteError{
        RouteError::Kind::unknown_model,
        fmt::format("the model `{}` does not exist here (GET /v1/models lists the deployed ones)",
                    model)});
  }
  ModelEntry& entry = it->second;
  if (auto lease = pick_locked(entry)) return lease;
  if (entry.held >= options_.hold_queue) {
    return std::unexpected(RouteError{
        RouteError::Kind::queue_full,
        fmt::format("model `{}` is starting and {} requests already wait for it; retry later",
                    model, entry.held)});
  }
  ++entry.held;
  std::unique_ptr<Lease> lease;
  bool timed_out = false;
  const std::uint64_t refusals = entry.refusals;
  for (;;) {
    if (stopping_ || !entry.listed) break;
    if ((lease = pick_locked(entry))) break;
    if (entry.refusals != refusals) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    // Ask for a cold start when nothing is starting (not on every request: the coordinator
    // answers with a route push, and a lost ask is repeated after cold_start_retry).
    if (ask_cold_start_ && !cold_starting_locked(entry) &&
        (!entry.asked || now - entry.last_cold_start_ask >= options_.cold_start_retry)) {
      entry.asked = true;
      entry.last_cold_start_ask = now;
      lock.unlock();
      ask_cold_start_(model);
      lock.lock();
      continue;  // the table may have changed meanwhile
    }
    changed_.wait_until(
        lock, std::min(deadline, entry.asked ? entry.last_cold_start_ask + options_.cold_start_retry
                                             : deadline));
  }
  --entry.held;
  if (lease) return lease;
  if (timed_out) {
    return std::unexpected(RouteError{
        RouteError::Kind::deadline,
        fmt::format("model `{}` had no serving worker within {} ms (a cold start may still be "
                    "under way); retry later",
                    model, options_.hold_deadline.count())});
  }
  if (stopping_) {
    return std::unexpected(RouteError{RouteError::Kind::stopping, "the gateway is stopping"});
  }
  if (entry.listed && entry.refusals != refusals) {
    return std::unexpected(
        RouteError{RouteError::Kind::cold_start_refused,
                   fmt::format("model `{}` could not be started: {}", model, entry.refusal)});
  }
  return std::unexpected(
      RouteError{RouteError::Kind::unknown_model,
                 fmt::format("the model `{}` was removed while the request waited for it", model)});
}

void Router::cold_start_refused(const std::string& model, const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    auto it = models_.find(model);
    if (it == models_.end() || !it->second.serving.empty() || cold_starting_locked(it->second)) {
      return;
    }
    ++it->second.refusals;
    it->second.refusal = why;
  }
  changed_.notify_all();
}

void Router::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

std::vector<std::string> Router::models() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, entry] : models_) {
    if (entry.listed) out.push_back(name);
  }
  return out;
}

bool Router::knows(const std::string& model) const {
  std::lock_guard lock(mutex_);
  auto it = models_.find(model);
  return it != models_.end() && it->second.listed;
}

RouteMap Router::routes() const {
  std::lock_guard lock(mutex_);
  RouteMap out;
  for (const auto& [name, entry] : models_) {
    if (entry.listed) out[name] = entry.workers;
  }
  return out;
}

std::uint64_t Router::outstanding(const std::string& url) const {
  std::lock_guard lock(mutex_);
  auto it = endpoints_.find(url);
  return it == endpoints_.end() ? 0 : it->second->outstanding.load();
}

Router::InFlight::InFlight(Router& router, std::string model)
    : router_(router), model_(std::move(model)) {
  std::lock_guard lock(router_.mutex_);
  auto it = router_.models_.find(model_);
  if (it == router_.models_.end() || !it->second.listed) return;  // unknown: not counted
  ++it->second.in_flight;
  ++it->second.arrivals;
  counted_ = true;
}

Router::InFlight::~InFlight() {
  if (!counted_) return;
  std::lock_guard lock(router_.mutex_);
  auto it = router_.models_.find(model_);
  if (it == router_.models_.end()) return;
  --it->second.in_flight;
  if (!it->second.listed && it->second.in_flight == 0 && it->second.held == 0) {
    router_.models_.erase(it);
  }
}

std::vector<ModelLoadSample> Router::take_window(std::chrono::steady_clock::time_point now) {
  std::lock_guard lock(mutex_);
  const double window_s = std::chrono::duration<double>(now - window_start_).count();
  window_start_ = now;
  std::vector<ModelLoadSample> out;
  for (auto& [name, entry] : models_) {
    if (!entry.listed) continue;
    ModelLoadSample s;
    s.model = name;
    s.concurrent = entry.in_flight;
    s.queue_length = entry.held;
    s.arrivals = entry.arrivals;
    s.window_s = window_s;
    s.active_instances = static_cast<std::uint32_t>(
        std::count_if(entry.workers.begin(), entry.workers.end(),
                      [](const WorkerRoute& w) { return w.state != WorkerState::draining; }));
    entry.arrivals = 0;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace thaw::gateway
