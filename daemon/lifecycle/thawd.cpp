#include "daemon/lifecycle/thawd.hpp"

#include <fmt/format.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-id128.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "common/text/byte_size.hpp"
#include "daemon/log/log.hpp"
#include "daemon/metrics/openmetrics.hpp"

namespace thaw::daemon {

namespace {

// How often thawd samples the classifier's inference counter (fetch windows clamp while
// inference runs): every 50 ms while fetches run, every second otherwise.
constexpr std::uint64_t kInferenceFetchSampleUs = 50'000;
constexpr std::uint64_t kInferenceIdleSampleUs = 1'000'000;

// The group engines run in (the first of shim.allow_groups that exists) reads the cache's
// files: engines open them by path. Only root can give files to a group it is not in;
// an unprivileged thawd (tests, a user's own) keeps its files to itself and its group.
std::optional<gid_t> cache_group(const std::vector<std::string>& allow_groups) {
  if (::geteuid() != 0) return std::nullopt;
  for (const std::string& name : allow_groups) {
    std::vector<char> buffer(4096);
    group entry{};
    group* found = nullptr;
    while (::getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) == ERANGE) {
      buffer.resize(buffer.size() * 2);
    }
    if (found != nullptr) return found->gr_gid;
  }
  return std::nullopt;
}

// What the start-up re-index kept, dropped and evicted: a cache that shrank or lost files
// across a restart must say so in the journal, not only in a later fetch's duration.
void log_reindex(const store::ReindexReport& r, const ThawdConfig& c) {
  log(LogLevel::info,
      fmt::format("cache {}: kept {} model(s), {} complete and {} partial file(s), {} in use",
                  c.cache_dir.string(), r.models, r.complete_files, r.partial_files,
                  text::format_bytes(static_cast<double>(r.bytes_used))));
  for (const store::DroppedEntry& d : r.dropped) {
    log(LogLevel::warning, fmt::format("cache: deleted {}: {}", d.path.string(), d.reason));
  }
  for (const std::string& key : r.incomplete) {
    log(LogLevel::warning,
        fmt::format("cache: model {} lost files (above) and is incomplete; the next fetch or "
                    "prewarm of it fetches them again",
                    key),
        {{"MODEL", key}});
  }
  for (const std::string& key : r.evicted) {
    log(LogLevel::warning,
        fmt::format("cache: evicted model {} to fit store.cache_budget = {}", key,
                    text::format_bytes(static_cast<double>(c.cache_budget_bytes))),
        {{"MODEL", key}});
  }
  for (const std::filesystem::path& p : r.ignored) {
    log(LogLevel::notice,
        fmt::format("cache: {} is not a model directory; left alone", p.string()));
  }
}

// Soft RLIMIT_NOFILE up to the hard one, as systemd advises for programs that need many
// descriptors (thawd polls, never select()s, so descriptors past 1024 are fine): every pool
// page thawd exports to an engine is a descriptor for a while, and under the emulator every
// page is one for good (80 GB at 2 MiB = 40,000, far above the usual soft 1024). A hard limit
// that is still too low is reported by the driver when the pool cannot be taken.
void raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    log(LogLevel::warning, fmt::format("cannot raise the open-file limit from {} to {}: {}", before,
                                       rl.rlim_max, std::strerror(errno)));
  }
}

}  // namespace

