#include "daemon/network/netlink_tc.hpp"

#include <fmt/format.h>
#include <libmnl/libmnl.h>
#include <linux/gen_stats.h>
#include <linux/if_link.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "bpf/traffic_class.h"

namespace thaw::network {
namespace {

NlError nl_error(int err, const std::string& what) {
  return NlError{err, fmt::format("{}: {}", what, std::strerror(err))};
}

struct Buf {
  alignas(nlmsghdr) char data[32768];  // above MNL_SOCKET_BUFFER_SIZE (a page, 8 kB at most), which
                                       // is not constexpr
};

nlmsghdr* start(Buf& b, std::uint16_t type, std::uint16_t flags, std::uint32_t seq) {
  nlmsghdr* h = mnl_nlmsg_put_header(b.data);
  h->nlmsg_type = type;
  h->nlmsg_flags = NLM_F_REQUEST | flags;
  h->nlmsg_seq = seq;
  return h;
}

tcmsg* put_tcmsg(nlmsghdr* h, int ifindex, std::uint32_t parent, std::uint32_t handle) {
  auto* t = static_cast<tcmsg*>(mnl_nlmsg_put_extra_header(h, sizeof(tcmsg)));
  t->tcm_family = AF_UNSPEC;
  t->tcm_ifindex = ifindex;
  t->tcm_parent = parent;
  t->tcm_handle = handle;
  return t;
}

// libmnl's attribute loops are C macros that assign void* (not C++); these are their twins.
nlattr* attrs_begin(const nlmsghdr* h) {
  return static_cast<nlattr*>(mnl_nlmsg_get_payload_offset(h, sizeof(tcmsg)));
}
bool attr_ok(const nlattr* a, const nlmsghdr* h) {
  return mnl_attr_ok(a, static_cast<int>(static_cast<const char*>(mnl_nlmsg_get_payload_tail(h)) -
                                         reinterpret_cast<const char*>(a)));
}

}  // namespace

std::expected<NetlinkTc, NlError> NetlinkTc::open() {
  mnl_socket* nl = mnl_socket_open(NETLINK_ROUTE);
  if (!nl) return std::unexpected(nl_error(errno, "netlink socket"));
  if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    int e = errno;
    mnl_socket_close(nl);
    return std::unexpected(nl_error(e, "netlink bind"));
  }
  NetlinkTc t(nl);
  t.seq_ = static_cast<std::uint32_t>(time(nullptr));
  return t;
}

NetlinkTc::~NetlinkTc() {
  if (nl_) mnl_socket_close(nl_);
}

std::expected<void, NlError> NetlinkTc::transact(nlmsghdr* req, const std::string& what,
                                                 int (*cb)(const nlmsghdr*, void*), void* data) {
  req->nlmsg_seq = ++seq_;
  // NLM_F_DUMP is two bits, one of which is NLM_F_EXCL: a create is not a dump.
  if ((req->nlmsg_flags & NLM_F_DUMP) != NLM_F_DUMP) req->nlmsg_flags |= NLM_F_ACK;
  if (mnl_socket_sendto(nl_, req, req->nlmsg_len) < 0)
    return std::unexpected(nl_error(errno, what));
  Buf b;
  std::uint32_t portid = mnl_socket_get_portid(nl_);
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(nl_, b.data, sizeof b.data);
    if (n < 0) return std::unexpected(nl_error(errno, what));
    int r = mnl_cb_run(b.data, n, req->nlmsg_seq, portid, cb, data);
    if (r < 0) return std::unexpected(nl_error(errno, what));
    if (r == MNL_CB_STOP) return {};
  }
}

std::expected<void, NlError> NetlinkTc::create_ifb(const std::string& name, std::uint32_t txqlen) {
  Buf b;
  nlmsghdr* h = start(b, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, name.c_str());
  mnl_attr_put_u32(h, IFLA_TXQLEN, txqlen);
  nlattr* info = mnl_attr_nest_start(h, IFLA_LINKINFO);
  mnl_attr_put_strz(h, IFLA_INFO_KIND, "ifb");
  mnl_attr_nest_end(h, info);
  return transact(h, fmt::format("creating IFB device {}", name));
}

