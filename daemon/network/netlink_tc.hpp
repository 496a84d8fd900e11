// The rtnetlink requests TrafficShaper needs (libmnl): the IFB device, HTB qdiscs and classes,
// the uplink's root qdisc and filter lists, class drop counters. One NETLINK_ROUTE socket per
// object, in the netns of the calling thread. Every failure is a message naming the device
// and the kernel's errno.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <vector>

struct mnl_socket;
struct nlmsghdr;

namespace thaw::network {

struct NlError {
  int err = 0;  // positive errno
  std::string message;
};

struct QdiscInfo {
  std::string kind;
  std::uint32_t handle = 0;
  std::uint32_t parent = 0;
};

struct HtbClassParams {
  std::uint32_t classid = 0;
  std::uint32_t parent = 0;
  std::uint64_t rate = 0;  // bytes/s
  std::uint64_t ceil = 0;
  std::uint32_t prio = 0;
  std::uint32_t mtu = 1514;
};

class NetlinkTc {
 public:
  static std::expected<NetlinkTc, NlError> open();
  NetlinkTc(NetlinkTc&& o) noexcept : nl_(o.nl_), seq_(o.seq_) { o.nl_ = nullptr; }
  NetlinkTc& operator=(NetlinkTc&&) = delete;
  NetlinkTc(const NetlinkTc&) = delete;
  ~NetlinkTc();

  std::expected<void, NlError> create_ifb(const std::string& name, std::uint32_t txqlen);
  std::expected<void, NlError> set_link_up(int ifindex);
  // ENODEV when absent is success: deleting is how thaw removes its own leftovers.
  std::expected<void, NlError> delete_link(const std::string& name);

  std::expected<std::vector<QdiscInfo>, NlError> qdiscs(int ifindex);
  // HTB as the root qdisc with handle major:0, unclassified packets to default_minor.
  std::expected<void, NlError> add_htb_root(int ifindex, std::uint32_t major,
                                            std::uint32_t default_minor);
  // Deletes the root qdisc only if its handle is major:0 (the kernel checks); absent is success.
  std::expected<void, NlError> delete_root_qdisc(int ifindex, std::uint32_t major);
  // Creates the class or changes it in place.
  std::expected<void, NlError> set_htb_class(int ifindex, const HtbClassParams& p, bool create);
  // Drops of a class's leaf (tc's "dropped"); 0 when the class is not there.
  std::expected<std::uint64_t, NlError> class_drops(int ifindex, std::uint32_t classid);
  // Whether the kernel knows qdisc `kind`: tries it as the root of ifindex (thaw's own IFB,
  // before anything else is there) and removes it again.
  bool kernel_has_qdisc(int ifindex, const char* kind);
  // Number of filters under a clsact hook (parent = TC_H_MAKE(TC_H_CLSACT,
  // TC_H_MIN_INGRESS/EGRESS)).
  std::expected<std::size_t, NlError> filter_count(int ifindex, std::uint32_t parent);

 private:
  explicit NetlinkTc(struct mnl_socket* nl) : nl_(nl) {}
  // Sends one request and reads replies until the ACK (or the dump's end); cb sees each
  // message of a dump.
  std::expected<void, NlError> transact(struct nlmsghdr* req, const std::string& what,
                                        int (*cb)(const struct nlmsghdr*, void*) = nullptr,
                                        void* data = nullptr);
  struct mnl_socket* nl_ = nullptr;
  std::uint32_t seq_ = 1;
};

}  // namespace thaw::network
