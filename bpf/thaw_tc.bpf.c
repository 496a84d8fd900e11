// thaw's tc classifier (clsact, direct action) on a node's uplink: puts each packet in a
// traffic class, writes the class's HTB leaf into skb->priority, counts bytes per class and
// per model, and on ingress redirects the packet to thaw's IFB device, whose HTB shapes
// downloads. It never drops or changes a packet's contents.
//
// How a packet's class is found, first match wins:
//   egress:  thaw's socket mark (SO_MARK, set by the store on fetch sockets; the kernel copies
//            it into skb->mark) -> the cgroup v2 id of the sending socket in inference_cgroups
//            -> the local (source) port in port_class -> other
//   ingress: the mark of the local socket the packet is for (bpf_sk_lookup_tcp/udp) -> the
//            local (destination) port in port_class -> other
// Built against the kernel's uapi headers (linux-libc-dev) and libbpf's bpf_helpers.h, no
// vmlinux.h: it reads only __sk_buff fields and packet bytes, which are stable ABI.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "traffic_class.h"

char LICENSE[] SEC("license") = "GPL";

// Set by the loader before load: the IFB device downloads go to (0: ingress not shaped).
const volatile __u32 ifb_ifindex = 0;

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, THAW_DIR_COUNT* THAW_CLASS_COUNT);
  __type(key, __u32);
  __type(value, struct thaw_class_counters);
} class_stats SEC(".maps");

// Registered model ids (from the socket mark) -> bytes; user space adds the keys, so the
// classifier never grows the map.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, THAW_MAX_MODELS);
  __type(key, __u32);
  __type(value, __u64);
} model_bytes SEC(".maps");

// Local port (host order) -> class: the engine's and the gateway's listening ports.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, THAW_MAX_PORTS);
  __type(key, __u16);
  __type(value, __u32);
} port_class SEC(".maps");

// cgroup v2 id -> class, for engine and gateway units (systemd transient units).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, THAW_MAX_CGROUPS);
  __type(key, __u64);
  __type(value, __u32);
} cgroup_class SEC(".maps");

struct flow {
  __u16 local_port;  // host order; 0 when not TCP/UDP
  int found;
  struct bpf_sock_tuple tuple;  // as seen from the remote side (for socket lookup)
  int is_v6;
  int is_tcp;
};

// Parses Ethernet + IPv4/IPv6 + TCP/UDP ports. IPv6 extension headers are not walked: such
// packets fall through to mark/cgroup matching (egress) or to other (ingress).
static __always_inline int parse_flow(struct __sk_buff* skb, int ingress, struct flow* f) {
  void* data = (void*)(long)skb->data;
  void* end = (void*)(long)skb->data_end;
  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > end) return 0;
  __u8 proto;
  void* l4;
  if (eth->h_proto == bpf_htons(ETH_P_IP)) {
    struct iphdr* ip = (void*)(eth + 1);
    if ((void*)(ip + 1) > end) return 0;
    if (ip->ihl < 5) return 0;
    proto = ip->protocol;
    l4 = (void*)ip + ip->ihl * 4;
    f->tuple.ipv4.saddr = ip->saddr;
    f->tuple.ipv4.daddr = ip->daddr;
  } else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
    struct ipv6hdr* ip6 = (void*)(eth + 1);
    if ((void*)(ip6 + 1) > end) return 0;
    proto = ip6->nexthdr;
    l4 = ip6 + 1;
    __builtin_memcpy(f->tuple.ipv6.saddr, &ip6->saddr, 16);
    __builtin_memcpy(f->tuple.ipv6.daddr, &ip6->daddr, 16);
    f->is_v6 = 1;
  } else {
    return 0;
  }
  if (proto != IPPROTO_TCP && proto != IPPROTO_UDP) return 0;
  // Both headers start with source and destination port.
  struct udphdr* ports = l4;
  if ((void*)(ports + 1) > end) return 0;
  f->is_tcp = proto == IPPROTO_TCP;
  if (f->is_v6) {
    f->tuple.ipv6.sport = ports->source;
    f->tuple.ipv6.dport = ports->dest;
  } else {
    f->tuple.ipv4.sport = ports->source;
    f->tuple.ipv4.dport = ports->dest;
  }
  f->local_port = bpf_ntohs(ingress ? ports->dest : ports->source);
  f->found = 1;
  return 1;
}

