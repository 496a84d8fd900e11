// TrafficShaper: thaw's eBPF traffic classes on a node's uplink.
//
// A tc (clsact) BPF classifier puts every packet of the uplink in a class (inference,
// critical fetch, background fetch, other; bpf/traffic_class.h) and writes the class's HTB
// leaf into skb->priority. Egress is shaped by an HTB root qdisc on the uplink; ingress
// (model downloads) is redirected by the same program to an IFB device with its own HTB, so
// downloads queue in thaw's qdisc, where inference packets overtake them, instead of in the
// upstream switch. thawd owns exactly: its filter (fixed handle/priority) in the uplink's
// clsact, the HTB roots with major handle 0x7468 on the uplink and the IFB, the IFB device
// "thifb<ifindex>" and the pins under /sys/fs/bpf/thaw/<ifindex>/; stop() removes exactly
// those, and start() removes any left by a thawd that crashed.
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bpf/traffic_class.h"

namespace thaw::network {

enum class TrafficClass : std::uint8_t {
  inference = THAW_CLASS_INFERENCE,
  critical_fetch = THAW_CLASS_CRITICAL_FETCH,
  background_fetch = THAW_CLASS_BACKGROUND_FETCH,
  other = THAW_CLASS_OTHER,
};
inline constexpr std::size_t kTrafficClassCount = THAW_CLASS_COUNT;

// "inference", "critical_fetch", "background_fetch", "other".
const char* traffic_class_name(TrafficClass c);

// SO_MARK value for a socket of class c carrying bytes of model model_id (0: none; 1..65535
// get per-model counters once registered with TrafficShaper::add_model).
inline std::uint32_t socket_mark(TrafficClass c, std::uint16_t model_id = 0) {
  return thaw_mark_make(static_cast<std::uint32_t>(c), model_id);
}

struct ClassRate {
  std::uint64_t rate_bytes_per_s = 0;  // guaranteed
  std::uint64_t ceil_bytes_per_s = 0;  // most it may borrow up to; 0 = the link rate
};

struct ShapingSettings {
  bool enabled = false;
  std::string uplink;                  // interface name, e.g. "eth0"
  std::uint64_t link_bytes_per_s = 0;  // what the uplink really carries; shaping runs at it
  std::uint32_t mtu = 1514;            // largest frame, for HTB bursts and quanta
  // Indexed by TrafficClass. Guaranteed rates must sum to at most the link rate.
  std::array<ClassRate, kTrafficClassCount> classes{};
  bool shape_ingress = true;  // downloads through the IFB device
  // Traffic recognised as inference without engine changes:
  std::vector<std::uint16_t> inference_ports;    // local TCP/UDP ports (engine, gateway)
  std::vector<std::uint64_t> inference_cgroups;  // cgroup v2 ids of engine/gateway units
};

// Defaults thawd uses for a link: inference 40 % guaranteed, critical fetch 40 %, background
// 5 %, other 15 %; every ceil is the link, so no bandwidth idles.
ShapingSettings default_shaping_settings(std::string uplink, std::uint64_t link_bytes_per_s);

enum class ShapingErrc {
  disabled = 1,      // settings.enabled is false (not a failure; start() returns it as info)
  no_permission,     // missing CAP_BPF / CAP_NET_ADMIN (thawd runs with shaping off)
  invalid_settings,  // rates that do not fit the link, unknown device, ...
  bpf,               // loading or attaching the BPF program failed
  netlink,           // creating a qdisc, class or the IFB device failed
  not_running,       // a call that needs start() first
};

struct ShapingError {
  ShapingErrc code = ShapingErrc::bpf;
  std::string message;  // one line a user can act on
};

struct ClassCounters {
  std::uint64_t bytes = 0;  // as the classifier saw them (skb->len, L2 header included)
  std::uint64_t packets = 0;
  std::uint64_t drops = 0;  // dropped by thaw's HTB leaf of this class (tc statistics)
};

struct ShapingCounters {
  // [direction][class]; direction 0 = egress (uploads), 1 = ingress (downloads).
  std::array<std::array<ClassCounters, kTrafficClassCount>, 2> classes{};
  std::map<std::uint16_t, std::uint64_t>
      model_bytes;  // registered model id -> bytes, both directions
};

// What start() found about the kernel.
struct ShapingStatus {
  bool running = false;
  bool edt_pacing = false;  // sch_fq exists (pacing by skb->tstamp); false: HTB only
  std::string ifb_device;   // "" when ingress is not shaped
  std::string detail;       // one line: what is attached where, or why shaping is off
};

class TrafficShaper {
 public:
  TrafficShaper();
  ~TrafficShaper();  // stop()
  TrafficShaper(const TrafficShaper&) = delete;
  TrafficShaper& operator=(const TrafficShaper&) = delete;

  // Attaches the classifier and builds the qdiscs. Removes thaw's own stale objects first.
  std::expected<ShapingStatus, ShapingError> start(const ShapingSettings& settings);
  // Changes the HTB rates in place (no packet loss, no re-attach).
  std::expected<void, ShapingError> set_class_rates(
      const std::array<ClassRate, kTrafficClassCount>& classes);
  std::expected<ShapingCounters, ShapingError> counters() const;
  // Packets of class c both ways since start, from the classifier's map alone: cheap enough
  // to sample every few tens of milliseconds (counters() also asks tc for every leaf's drops).
  std::expected<std::uint64_t, ShapingError> class_packets(TrafficClass c) const;
  // Per-model byte counters: the classifier counts bytes of sockets marked with model_id.
  std::expected<void, ShapingError> add_model(std::uint16_t model_id);
  std::expected<void, ShapingError> remove_model(std::uint16_t model_id);
  // Inference recognition, changeable while running.
  std::expected<void, ShapingError> set_port_class(std::uint16_t port, TrafficClass c);
  // The port back to unclassed (its packets fall through to marks and cgroups, or other).
  std::expected<void, ShapingError> clear_port_class(std::uint16_t port);
  std::expected<void, ShapingError> add_inference_cgroup(std::uint64_t cgroup_id);
  // A worker's cgroup that is gone (ids are not reused; the entry would only take a slot).
  std::expected<void, ShapingError> remove_inference_cgroup(std::uint64_t cgroup_id);
  // The cgroup ids the classifier now counts as inference (its map, read back).
  std::expected<std::vector<std::uint64_t>, ShapingError> inference_cgroups() const;
  // Detaches exactly what start() attached. Idempotent.
  void stop();
  ShapingStatus status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace thaw::network
