// NodeShaping with a recording shaper backend: what it starts the shaper with, when it runs
// without one, and how the coordinator's rates are fitted to this node's link and applied.
#include "daemon/lifecycle/node_shaping.hpp"

#include <gtest/gtest.h>

namespace thaw::daemon {
namespace {

struct Probe : NetworkProbe {
  std::string missing;
  std::optional<std::string> default_route_device() const override { return "eth0"; }
  bool device_exists(const std::string& d) const override { return d == "eth0"; }
  std::optional<std::uint64_t> link_bytes_per_s(const std::string&) const override {
    return 1'000'000'000;
  }
  std::string missing_capabilities() const override { return missing; }
};

struct Recorded {
  std::vector<network::ShapingSettings> started;
  std::vector<std::array<network::ClassRate, network::kTrafficClassCount>> rates;
  int stops = 0;
  std::vector<std::uint64_t> cgroups;  // inference cgroups now registered
  std::vector<std::uint16_t> ports;    // inference ports now set
};

class FakeShaper : public ShaperBackend {
 public:
  FakeShaper(Recorded& r, std::optional<network::ShapingError> fail = std::nullopt)
      : r_(r), fail_(std::move(fail)) {}
  std::expected<std::string, network::ShapingError> start(
      const network::ShapingSettings& s) override {
    if (fail_) return std::unexpected(*fail_);
    r_.started.push_back(s);
    return std::string("attached to eth0");
  }
  std::expected<void, network::ShapingError> set_class_rates(
      const std::array<network::ClassRate, network::kTrafficClassCount>& c) override {
    r_.rates.push_back(c);
    return {};
  }
  std::expected<network::ShapingCounters, network::ShapingError> counters() const override {
    network::ShapingCounters c;
    c.classes[1][1] = {5000, 4, 1};  // ingress, critical fetch
    c.classes[0][0] = {900, 7, 0};   // egress, inference
    c.classes[1][0] = {600, 5, 0};   // ingress, inference
    return c;
  }
  std::expected<void, network::ShapingError> add_inference_cgroup(std::uint64_t id) override {
    if (id == 666)
      return std::unexpected(network::ShapingError{network::ShapingErrc::bpf, "E2BIG"});
    r_.cgroups.push_back(id);
    return {};
  }
  std::expected<void, network::ShapingError> remove_inference_cgroup(std::uint64_t id) override {
    std::erase(r_.cgroups, id);
    return {};
  }
  std::expected<void, network::ShapingError> set_inference_port(std::uint16_t port) override {
    r_.ports.push_back(port);
    return {};
  }
  std::expected<void, network::ShapingError> clear_port(std::uint16_t port) override {
    std::erase(r_.ports, port);
    return {};
  }
  void stop() override { ++r_.stops; }

