// thaw's tc classifier (bpf/thaw_tc.bpf.c) run by the kernel on crafted packets with
// BPF_PROG_TEST_RUN: the class it picks (skb->priority), its verdict and its counters.
// Needs root (CAP_BPF, CAP_NET_ADMIN): skipped otherwise, with the reason.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "bpf/thaw_tc.skel.h"
#include "bpf/traffic_class.h"

namespace {

struct Packet {
  std::vector<unsigned char> bytes;
};

// Ethernet + IPv4 + TCP (no options) + payload. The headers are filled in aligned locals and
// copied in: after the 14-byte Ethernet header the IPv4 header is not 4-byte aligned in the
// buffer, and writing it through an iphdr* there is undefined behaviour (UBSan says so).
Packet tcp4(const char* src, std::uint16_t sport, const char* dst, std::uint16_t dport,
            std::size_t payload) {
  Packet p;
  p.bytes.resize(sizeof(ethhdr) + sizeof(iphdr) + sizeof(tcphdr) + payload, 0);
  ethhdr eth{};
  eth.h_proto = htons(ETH_P_IP);
  iphdr ip{};
  ip.version = 4;
  ip.ihl = 5;
  ip.ttl = 64;
  ip.protocol = IPPROTO_TCP;
  ip.tot_len = htons(static_cast<std::uint16_t>(p.bytes.size() - sizeof(ethhdr)));
  inet_pton(AF_INET, src, &ip.saddr);
  inet_pton(AF_INET, dst, &ip.daddr);
  tcphdr tcp{};
  tcp.source = htons(sport);
  tcp.dest = htons(dport);
  tcp.doff = 5;
  tcp.ack = 1;
  unsigned char* at = p.bytes.data();
  std::memcpy(at, &eth, sizeof eth);
  std::memcpy(at + sizeof eth, &ip, sizeof ip);
  std::memcpy(at + sizeof eth + sizeof ip, &tcp, sizeof tcp);
  return p;
}

struct Verdict {
  int retval = -1;
  std::uint32_t priority = 0;
};

class Classifier : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "BPF_PROG_TEST_RUN needs root (CAP_BPF, CAP_NET_ADMIN)";
    skel_ = thaw_tc__open();
    ASSERT_NE(skel_, nullptr);
  }
  void load(std::uint32_t ifb_ifindex = 0) {
    skel_->rodata->ifb_ifindex = ifb_ifindex;
    int rc = thaw_tc__load(skel_);
    if (rc == -EPERM) GTEST_SKIP() << "the kernel refused to load BPF (no CAP_BPF?)";
    ASSERT_EQ(rc, 0) << "loading thaw_tc: " << std::strerror(-rc);
  }
  void TearDown() override {
    if (skel_) thaw_tc__destroy(skel_);
  }

  Verdict run(bpf_program* prog, const Packet& p, std::uint32_t mark = 0) {
    __sk_buff ctx{};
    ctx.mark = mark;
    __sk_buff ctx_out{};
    LIBBPF_OPTS(bpf_test_run_opts, opts);
    opts.data_in = p.bytes.data();
    opts.data_size_in = static_cast<__u32>(p.bytes.size());
    opts.ctx_in = &ctx;
    opts.ctx_size_in = sizeof ctx;
    opts.ctx_out = &ctx_out;
    opts.ctx_size_out = sizeof ctx_out;
    opts.repeat = 1;
    int rc = bpf_prog_test_run_opts(bpf_program__fd(prog), &opts);
    EXPECT_EQ(rc, 0) << std::strerror(errno);
    return Verdict{static_cast<int>(opts.retval), ctx_out.priority};
  }

  thaw_class_counters stats(std::uint32_t dir, std::uint32_t cls) {
    int ncpu = libbpf_num_possible_cpus();
    std::vector<thaw_class_counters> per(ncpu);
    std::uint32_t key = thaw_stats_index(dir, cls);
    EXPECT_EQ(bpf_map_lookup_elem(bpf_map__fd(skel_->maps.class_stats), &key, per.data()), 0);
    thaw_class_counters sum{};
    for (auto& c : per) {
      sum.bytes += c.bytes;
      sum.packets += c.packets;
    }
    return sum;
  }

  void set_port(std::uint16_t port, std::uint32_t cls) {
    ASSERT_EQ(bpf_map_update_elem(bpf_map__fd(skel_->maps.port_class), &port, &cls, BPF_ANY), 0);
  }

  thaw_tc* skel_ = nullptr;
};

TEST_F(Classifier, EgressClassFromThawsSocketMark) {
  load();
  Packet p = tcp4("10.0.0.1", 40000, "10.0.0.2", 80, 1000);
  for (std::uint32_t c = 0; c < THAW_CLASS_COUNT; ++c) {
    Verdict r = run(skel_->progs.thaw_egress, p, thaw_mark_make(c, 0));
    EXPECT_EQ(r.retval, TC_ACT_OK);
    EXPECT_EQ(r.priority, thaw_skb_priority_model(c, 0)) << "class " << c;
  }
  auto crit = stats(THAW_DIR_EGRESS, THAW_CLASS_CRITICAL_FETCH);
  EXPECT_EQ(crit.packets, 1u);
  EXPECT_EQ(crit.bytes, p.bytes.size());
}

TEST_F(Classifier, EgressForeignMarkAndUnknownPortAreOther) {
  load();
  Packet p = tcp4("10.0.0.1", 40000, "10.0.0.2", 80, 100);
  EXPECT_EQ(run(skel_->progs.thaw_egress, p, 0x1234).priority, thaw_skb_priority(THAW_CLASS_OTHER));
  EXPECT_EQ(run(skel_->progs.thaw_egress, p, 0).priority, thaw_skb_priority(THAW_CLASS_OTHER));
  EXPECT_EQ(stats(THAW_DIR_EGRESS, THAW_CLASS_OTHER).packets, 2u);
  EXPECT_EQ(stats(THAW_DIR_EGRESS, THAW_CLASS_INFERENCE).packets, 0u);
}

