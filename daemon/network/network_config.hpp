// The [network] section of thawd.toml: whether thawd shapes the node's uplink with its
// eBPF traffic classes, on which device, at what link rate, and each class's guaranteed
// rate and ceiling. Parsing (the keys) lives in daemon/config/thawd_config.cpp with the
// other sections; this file holds the settings, their cross-key validation and their
// resolution against the machine (default-route device, /sys/class/net/DEV/speed,
// capabilities) into the rates the shaper is started with.
//
// Four classes, in priority order: inference (engines' and the gateway's traffic, small
// and latency-bound: HydraServe §4.2 simply prioritises it), critical fetch (the layers a
// cold start waits for), background (prefetch, consolidation), other (whatever else the
// node sends: it keeps a guaranteed share so ssh and monitoring never starve). Marks are the values
// the store writes with SO_MARK on its fetch sockets and the BPF classifier reads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::daemon {

// In the order and with the ids of bpf/traffic_class.h (THAW_CLASS_*).
enum class NetClass : std::uint8_t { inference = 0, critical = 1, background = 2, other = 3 };
inline constexpr std::size_t kNetClassCount = 4;
std::string_view to_string(NetClass cls);

// A class's rate as written: an absolute rate in bytes per second, or a share of the link.
struct RateSetting {
  std::uint64_t bytes_per_s = 0;  // used when share == 0
  double share = 0;               // (0, 1]: of the link rate
  bool operator==(const RateSetting&) const = default;
};

struct ClassSetting {
  RateSetting guaranteed;  // what the class gets whatever the others send
  RateSetting ceil;        // the most it may borrow up to
  bool operator==(const ClassSetting&) const = default;
};

enum class ShapingMode { automatic, on, off };

struct NetworkSettings {
  // automatic: on when the uplink exists, its rate is known and thawd has CAP_BPF,
  // CAP_NET_ADMIN and CAP_PERFMON, else off with one log line saying which; on: the same, but a
  // missing device or unknown link rate stops thawd (missing capabilities still only turn it off).
  ShapingMode mode = ShapingMode::automatic;
  std::string uplink;           // "" = the device of the default route
  std::uint64_t link_rate = 0;  // bytes/s; 0 = /sys/class/net/DEV/speed
  std::array<ClassSetting, kNetClassCount> classes = default_classes();
  // Local TCP/UDP ports whose traffic is inference (the gateway's, engines' HTTP ports):
  // recognised by port, so neither needs to mark its sockets.
  std::vector<std::uint16_t> inference_ports;
  // While shaping runs and inference traffic or other models' fetches compete: each fetch
  // socket's receive window is kept at its class's current share × round trip
  // (daemon/network/fetch_window.hpp), so an unpaced registry cannot queue a whole
  // autotuned window upstream, ahead of inference. false: the kernel's windows always.
  bool clamp_fetch_windows = true;

  static constexpr std::array<ClassSetting, kNetClassCount> default_classes() {
    // network::default_shaping_settings's shares (daemon/network/traffic_shaper.hpp): the
    // guarantees bite only under contention; every ceiling is the link, so none idles.
    return {ClassSetting{{0, 0.40}, {0, 1.0}},   // inference: latency-bound, served first
            ClassSetting{{0, 0.40}, {0, 1.0}},   // critical fetch: what cold starts wait on
            ClassSetting{{0, 0.05}, {0, 1.0}},   // background: borrows when the link is idle
            ClassSetting{{0, 0.15}, {0, 1.0}}};  // other: the node's own traffic
  }
  bool operator==(const NetworkSettings&) const = default;
};

// Checks what can be checked without the machine: every absolute guaranteed rate at most its
// ceiling and the link rate (when set), shares' sum at most 1, the device name one the kernel
// accepts. The message names the keys ("network.critical_rate ...") and what to change.
std::expected<void, std::string> validate_network_settings(const NetworkSettings& s);

