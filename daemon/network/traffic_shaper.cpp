#include "daemon/network/traffic_shaper.hpp"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/capability.h>
#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <net/if.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "bpf/thaw_tc.skel.h"
#include "daemon/network/netlink_tc.hpp"

namespace thaw::network {
namespace {

constexpr std::uint32_t kIfbTxQueueLen = 256;  // see start()
constexpr int kCapPerfmon = 38;                // CAP_PERFMON (5.8)
constexpr int kCapBpf = 39;  // CAP_BPF (5.8); Debian 12's uapi header has it, older ones not

ShapingError err(ShapingErrc c, std::string m) {
  return ShapingError{c, std::move(m)};
}

// The capabilities the classifier needs, each for one reason:
//   CAP_BPF        load the program and create its maps
//   CAP_NET_ADMIN  attach to clsact, create qdiscs/classes and the IFB device, bpf_redirect
//   CAP_PERFMON    (or CAP_SYS_ADMIN) the verifier accepts the classifier's packet-pointer
//                  arithmetic only from a program loader it trusts with pointer values
std::string missing_capabilities() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) return "capget failed";
  auto has = [&](int cap) { return (data[cap / 32].effective >> (cap % 32)) & 1u; };
  std::string missing;
  if (!has(kCapBpf)) missing += "CAP_BPF ";
  if (!has(CAP_NET_ADMIN)) missing += "CAP_NET_ADMIN ";
  if (!has(kCapPerfmon) && !has(CAP_SYS_ADMIN)) missing += "CAP_PERFMON ";
  if (!missing.empty()) missing.pop_back();
  return missing;
}

std::uint32_t clsact_parent(bool ingress) {
  return TC_H_MAKE(TC_H_CLSACT, ingress ? TC_H_MIN_INGRESS : TC_H_MIN_EGRESS);
}

// Where thawd notes that it created the uplink's clsact qdisc, so that a start after a crash
// can remove an empty clsact it left behind but never one someone else made. Keyed by netns
// inode and ifindex (tests run thawd in several network namespaces).
std::string clsact_marker(int ifindex) {
  struct stat st {};
  ::stat("/proc/self/ns/net", &st);
  const char* dir = std::getenv("THAW_NETWORK_STATE_DIR");
  return fmt::format("{}/clsact-{}-{}", dir ? dir : "/run/thaw/network", st.st_ino, ifindex);
}

}  // namespace

const char* traffic_class_name(TrafficClass c) {
  switch (c) {
    case TrafficClass::inference:
      return "inference";
    case TrafficClass::critical_fetch:
      return "critical_fetch";
    case TrafficClass::background_fetch:
      return "background_fetch";
    case TrafficClass::other:
      return "other";
  }
  return "unknown";
}

ShapingSettings default_shaping_settings(std::string uplink, std::uint64_t link) {
  ShapingSettings s;
  s.enabled = true;
  s.uplink = std::move(uplink);
  s.link_bytes_per_s = link;
  const std::uint64_t pct[kTrafficClassCount] = {40, 40, 5, 15};
  for (std::size_t i = 0; i < kTrafficClassCount; ++i)
    s.classes[i] = ClassRate{link * pct[i] / 100, link};
  return s;
}

struct TrafficShaper::Impl {
  ShapingSettings settings;
  ShapingStatus status;
  thaw_tc* skel = nullptr;
  int ifindex = 0;
  int ifb_ifindex = 0;
  bool attached[2] = {false, false};  // egress, ingress
  bool created_clsact = false;

  ~Impl() {
    if (skel) thaw_tc__destroy(skel);
  }
};

TrafficShaper::TrafficShaper() : impl_(std::make_unique<Impl>()) {}
TrafficShaper::~TrafficShaper() {
  stop();
}

