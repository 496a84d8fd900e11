#include "daemon/network/network_config.hpp"

#include <fmt/format.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace thaw::daemon {

namespace {

constexpr std::array<std::string_view, kNetClassCount> kClassKey = {"inference", "critical",
                                                                    "background", "other"};

std::string describe(const RateSetting& r) {
  if (r.share > 0) return fmt::format("{:g}%", r.share * 100);
  return fmt::format("{} B/s", r.bytes_per_s);
}

std::uint64_t absolute(const RateSetting& r, std::uint64_t link) {
  if (r.share > 0)
    return static_cast<std::uint64_t>(std::llround(r.share * static_cast<double>(link)));
  return r.bytes_per_s;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string_view to_string(NetClass cls) {
  return kClassKey[static_cast<std::size_t>(cls)];
}

std::expected<void, std::string> validate_network_settings(const NetworkSettings& s) {
  if (!s.uplink.empty()) {
    // The kernel's rule for interface names (dev_valid_name): < IFNAMSIZ, no '/', ':' or
    // white space, not "." or "..".
    const bool bad_char = s.uplink.find_first_of("/: \t\n") != std::string::npos;
    if (s.uplink.size() >= IFNAMSIZ || bad_char || s.uplink == "." || s.uplink == "..") {
      return std::unexpected(fmt::format(
          "network.uplink: '{}' is not a network device name (at most {} characters, no '/', "
          "':' or spaces); `ip -br link` lists the node's devices",
          s.uplink, IFNAMSIZ - 1));
    }
  }
  double share_sum = 0;
  std::uint64_t absolute_sum = 0;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    const ClassSetting& c = s.classes[i];
    share_sum += c.guaranteed.share;
    absolute_sum += c.guaranteed.bytes_per_s;
    // Comparable without the link rate only when both are of one kind.
    const bool both_shares = c.guaranteed.share > 0 && c.ceil.share > 0;
    const bool both_absolute = c.guaranteed.share == 0 && c.ceil.share == 0;
    if ((both_shares && c.guaranteed.share > c.ceil.share) ||
        (both_absolute && c.guaranteed.bytes_per_s > c.ceil.bytes_per_s)) {
      return std::unexpected(
          fmt::format("network.{0}_rate ({1}) is above network.{0}_ceil ({2}); a class cannot be "
                      "guaranteed more than it may send: lower the rate or raise the ceiling",
                      kClassKey[i], describe(c.guaranteed), describe(c.ceil)));
    }
    if (s.link_rate > 0) {
      for (auto [name, r] : {std::pair{"rate", c.guaranteed}, std::pair{"ceil", c.ceil}}) {
        if (r.share == 0 && r.bytes_per_s > s.link_rate) {
          return std::unexpected(fmt::format(
              "network.{}_{} ({} B/s) is above network.link_rate ({} B/s); give at most the "
              "link rate, or a share such as \"20%\"",
              kClassKey[i], name, r.bytes_per_s, s.link_rate));
        }
      }
    }
  }
  if (share_sum > 1.0 + 1e-9) {
    return std::unexpected(
        fmt::format("network: the guaranteed shares add up to {:g}% of the link (inference_rate, "
                    "critical_rate, background_rate); they must add up to at most 100%",
                    share_sum * 100));
  }
  if (s.link_rate > 0 &&
      absolute_sum + static_cast<std::uint64_t>(share_sum * s.link_rate) > s.link_rate) {
    return std::unexpected(fmt::format(
        "network: the guaranteed rates (inference_rate, critical_rate, background_rate) add up "
        "to more than network.link_rate ({} B/s); lower them",
        s.link_rate));
  }
  return {};
}

std::optional<std::string> default_route_in(std::string_view text) {
  // Iface Destination Gateway Flags RefCnt Use Metric Mask ... (hex, host byte order)
  std::istringstream in{std::string(text)};
  std::string line;
  std::getline(in, line);  // header
  std::optional<std::string> best;
  long best_metric = std::numeric_limits<long>::max();
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string iface, destination, gateway, flags, refcnt, use, metric, mask;
    if (!(fields >> iface >> destination >> gateway >> flags >> refcnt >> use >> metric >> mask)) {
      continue;
    }
    constexpr unsigned long kRouteUp = 0x1;
    unsigned long f = std::strtoul(flags.c_str(), nullptr, 16);
    if (destination != "00000000" || mask != "00000000" || (f & kRouteUp) == 0) continue;
    const long m = std::strtol(metric.c_str(), nullptr, 10);
    if (m < best_metric) {
      best_metric = m;
      best = iface;
    }
  }
  return best;
}

std::optional<std::string> SystemNetworkProbe::default_route_device() const {
  std::ifstream in("/proc/net/route");
  std::stringstream text;
  text << in.rdbuf();
  return default_route_in(text.str());
}

