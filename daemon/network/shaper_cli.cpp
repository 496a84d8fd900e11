// thaw-shaper: runs TrafficShaper on one device until SIGINT/SIGTERM, printing the class
// counters every second. For the netns tests' manual twins and for trying shaping on a node
// without thawd:  thaw-shaper DEV LINK_BYTES_PER_S [inference-port ...]
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "daemon/network/traffic_shaper.hpp"

namespace {
volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace thaw::network;
  if (argc < 3) {
    fmt::print(stderr, "usage: {} DEV LINK_BYTES_PER_S [inference-port ...]\n", argv[0]);
    return 2;
  }
  ShapingSettings s = default_shaping_settings(argv[1], std::strtoull(argv[2], nullptr, 10));
  for (int i = 3; i < argc; ++i)
    s.inference_ports.push_back(static_cast<std::uint16_t>(std::atoi(argv[i])));
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  TrafficShaper shaper;
  auto st = shaper.start(s);
  if (!st) {
    fmt::print(stderr, "thaw-shaper: {}\n", st.error().message);
    return 1;
  }
  fmt::print("{}\n", st->detail);
  while (!g_stop) {
    sleep(1);
    auto c = shaper.counters();
    if (!c) continue;
    for (int d = 0; d < 2; ++d)
      for (std::size_t k = 0; k < kTrafficClassCount; ++k) {
        const auto& x = c->classes[d][k];
        fmt::print("{} {} bytes={} packets={} drops={}\n", d == 0 ? "egress" : "ingress",
                   traffic_class_name(static_cast<TrafficClass>(k)), x.bytes, x.packets, x.drops);
      }
    std::fflush(stdout);
  }
  shaper.stop();
  return 0;
}