namespace {

std::string ifb_name(int ifindex) {
  return fmt::format("thifb{}", ifindex);
}

// Asking libbpf to detach from, or create, a clsact that is absent / present makes the
// kernel answer with an error libbpf prints; looking first keeps thawd's log clean.
bool has_clsact(NetlinkTc& nl, int ifindex) {
  auto qd = nl.qdiscs(ifindex);
  if (!qd) return false;
  for (const auto& q : *qd)
    if (q.kind == "clsact") return true;
  return false;
}

// Removes what a thawd that died left on this uplink: our filters, our HTB roots, our IFB
// and (when our marker says we made it and it is empty) the clsact qdisc.
void remove_own(NetlinkTc& nl, int ifindex) {
  for (bool ingress : {false, true}) {
    if (!has_clsact(nl, ifindex)) break;
    bpf_tc_hook hook{};
    hook.sz = sizeof hook;
    hook.ifindex = ifindex;
    hook.attach_point = ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
    bpf_tc_opts opts{};
    opts.sz = sizeof opts;
    opts.handle = THAW_TC_HANDLE;
    opts.priority = THAW_TC_PRIORITY;
    bpf_tc_detach(&hook, &opts);  // ENOENT when there is none: fine
  }
  (void)nl.delete_root_qdisc(ifindex, THAW_HTB_MAJOR);
  (void)nl.delete_link(ifb_name(ifindex));
  std::string marker = clsact_marker(ifindex);
  if (std::filesystem::exists(marker)) {
    auto in = nl.filter_count(ifindex, clsact_parent(true));
    auto out = nl.filter_count(ifindex, clsact_parent(false));
    if (in && out && *in == 0 && *out == 0) {
      bpf_tc_hook hook{};
      hook.sz = sizeof hook;
      hook.ifindex = ifindex;
      hook.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);
      bpf_tc_hook_destroy(&hook);
    }
    std::error_code ec;
    std::filesystem::remove(marker, ec);
  }
}

std::expected<void, ShapingError> build_htb(NetlinkTc& nl, int ifindex, const ShapingSettings& s,
                                            bool create) {
  const std::uint32_t major = THAW_HTB_MAJOR << 16;
  if (create) {
    auto r = nl.add_htb_root(ifindex, THAW_HTB_MAJOR, thaw_htb_leaf_minor(THAW_CLASS_OTHER));
    if (!r) return std::unexpected(err(ShapingErrc::netlink, r.error().message));
  }
  HtbClassParams root{major | THAW_HTB_ROOT_MINOR, major, s.link_bytes_per_s,
                      s.link_bytes_per_s,          0,     s.mtu};
  if (auto r = nl.set_htb_class(ifindex, root, create); !r)
    return std::unexpected(err(ShapingErrc::netlink, r.error().message));
  for (std::uint32_t c = 0; c < kTrafficClassCount; ++c) {
    HtbClassParams leaf{major | thaw_htb_leaf_minor(c),
                        major | THAW_HTB_ROOT_MINOR,
                        s.classes[c].rate_bytes_per_s,
                        s.classes[c].ceil_bytes_per_s,
                        thaw_htb_prio(c),
                        s.mtu};
    if (auto r = nl.set_htb_class(ifindex, leaf, create); !r)
      return std::unexpected(err(ShapingErrc::netlink, r.error().message));
    if (!thaw_class_has_slots(c)) continue;
    for (std::uint32_t slot = 0; slot < THAW_FETCH_SLOTS; ++slot) {
      HtbClassParams sub = leaf;
      sub.parent = leaf.classid;
      sub.classid = major | thaw_htb_slot_minor(c, slot);
      sub.rate = std::max<std::uint64_t>(leaf.rate / THAW_FETCH_SLOTS, 1);
      if (auto r = nl.set_htb_class(ifindex, sub, create); !r)
        return std::unexpected(err(ShapingErrc::netlink, r.error().message));
    }
  }
  return {};
}

std::expected<void, ShapingError> check_rates(ShapingSettings& s) {
  thaw_class_rate r[kTrafficClassCount];
  for (std::size_t i = 0; i < kTrafficClassCount; ++i) {
    if (s.classes[i].ceil_bytes_per_s == 0) s.classes[i].ceil_bytes_per_s = s.link_bytes_per_s;
    r[i] = {s.classes[i].rate_bytes_per_s, s.classes[i].ceil_bytes_per_s};
  }
  static const char* why[] = {"",
                              "the link rate is 0",
                              "a class has rate 0 (HTB needs every class above 0)",
                              "a class's guaranteed rate is above its ceil",
                              "a class's ceil is above the link rate",
                              "the guaranteed rates add up to more than the link rate"};
  int rc = thaw_rates_check(s.link_bytes_per_s, r, kTrafficClassCount);
  if (rc != 0)
    return std::unexpected(err(ShapingErrc::invalid_settings,
                               fmt::format("traffic shaping on {}: {} (link {} bytes/s)", s.uplink,
                                           why[rc], s.link_bytes_per_s)));
  return {};
}