bool SystemNetworkProbe::device_exists(const std::string& dev) const {
  return if_nametoindex(dev.c_str()) != 0;
}

std::optional<std::uint64_t> SystemNetworkProbe::link_bytes_per_s(const std::string& dev) const {
  // Reading speed of a device that is down fails with EINVAL; virtual devices say -1.
  const std::string text = read_first_line("/sys/class/net/" + dev + "/speed");
  char* end = nullptr;
  const long mbit = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || mbit <= 0) return std::nullopt;
  return static_cast<std::uint64_t>(mbit) * 1'000'000 / 8;
}

std::string SystemNetworkProbe::missing_capabilities() const {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) {
    return "CAP_BPF CAP_NET_ADMIN CAP_PERFMON (capget failed)";
  }
  auto has = [&](int cap) { return (data[cap / 32].effective & (1u << (cap % 32))) != 0; };
  std::string missing;
  auto add = [&](const char* name) { missing += std::string(missing.empty() ? "" : " ") + name; };
  if (!has(CAP_BPF)) add("CAP_BPF");
  if (!has(CAP_NET_ADMIN)) add("CAP_NET_ADMIN");
  // The verifier allows the classifier's packet-pointer arithmetic only to a loader with
  // CAP_PERFMON (or CAP_SYS_ADMIN, which implies it): see packaging/thawd.service.
  if (!has(CAP_PERFMON) && !has(CAP_SYS_ADMIN)) add("CAP_PERFMON");
  return missing;
}

std::expected<ResolvedNetwork, std::string> resolve_network(const NetworkSettings& s,
                                                            const NetworkProbe& probe) {
  ResolvedNetwork r;
  if (s.mode == ShapingMode::off) {
    r.why_off = "traffic shaping off: network.shaping = false";
    return r;
  }
  const bool required = s.mode == ShapingMode::on;
  auto off_or_fail = [&](std::string why,
                         std::string fix) -> std::expected<ResolvedNetwork, std::string> {
    if (required) return std::unexpected(fmt::format("{}; {}", why, fix));
    r.why_off = fmt::format(
        "traffic shaping off: {} ({}, or set network.shaping = false to "
        "silence this)",
        why, fix);
    return r;
  };
  r.device = s.uplink;
  if (r.device.empty()) {
    auto dev = probe.default_route_device();
    if (!dev) {
      return off_or_fail("no default route to find the uplink by",
                         "set network.uplink to the device model bytes arrive on");
    }
    r.device = *dev;
  } else if (!probe.device_exists(r.device)) {
    return off_or_fail(fmt::format("network.uplink: no device '{}' on this node", r.device),
                       "`ip -br link` lists the node's devices");
  }
  r.link_bytes_per_s = s.link_rate;
  if (r.link_bytes_per_s == 0) {
    auto rate = probe.link_bytes_per_s(r.device);
    if (!rate) {
      return off_or_fail(
          fmt::format("the link rate of {} is unknown (its driver does not report a speed)",
                      r.device),
          "set network.link_rate, e.g. \"1.25GB\" for 10 Gbit/s");
    }
    r.link_bytes_per_s = *rate;
  }
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    const ClassSetting& c = s.classes[i];
    ClassRates& out = r.rates[i];
    out.guaranteed_bytes_per_s = absolute(c.guaranteed, r.link_bytes_per_s);
    out.ceil_bytes_per_s = absolute(c.ceil, r.link_bytes_per_s);
    if (out.ceil_bytes_per_s > r.link_bytes_per_s ||
        out.guaranteed_bytes_per_s > out.ceil_bytes_per_s) {
      return std::unexpected(fmt::format(
          "network.{0}_rate / network.{0}_ceil ({1} / {2} B/s) do not fit the link of {3} "
          "({4} B/s): a ceiling at most the link, a rate at most the ceiling",
          kClassKey[i], out.guaranteed_bytes_per_s, out.ceil_bytes_per_s, r.device,
          r.link_bytes_per_s));
    }
  }
  std::uint64_t sum = 0;
  for (const ClassRates& c : r.rates) sum += c.guaranteed_bytes_per_s;
  if (sum > r.link_bytes_per_s) {
    return std::unexpected(fmt::format(
        "network: the guaranteed rates add up to {} B/s, more than the link of {} ({} B/s); "
        "lower network.*_rate",
        sum, r.device, r.link_bytes_per_s));
  }
  // Capabilities last: a configuration error is reported even on an unprivileged test run.
  if (std::string missing = probe.missing_capabilities(); !missing.empty()) {
    r.why_off = fmt::format(
        "traffic shaping off: thawd lacks {} (loading the classifier and changing {}'s qdisc "
        "need them; the packaged thawd.service grants them)",
        missing, r.device);
    return r;
  }
  r.enabled = true;
  return r;
}

}  // namespace thaw::daemon
