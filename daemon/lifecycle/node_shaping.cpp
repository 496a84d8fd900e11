#include "daemon/lifecycle/node_shaping.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "common/text/byte_size.hpp"
#include "daemon/log/log.hpp"

namespace thaw::daemon {

namespace {

class BpfShaper final : public ShaperBackend {
 public:
  std::expected<std::string, network::ShapingError> start(
      const network::ShapingSettings& settings) override {
    auto status = shaper_.start(settings);
    if (!status) return std::unexpected(status.error());
    return status->detail;
  }
  std::expected<void, network::ShapingError> add_model(std::uint16_t id) override {
    return shaper_.add_model(id);
  }
  std::expected<void, network::ShapingError> set_class_rates(
      const std::array<network::ClassRate, network::kTrafficClassCount>& classes) override {
    return shaper_.set_class_rates(classes);
  }
  std::expected<network::ShapingCounters, network::ShapingError> counters() const override {
    return shaper_.counters();
  }
  std::expected<std::uint64_t, network::ShapingError> class_packets(
      network::TrafficClass c) const override {
    return shaper_.class_packets(c);
  }
  std::expected<void, network::ShapingError> add_inference_cgroup(std::uint64_t id) override {
    return shaper_.add_inference_cgroup(id);
  }
  std::expected<void, network::ShapingError> remove_inference_cgroup(std::uint64_t id) override {
    return shaper_.remove_inference_cgroup(id);
  }
  std::expected<void, network::ShapingError> set_inference_port(std::uint16_t port) override {
    return shaper_.set_port_class(port, network::TrafficClass::inference);
  }
  std::expected<void, network::ShapingError> clear_port(std::uint16_t port) override {
    return shaper_.clear_port_class(port);
  }
  void stop() override { shaper_.stop(); }

 private:
  network::TrafficShaper shaper_;
};

static_assert(kNetClassCount == network::kTrafficClassCount);

std::array<network::ClassRate, network::kTrafficClassCount> to_shaper(
    const std::array<ClassRates, kNetClassCount>& rates) {
  std::array<network::ClassRate, network::kTrafficClassCount> out{};
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    out[i] = {rates[i].guaranteed_bytes_per_s, rates[i].ceil_bytes_per_s};
  }
  return out;
}

std::string rates_line(const std::array<ClassRates, kNetClassCount>& rates) {
  std::string line;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    line += fmt::format("{}{} {}/s", line.empty() ? "" : ", ", to_string(static_cast<NetClass>(i)),
                        text::format_bytes(static_cast<double>(rates[i].guaranteed_bytes_per_s)));
  }
  return line;
}

}  // namespace

std::unique_ptr<ShaperBackend> make_bpf_shaper() {
  return std::make_unique<BpfShaper>();
}

std::expected<std::unique_ptr<NodeShaping>, std::string> NodeShaping::start(
    const NetworkSettings& settings, const NetworkProbe& probe,
    std::unique_ptr<ShaperBackend> backend) {
  auto resolved = resolve_network(settings, probe);
  if (!resolved) return std::unexpected(resolved.error());
  std::unique_ptr<NodeShaping> s(new NodeShaping());
  s->resolved_ = *resolved;
  s->configured_ = resolved->rates;
  s->configured_ports_ = settings.inference_ports;
  NetStatus& st = s->status_;
  st.device = resolved->device;
  st.link_bytes_per_s = resolved->link_bytes_per_s;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    st.classes[i].rate_bytes_per_s = resolved->rates[i].guaranteed_bytes_per_s;
    st.classes[i].ceil_bytes_per_s = resolved->rates[i].ceil_bytes_per_s;
  }
  if (!resolved->enabled) {
    st.detail = resolved->why_off;
    log(LogLevel::notice, st.detail);
    return s;
  }
  network::ShapingSettings shaping;
  shaping.enabled = true;
  shaping.uplink = resolved->device;
  shaping.link_bytes_per_s = resolved->link_bytes_per_s;
  shaping.classes = to_shaper(resolved->rates);
  shaping.inference_ports = settings.inference_ports;
  auto started = backend->start(shaping);
  if (!started) {
    const network::ShapingError& e = started.error();
    // Missing permissions never stop thawd (shaping is an optimisation); in "auto" nothing
    // does. With shaping = true anything else is the operator's to fix.
    if (settings.mode == ShapingMode::on && e.code != network::ShapingErrc::no_permission) {
      return std::unexpected(
          fmt::format("network: traffic shaping on {} failed: {} (set "
                      "network.shaping = \"auto\" to run without it)",
                      resolved->device, e.message));
    }
    st.detail = fmt::format("traffic shaping off: starting it on {} failed: {}", resolved->device,
                            e.message);
    log(LogLevel::warning, st.detail);
    return s;
  }
  s->backend_ = std::move(backend);
  st.enabled = true;
  st.detail = *started;
  log(LogLevel::info,
      fmt::format("traffic shaping on {} at {}/s: {} ({})", resolved->device,
                  text::format_bytes(static_cast<double>(resolved->link_bytes_per_s)),
                  rates_line(resolved->rates), st.detail));
  return s;
}