std::expected<std::unique_ptr<Thawd>, std::string> Thawd::start(std::filesystem::path config_path,
                                                                ConfigFile need,
                                                                ServiceNotifier& notifier) {
  // Block the signals the loop takes before any thread exists (the GPU managers start
  // some): a process-directed SIGHUP would otherwise kill thawd through a thread that
  // does not block it.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&mask, sig);
  if (sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) return std::unexpected("cannot block signals");

  raise_open_file_limit();
  auto config = load_config(config_path, need);
  if (!config) return std::unexpected(config.error().message);
  std::unique_ptr<Thawd> d(new Thawd(std::move(config_path), need, notifier, std::move(*config)));
  const ThawdConfig& c = d->config_;

  notifier.status("opening the host cache");
  store::HostCacheConfig cache_config{c.cache_dir, c.cache_budget_bytes, {}, {}};
  cache_config.group = cache_group(c.allow_groups);
  auto cache = store::HostCache::open(std::move(cache_config));
  if (!cache) {
    return std::unexpected(
        fmt::format("store.cache_dir {}: {}", c.cache_dir.string(), cache.error().message));
  }
  d->cache_.emplace(std::move(*cache));
  log_reindex(d->cache_->reindex_report(), c);

  notifier.status("taking the GPUs' memory");
  auto driver = cuda::Driver::load();
  if (!driver) {
    log(LogLevel::warning,
        fmt::format("no CUDA driver ({}); serving the model store only: prewarm and activation "
                    "are unavailable until thawd is restarted on a node with a driver",
                    driver.error().what()));
  } else {
    d->driver_ = *driver;
    int count = 0;
    if (auto ok = d->driver_->init(); ok) count = d->driver_->device_count().value_or(0);
    for (int i = 0; i < count; ++i) {
      vmm::GpuMemoryConfig gc;
      gc.ordinal = i;
      gc.pool_share = c.pool_share;
      gc.max_slots = c.max_slots;
      auto gpu = vmm::GpuMemory::create(d->driver_, gc);
      if (!gpu) return std::unexpected(fmt::format("GPU {}: {}", i, gpu.error().message));
      const auto pool = (*gpu)->pool();
      log(LogLevel::info,
          fmt::format("GPU {}: {} pool of {} pages", i,
                      text::format_bytes(static_cast<double>(pool.pages * pool.page_bytes)),
                      pool.pages),
          {{"GPU", std::to_string(i)}});
      d->gpus_.push_back(std::move(*gpu));
    }
  }

  // Signals arrive through the loop (they are blocked above), never asynchronously.
  if (sd_event_default(&d->event_) < 0) return std::unexpected("cannot create the event loop");
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    sd_event_source* source = nullptr;
    if (sd_event_add_signal(d->event_, &source, sig, &Thawd::on_signal, d.get()) < 0) {
      return std::unexpected(fmt::format("cannot watch signal {}", sig));
    }
    d->sources_.push_back(source);
  }
  // WATCHDOG=1 at half of $WATCHDOG_USEC, when systemd set it.
  (void)sd_event_set_watchdog(d->event_, 1);

  // Before any fetch: the store marks its sockets only when the classifier reads them. An
  // error only for shaping = true on a node that cannot shape (the message says what to fix).
  notifier.status("setting up traffic shaping");
  auto shaping = NodeShaping::start(c.network, SystemNetworkProbe{}, make_bpf_shaper());
  if (!shaping) return std::unexpected(shaping.error());
  d->shaping_ = std::move(*shaping);
  if (d->shaping_->enabled() && c.network.clamp_fetch_windows) {
    // Clamped only while something competes with a fetch (inference traffic, other models'
    // fetches): alone, a fetch keeps the kernel's windows and its full goodput.
    d->fetch_windows_ = std::make_shared<network::FetchWindows>(d->shaping_->fetch_window_rates(),
                                                                network::ClampWhen::contended);
    sd_event_source* sampler = nullptr;
    if (sd_event_add_time_relative(d->event_, &sampler, CLOCK_MONOTONIC, kInferenceIdleSampleUs, 0,
                                   &Thawd::on_inference_sample, d.get()) >= 0) {
      d->sources_.push_back(sampler);
    }
  }

  d->access_ = std::make_unique<AccessPolicy>(c.allow_groups);
  for (const std::string& g : d->access_->unknown_groups()) {
    log(LogLevel::warning, fmt::format("shim.allow_groups: no group \"{}\" on this node; only "
                                       "root and the other groups may change thawd's state",
                                       g));
  }
  std::vector<vmm::GpuMemory*> gpus;
  for (auto& g : d->gpus_) gpus.push_back(g.get());
  d->service_ = std::make_unique<NodeService>(*d->cache_, std::move(gpus), d->service_config());

  const ManagerInfo info = d->manager_info();
  notifier.status("listening on the shim socket " + c.socket_path.string());
  d->artifacts_ = std::make_unique<ArtifactStore>(c.state_dir);
  // Once an engine recorded where it puts a model's bytes, prewarms use that layout.
  d->service_->set_engine_layouts([store = d->artifacts_.get()](const std::string& key) {
    return store->newest_for_model("layout", key);
  });
  auto shim = ShimServer::start(c.socket_path, *d->service_, *d->artifacts_, *d->access_,
                                info.node_id, d->event_);
  if (!shim) return std::unexpected(shim.error());
  d->shim_ = std::move(*shim);

  if (!c.coordinator_endpoint.empty()) {
    notifier.status("connecting to the coordinator at " + c.coordinator_endpoint);
    if (auto ok = d->start_agent(info.node_id); !ok) return std::unexpected(ok.error());
  }

  if (!c.metrics_listen.empty()) {
    auto metrics = MetricsServer::start(c.metrics_listen, [t = d.get()] {
      return render_openmetrics(*t->service_, t->shim_->counters(), t->cache_->bytes_used(),
                                t->config_.cache_budget_bytes, t->network_status());
    });
    if (!metrics) return std::unexpected(metrics.error());
    d->metrics_ = std::move(*metrics);
  }

  notifier.status("taking the D-Bus name " + std::string(kBusName));
  auto bus = NodeBus::start(c.bus, info, *d->service_, *d->access_, d->event_, d->artifacts_.get());
  if (!bus) return std::unexpected(bus.error());
  d->bus_ = std::move(*bus);
  d->state_ = "running";
  d->bus_->refresh();  // State is served from a snapshot: show "running" before READY=1
  d->last_status_ = d->status_line();
  notifier.ready(d->last_status_);
  log(LogLevel::notice, "ready: " + d->last_status_);
  // STATUS= follows what thawd holds (systemctl status shows it), checked once a second.
  sd_event_source* status_timer = nullptr;
  if (sd_event_add_time_relative(d->event_, &status_timer, CLOCK_MONOTONIC, 1'000'000, 0,
                                 &Thawd::on_status_timer, d.get()) >= 0) {
    d->sources_.push_back(status_timer);
  }
  return d;
}

