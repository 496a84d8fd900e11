/* thaw's traffic classes: ids, socket-mark layout, skb->priority mapping and the rate
 * arithmetic. One header, compiled into the BPF objects (clang -target bpf, C) and into
 * thawd and its unit tests (C++), so the classifier and the qdiscs thawd builds cannot
 * disagree about what a class or a mark means. Plain C, no libc: only fixed-width types
 * (from <linux/types.h> in BPF, <stdint.h> elsewhere), everything static inline. */
#ifndef THAW_BPF_TRAFFIC_CLASS_H
#define THAW_BPF_TRAFFIC_CLASS_H

#ifdef __bpf__
#include <linux/types.h>
typedef __u8 thaw_u8;
typedef __u16 thaw_u16;
typedef __u32 thaw_u32;
typedef __u64 thaw_u64;
#else
#include <stdint.h>
typedef uint8_t thaw_u8;
typedef uint16_t thaw_u16;
typedef uint32_t thaw_u32;
typedef uint64_t thaw_u64;
#endif

/* Class ids, in priority order (0 is served first when HTB lends spare bandwidth). */
enum thaw_traffic_class {
  THAW_CLASS_INFERENCE = 0,        /* engine and gateway traffic: requests, responses */
  THAW_CLASS_CRITICAL_FETCH = 1,   /* model bytes a cold start is waiting for */
  THAW_CLASS_BACKGROUND_FETCH = 2, /* prefetch, consolidation, anything that can wait */
  THAW_CLASS_OTHER = 3,            /* everything thaw does not recognise */
  THAW_CLASS_COUNT = 4,
};

/* Directions the classifier sees: egress of the uplink, and ingress (downloads), which is
 * redirected to an IFB device so it can be shaped by a real queue (see bpf/README.md). */
enum thaw_direction {
  THAW_DIR_EGRESS = 0,
  THAW_DIR_INGRESS = 1,
  THAW_DIR_COUNT = 2,
};

/* Socket marks (SO_MARK) the store puts on fetch sockets:
 *   bits 31..24  0x74 ('t'), so a mark set by someone else (iptables, a CNI) is never
 *                mistaken for thaw's
 *   bits 23..8   model id (0 = none), for per-model byte counters
 *   bits  7..0   class id */
#define THAW_MARK_MAGIC 0x74000000u
#define THAW_MARK_MAGIC_MASK 0xff000000u
#define THAW_MARK_MODEL_SHIFT 8
#define THAW_MARK_MODEL_MASK 0xffffu

static inline thaw_u32 thaw_mark_make(thaw_u32 traffic_class, thaw_u32 model_id) {
  return THAW_MARK_MAGIC | ((model_id & THAW_MARK_MODEL_MASK) << THAW_MARK_MODEL_SHIFT) |
         (traffic_class & 0xffu);
}

/* The class a mark names, or -1 when the mark is not thaw's or names no class. */
static inline int thaw_mark_class(thaw_u32 mark) {
  if ((mark & THAW_MARK_MAGIC_MASK) != THAW_MARK_MAGIC) return -1;
  thaw_u32 c = mark & 0xffu;
  return c < THAW_CLASS_COUNT ? (int)c : -1;
}

static inline thaw_u32 thaw_mark_model(thaw_u32 mark) {
  return (mark >> THAW_MARK_MODEL_SHIFT) & THAW_MARK_MODEL_MASK;
}

/* HTB: thaw's root qdisc on the uplink and on the IFB has this major handle ("th"), so a
 * start after a crash recognises its own qdisc and never touches anyone else's. The parent
 * class is :1, leaves are :0x10 + class. The classifier writes major:minor into
 * skb->priority; HTB puts a packet whose priority names one of its leaves straight in it. */
#define THAW_HTB_MAJOR 0x7468u
#define THAW_HTB_ROOT_MINOR 0x1u
#define THAW_HTB_LEAF_MINOR_BASE 0x10u

static inline thaw_u32 thaw_htb_leaf_minor(thaw_u32 traffic_class) {
  return THAW_HTB_LEAF_MINOR_BASE + traffic_class;
}

static inline thaw_u32 thaw_skb_priority(thaw_u32 traffic_class) {
  if (traffic_class >= THAW_CLASS_COUNT) traffic_class = THAW_CLASS_OTHER;
  return (THAW_HTB_MAJOR << 16) | thaw_htb_leaf_minor(traffic_class);
}

/* Fetch classes are inner HTB classes with THAW_FETCH_SLOTS leaves each, and a fetch goes to
 * slot (model id % THAW_FETCH_SLOTS): HTB serves sibling leaves round robin, so two models'
 * fetches in one class share it evenly, which TCP flows in one FIFO do not (measured 43/57).
 * Leaf minors: 0x100 + class * 0x10 + slot. */
#define THAW_FETCH_SLOTS 4u

static inline int thaw_class_has_slots(thaw_u32 traffic_class) {
  return traffic_class == THAW_CLASS_CRITICAL_FETCH || traffic_class == THAW_CLASS_BACKGROUND_FETCH;
}

static inline thaw_u32 thaw_htb_slot_minor(thaw_u32 traffic_class, thaw_u32 slot) {
  return 0x100u + traffic_class * 0x10u + (slot % THAW_FETCH_SLOTS);
}

/* skb->priority for a packet of a class and model: the class's leaf, or for a fetch class
 * the model's slot leaf under it. */