std::expected<void, ShapingError> attach(NetlinkTc& nl, thaw_tc* skel, int ifindex, bool ingress,
                                         bool& created_clsact) {
  bpf_tc_hook hook{};
  hook.sz = sizeof hook;
  hook.ifindex = ifindex;
  hook.attach_point = ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS;
  int rc = has_clsact(nl, ifindex) ? -EEXIST : bpf_tc_hook_create(&hook);
  if (rc == 0)
    created_clsact = true;
  else if (rc != -EEXIST)
    return std::unexpected(err(ShapingErrc::bpf, fmt::format("creating clsact on ifindex {}: {}",
                                                             ifindex, std::strerror(-rc))));
  bpf_tc_opts opts{};
  opts.sz = sizeof opts;
  opts.handle = THAW_TC_HANDLE;
  opts.priority = THAW_TC_PRIORITY;
  opts.flags = BPF_TC_F_REPLACE;
  opts.prog_fd = bpf_program__fd(ingress ? skel->progs.thaw_ingress : skel->progs.thaw_egress);
  rc = bpf_tc_attach(&hook, &opts);
  if (rc != 0)
    return std::unexpected(
        err(ShapingErrc::bpf,
            fmt::format("attaching thaw's {} classifier to ifindex {}: {}",
                        ingress ? "ingress" : "egress", ifindex, std::strerror(-rc))));
  return {};
}

}  // namespace