Thawd::Thawd(std::filesystem::path config_path, ConfigFile need, ServiceNotifier& notifier,
             ThawdConfig config)
    : config_path_(std::move(config_path)),
      config_need_(need),
      notifier_(notifier),
      config_(std::move(config)) {}

Thawd::~Thawd() {
  agent_.reset();  // no new tasks
  metrics_.reset();
  bus_.reset();
  shim_.reset();  // every client's slots given back
  // Fetches cancelled and prewarms finished before the GPUs and the cache go away.
  tasks_.reset();
  workers_.reset();  // supervised workers stopped (transient units keep running)
  if (service_) service_->shutdown();
  service_.reset();
  for (sd_event_source* s : sources_) sd_event_source_unref(s);
  // GPU memory first: every slot and page back to the driver before the process exits.
  std::size_t pages = 0, page_bytes = 0;
  for (const auto& gpu : gpus_) {
    const vmm::PoolInfo pool = gpu->pool();
    pages += pool.pages;
    page_bytes += pool.pages * pool.page_bytes;
  }
  const std::size_t gpu_count = gpus_.size();
  gpus_.clear();
  if (gpu_count > 0) {
    log(LogLevel::notice,
        fmt::format("stopped: gave {} GPU page(s) ({}) of {} GPU(s) back to the driver", pages,
                    text::format_bytes(static_cast<double>(page_bytes)), gpu_count));
  }
  shaping_.reset();  // thawd's filter and qdiscs off the uplink
  if (event_ != nullptr) sd_event_unref(event_);
}

NodeServiceConfig Thawd::service_config() const {
  NodeServiceConfig s{config_.registry, config_.connections, config_.max_rate_bytes_per_s,
                      config_.allow_unverified, shaping_ != nullptr && shaping_->enabled()};
  if (s.mark_fetch_sockets) {
    s.fetch_windows = fetch_windows_;
    s.on_model_id = [shaping = shaping_.get()](std::uint16_t id, const std::string& key) {
      shaping->register_model(id, key);
    };
  }
  return s;
}

