// NodeService: models (fetches into the host cache) and the operations shared by all front
// ends. Slots are in node_slots.cpp.
#include "daemon/service/node_service.hpp"

#include <fmt/format.h>

#include "daemon/log/log.hpp"
#include "daemon/service/node_service_state.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/registry/socket_tagging.hpp"

namespace thaw::daemon {

std::string_view to_string(ModelState state) {
  switch (state) {
    case ModelState::fetching:
      return "fetching";
    case ModelState::partial:
      return "partial";
    case ModelState::complete:
      return "complete";
    case ModelState::failed:
      return "failed";
  }
  return "unknown";
}

NodeService::NodeService(store::HostCache& cache, std::vector<vmm::GpuMemory*> gpus,
                         NodeServiceConfig config)
    : cache_(cache), gpus_(std::move(gpus)), config_(std::move(config)) {}

NodeService::~NodeService() {
  shutdown();
}

void NodeService::set_config(NodeServiceConfig config) {
  std::lock_guard lock(mutex_);
  config_ = std::move(config);
}

ServiceResult<std::string> NodeService::key_for(const std::string& key_or_name) {
  if (key_or_name.empty()) {
    return service_error(error_name::kInvalidArgument,
                         "no model given: name it as on the registry (e.g. \"gpt2\" or "
                         "\"org/name\") or by its cache key");
  }
  auto key = store::cache_key_for(key_or_name);
  if (!key) return service_error(error_name::kInvalidArgument, key.error().message);
  return *key;
}

ServiceResult<std::string> NodeService::fetch(const std::string& model,
                                              std::optional<store::StageSpec> stage,
                                              bool consolidate) {
  auto key = key_for(model);
  if (!key) return std::unexpected(key.error());
  std::lock_guard lock(mutex_);
  auto job = start_fetch_locked(model, *key, stage, consolidate);
  if (!job) return std::unexpected(job.error());
  return *key;
}

ServiceResult<std::shared_ptr<NodeService::FetchJob>> NodeService::start_fetch_locked(
    const std::string& name, const std::string& key, std::optional<store::StageSpec> stage,
    bool consolidate) {
  if (shutting_down_) return service_error(error_name::kShuttingDown, "thawd is stopping");
  if (auto it = fetches_.find(key); it != fetches_.end() && !it->second->done()) return it->second;
  if (config_.registry.empty()) {
    return service_error(error_name::kNoRegistry,
                         "no registry is configured: set store.registry in "
                         "/etc/thaw/thawd.toml (e.g. \"http://models.internal/models\") and "
                         "reload thawd (systemctl reload thawd)");
  }
  store::RegistryOptions registry_options;
  auto registry = store::open_registry(config_.registry, registry_options);
  if (!registry) {
    return service_error(
        error_name::kRegistry,
        fmt::format("store.registry \"{}\": {}", config_.registry, registry.error().message));
  }
  auto job = std::make_shared<FetchJob>();
  job->name = name;
  job->key = key;
  job->registry = std::move(*registry);
  store::ModelFetchOptions options;
  options.model = name;
  options.cache_key = key;
  options.stage = stage;
  options.consolidate = stage.has_value() && consolidate;
  options.allow_unverified = config_.allow_unverified;
  options.fetcher.max_connections = std::max<std::uint32_t>(config_.connections, 1);
  options.fetcher.connections_per_file = options.fetcher.max_connections;
  options.fetcher.rate_limits[static_cast<std::size_t>(store::FetchClass::critical)] =
      store::RateLimit{config_.max_rate_bytes_per_s, 0};
  if (config_.mark_fetch_sockets) {
    options.fetcher.socket_tags = store::shaper_socket_tags(model_id_locked(key));
    options.fetcher.fetch_windows = config_.fetch_windows;
  }
  options.on_plan = [weak = std::weak_ptr<FetchJob>(job)](const safetensors::FetchPlan&) {
    if (auto j = weak.lock()) j->mark_plan_known();
  };
  job->fetch = std::make_unique<store::ModelFetch>(*job->registry, cache_, std::move(options));
  counters_.fetches_started.fetch_add(1);
  log(LogLevel::info,
      fmt::format("fetching {}{} from {}", name,
                  stage ? fmt::format(" (stage {} of {}{})", stage->stage + 1, stage->num_stages,
                                      consolidate ? ", then the rest" : "")
                        : "",
                  job->registry->describe()),
      {{"MODEL", key}});
  job->thread = std::thread([this, job] {
    auto result = job->fetch->run();
    const store::ModelFetchProgress last = job->fetch->progress();
    counters_.fetched_bytes_critical.fetch_add(last.bytes_verified);
    if (!result) {
      counters_.fetches_failed.fetch_add(1);
      log(LogLevel::warning,
          fmt::format("fetching {} failed: {}", job->key, result.error().message),
          {{"MODEL", job->key}});
    } else {
      log(LogLevel::info,
          fmt::format("fetched {}: {} bytes in {:.2f} s ({} already cached)", job->key,
                      result->bytes_fetched, result->seconds, result->bytes_cached),
          {{"MODEL", job->key}});
    }
    job->finish(result ? std::string() : result.error().message);
    changed();
  });
  fetches_[key] = job;
  changed();
  return job;
}

std::uint16_t NodeService::model_id_locked(const std::string& key) {
  if (auto it = model_ids_.find(key); it != model_ids_.end()) return it->second;
  // Ids are not reused: a counter the classifier keeps under an id must stay one model's.
  if (model_ids_.size() >= 0xffff) return 0;
  const auto id = static_cast<std::uint16_t>(model_ids_.size() + 1);
  model_ids_.emplace(key, id);
  if (config_.on_model_id) config_.on_model_id(id, key);
  return id;
}

ModelStatus NodeService::status_of_locked(const std::string& key,
                                          const store::CachedModelInfo* cached) const {
  ModelStatus s;
  s.key = key;
  bool all_complete = cached != nullptr && !cached->files.empty();
  if (cached != nullptr) {
    s.unverified = cached->unverified;
    s.files = static_cast<std::uint32_t>(cached->files.size());
    for (const store::CachedFileInfo& f : cached->files) {
      s.total_bytes += f.size;
      s.fetched_bytes += std::min(f.size, f.verified_chunks * f.chunk_size);
      if (f.state != store::FillState::complete) all_complete = false;
    }
  }
  s.state = all_complete ? ModelState::complete : ModelState::partial;
  if (auto it = fetches_.find(key); it != fetches_.end()) {
    const FetchJob& job = *it->second;
    s.name = job.name;
    if (!job.done()) {
      s.state = ModelState::fetching;
      s.rate_bytes_per_s = job.fetch->progress().rate_bytes_per_s;
    } else if (auto error = job.error(); !error.empty()) {
      s.error = error;
      if (!all_complete) s.state = ModelState::failed;
    }
  }
  return s;
}

std::vector<ModelStatus> NodeService::models() const {
  const std::vector<store::CachedModelInfo> cached = cache_.models();
  std::lock_guard lock(mutex_);
  std::vector<ModelStatus> out;
  std::map<std::string, const store::CachedModelInfo*> by_key;
  for (const auto& m : cached) by_key[m.key] = &m;
  for (const auto& [key, job] : fetches_) by_key.try_emplace(key, nullptr);
  for (const auto& [key, info] : by_key) out.push_back(status_of_locked(key, info));
  return out;
}

ServiceResult<ModelStatus> NodeService::model(const std::string& key_or_name) const {
  auto key = key_for(key_or_name);
  if (!key) return std::unexpected(key.error());
  for (ModelStatus& m : models()) {
    if (m.key == *key) return std::move(m);
  }
  return service_error(error_name::kUnknownModel,
                       fmt::format("model \"{}\" is neither cached nor being fetched (fetch it: "
                                   "thawctl fetch {})",
                                   key_or_name, key_or_name));
}

ServiceResult<OpenedFile> NodeService::open_file(const std::string& model,
                                                 const std::string& path) {
  auto key = key_for(model);
  if (!key) return std::unexpected(key.error());
  if (auto ok = store::cache_layout::check_relative_path(path); !ok) {
    return service_error(error_name::kInvalidArgument, ok.error().message);
  }
  auto file = cache_.find_file(*key, path);
  if (!file) {
    if (file.error().code != store::CacheErrc::not_found) {
      return service_error(error_name::kCache, file.error().message);
    }
    std::lock_guard lock(mutex_);
    if (auto it = fetches_.find(*key); it != fetches_.end() && !it->second->done()) {
      // A fetch creates the files it will ever create by the end of its headers phase
      // (small files, then every weight file). The shim waits on NotReady (an engine
      // launched with the fetch looks its files up at once), so a file absent after that
      // phase must not be NotReady: it will never come, and an engine checking for an
      // optional file (model.safetensors.index.json) would wait for the whole fetch.
      const store::FetchPhase phase = it->second->fetch != nullptr
                                          ? it->second->fetch->progress().phase
                                          : store::FetchPhase::starting;
      if (phase <= store::FetchPhase::headers) {
        return service_error(error_name::kNotReady,
                             fmt::format("{} of model {} is not in the cache yet (the fetch is "
                                         "{}); ask again shortly",
                                         path, *key, store::to_string(phase)));
      }
      return service_error(error_name::kUnknownModel,
                           fmt::format("{} is not a file of model {} (its fetch, {}, created "
                                       "every file the model has)",
                                       path, *key, store::to_string(phase)));
    }
    return service_error(error_name::kUnknownModel,
                         fmt::format("{} of model {} is not cached and no fetch of it runs "
                                     "(thawctl fetch {})",
                                     path, *key, model));
  }
  auto data = (*file)->reader_data_fd();
  if (!data) return service_error(error_name::kCache, data.error().message);
  auto ready = (*file)->reader_readiness_fd();
  if (!ready) return service_error(error_name::kCache, ready.error().message);
  OpenedFile out;
  out.size = (*file)->size();
  out.chunk_size = (*file)->chunk_size();
  out.chunk_count = (*file)->readiness().chunk_count();
  out.complete = (*file)->readiness().state() == store::FillState::complete;
  out.data_fd = data->release();
  out.readiness_fd = ready->release();
  return out;
}

void NodeService::reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, job] : fetches_) {
      if (job->done() && job->thread.joinable()) done.push_back(std::move(job->thread));
    }
    reap_slots_locked(done);
    // Pages given back to the driver for engines (their budgets, their own copies of their
    // weights) come back to the pool once no engine holding such pages is attached on that
    // GPU: the driver's free memory is one heap, so re-creating a departed engine's pages
    // while another is still allocating could take what that one was promised.
    for (std::uint32_t g = 0; g < gpus_.size(); ++g) {
      if (!engine_needs_driver_room_locked(g) && gpus_[g]->take_back_returned() != 0) changed();
    }
  }
  for (std::thread& t : done) t.join();
}

bool NodeService::engine_needs_driver_room_locked(std::uint32_t gpu) const {
  const bool leased = std::ranges::any_of(
      leases_, [&](const auto& entry) { return entry.second.gpu == gpu && entry.second.pages; });
  return leased || std::ranges::any_of(slots_, [&](const auto& entry) {
           const SlotRecord& r = *entry.second;
           return r.gpu == gpu && !r.owner.empty() && r.pages_freed;
         });
}

void NodeService::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
    for (auto& [key, job] : fetches_) {
      job->fetch->cancel();
      if (job->thread.joinable()) threads.push_back(std::move(job->thread));
    }
    for (auto& [id, record] : slots_) {
      if (record->thread.joinable()) threads.push_back(std::move(record->thread));
    }
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace thaw::daemon