std::expected<ShapingStatus, ShapingError> TrafficShaper::start(const ShapingSettings& in) {
  stop();
  Impl& m = *impl_;
  m = Impl{};
  if (!in.enabled) {
    m.status.detail = "traffic shaping is off (settings)";
    return std::unexpected(err(ShapingErrc::disabled, m.status.detail));
  }
  if (auto missing = missing_capabilities(); !missing.empty()) {
    m.status.detail = fmt::format(
        "traffic shaping is off: thawd lacks {} (the unit grants CAP_BPF, CAP_NET_ADMIN and "
        "CAP_PERFMON)",
        missing);
    return std::unexpected(err(ShapingErrc::no_permission, m.status.detail));
  }
  ShapingSettings s = in;
  if (auto r = check_rates(s); !r) return std::unexpected(r.error());
  int ifindex = static_cast<int>(if_nametoindex(s.uplink.c_str()));
  if (ifindex == 0)
    return std::unexpected(err(ShapingErrc::invalid_settings,
                               fmt::format("traffic shaping: no network device '{}' (uplink "
                                           "in thawd.toml [network])",
                                           s.uplink)));
  auto nl = NetlinkTc::open();
  if (!nl) return std::unexpected(err(ShapingErrc::netlink, nl.error().message));
  remove_own(*nl, ifindex);

  // The uplink's root qdisc: replacing a default one (handle 0: mq, fq_codel, pfifo_fast,
  // noqueue) loses nothing; replacing one an administrator configured would.
  auto qd = nl->qdiscs(ifindex);
  if (!qd) return std::unexpected(err(ShapingErrc::netlink, qd.error().message));
  for (const auto& q : *qd)
    if (q.parent == TC_H_ROOT && q.handle != 0)
      return std::unexpected(
          err(ShapingErrc::invalid_settings,
              fmt::format("traffic shaping on {}: its root qdisc is a '{}' with handle {:x}: that "
                          "someone configured; thawd does not replace it (remove it or turn "
                          "shaping off)",
                          s.uplink, q.kind, q.handle >> 16)));

  m.settings = s;
  m.ifindex = ifindex;
  auto fail = [&](ShapingError e) -> std::expected<ShapingStatus, ShapingError> {
    stop();
    return std::unexpected(std::move(e));
  };

  // sch_fq would allow EDT pacing (skb->tstamp); it is probed on the IFB before HTB goes
  // there. This build shapes with HTB either way (see bpf/README.md): status says which.
  bool fq_present = false;

  if (s.shape_ingress) {
    std::string name = ifb_name(ifindex);
    // The IFB's txqueuelen is also the pfifo limit of its HTB leaves. 32 (the IFB default)
    // let a fetch's TCP drain its slot between losses, and HTB can only share what is
    // queued: two models' fetches split 43/57. 256 keeps every slot backlogged (50/50
    // measured). Inference skips the IFB, so this queue never delays it.
    if (auto r = nl->create_ifb(name, kIfbTxQueueLen); !r)
      return fail(err(ShapingErrc::netlink, r.error().message));
    m.ifb_ifindex = static_cast<int>(if_nametoindex(name.c_str()));
    if (m.ifb_ifindex == 0) return fail(err(ShapingErrc::netlink, name + " vanished"));
    if (auto r = nl->set_link_up(m.ifb_ifindex); !r)
      return fail(err(ShapingErrc::netlink, r.error().message));
    fq_present = nl->kernel_has_qdisc(m.ifb_ifindex, "fq");
    if (auto r = build_htb(*nl, m.ifb_ifindex, s, true); !r) return fail(r.error());
    m.status.ifb_device = name;
  }
  if (auto r = build_htb(*nl, ifindex, s, true); !r) return fail(r.error());

  m.skel = thaw_tc__open();
  if (!m.skel)
    return fail(
        err(ShapingErrc::bpf, fmt::format("opening the BPF object: {}", std::strerror(errno))));
  m.skel->rodata->ifb_ifindex = static_cast<__u32>(m.ifb_ifindex);
  if (int rc = thaw_tc__load(m.skel); rc != 0)
    return fail(err(ShapingErrc::bpf, fmt::format("loading the BPF classifier: {} (the kernel "
                                                  "verifier's log is on stderr)",
                                                  std::strerror(-rc))));
  for (auto port : s.inference_ports)
    if (auto r = set_port_class(port, TrafficClass::inference); !r) return fail(r.error());
  for (auto cg : s.inference_cgroups)
    if (auto r = add_inference_cgroup(cg); !r) return fail(r.error());

  bool created = false;
  if (auto r = attach(*nl, m.skel, ifindex, false, created); !r) return fail(r.error());
  m.attached[0] = true;
  if (s.shape_ingress) {
    if (auto r = attach(*nl, m.skel, ifindex, true, created); !r) return fail(r.error());
    m.attached[1] = true;
  }
  if (created) {
    m.created_clsact = true;
    std::string marker = clsact_marker(ifindex);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(marker).parent_path(), ec);
    std::ofstream(marker) << "thawd created this uplink's clsact qdisc\n";
  }
  m.status.running = true;
  m.status.edt_pacing = false;  // not implemented: HTB paces every class
  m.status.detail = fmt::format(
      "shaping {} at {} bytes/s: egress HTB {:x}:, ingress {}; sch_fq {} (EDT pacing not "
      "implemented, HTB used)",
      s.uplink, s.link_bytes_per_s, THAW_HTB_MAJOR,
      s.shape_ingress ? "via " + m.status.ifb_device : "not shaped",
      !s.shape_ingress ? "not probed"
      : fq_present     ? "present"
                       : "absent in this kernel");
  return m.status;
}

void TrafficShaper::stop() {
  Impl& m = *impl_;
  if (m.ifindex == 0) return;
  auto nl = NetlinkTc::open();
  for (int i = 0; i < 2; ++i) {
    if (!m.attached[i]) continue;
    bpf_tc_hook hook{};
    hook.sz = sizeof hook;
    hook.ifindex = m.ifindex;
    hook.attach_point = i == 1 ? BPF_TC_INGRESS : BPF_TC_EGRESS;
    bpf_tc_opts opts{};
    opts.sz = sizeof opts;
    opts.handle = THAW_TC_HANDLE;
    opts.priority = THAW_TC_PRIORITY;
    bpf_tc_detach(&hook, &opts);
    m.attached[i] = false;
  }
  if (nl) {
    (void)nl->delete_root_qdisc(m.ifindex, THAW_HTB_MAJOR);
    if (m.ifb_ifindex) (void)nl->delete_link(ifb_name(m.ifindex));
    std::string marker = clsact_marker(m.ifindex);
    if (m.created_clsact || std::filesystem::exists(marker)) {
      // Remove the clsact qdisc we made only when no one else's filter has joined ours.
      auto in = nl->filter_count(m.ifindex, clsact_parent(true));
      auto out = nl->filter_count(m.ifindex, clsact_parent(false));
      if (in && out && *in == 0 && *out == 0) {
        bpf_tc_hook hook{};
        hook.sz = sizeof hook;
        hook.ifindex = m.ifindex;
        hook.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);
        bpf_tc_hook_destroy(&hook);
      }
      std::error_code ec;
      std::filesystem::remove(marker, ec);
    }
  }
  if (m.skel) thaw_tc__destroy(m.skel);
  m.skel = nullptr;
  m.ifindex = m.ifb_ifindex = 0;
  m.created_clsact = false;
  m.status.running = false;
}