static __always_inline int class_of_mark(__u32 mark, __u32* model) {
  int c = thaw_mark_class(mark);
  if (c >= 0) *model = thaw_mark_model(mark);
  return c;
}

static __always_inline int class_of_cgroup(__u64 id) {
  if (id == 0) return -1;
  __u32* c = bpf_map_lookup_elem(&cgroup_class, &id);
  return c && *c < THAW_CLASS_COUNT ? (int)*c : -1;
}

static __always_inline int class_of_port(const struct flow* f) {
  if (!f->found) return -1;
  __u16 port = f->local_port;
  __u32* c = bpf_map_lookup_elem(&port_class, &port);
  return c && *c < THAW_CLASS_COUNT ? (int)*c : -1;
}

// Ingress: the packet has no socket yet; find the local socket it is for and use its mark, so
// downloads are classed by the same SO_MARK as the fetch socket's uploads.
static __always_inline int class_of_local_socket(struct __sk_buff* skb, struct flow* f,
                                                 __u32* model) {
  if (!f->found) return -1;
  __u32 size = f->is_v6 ? sizeof(f->tuple.ipv6) : sizeof(f->tuple.ipv4);
  struct bpf_sock* sk;
  if (f->is_tcp)
    sk = bpf_sk_lookup_tcp(skb, &f->tuple, size, BPF_F_CURRENT_NETNS, 0);
  else
    sk = bpf_sk_lookup_udp(skb, &f->tuple, size, BPF_F_CURRENT_NETNS, 0);
  if (!sk) return -1;
  // Only the mark: tc programs may not call bpf_sk_cgroup_id, so inbound engine traffic is
  // recognised by its local port.
  int c = class_of_mark(sk->mark, model);
  bpf_sk_release(sk);
  return c;
}

static __always_inline void count(struct __sk_buff* skb, __u32 dir, __u32 cls, __u32 model) {
  __u32 idx = thaw_stats_index(dir, cls);
  struct thaw_class_counters* s = bpf_map_lookup_elem(&class_stats, &idx);
  if (s) {
    s->bytes += skb->len;
    s->packets += 1;
  }
  if (model) {
    __u64* b = bpf_map_lookup_elem(&model_bytes, &model);
    if (b) *b += skb->len;
  }
}

SEC("tc")
int thaw_egress(struct __sk_buff* skb) {
  struct flow f = {};
  __u32 model = 0;
  int c = class_of_mark(skb->mark, &model);
  if (c < 0) c = class_of_cgroup(bpf_skb_cgroup_id(skb));
  if (c < 0) {
    parse_flow(skb, 0, &f);
    c = class_of_port(&f);
  }
  if (c < 0) c = THAW_CLASS_OTHER;
  skb->priority = thaw_skb_priority_model(c, model);
  count(skb, THAW_DIR_EGRESS, c, model);
  return TC_ACT_OK;
}

SEC("tc")
int thaw_ingress(struct __sk_buff* skb) {
  struct flow f = {};
  __u32 model = 0;
  parse_flow(skb, 1, &f);
  int c = class_of_local_socket(skb, &f, &model);
  if (c < 0) c = class_of_port(&f);
  if (c < 0) c = THAW_CLASS_OTHER;
  skb->priority = thaw_skb_priority_model(c, model);
  count(skb, THAW_DIR_INGRESS, c, model);
  // Inference skips the IFB: it is the class HTB would serve first anyway, and the IFB's
  // extra hop (a tasklet that re-injects each packet) costs its round trips the most when the
  // CPU is busy. Its bytes still count against the link: keep the shaped link rate below the
  // real one by more than the inference traffic's rate.
  if (ifb_ifindex && c != THAW_CLASS_INFERENCE) return bpf_redirect(ifb_ifindex, 0);
  return TC_ACT_OK;
}