std::expected<void, NlError> NetlinkTc::set_link_up(int ifindex) {
  Buf b;
  nlmsghdr* h = start(b, RTM_NEWLINK, 0, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = ifindex;
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  return transact(h, fmt::format("setting ifindex {} up", ifindex));
}

std::expected<void, NlError> NetlinkTc::delete_link(const std::string& name) {
  Buf b;
  nlmsghdr* h = start(b, RTM_DELLINK, 0, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(h, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(h, IFLA_IFNAME, name.c_str());
  auto r = transact(h, fmt::format("deleting device {}", name));
  if (!r && (r.error().err == ENODEV || r.error().err == ENOENT)) return {};
  return r;
}

namespace {
struct QdiscDump {
  int ifindex;
  std::vector<QdiscInfo>* out;
};

int qdisc_cb(const nlmsghdr* h, void* data) {
  auto* d = static_cast<QdiscDump*>(data);
  const auto* t = static_cast<const tcmsg*>(mnl_nlmsg_get_payload(h));
  if (t->tcm_ifindex != d->ifindex) return MNL_CB_OK;
  QdiscInfo q;
  q.handle = t->tcm_handle;
  q.parent = t->tcm_parent;
  for (auto* a = attrs_begin(h); attr_ok(a, h); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) == TCA_KIND) q.kind = mnl_attr_get_str(a);
  }
  d->out->push_back(q);
  return MNL_CB_OK;
}
}  // namespace

std::expected<std::vector<QdiscInfo>, NlError> NetlinkTc::qdiscs(int ifindex) {
  Buf b;
  nlmsghdr* h = start(b, RTM_GETQDISC, NLM_F_DUMP, 0);
  put_tcmsg(h, ifindex, 0, 0);
  std::vector<QdiscInfo> out;
  QdiscDump d{ifindex, &out};
  auto r = transact(h, fmt::format("listing qdiscs of ifindex {}", ifindex), qdisc_cb, &d);
  if (!r) return std::unexpected(r.error());
  return out;
}

std::expected<void, NlError> NetlinkTc::add_htb_root(int ifindex, std::uint32_t major,
                                                     std::uint32_t default_minor) {
  Buf b;
  nlmsghdr* h = start(b, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, 0);
  put_tcmsg(h, ifindex, TC_H_ROOT, major << 16);
  mnl_attr_put_strz(h, TCA_KIND, "htb");
  nlattr* opts = mnl_attr_nest_start(h, TCA_OPTIONS);
  tc_htb_glob g{};
  g.version = 3;  // TC_HTB_PROTOVER
  g.rate2quantum = 10;
  g.defcls = default_minor;
  mnl_attr_put(h, TCA_HTB_INIT, sizeof g, &g);
  mnl_attr_nest_end(h, opts);
  return transact(h, fmt::format("adding HTB root qdisc {:x}: on ifindex {}", major, ifindex));
}

bool NetlinkTc::kernel_has_qdisc(int ifindex, const char* kind) {
  constexpr std::uint32_t kProbeMajor = THAW_HTB_MAJOR + 1;
  Buf b;
  nlmsghdr* h = start(b, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, 0);
  put_tcmsg(h, ifindex, TC_H_ROOT, kProbeMajor << 16);
  mnl_attr_put_strz(h, TCA_KIND, kind);
  bool ok = transact(h, "probing qdisc").has_value();
  if (ok) (void)delete_root_qdisc(ifindex, kProbeMajor);
  return ok;
}

std::expected<void, NlError> NetlinkTc::delete_root_qdisc(int ifindex, std::uint32_t major) {
  Buf b;
  nlmsghdr* h = start(b, RTM_DELQDISC, 0, 0);
  put_tcmsg(h, ifindex, TC_H_ROOT, major << 16);
  auto r = transact(h, fmt::format("deleting root qdisc {:x}: on ifindex {}", major, ifindex));
  // EINVAL: the root qdisc is someone else's (handle differs); ENOENT: none of ours.
  if (!r && (r.error().err == ENOENT || r.error().err == EINVAL || r.error().err == ENODEV))
    return {};
  return r;
}

std::expected<void, NlError> NetlinkTc::set_htb_class(int ifindex, const HtbClassParams& p,
                                                      bool create) {
  Buf b;
  nlmsghdr* h = start(b, RTM_NEWTCLASS, create ? (NLM_F_CREATE | NLM_F_EXCL) : 0, 0);
  put_tcmsg(h, ifindex, p.parent, p.classid);
  mnl_attr_put_strz(h, TCA_KIND, "htb");
  nlattr* opts = mnl_attr_nest_start(h, TCA_OPTIONS);
  tc_htb_opt o{};
  auto clamp32 = [](std::uint64_t v) {
    return v >= 0xffffffffull ? 0xffffffffu : static_cast<std::uint32_t>(v);
  };
  o.rate.rate = clamp32(p.rate);
  o.ceil.rate = clamp32(p.ceil);
  o.rate.mpu = o.ceil.mpu = 0;
  o.buffer = thaw_htb_burst_ticks(p.rate, thaw_htb_burst_bytes(p.rate, p.mtu));
  o.cbuffer = thaw_htb_burst_ticks(p.ceil, thaw_htb_burst_bytes(p.ceil, p.mtu));
  o.quantum = thaw_htb_quantum(p.rate, p.mtu);
  o.prio = p.prio;
  mnl_attr_put(h, TCA_HTB_PARMS, sizeof o, &o);
  // Rates of 4 GB/s and above do not fit tc_ratespec's 32 bits.
  if (p.rate >= 0xffffffffull) mnl_attr_put_u64(h, TCA_HTB_RATE64, p.rate);
  if (p.ceil >= 0xffffffffull) mnl_attr_put_u64(h, TCA_HTB_CEIL64, p.ceil);
  mnl_attr_nest_end(h, opts);
  return transact(
      h, fmt::format("{} HTB class {:x}:{:x} on ifindex {}", create ? "adding" : "changing",
                     p.classid >> 16, p.classid & 0xffff, ifindex));
}

namespace {
struct ClassDump {
  int ifindex;
  std::uint32_t classid;
  std::uint64_t drops;
};

int class_cb(const nlmsghdr* h, void* data) {
  auto* d = static_cast<ClassDump*>(data);
  const auto* t = static_cast<const tcmsg*>(mnl_nlmsg_get_payload(h));
  if (t->tcm_ifindex != d->ifindex || t->tcm_handle != d->classid) return MNL_CB_OK;
  for (auto* a = attrs_begin(h); attr_ok(a, h); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) != TCA_STATS2) continue;
    auto* nest_end =
        static_cast<const char*>(mnl_attr_get_payload(a)) + mnl_attr_get_payload_len(a);
    for (auto* s = static_cast<nlattr*>(mnl_attr_get_payload(a));
         mnl_attr_ok(s, static_cast<int>(nest_end - reinterpret_cast<const char*>(s)));
         s = mnl_attr_next(s)) {
      if (mnl_attr_get_type(s) == TCA_STATS_QUEUE &&
          mnl_attr_get_payload_len(s) >= sizeof(gnet_stats_queue)) {
        gnet_stats_queue q;
        std::memcpy(&q, mnl_attr_get_payload(s), sizeof q);
        d->drops = q.drops;
      }
    }
  }
  return MNL_CB_OK;
}

int count_cb(const nlmsghdr*, void* data) {
  ++*static_cast<std::size_t*>(data);
  return MNL_CB_OK;
}
}  // namespace

std::expected<std::uint64_t, NlError> NetlinkTc::class_drops(int ifindex, std::uint32_t classid) {
  Buf b;
  nlmsghdr* h = start(b, RTM_GETTCLASS, NLM_F_DUMP, 0);
  put_tcmsg(h, ifindex, 0, 0);
  ClassDump d{ifindex, classid, 0};
  auto r = transact(h, fmt::format("listing classes of ifindex {}", ifindex), class_cb, &d);
  if (!r) return std::unexpected(r.error());
  return d.drops;
}

std::expected<std::size_t, NlError> NetlinkTc::filter_count(int ifindex, std::uint32_t parent) {
  Buf b;
  nlmsghdr* h = start(b, RTM_GETTFILTER, NLM_F_DUMP, 0);
  put_tcmsg(h, ifindex, parent, 0);
  std::size_t n = 0;
  auto r = transact(h, fmt::format("listing filters of ifindex {}", ifindex), count_cb, &n);
  if (!r) return std::unexpected(r.error());
  return n;
}

}  // namespace thaw::network