ShapingStatus TrafficShaper::status() const {
  return impl_->status;
}

std::expected<void, ShapingError> TrafficShaper::set_class_rates(
    const std::array<ClassRate, kTrafficClassCount>& classes) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  ShapingSettings s = m.settings;
  s.classes = classes;
  if (auto r = check_rates(s); !r) return std::unexpected(r.error());
  auto nl = NetlinkTc::open();
  if (!nl) return std::unexpected(err(ShapingErrc::netlink, nl.error().message));
  if (auto r = build_htb(*nl, m.ifindex, s, false); !r) return r;
  if (m.ifb_ifindex)
    if (auto r = build_htb(*nl, m.ifb_ifindex, s, false); !r) return r;
  m.settings = s;
  return {};
}

std::expected<std::uint64_t, ShapingError> TrafficShaper::class_packets(TrafficClass c) const {
  const Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return std::unexpected(err(ShapingErrc::bpf, "cannot count possible CPUs"));
  std::vector<thaw_class_counters> per(ncpu);
  int fd = bpf_map__fd(m.skel->maps.class_stats);
  std::uint64_t packets = 0;
  for (std::uint32_t d = 0; d < THAW_DIR_COUNT; ++d) {
    std::uint32_t key = thaw_stats_index(d, static_cast<std::uint32_t>(c));
    if (bpf_map_lookup_elem(fd, &key, per.data()) != 0)
      return std::unexpected(
          err(ShapingErrc::bpf, fmt::format("reading class counters: {}", std::strerror(errno))));
    for (const auto& p : per) packets += p.packets;
  }
  return packets;
}

std::expected<ShapingCounters, ShapingError> TrafficShaper::counters() const {
  const Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  ShapingCounters out;
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return std::unexpected(err(ShapingErrc::bpf, "cannot count possible CPUs"));
  std::vector<thaw_class_counters> per(ncpu);
  int fd = bpf_map__fd(m.skel->maps.class_stats);
  for (std::uint32_t d = 0; d < THAW_DIR_COUNT; ++d)
    for (std::uint32_t c = 0; c < kTrafficClassCount; ++c) {
      std::uint32_t key = thaw_stats_index(d, c);
      if (bpf_map_lookup_elem(fd, &key, per.data()) != 0)
        return std::unexpected(
            err(ShapingErrc::bpf, fmt::format("reading class counters: {}", std::strerror(errno))));
      for (const auto& p : per) {
        out.classes[d][c].bytes += p.bytes;
        out.classes[d][c].packets += p.packets;
      }
    }
  auto nl = NetlinkTc::open();
  if (nl) {
    for (std::uint32_t c = 0; c < kTrafficClassCount; ++c) {
      // Drops happen in leaves: the class's own, or its model slots'.
      std::vector<std::uint32_t> leaves;
      if (thaw_class_has_slots(c))
        for (std::uint32_t slot = 0; slot < THAW_FETCH_SLOTS; ++slot)
          leaves.push_back((THAW_HTB_MAJOR << 16) | thaw_htb_slot_minor(c, slot));
      else
        leaves.push_back((THAW_HTB_MAJOR << 16) | thaw_htb_leaf_minor(c));
      for (std::uint32_t id : leaves) {
        if (auto dr = nl->class_drops(m.ifindex, id)) out.classes[THAW_DIR_EGRESS][c].drops += *dr;
        if (m.ifb_ifindex)
          if (auto dr = nl->class_drops(m.ifb_ifindex, id))
            out.classes[THAW_DIR_INGRESS][c].drops += *dr;
      }
    }
  }
  int mfd = bpf_map__fd(m.skel->maps.model_bytes);
  std::vector<std::uint64_t> bytes(ncpu);
  std::uint32_t key = 0, next = 0;
  std::uint32_t* prev = nullptr;
  while (bpf_map_get_next_key(mfd, prev, &next) == 0) {
    if (bpf_map_lookup_elem(mfd, &next, bytes.data()) == 0) {
      std::uint64_t sum = 0;
      for (auto b : bytes) sum += b;
      out.model_bytes[static_cast<std::uint16_t>(next)] = sum;
    }
    key = next;
    prev = &key;
  }
  return out;
}