// What the machine answers; an interface so resolution is testable without one.
class NetworkProbe {
 public:
  virtual ~NetworkProbe() = default;
  virtual std::optional<std::string> default_route_device() const = 0;
  virtual bool device_exists(const std::string& dev) const = 0;
  // The link rate in bytes/s from /sys/class/net/DEV/speed (Mbit/s); nullopt when the driver
  // does not say (virtual devices report -1 or fail the read).
  virtual std::optional<std::uint64_t> link_bytes_per_s(const std::string& dev) const = 0;
  // "" when thawd may load its classifier and change qdiscs (CAP_BPF, CAP_NET_ADMIN and
  // CAP_PERFMON or CAP_SYS_ADMIN); else the missing capabilities.
  virtual std::string missing_capabilities() const = 0;
};

// The real machine: /proc/net/route, /sys/class/net, capget(2).
class SystemNetworkProbe final : public NetworkProbe {
 public:
  std::optional<std::string> default_route_device() const override;
  bool device_exists(const std::string& dev) const override;
  std::optional<std::uint64_t> link_bytes_per_s(const std::string& dev) const override;
  std::string missing_capabilities() const override;
};

// The device of the first default route (destination 0, mask 0, lowest metric) in the text
// of /proc/net/route; nullopt if none.
std::optional<std::string> default_route_in(std::string_view proc_net_route);

struct ClassRates {
  std::uint64_t guaranteed_bytes_per_s = 0;
  std::uint64_t ceil_bytes_per_s = 0;
  bool operator==(const ClassRates&) const = default;
};

struct ResolvedNetwork {
  bool enabled = false;
  std::string why_off;  // when !enabled: one line for the log ("shaping off: ...")
  std::string device;
  std::uint64_t link_bytes_per_s = 0;
  std::array<ClassRates, kNetClassCount> rates{};
};

// The settings against the machine. An error only where mode == on and the machine cannot
// do it for a reason the operator must fix (no such device, link rate unknown, rates above
// the link); everything else that prevents shaping gives enabled = false and why_off.
std::expected<ResolvedNetwork, std::string> resolve_network(const NetworkSettings& s,
                                                            const NetworkProbe& probe);

// What D-Bus (GetNetwork), the metrics and `thawctl net` show: the shaper's state, the rates
// in force and the classifier's counters.
struct NetClassStatus {
  std::uint64_t rate_bytes_per_s = 0;  // guaranteed, in force now
  std::uint64_t ceil_bytes_per_s = 0;
  // [0] egress (uploads), [1] ingress (downloads)
  std::array<std::uint64_t, 2> bytes{}, packets{}, drops{};
};

// A fetched model's bytes as the classifier counted them (both directions, headers included).
struct NetModelStatus {
  std::uint16_t id = 0;  // the socket marks' model id (bpf/traffic_class.h)
  std::string name;      // the model's cache key
  std::uint64_t bytes = 0;
};

struct NetStatus {
  bool enabled = false;  // the classifier is attached and shaping
  std::string detail;    // what is attached where, or why shaping is off
  std::string device;
  std::uint64_t link_bytes_per_s = 0;
  // "config" ([network]) or "coordinator" (its last per-node rates, see ClassRates in
  // common/proto/cluster/cluster.proto)
  std::string rates_from = "config";
  std::uint32_t cold_starts = 0;                 // the coordinator's N for this node
  std::uint64_t per_cold_start_bytes_per_s = 0;  // its equal share B_c / N (0: N = 0)
  std::array<NetClassStatus, kNetClassCount> classes{};
  std::vector<NetModelStatus> models;  // by id; fetched models, once shaping runs
  // Whether fetch sockets' receive windows are clamped now (inference traffic or fetches of
  // several models compete; daemon/network/fetch_window.hpp); none: windows are off.
  std::optional<bool> fetch_windows_clamped;
};

}  // namespace thaw::daemon