static inline thaw_u32 thaw_skb_priority_model(thaw_u32 traffic_class, thaw_u32 model) {
  if (traffic_class < THAW_CLASS_COUNT && thaw_class_has_slots(traffic_class))
    return (THAW_HTB_MAJOR << 16) | thaw_htb_slot_minor(traffic_class, model);
  return thaw_skb_priority(traffic_class);
}

/* HTB's priority among classes borrowing spare bandwidth (lower wins). */
static inline thaw_u32 thaw_htb_prio(thaw_u32 traffic_class) {
  return traffic_class;
}

/* tc filter handle and priority of thaw's BPF classifier in clsact: fixed, so thaw attaches,
 * replaces and detaches exactly its own filter and leaves other programs' filters alone. */
#define THAW_TC_HANDLE 0x7468u
#define THAW_TC_PRIORITY 0x7468u

/* Rates are bytes per second throughout. */
struct thaw_class_rate {
  thaw_u64 rate; /* guaranteed */
  thaw_u64 ceil; /* most it may take when others leave bandwidth unused */
};

/* 0 when a set of class rates fits a link, else a nonzero code saying which rule broke:
 *   1 link rate 0, 2 a class with rate 0 (HTB rejects it), 3 rate above ceil,
 *   4 ceil above the link, 5 guaranteed rates sum above the link. */
static inline int thaw_rates_check(thaw_u64 link_rate, const struct thaw_class_rate* rates,
                                   thaw_u32 count) {
  if (link_rate == 0) return 1;
  thaw_u64 sum = 0;
  for (thaw_u32 i = 0; i < count; i++) {
    if (rates[i].rate == 0 || rates[i].ceil == 0) return 2;
    if (rates[i].rate > rates[i].ceil) return 3;
    if (rates[i].ceil > link_rate) return 4;
    sum += rates[i].rate;
    if (sum > link_rate) return 5;
  }
  return 0;
}

/* HTB burst: bytes a class may send back to back. One timer tick's worth at 1000 Hz plus one
 * MTU-sized frame, as tc computes its default; never below two frames, so a class at a low
 * rate still sends whole packets. */
static inline thaw_u64 thaw_htb_burst_bytes(thaw_u64 rate, thaw_u32 mtu) {
  thaw_u64 b = rate / 1000 + mtu;
  return b < 2ull * mtu ? 2ull * mtu : b;
}

/* HTB expresses bursts as time at the class's rate, in psched ticks of 64 ns. */
static inline thaw_u32 thaw_htb_burst_ticks(thaw_u64 rate, thaw_u64 burst_bytes) {
  if (rate == 0) return 0;
  thaw_u64 ns = burst_bytes * 1000000000ull / rate;
  thaw_u64 ticks = ns >> 6;
  return ticks > 0xffffffffull ? 0xffffffffu : (thaw_u32)ticks;
}

/* HTB quantum (bytes a class sends per round when borrowing): rate / 10 as tc's r2q does,
 * clamped to [mtu, 200000], the range in which HTB does not warn and stays fair. */
static inline thaw_u32 thaw_htb_quantum(thaw_u64 rate, thaw_u32 mtu) {
  thaw_u64 q = rate / 10;
  if (q < mtu) q = mtu;
  if (q > 200000) q = 200000;
  return (thaw_u32)q;
}

/* EDT pacing (skb->tstamp with sch_fq): the departure time of a packet of len bytes for a
 * class whose previous packet left at last_ns, at rate bytes/s, now being now_ns. A class
 * idle longer than one packet's time starts again at now: no credit for idle time. */
static inline thaw_u64 thaw_edt_next(thaw_u64 now_ns, thaw_u64 last_ns, thaw_u64 len,
                                     thaw_u64 rate) {
  if (rate == 0) return now_ns;
  thaw_u64 start = last_ns > now_ns ? last_ns : now_ns;
  return start + len * 1000000000ull / rate;
}

/* Receive window of a fetch socket: its class's rate times the path's round trip (the
 * bandwidth-delay product, which keeps the fetch at that rate), never below floor (so a
 * round trip measured short on a LAN, or a handshake faster than the path under load, still
 * leaves a few segments in flight). A download can only have one window in flight, so this
 * bounds what it queues upstream of the node, where thaw's ingress shaping cannot reach:
 * an unpaced sender otherwise fills the upstream buffer up to the autotuned window (64 KB to
 * MBs) and an inference request waits behind it. rtt in microseconds. */
static inline thaw_u64 thaw_fetch_window_bytes(thaw_u64 rate, thaw_u64 rtt_us, thaw_u64 floor) {
  thaw_u64 w = rtt_us > 0 && rate > 0xffffffffffffffffull / rtt_us ? 0xffffffffffffffffull
                                                                   : rate * rtt_us / 1000000ull;
  return w < floor ? floor : w;
}

/* Class counters as the BPF maps hold them (per CPU; user space sums). */
struct thaw_class_counters {
  thaw_u64 bytes;
  thaw_u64 packets;
  thaw_u64 drops; /* dropped by the classifier itself (policing); HTB's drops come from tc */
};

/* Index into the class_stats map. */
static inline thaw_u32 thaw_stats_index(thaw_u32 direction, thaw_u32 traffic_class) {
  return direction * THAW_CLASS_COUNT + traffic_class;
}

/* Keys of the port map: a local TCP/UDP port (host order) of a direction-less service. */
#define THAW_MAX_PORTS 256
#define THAW_MAX_CGROUPS 256
#define THAW_MAX_MODELS 1024

#endif /* THAW_BPF_TRAFFIC_CLASS_H */