std::expected<void, ShapingError> TrafficShaper::add_model(std::uint16_t model_id) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  int ncpu = libbpf_num_possible_cpus();
  std::vector<std::uint64_t> zero(ncpu > 0 ? ncpu : 1, 0);
  std::uint32_t key = model_id;
  if (bpf_map_update_elem(bpf_map__fd(m.skel->maps.model_bytes), &key, zero.data(), BPF_NOEXIST) !=
          0 &&
      errno != EEXIST)
    return std::unexpected(err(
        ShapingErrc::bpf, fmt::format("registering model {}: {}", model_id, std::strerror(errno))));
  return {};
}

std::expected<void, ShapingError> TrafficShaper::remove_model(std::uint16_t model_id) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  std::uint32_t key = model_id;
  bpf_map_delete_elem(bpf_map__fd(m.skel->maps.model_bytes), &key);
  return {};
}

std::expected<void, ShapingError> TrafficShaper::set_port_class(std::uint16_t port,
                                                                TrafficClass c) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  std::uint32_t v = static_cast<std::uint32_t>(c);
  if (bpf_map_update_elem(bpf_map__fd(m.skel->maps.port_class), &port, &v, BPF_ANY) != 0)
    return std::unexpected(err(
        ShapingErrc::bpf, fmt::format("setting port {}'s class: {}", port, std::strerror(errno))));
  return {};
}

std::expected<void, ShapingError> TrafficShaper::add_inference_cgroup(std::uint64_t cgroup_id) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  std::uint32_t v = THAW_CLASS_INFERENCE;
  if (bpf_map_update_elem(bpf_map__fd(m.skel->maps.cgroup_class), &cgroup_id, &v, BPF_ANY) != 0)
    return std::unexpected(err(
        ShapingErrc::bpf, fmt::format("adding cgroup {}: {}", cgroup_id, std::strerror(errno))));
  return {};
}

std::expected<void, ShapingError> TrafficShaper::clear_port_class(std::uint16_t port) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  if (bpf_map_delete_elem(bpf_map__fd(m.skel->maps.port_class), &port) != 0 && errno != ENOENT)
    return std::unexpected(err(
        ShapingErrc::bpf, fmt::format("clearing port {}'s class: {}", port, std::strerror(errno))));
  return {};
}

std::expected<void, ShapingError> TrafficShaper::remove_inference_cgroup(std::uint64_t cgroup_id) {
  Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  if (bpf_map_delete_elem(bpf_map__fd(m.skel->maps.cgroup_class), &cgroup_id) != 0 &&
      errno != ENOENT)
    return std::unexpected(err(
        ShapingErrc::bpf, fmt::format("removing cgroup {}: {}", cgroup_id, std::strerror(errno))));
  return {};
}

std::expected<std::vector<std::uint64_t>, ShapingError> TrafficShaper::inference_cgroups() const {
  const Impl& m = *impl_;
  if (!m.skel)
    return std::unexpected(err(ShapingErrc::not_running, "traffic shaping is not running"));
  const int fd = bpf_map__fd(m.skel->maps.cgroup_class);
  std::vector<std::uint64_t> out;
  std::uint64_t key = 0, next = 0;
  for (const std::uint64_t* prev = nullptr; bpf_map_get_next_key(fd, prev, &next) == 0;
       prev = &key) {
    key = next;
    std::uint32_t c = 0;
    if (bpf_map_lookup_elem(fd, &key, &c) == 0 && c == THAW_CLASS_INFERENCE) out.push_back(key);
  }
  return out;
}

}  // namespace thaw::network