NodeShaping::~NodeShaping() {
  if (backend_) backend_->stop();
}

bool NodeShaping::enabled() const {
  std::lock_guard lock(mutex_);
  return backend_ != nullptr;
}

std::uint64_t NodeShaping::link_bytes_per_s() const {
  std::lock_guard lock(mutex_);
  return resolved_.link_bytes_per_s;
}

std::uint64_t NodeShaping::inference_packets() const {
  std::lock_guard lock(mutex_);
  if (!backend_) return 0;
  return backend_->class_packets(network::TrafficClass::inference).value_or(0);
}

void NodeShaping::register_model(std::uint16_t id, const std::string& name) {
  std::lock_guard lock(mutex_);
  if (!backend_ || id == 0) return;
  if (auto ok = backend_->add_model(id); !ok) {
    log(LogLevel::warning, fmt::format("traffic shaping: {}'s bytes are not counted per model: {}",
                                       name, ok.error().message));
    return;
  }
  model_names_[id] = name;
}

network::FetchWindowRates NodeShaping::fetch_window_rates() const {
  std::lock_guard lock(mutex_);
  const auto& c = status_.classes;
  return {c[static_cast<std::size_t>(NetClass::critical)].ceil_bytes_per_s,
          c[static_cast<std::size_t>(NetClass::background)].ceil_bytes_per_s,
          c[static_cast<std::size_t>(NetClass::background)].rate_bytes_per_s};
}

NetStatus NodeShaping::status() const {
  std::lock_guard lock(mutex_);
  NetStatus out = status_;
  if (!backend_) return out;
  auto counters = backend_->counters();
  if (!counters) {
    out.detail += fmt::format(" (counters unreadable: {})", counters.error().message);
    return out;
  }
  for (const auto& [id, name] : model_names_) {
    auto it = counters->model_bytes.find(id);
    out.models.push_back({id, name, it != counters->model_bytes.end() ? it->second : 0});
  }
  for (std::size_t dir = 0; dir < 2; ++dir) {
    for (std::size_t i = 0; i < kNetClassCount; ++i) {
      const network::ClassCounters& c = counters->classes[dir][i];
      out.classes[i].bytes[dir] = c.bytes;
      out.classes[i].packets[dir] = c.packets;
      out.classes[i].drops[dir] = c.drops;
    }
  }
  return out;
}

std::expected<std::array<ClassRates, kNetClassCount>, std::string> NodeShaping::fit_to_link(
    const CoordinatorRates& rates, std::uint64_t link) {
  if (link == 0) return std::unexpected("this node's link rate is unknown");
  std::array<ClassRates, kNetClassCount> out{};
  const double scale = rates.link_bytes_per_s > 0 && rates.link_bytes_per_s != link
                           ? static_cast<double>(link) / static_cast<double>(rates.link_bytes_per_s)
                           : 1.0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    // Rounded down, so scaled shares that summed to the coordinator's link fit this one.
    auto scaled = [&](std::uint64_t v) {
      return static_cast<std::uint64_t>(static_cast<double>(v) * scale);
    };
    out[i].guaranteed_bytes_per_s =
        std::max<std::uint64_t>(scaled(rates.classes[i].guaranteed_bytes_per_s), 1);
    out[i].ceil_bytes_per_s = std::min(
        link, std::max(scaled(rates.classes[i].ceil_bytes_per_s), out[i].guaranteed_bytes_per_s));
    if (out[i].guaranteed_bytes_per_s > out[i].ceil_bytes_per_s) {
      return std::unexpected(fmt::format("{}: rate {} B/s above the link of {} B/s",
                                         to_string(static_cast<NetClass>(i)),
                                         out[i].guaranteed_bytes_per_s, link));
    }
    sum += out[i].guaranteed_bytes_per_s;
  }
  if (sum > link) {
    return std::unexpected(
        fmt::format("guaranteed rates sum to {} B/s, above the link of {} B/s", sum, link));
  }
  return out;
}