std::expected<void, std::string> Thawd::start_agent(const std::string& node_id) {
  const ThawdConfig& c = config_;
  auto node_key = zmqx::load_secret_key(c.node_key);
  if (!node_key) {
    return std::unexpected(fmt::format(
        "coordinator.key: {} (make this node's pair with `thaw-coordinator keygen {}` and copy "
        "the .pub to the coordinator's allow directory as {}.pub)",
        node_key.error(), c.node_key.parent_path().string() + "/" + c.node_key.stem().string(),
        node_id));
  }
  auto server_key = zmqx::load_public_key(c.coordinator_key);
  if (!server_key) return std::unexpected("coordinator.server_key: " + server_key.error());
  workers_ = std::make_unique<WorkerLauncher>(c.state_dir / "workers", sd_booted() > 0);
  // Each worker's traffic (its cgroup, its ports) is inference to the shaper while it runs.
  workers_->set_traffic_hooks(
      {[shaping = shaping_.get()](const std::string& unit, const WorkerTraffic& t) {
         shaping->add_worker(unit, t.cgroup_id, t.ports);
       },
       [shaping = shaping_.get()](const std::string& unit, const WorkerTraffic& t) {
         shaping->remove_worker(unit, t.cgroup_id, t.ports);
       }});
  // Under systemd, workers outlive a thawd restart (transient units): managed again, and
  // their traffic inference again, from now on.
  for (const std::string& unit : workers_->adopt_running_units()) {
    log(LogLevel::notice,
        fmt::format("worker {}: running since before this start; adopted (status, stop and its "
                    "traffic class as if launched now)",
                    unit));
  }
  tasks_ = std::make_unique<TaskRunner>(*service_, *workers_,
                                        WorkerSettings{c.worker_command,
                                                       c.worker_preload.string(),
                                                       c.socket_path.string(),
                                                       c.state_dir / "workers",
                                                       {}});
  AgentConfig agent;
  agent.endpoint = c.coordinator_endpoint;
  agent.node_id = node_id;
  agent.node_key = *node_key;
  agent.coordinator_public_z85 = *server_key;
  // HydraServe's B: coordinator.network, else the uplink's rate [network] resolved (its
  // setting or what the driver reports), else 0 (the coordinator assumes 16 Gbit/s).
  agent.network_bytes_per_s =
      c.network_bytes_per_s > 0 ? c.network_bytes_per_s : shaping_->link_bytes_per_s();
  agent.pcie_bytes_per_s = c.pcie_bytes_per_s;
  agent.shapes_traffic = shaping_->enabled();
  agent.on_class_rates = [shaping = shaping_.get(),
                          windows = fetch_windows_](const v1::ClassRates& r) {
    CoordinatorRates rates;
    rates.link_bytes_per_s = static_cast<std::uint64_t>(r.link_bytes_per_s());
    rates.cold_starts = r.cold_starts();
    rates.per_cold_start_bytes_per_s = static_cast<std::uint64_t>(r.per_cold_start_bytes_per_s());
    // The codec checked: no classes, or exactly one per class.
    for (int i = 0; i < r.classes_size() && i < static_cast<int>(kNetClassCount); ++i) {
      rates.classes[i] = {static_cast<std::uint64_t>(r.classes(i).rate_bytes_per_s()),
                          static_cast<std::uint64_t>(r.classes(i).ceil_bytes_per_s())};
    }
    if (auto ok = shaping->apply_coordinator_rates(rates); !ok) {
      log(LogLevel::warning, ok.error() + "; keeping the rates in force");
    }
    // Live fetches' windows follow the new class rates.
    if (windows) {
      if (auto ok = windows->set_rates(shaping->fetch_window_rates()); !ok) {
        log(LogLevel::warning, "re-clamping fetch windows to the new class rates: " + ok.error());
      }
    }
  };
  agent.worker_host = c.worker_host;
  auto started = ClusterAgent::start(std::move(agent), *service_, *tasks_, *workers_);
  if (!started) return std::unexpected("coordinator: " + started.error());
  agent_ = std::move(*started);
  log(LogLevel::info,
      fmt::format("cluster agent: node {} connecting to {}", node_id, c.coordinator_endpoint));
  return {};
}

ManagerInfo Thawd::manager_info() {
  ManagerInfo m;
  m.node_id = config_.node_id;
  if (m.node_id.empty()) {
    sd_id128_t id;
    char text[SD_ID128_STRING_MAX];
    if (sd_id128_get_machine(&id) == 0) {
      m.node_id = sd_id128_to_string(id, text);
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      m.node_id = host;
    }
  }
  m.version = THAW_VERSION;
  m.state = [this] { return state_; };
  m.cache_bytes_used = [this] { return cache_->bytes_used(); };
  m.cache_budget_bytes = config_.cache_budget_bytes;
  m.network = [this] { return network_status(); };
  return m;
}

