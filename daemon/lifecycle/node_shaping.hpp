// NodeShaping: thawd's side of the uplink's traffic shaping. It resolves [network] against
// the machine, starts the shaper (daemon/network/traffic_shaper.hpp) when it can, and
// otherwise runs without it, having said why once in the log; it applies the per-class rates
// the coordinator sends (ClassRates, cluster.proto) and answers what D-Bus, the metrics and
// `thawctl net` show. Safe from any thread (the bus and the event loop, the metrics thread,
// the cluster agent's thread).
//
// The shaper is behind ShaperBackend so this logic runs in tests without CAP_BPF.
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/network/fetch_window.hpp"
#include "daemon/network/network_config.hpp"
#include "daemon/network/traffic_shaper.hpp"

namespace thaw::daemon {

class ShaperBackend {
 public:
  virtual ~ShaperBackend() = default;
  // The detail line of what was attached.
  virtual std::expected<std::string, network::ShapingError> start(
      const network::ShapingSettings& settings) = 0;
  virtual std::expected<void, network::ShapingError> set_class_rates(
      const std::array<network::ClassRate, network::kTrafficClassCount>& classes) = 0;
  virtual std::expected<network::ShapingCounters, network::ShapingError> counters() const = 0;
  // Packets of class c both ways (the bpf shaper reads only the classifier's map for it).
  virtual std::expected<std::uint64_t, network::ShapingError> class_packets(
      network::TrafficClass c) const {
    auto all = counters();
    if (!all) return std::unexpected(all.error());
    std::uint64_t packets = 0;
    for (const auto& direction : all->classes) packets += direction[static_cast<int>(c)].packets;
    return packets;
  }
  // Engines' cgroup v2 ids whose packets are inference (the classifier's cgroup map).
  virtual std::expected<void, network::ShapingError> add_inference_cgroup(std::uint64_t id) = 0;
  virtual std::expected<void, network::ShapingError> remove_inference_cgroup(std::uint64_t id) = 0;
  // Local ports whose packets are inference (engines' HTTP and pipeline ports), and back.
  virtual std::expected<void, network::ShapingError> set_inference_port(std::uint16_t port) = 0;
  virtual std::expected<void, network::ShapingError> clear_port(std::uint16_t port) = 0;
  virtual void stop() = 0;
  // Per-model byte counters for fetch sockets marked with `id` (none by default).
  virtual std::expected<void, network::ShapingError> add_model(std::uint16_t /*id*/) { return {}; }
};

// network::TrafficShaper (BPF classifier, HTB on the uplink and its IFB).
std::unique_ptr<ShaperBackend> make_bpf_shaper();

// Rates the coordinator computed for this node (HydraServe Eq. 3/4: its link shared equally
// by the cold starts placed here). `link_bytes_per_s` is the B it computed with: rates are
// scaled to this node's own link rate when that differs. Every class rate 0 (the coordinator
// has no cold start here): back to the configured rates.
struct CoordinatorRates {
  std::uint64_t link_bytes_per_s = 0;
  std::uint32_t cold_starts = 0;
  std::uint64_t per_cold_start_bytes_per_s = 0;
  std::array<ClassRates, kNetClassCount> classes{};
};

class NodeShaping {
 public:
  // An error only where [network] shaping = true and the machine or the settings make it
  // impossible for a reason the operator must fix; missing capabilities and (in "auto")
  // anything else turn shaping off, logged once.
  static std::expected<std::unique_ptr<NodeShaping>, std::string> start(
      const NetworkSettings& settings, const NetworkProbe& probe,
      std::unique_ptr<ShaperBackend> backend);
  ~NodeShaping();  // stops the shaper: thawd's qdiscs and filter leave with it
  NodeShaping(const NodeShaping&) = delete;
  NodeShaping& operator=(const NodeShaping&) = delete;

  bool enabled() const;
  // The uplink's rate as resolved ([network] link_rate, else the driver's); 0 when unknown
  // or [network] shaping = false.
  std::uint64_t link_bytes_per_s() const;
  NetStatus status() const;
  // The classifier counts the bytes of fetch sockets marked with model `id` (NodeService's
  // on_model_id), shown under `name` in status().models. Without shaping nothing to do; a
  // failure (the classifier's map full) is logged.
  void register_model(std::uint16_t id, const std::string& name);
  // The rates fetch sockets' receive windows follow (daemon/network/fetch_window.hpp) under
  // the class rates in force: critical and background at their ceilings, background cut to its
  // guaranteed rate while a critical fetch runs.
  network::FetchWindowRates fetch_window_rates() const;
  // Inference packets on the uplink both ways since shaping started (the classifier's
  // counter; thawd samples it to clamp fetch windows only while inference runs). 0 without
  // shaping or when the map cannot be read.
  std::uint64_t inference_packets() const;
  // Applies the coordinator's rates (checked against this node's link first). Without
  // shaping they are recorded for status() and the call succeeds: the coordinator cannot
  // know, and there is nothing to fix on its side.
  std::expected<void, std::string> apply_coordinator_rates(const CoordinatorRates& rates);
  // A worker's traffic (WorkerLauncher's hooks): packets of its cgroup (egress) and to its
  // ports (ingress) are inference while it runs; a port of network.inference_ports stays
  // inference after. Without shaping nothing to do; a failure is logged (its traffic is then
  // classed by network.inference_ports only).
  void add_worker(const std::string& unit, std::uint64_t cgroup_id,
                  const std::vector<std::uint16_t>& ports);
  void remove_worker(const std::string& unit, std::uint64_t cgroup_id,
                     const std::vector<std::uint16_t>& ports);

  // The rates a CoordinatorRates means on a link of `link` bytes/s: scaled from the
  // coordinator's B, each class at least 1 byte/s (HTB refuses 0) and its ceiling at most
  // the link; an error when they cannot fit (the guaranteed sum above the link).
  static std::expected<std::array<ClassRates, kNetClassCount>, std::string> fit_to_link(
      const CoordinatorRates& rates, std::uint64_t link);

 private:
  NodeShaping() = default;

  mutable std::mutex mutex_;
  std::unique_ptr<ShaperBackend> backend_;  // null when shaping is off
  ResolvedNetwork resolved_;
  std::array<ClassRates, kNetClassCount> configured_{};
  std::vector<std::uint16_t> configured_ports_;       // network.inference_ports: never cleared
  NetStatus status_;                                  // all but the counters
  std::map<std::uint16_t, std::string> model_names_;  // registered model ids
};

}  // namespace thaw::daemon