std::expected<void, std::string> NodeShaping::apply_coordinator_rates(
    const CoordinatorRates& rates) {
  std::lock_guard lock(mutex_);
  bool revert = true;
  for (const ClassRates& c : rates.classes) revert = revert && c.guaranteed_bytes_per_s == 0;
  std::array<ClassRates, kNetClassCount> next = configured_;
  if (!revert) {
    auto fitted = fit_to_link(rates, resolved_.link_bytes_per_s);
    if (!fitted) return std::unexpected("coordinator's class rates: " + fitted.error());
    next = *fitted;
  }
  if (backend_) {
    if (auto ok = backend_->set_class_rates(to_shaper(next)); !ok) {
      return std::unexpected("setting the coordinator's class rates: " + ok.error().message);
    }
  }
  const bool changed = status_.rates_from != (revert ? "config" : "coordinator") ||
                       status_.cold_starts != rates.cold_starts;
  status_.rates_from = revert ? "config" : "coordinator";
  status_.cold_starts = rates.cold_starts;
  status_.per_cold_start_bytes_per_s = revert ? 0 : rates.per_cold_start_bytes_per_s;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    status_.classes[i].rate_bytes_per_s = next[i].guaranteed_bytes_per_s;
    status_.classes[i].ceil_bytes_per_s = next[i].ceil_bytes_per_s;
  }
  if (changed && backend_) {
    log(LogLevel::info, fmt::format("traffic shaping: {} cold start(s) here per the coordinator; "
                                    "{}",
                                    rates.cold_starts, rates_line(next)));
  }
  return {};
}

void NodeShaping::add_worker(const std::string& unit, std::uint64_t cgroup_id,
                             const std::vector<std::uint16_t>& ports) {
  std::lock_guard lock(mutex_);
  if (!backend_) return;
  if (cgroup_id != 0) {
    if (auto ok = backend_->add_inference_cgroup(cgroup_id); !ok) {
      log(LogLevel::warning,
          fmt::format("traffic shaping: worker {} (cgroup {}) not classed by its cgroup: {}; its "
                      "uploads are inference only from network.inference_ports",
                      unit, cgroup_id, ok.error().message));
    }
  }
  for (std::uint16_t port : ports) {
    if (auto ok = backend_->set_inference_port(port); !ok) {
      log(LogLevel::warning, fmt::format("traffic shaping: worker {}'s port {} not inference: {}",
                                         unit, port, ok.error().message));
    }
  }
  log(LogLevel::debug,
      fmt::format("traffic shaping: worker {} (cgroup {}, {} port(s)) is inference", unit,
                  cgroup_id, ports.size()));
}

void NodeShaping::remove_worker(const std::string& unit, std::uint64_t cgroup_id,
                                const std::vector<std::uint16_t>& ports) {
  std::lock_guard lock(mutex_);
  if (!backend_) return;
  if (cgroup_id != 0) {
    if (auto ok = backend_->remove_inference_cgroup(cgroup_id); !ok) {
      log(LogLevel::warning, fmt::format("traffic shaping: forgetting worker {}'s cgroup {}: {}",
                                         unit, cgroup_id, ok.error().message));
    }
  }
  for (std::uint16_t port : ports) {
    if (std::ranges::find(configured_ports_, port) != configured_ports_.end()) continue;
    if (auto ok = backend_->clear_port(port); !ok) {
      log(LogLevel::warning, fmt::format("traffic shaping: clearing worker {}'s port {}: {}", unit,
                                         port, ok.error().message));
    }
  }
}

}  // namespace thaw::daemon