TEST_F(Classifier, EngineAndGatewayPortsAreInferenceBothWays) {
  load();
  set_port(8000, THAW_CLASS_INFERENCE);
  // A response leaves from the engine's port; a request arrives at it.
  Verdict out = run(skel_->progs.thaw_egress, tcp4("10.0.0.1", 8000, "10.0.0.9", 51000, 300));
  Verdict in = run(skel_->progs.thaw_ingress, tcp4("10.0.0.9", 51000, "10.0.0.1", 8000, 200));
  EXPECT_EQ(out.priority, thaw_skb_priority(THAW_CLASS_INFERENCE));
  EXPECT_EQ(in.priority, thaw_skb_priority(THAW_CLASS_INFERENCE));
  EXPECT_EQ(in.retval, TC_ACT_OK);  // no IFB configured: not redirected
  // The remote port being 8000 does not make a packet inference.
  Verdict other = run(skel_->progs.thaw_ingress, tcp4("10.0.0.9", 8000, "10.0.0.1", 51000, 200));
  EXPECT_EQ(other.priority, thaw_skb_priority(THAW_CLASS_OTHER));
  EXPECT_EQ(stats(THAW_DIR_INGRESS, THAW_CLASS_INFERENCE).bytes,
            sizeof(ethhdr) + sizeof(iphdr) + sizeof(tcphdr) + 200);
}

TEST_F(Classifier, ThawMarkWinsOverPort) {
  load();
  set_port(8000, THAW_CLASS_INFERENCE);
  Verdict r = run(skel_->progs.thaw_egress, tcp4("10.0.0.1", 8000, "10.0.0.2", 80, 10),
                  thaw_mark_make(THAW_CLASS_BACKGROUND_FETCH, 0));
  EXPECT_EQ(r.priority, thaw_skb_priority_model(THAW_CLASS_BACKGROUND_FETCH, 0));
}

TEST_F(Classifier, IngressRedirectsToTheIfb) {
  load(/*ifb_ifindex=*/1);  // loopback stands in for the IFB: only the verdict is checked
  Verdict r = run(skel_->progs.thaw_ingress, tcp4("10.0.0.9", 80, "10.0.0.1", 40000, 10));
  EXPECT_EQ(r.retval, TC_ACT_REDIRECT);
  // Inference stays on the uplink (no IFB hop); it is still classed and counted.
  set_port(8000, THAW_CLASS_INFERENCE);
  Verdict inf = run(skel_->progs.thaw_ingress, tcp4("10.0.0.9", 51000, "10.0.0.1", 8000, 10));
  EXPECT_EQ(inf.retval, TC_ACT_OK);
  EXPECT_EQ(inf.priority, thaw_skb_priority(THAW_CLASS_INFERENCE));
}

TEST_F(Classifier, IngressUsesTheMarkOfTheLocalSocket) {
  load();
  // A listening socket in this netns, marked as the store marks a critical fetch socket: a
  // download packet for it is classed from the socket (bpf_sk_lookup_tcp), not from ports.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  std::uint32_t mark = thaw_mark_make(THAW_CLASS_CRITICAL_FETCH, 0);
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  std::uint16_t port = ntohs(a.sin_port);
  Verdict r = run(skel_->progs.thaw_ingress, tcp4("127.0.0.1", 43210, "127.0.0.1", port, 1400));
  EXPECT_EQ(r.priority, thaw_skb_priority_model(THAW_CLASS_CRITICAL_FETCH, 0));
  close(fd);
  // Same packet once the socket is gone: other.
  Verdict gone = run(skel_->progs.thaw_ingress, tcp4("127.0.0.1", 43210, "127.0.0.1", port, 1400));
  EXPECT_EQ(gone.priority, thaw_skb_priority(THAW_CLASS_OTHER));
}

TEST_F(Classifier, PerModelBytesOnlyForRegisteredModels) {
  load();
  int ncpu = libbpf_num_possible_cpus();
  std::vector<std::uint64_t> zero(ncpu, 0);
  std::uint32_t model = 7;
  ASSERT_EQ(
      bpf_map_update_elem(bpf_map__fd(skel_->maps.model_bytes), &model, zero.data(), BPF_NOEXIST),
      0);
  Packet p = tcp4("10.0.0.1", 40000, "10.0.0.2", 80, 500);
  // Model 7's fetch goes to its slot leaf under the critical class (7 % 4 = 3: minor 0x113).
  EXPECT_EQ(run(skel_->progs.thaw_egress, p, thaw_mark_make(THAW_CLASS_CRITICAL_FETCH, 7)).priority,
            0x74680113u);
  run(skel_->progs.thaw_egress, p, thaw_mark_make(THAW_CLASS_CRITICAL_FETCH, 7));
  run(skel_->progs.thaw_egress, p, thaw_mark_make(THAW_CLASS_CRITICAL_FETCH, 8));
  std::vector<std::uint64_t> per(ncpu);
  ASSERT_EQ(bpf_map_lookup_elem(bpf_map__fd(skel_->maps.model_bytes), &model, per.data()), 0);
  std::uint64_t sum = 0;
  for (auto b : per) sum += b;
  EXPECT_EQ(sum, 2 * p.bytes.size());
  std::uint32_t unregistered = 8;
  EXPECT_NE(bpf_map_lookup_elem(bpf_map__fd(skel_->maps.model_bytes), &unregistered, per.data()),
            0);
}

}  // namespace