std::string Thawd::status_line() const {
  std::string line =
      fmt::format("{} GPU(s), cache {} of {}", gpus_.size(),
                  text::format_bytes(static_cast<double>(cache_->bytes_used())),
                  text::format_bytes(static_cast<double>(config_.cache_budget_bytes)));
  if (!service_) return line;
  int fetching = 0, active = 0;
  for (const ModelStatus& m : service_->models()) fetching += m.state == ModelState::fetching;
  const std::vector<SlotStatus> slots = service_->slots();
  for (const SlotStatus& s : slots) active += s.state == "active";
  if (fetching > 0) line += fmt::format(", {} fetching", fetching);
  if (!slots.empty()) line += fmt::format(", {} slot(s), {} active", slots.size(), active);
  return line;
}

int Thawd::on_status_timer(sd_event_source* source, uint64_t usec, void* self) {
  auto* d = static_cast<Thawd*>(self);
  if (std::string line = d->status_line(); line != d->last_status_) {
    d->last_status_ = line;
    d->notifier_.status(line);
  }
  const int r = sd_event_source_set_time(source, usec + 1'000'000);
  return r < 0 ? r : sd_event_source_set_enabled(source, SD_EVENT_ON);
}

NetStatus Thawd::network_status() const {
  NetStatus n = shaping_ ? shaping_->status() : NetStatus{};
  if (fetch_windows_) n.fetch_windows_clamped = fetch_windows_->clamping();
  return n;
}

int Thawd::on_inference_sample(sd_event_source* source, uint64_t usec, void* self) {
  auto* d = static_cast<Thawd*>(self);
  const bool was = d->fetch_windows_->clamping();
  const bool active = d->inference_activity_.sample(d->shaping_->inference_packets(),
                                                    network::InferenceActivity::Clock::now());
  d->fetch_windows_->set_inference_active(active);
  if (const bool now = d->fetch_windows_->clamping(); now != was) {
    log(LogLevel::debug, now ? "fetch windows clamped: inference traffic or fetches compete"
                             : "fetch windows released: nothing competes with the fetches");
  }
  // Often while fetches run (a request arriving mid-fetch waits at most this long for the
  // clamp); otherwise only to keep the hold time's view of recent inference fresh.
  const std::uint64_t next =
      d->fetch_windows_->live().empty() ? kInferenceIdleSampleUs : kInferenceFetchSampleUs;
  const int r = sd_event_source_set_time(source, usec + next);
  return r < 0 ? r : sd_event_source_set_enabled(source, SD_EVENT_ON);
}

int Thawd::on_signal(sd_event_source*, const struct signalfd_siginfo* info, void* self) {
  auto* d = static_cast<Thawd*>(self);
  if (info->ssi_signo == SIGHUP) {
    d->reload();
    return 0;
  }
  d->state_ = "stopping";
  d->notifier_.stopping("stopping: releasing GPU memory");
  log(LogLevel::notice, fmt::format("signal {}: stopping", info->ssi_signo));
  return sd_event_exit(d->event_, 0);
}

void Thawd::reload() {
  notifier_.reloading();
  auto next = load_config(config_path_, config_need_);
  if (!next) {
    log(LogLevel::error, "reload: " + next.error().message + "; keeping the running configuration");
    notifier_.ready(status_line());
    return;
  }
  for (const std::string& key : restart_needed(config_, *next)) {
    log(LogLevel::warning,
        fmt::format("reload: {} changed; it takes effect at the next restart", key));
  }
  config_.registry = next->registry;
  config_.connections = next->connections;
  config_.max_rate_bytes_per_s = next->max_rate_bytes_per_s;
  config_.allow_unverified = next->allow_unverified;
  config_.allow_groups = next->allow_groups;
  // The old policy stays alive until the bus uses the new one (it holds a pointer). The
  // shim server applies the new rule to open connections too: engines of a group taken out
  // of shim.allow_groups are disconnected now, not left talking until they exit.
  auto access = std::make_unique<AccessPolicy>(config_.allow_groups);
  bus_->set_access(*access);
  shim_->set_access(*access);
  access_ = std::move(access);
  service_->set_config(service_config());
  log(LogLevel::notice, "reloaded " + config_path_.string());
  notifier_.ready(status_line());
}

int Thawd::run() {
  const int rc = sd_event_loop(event_);
  return rc < 0 ? 1 : rc;
}

}  // namespace thaw::daemon
