// Two network namespaces joined by a veth pair, for TrafficShaper tests with real qdiscs and
// real BPF: "node" (thawd's side, uplink up0, 10.77.0.1) and "peer" (the model registry and
// the clients, pe0, 10.77.0.2). The peer's egress toward the node is the emulated link: a tbf
// at the link rate with a deep (200 ms) buffer, like an upstream switch port, so a download
// that fills the link builds its queue there unless thaw's ingress shaping moves it home.
// Built with ip(8) and tc(8) (the tests only; thawd itself speaks netlink).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace thaw::network::test {

inline int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

inline std::string capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

// Moves the calling thread into a named netns (/run/netns/NAME).
inline void enter_netns(const std::string& name) {
  int fd = ::open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) throw std::runtime_error("setns " + name);
  ::close(fd);
}

struct NetnsPair {
  std::string node, peer;
  bool ok = false;

  // link_bytes_per_s: the emulated link (tbf on the peer's egress); 0 = no bottleneck.
  explicit NetnsPair(std::uint64_t link_bytes_per_s) {
    node = fmt::format("thn{}", getpid());
    peer = fmt::format("thp{}", getpid());
    destroy();
    ok = sh("ip netns add " + node) == 0 && sh("ip netns add " + peer) == 0 &&
         sh(fmt::format("ip -n {} link add name up0 type veth peer name pe0 netns {}", node,
                        peer)) == 0 &&
         sh(fmt::format("ip -n {} addr add 10.77.0.1/24 dev up0", node)) == 0 &&
         sh(fmt::format("ip -n {} addr add 10.77.0.2/24 dev pe0", peer)) == 0 &&
         sh(fmt::format("ip -n {} link set up0 up", node)) == 0 &&
         sh(fmt::format("ip -n {} link set pe0 up", peer)) == 0 &&
         sh(fmt::format("ip -n {} link set lo up", node)) == 0 &&
         sh(fmt::format("ip -n {} link set lo up", peer)) == 0;
    if (ok && link_bytes_per_s)
      ok = sh(fmt::format("ip netns exec {} tc qdisc add dev pe0 root tbf rate {}bit burst 16kb "
                          "latency 200ms",
                          peer, link_bytes_per_s * 8)) == 0;
  }
  ~NetnsPair() { destroy(); }
  void destroy() {
    sh("ip netns del " + node);
    sh("ip netns del " + peer);
  }
  std::string tc_node(const std::string& args) const {
    return capture(fmt::format("ip netns exec {} tc {} 2>&1", node, args));
  }
};

// A thread that runs fn inside netns name.
template <class F>
std::thread in_netns(std::string name, F fn) {
  return std::thread([name, fn]() mutable {
    enter_netns(name);
    fn();
  });
}

}  // namespace thaw::network::test
