// The [network] section: parsing and validation (via parse_config, so errors carry the file
// position), and resolution against a fake machine and against this one.
#include "daemon/network/network_config.hpp"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/config/thawd_config.hpp"

namespace thaw::daemon {
namespace {

struct FakeProbe : NetworkProbe {
  std::optional<std::string> route = "eth0";
  std::vector<std::string> devices = {"eth0", "eth1"};
  std::optional<std::uint64_t> speed = 1'250'000'000;  // 10 Gbit/s
  std::string missing;
  std::optional<std::string> default_route_device() const override { return route; }
  bool device_exists(const std::string& d) const override {
    return std::find(devices.begin(), devices.end(), d) != devices.end();
  }
  std::optional<std::uint64_t> link_bytes_per_s(const std::string&) const override { return speed; }
  std::string missing_capabilities() const override { return missing; }
};

NetworkSettings parse(std::string_view section) {
  auto c = parse_config(std::string("[network]\n") + std::string(section), "n.toml");
  EXPECT_TRUE(c) << c.error().message;
  return c ? c->network : NetworkSettings{};
}

std::string error_of(std::string_view section) {
  auto c = parse_config(std::string("[network]\n") + std::string(section), "n.toml");
  return c ? std::string("(accepted)") : c.error().message;
}

TEST(NetworkConfig, EveryKeyIsRead) {
  NetworkSettings s = parse(R"(shaping = true
uplink = "ens5"
link_rate = "2.5GB"
inference_rate = "100MB"
inference_ceil = "50%"
critical_rate = "60%"
critical_ceil = "90%"
background_rate = "10%"
background_ceil = "2GB"
)");
  EXPECT_EQ(s.mode, ShapingMode::on);
  EXPECT_EQ(s.uplink, "ens5");
  EXPECT_EQ(s.link_rate, 2'500'000'000u);
  EXPECT_EQ(s.classes[0].guaranteed, (RateSetting{100'000'000, 0}));
  EXPECT_EQ(s.classes[0].ceil, (RateSetting{0, 0.5}));
  EXPECT_EQ(s.classes[1].guaranteed, (RateSetting{0, 0.6}));
  EXPECT_EQ(s.classes[2].ceil, (RateSetting{2'000'000'000, 0}));
  EXPECT_EQ(parse("inference_ports = [8000, 443]").inference_ports,
            (std::vector<std::uint16_t>{8000, 443}));
  EXPECT_EQ(parse("shaping = false").mode, ShapingMode::off);
  EXPECT_EQ(parse("shaping = \"auto\"").mode, ShapingMode::automatic);
  EXPECT_TRUE(parse("").clamp_fetch_windows);
  EXPECT_FALSE(parse("clamp_fetch_windows = false").clamp_fetch_windows);
}

TEST(NetworkConfig, BadValuesNameTheKeyAndWhatIsAccepted) {
  EXPECT_NE(error_of("shaping = \"yes\"").find("n.toml:2:11: network.shaping: must be \"auto\""),
            std::string::npos)
      << error_of("shaping = \"yes\"");
  EXPECT_NE(error_of("critical_rate = \"120%\"").find("network.critical_rate: must be a share"),
            std::string::npos);
  EXPECT_NE(error_of("critical_rate = \"-5%\"").find("network.critical_rate"), std::string::npos);
  EXPECT_NE(error_of("critical_rate = \"fast\"").find("network.critical_rate"), std::string::npos);
  EXPECT_NE(error_of("critical_rate = \"nan%\"").find("network.critical_rate"), std::string::npos);
  EXPECT_NE(error_of("uplink = \"eth0/x\"")
                .find("network.uplink: 'eth0/x' is not a network "
                      "device name"),
            std::string::npos);
  EXPECT_NE(error_of("uplink = \"averyveryverylongname\"").find("network.uplink"),
            std::string::npos);
  EXPECT_NE(error_of("ceil = \"1GB\"").find("network.ceil: unknown key"), std::string::npos);
  EXPECT_NE(error_of("inference_ports = [0]")
                .find("network.inference_ports: every entry must be a "
                      "port number in 1..65535"),
            std::string::npos);
  EXPECT_NE(error_of("inference_ports = 8000").find("must be an array of port numbers"),
            std::string::npos);
  EXPECT_NE(error_of("clamp_fetch_windows = \"yes\"").find("network.clamp_fetch_windows"),
            std::string::npos)
      << error_of("clamp_fetch_windows = \"yes\"");
}

TEST(NetworkConfig, CrossKeyChecksNameTheSectionAndTheKeys) {
  const std::string over = error_of("critical_rate = \"60%\"");  // 40 + 60 + 5 + 15 > 100
  EXPECT_NE(over.find("n.toml:1:1: network: the guaranteed shares add up to 120%"),
            std::string::npos)
      << over;
  const std::string above_ceil = error_of("background_rate = \"5%\"\nbackground_ceil = \"4%\"");
  EXPECT_NE(above_ceil.find("network.background_rate (5%) is above network.background_ceil (4%)"),
            std::string::npos)
      << above_ceil;
  const std::string above_link =
      error_of("link_rate = \"1GB\"\ncritical_ceil = \"2GB\"\ncritical_rate = \"10%\"");
  EXPECT_NE(above_link.find("network.critical_ceil (2000000000 B/s) is above network.link_rate"),
            std::string::npos)
      << above_link;
}

TEST(NetworkConfig, DefaultsResolveAgainstTheDefaultRouteAndItsSpeed) {
  FakeProbe probe;
  auto r = resolve_network(NetworkSettings{}, probe);
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(r->enabled) << r->why_off;
  EXPECT_EQ(r->device, "eth0");
  EXPECT_EQ(r->link_bytes_per_s, 1'250'000'000u);
  EXPECT_EQ(r->rates[0], (ClassRates{500'000'000, 1'250'000'000}));
  EXPECT_EQ(r->rates[1], (ClassRates{500'000'000, 1'250'000'000}));
  EXPECT_EQ(r->rates[2], (ClassRates{62'500'000, 1'250'000'000}));
  EXPECT_EQ(r->rates[3], (ClassRates{187'500'000, 1'250'000'000}));
}

TEST(NetworkConfig, AutomaticTurnsOffWithOneReasonInsteadOfFailing) {
  FakeProbe probe;
  probe.missing = "CAP_BPF";
  auto r = resolve_network(NetworkSettings{}, probe);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->enabled);
  EXPECT_NE(r->why_off.find("thawd lacks CAP_BPF"), std::string::npos) << r->why_off;

  probe.missing.clear();
  probe.route.reset();
  r = resolve_network(NetworkSettings{}, probe);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->enabled);
  EXPECT_NE(r->why_off.find("no default route"), std::string::npos) << r->why_off;

  probe.route = "lo";
  probe.speed.reset();
  r = resolve_network(NetworkSettings{}, probe);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->enabled);
  EXPECT_NE(r->why_off.find("set network.link_rate"), std::string::npos) << r->why_off;

  NetworkSettings off;
  off.mode = ShapingMode::off;
  r = resolve_network(off, FakeProbe{});
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->enabled);
}

TEST(NetworkConfig, RequiredShapingFailsOnWhatTheOperatorMustFix) {
  NetworkSettings s;
  s.mode = ShapingMode::on;
  s.uplink = "eth9";
  auto r = resolve_network(s, FakeProbe{});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("no device 'eth9'"), std::string::npos) << r.error();

  s.uplink = "eth1";
  FakeProbe unknown_speed;
  unknown_speed.speed.reset();
  r = resolve_network(s, unknown_speed);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("set network.link_rate"), std::string::npos) << r.error();

  // Missing capabilities never stop thawd: shaping is an optimisation.
  s.link_rate = 125'000'000;
  unknown_speed.missing = "CAP_NET_ADMIN";
  r = resolve_network(s, unknown_speed);
  ASSERT_TRUE(r) << r.error();
  EXPECT_FALSE(r->enabled);
  EXPECT_EQ(r->link_bytes_per_s, 125'000'000u);
}

TEST(NetworkConfig, AbsoluteRatesAboveADetectedLinkAreRefused) {
  NetworkSettings s;
  s.classes[1].guaranteed = RateSetting{2'000'000'000, 0};  // the link is 1.25 GB/s
  auto r = resolve_network(s, FakeProbe{});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("network.critical_rate / network.critical_ceil"), std::string::npos)
      << r.error();
}

TEST(NetworkConfig, DefaultRouteIsTheLowestMetricDefault) {
  const char* table =
      "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
      "eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
      "eth0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
      "eth2\t00000000\t0103A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
      "eth3\t00000000\t0104A8C0\t0002\t0\t0\t10\t00000000\t0\t0\t0\n";  // not up
  EXPECT_EQ(default_route_in(table), "eth2");
  EXPECT_EQ(default_route_in("Iface\tDestination\n"), std::nullopt);
}

TEST(NetworkConfig, TheSystemProbeAnswersOnThisMachine) {
  SystemNetworkProbe probe;
  EXPECT_TRUE(probe.device_exists("lo"));
  EXPECT_FALSE(probe.device_exists("thaw-no-such0"));
  EXPECT_EQ(probe.link_bytes_per_s("thaw-no-such0"), std::nullopt);
  // Loopback has no speed: the rate must come from the configuration.
  EXPECT_EQ(probe.link_bytes_per_s("lo"), std::nullopt);
}

// In a child that drops `caps` from its effective set: whether SystemNetworkProbe then names
// exactly `expected` as missing (exit 0) or not (1); 2: the drop itself failed.
int missing_after_dropping(std::initializer_list<int> caps, const std::string& expected) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (syscall(SYS_capget, &header, data) != 0) ::_exit(2);
    for (int cap : caps) data[cap / 32].effective &= ~(1u << (cap % 32));
    if (syscall(SYS_capset, &header, data) != 0) ::_exit(2);
    ::_exit(SystemNetworkProbe{}.missing_capabilities() == expected ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

TEST(NetworkConfig, TheSystemProbeNamesTheCapabilitiesTheClassifierNeeds) {
  if (!SystemNetworkProbe{}.missing_capabilities().empty()) {
    GTEST_SKIP() << "needs root with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON; lacks "
                 << SystemNetworkProbe{}.missing_capabilities();
  }
  EXPECT_EQ(missing_after_dropping({CAP_BPF}, "CAP_BPF"), 0);
  EXPECT_EQ(missing_after_dropping({CAP_NET_ADMIN, CAP_BPF}, "CAP_BPF CAP_NET_ADMIN"), 0);
  // CAP_SYS_ADMIN implies CAP_PERFMON for the verifier: only both gone is a lack.
  EXPECT_EQ(missing_after_dropping({CAP_PERFMON}, ""), 0);
  EXPECT_EQ(missing_after_dropping({CAP_PERFMON, CAP_SYS_ADMIN}, "CAP_PERFMON"), 0);
}

}  // namespace
}  // namespace thaw::daemon