 private:
  Recorded& r_;
  std::optional<network::ShapingError> fail_;
};

TEST(NodeShaping, StartsTheShaperWithTheResolvedRatesAndStopsIt) {
  Recorded rec;
  NetworkSettings settings;
  settings.inference_ports = {8000};
  {
    auto s = NodeShaping::start(settings, Probe{}, std::make_unique<FakeShaper>(rec));
    ASSERT_TRUE(s) << s.error();
    EXPECT_TRUE((*s)->enabled());
    EXPECT_EQ((*s)->link_bytes_per_s(), 1'000'000'000u);  // the agent reports it as B
    ASSERT_EQ(rec.started.size(), 1u);
    const network::ShapingSettings& st = rec.started[0];
    EXPECT_EQ(st.uplink, "eth0");
    EXPECT_EQ(st.link_bytes_per_s, 1'000'000'000u);
    EXPECT_EQ(st.classes[0].rate_bytes_per_s, 400'000'000u);
    EXPECT_EQ(st.classes[2].rate_bytes_per_s, 50'000'000u);
    EXPECT_EQ(st.classes[3].ceil_bytes_per_s, 1'000'000'000u);
    EXPECT_EQ(st.inference_ports, std::vector<std::uint16_t>{8000});
    const NetStatus status = (*s)->status();
    EXPECT_TRUE(status.enabled);
    EXPECT_EQ(status.classes[1].bytes[1], 5000u);
    EXPECT_EQ(status.classes[1].drops[1], 1u);
    EXPECT_EQ(status.rates_from, "config");
  }
  EXPECT_EQ(rec.stops, 1);
}

// What thawd samples to clamp fetch windows only while inference runs: the inference
// class's packets both ways; 0 without shaping.
TEST(NodeShaping, InferencePacketsCountBothDirections) {
  Recorded rec;
  auto s = NodeShaping::start(NetworkSettings{}, Probe{}, std::make_unique<FakeShaper>(rec));
  ASSERT_TRUE(s) << s.error();
  EXPECT_EQ((*s)->inference_packets(), 12u);
  NetworkSettings off;
  off.mode = ShapingMode::off;
  auto none = NodeShaping::start(off, Probe{}, std::make_unique<FakeShaper>(rec));
  ASSERT_TRUE(none) << none.error();
  EXPECT_EQ((*none)->inference_packets(), 0u);
}

TEST(NodeShaping, WorkersCgroupsAndPortsAreInferenceWhileTheyRun) {
  Recorded rec;
  NetworkSettings settings;
  settings.inference_ports = {8000};  // the operator's: stays inference whatever workers do
  auto s = NodeShaping::start(settings, Probe{}, std::make_unique<FakeShaper>(rec));
  ASSERT_TRUE(s);
  (*s)->add_worker("thaw-worker-p-1-0", 41, {20001, 20002});
  (*s)->add_worker("thaw-worker-p-1-1", 42, {});
  (*s)->add_worker("thaw-worker-p-1-2", 666, {8000});  // cgroup refused by the map: logged
  EXPECT_EQ(rec.cgroups, (std::vector<std::uint64_t>{41, 42}));
  EXPECT_EQ(rec.ports, (std::vector<std::uint16_t>{20001, 20002, 8000}));
  (*s)->remove_worker("thaw-worker-p-1-0", 41, {20001, 20002});
  (*s)->remove_worker("thaw-worker-p-1-2", 0, {8000});
  EXPECT_EQ(rec.cgroups, std::vector<std::uint64_t>{42});
  EXPECT_EQ(rec.ports, std::vector<std::uint16_t>{8000});

  // Without shaping there is nothing to register with.
  Recorded off;
  Probe probe;
  probe.missing = "CAP_BPF";
  auto unshaped = NodeShaping::start(NetworkSettings{}, probe, std::make_unique<FakeShaper>(off));
  ASSERT_TRUE(unshaped);
  (*unshaped)->add_worker("thaw-worker-p-1-0", 41, {20001});
  EXPECT_TRUE(off.cgroups.empty());
  EXPECT_TRUE(off.ports.empty());
}

TEST(NodeShaping, WithoutCapabilitiesItRunsWithoutTheShaperAndSaysWhy) {
  Recorded rec;
  Probe probe;
  probe.missing = "CAP_BPF CAP_NET_ADMIN";
  auto s = NodeShaping::start(NetworkSettings{}, probe, std::make_unique<FakeShaper>(rec));
  ASSERT_TRUE(s);
  EXPECT_FALSE((*s)->enabled());
  EXPECT_EQ((*s)->link_bytes_per_s(), 1'000'000'000u) << "known even where it cannot shape";
  EXPECT_TRUE(rec.started.empty());
  EXPECT_NE((*s)->status().detail.find("lacks CAP_BPF CAP_NET_ADMIN"), std::string::npos);
  // The coordinator's rates are still recorded (it cannot know), and nothing fails.
  CoordinatorRates c;
  c.link_bytes_per_s = 1'000'000'000;
  c.cold_starts = 2;
  c.classes = {{{100, 1000}, {800, 1000}, {50, 1000}, {50, 1000}}};
  ASSERT_TRUE((*s)->apply_coordinator_rates(c));
  EXPECT_EQ((*s)->status().cold_starts, 2u);
  EXPECT_TRUE(rec.rates.empty());
}

TEST(NodeShaping, AShaperThatFailsToStartFailsThawdOnlyWhenShapingIsRequired) {
  const network::ShapingError netlink{network::ShapingErrc::netlink, "RTM_NEWQDISC: EINVAL"};
  Recorded rec;
  auto automatic =
      NodeShaping::start(NetworkSettings{}, Probe{}, std::make_unique<FakeShaper>(rec, netlink));
  ASSERT_TRUE(automatic);
  EXPECT_FALSE((*automatic)->enabled());
  EXPECT_NE((*automatic)->status().detail.find("RTM_NEWQDISC"), std::string::npos);

  NetworkSettings on;
  on.mode = ShapingMode::on;
  auto required = NodeShaping::start(on, Probe{}, std::make_unique<FakeShaper>(rec, netlink));
  ASSERT_FALSE(required);
  EXPECT_NE(required.error().find("network.shaping = \"auto\""), std::string::npos);

  const network::ShapingError perm{network::ShapingErrc::no_permission, "EPERM"};
  auto no_perm = NodeShaping::start(on, Probe{}, std::make_unique<FakeShaper>(rec, perm));
  ASSERT_TRUE(no_perm) << "missing permissions never stop thawd";
  EXPECT_FALSE((*no_perm)->enabled());
}

TEST(NodeShaping, CoordinatorRatesAreScaledToThisLinkAndRevertedWhenNoColdStartIsLeft) {
  Recorded rec;
  auto s = NodeShaping::start(NetworkSettings{}, Probe{}, std::make_unique<FakeShaper>(rec));
  ASSERT_TRUE(s);
  CoordinatorRates c;
  c.link_bytes_per_s = 2'000'000'000;  // the coordinator assumed twice this node's link
  c.cold_starts = 4;
  c.per_cold_start_bytes_per_s = 400'000'000;
  c.classes = {{{200'000'000, 2'000'000'000},
                {1'600'000'000, 2'000'000'000},
                {20'000'000, 2'000'000'000},
                {180'000'000, 2'000'000'000}}};
  ASSERT_TRUE((*s)->apply_coordinator_rates(c));
  ASSERT_EQ(rec.rates.size(), 1u);
  EXPECT_EQ(rec.rates[0][1].rate_bytes_per_s, 800'000'000u);
  EXPECT_EQ(rec.rates[0][1].ceil_bytes_per_s, 1'000'000'000u);
  EXPECT_EQ(rec.rates[0][0].rate_bytes_per_s, 100'000'000u);
  NetStatus st = (*s)->status();
  EXPECT_EQ(st.rates_from, "coordinator");
  EXPECT_EQ(st.cold_starts, 4u);
  EXPECT_EQ(st.classes[1].rate_bytes_per_s, 800'000'000u);

  ASSERT_TRUE((*s)->apply_coordinator_rates(CoordinatorRates{}));  // no cold start left
  ASSERT_EQ(rec.rates.size(), 2u);
  EXPECT_EQ(rec.rates[1][1].rate_bytes_per_s, 400'000'000u);  // [network]'s 40 %
  EXPECT_EQ((*s)->status().rates_from, "config");
}

TEST(NodeShaping, RatesThatCannotFitAreRefusedAndTheOldOnesStay) {
  CoordinatorRates c;
  c.link_bytes_per_s = 1'000;
  c.classes = {{{600, 1000}, {600, 1000}, {1, 1000}, {1, 1000}}};  // 1202 > 1000
  auto fitted = NodeShaping::fit_to_link(c, 1'000);
  ASSERT_FALSE(fitted);
  EXPECT_NE(fitted.error().find("sum to 1202 B/s, above the link of 1000 B/s"), std::string::npos)
      << fitted.error();
  // A zero class rate becomes 1 B/s (HTB refuses 0), a ceiling above the link the link.
  c.classes = {{{0, 5000}, {500, 5000}, {1, 1}, {1, 0}}};
  fitted = NodeShaping::fit_to_link(c, 1'000);
  ASSERT_TRUE(fitted) << fitted.error();
  EXPECT_EQ((*fitted)[0].guaranteed_bytes_per_s, 1u);
  EXPECT_EQ((*fitted)[0].ceil_bytes_per_s, 1000u);
  EXPECT_EQ((*fitted)[3].ceil_bytes_per_s, 1u);
}

}  // namespace
}  // namespace thaw::daemon
