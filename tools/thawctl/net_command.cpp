// thawctl net: traffic shaping on the node's uplink (GetNetwork): whether it runs and why
// not, the rates in force per class and where they come from, and each class's counters.
#include <fmt/format.h>

#include "commands.hpp"
#include "common/text/byte_size.hpp"

namespace thawctl {

namespace {

std::string rate(std::uint64_t bytes_per_s) {
  return bytes_per_s == 0 ? "-" : thaw::text::format_bytes(static_cast<double>(bytes_per_s)) + "/s";
}

}  // namespace

int net(sd_bus* bus, const Options& o) {
  Reply reply = call(bus, "GetNetwork", {});
  sd_bus_message* m = reply.get();
  int enabled = 0;
  const char *detail = nullptr, *device = nullptr, *rates_from = nullptr;
  std::uint64_t link = 0, per_cold_start = 0;
  std::uint32_t cold_starts = 0;
  if (sd_bus_message_read(m, "bsstsut", &enabled, &detail, &device, &link, &rates_from,
                          &cold_starts, &per_cold_start) < 0) {
    fail("malformed reply from thawd (GetNetwork)");
  }
  nlohmann::json classes = nlohmann::json::array();
  int r = sd_bus_message_enter_container(m, 'a', "(stttttttt)");
  while (r >= 0) {
    const char* name = nullptr;
    std::uint64_t v[8] = {};
    r = sd_bus_message_read(m, "(stttttttt)", &name, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                            &v[6], &v[7]);
    if (r <= 0) break;
    classes.push_back({{"class", name},
                       {"rate_bytes_per_s", v[0]},
                       {"ceil_bytes_per_s", v[1]},
                       {"egress", {{"bytes", v[2]}, {"packets", v[3]}, {"drops", v[4]}}},
                       {"ingress", {{"bytes", v[5]}, {"packets", v[6]}, {"drops", v[7]}}}});
  }
  if (r < 0) fail(fmt::format("malformed reply from thawd (GetNetwork): {}", std::strerror(-r)));
  // Per-model bytes (absent from a thawd older than them: an empty list).
  nlohmann::json models = nlohmann::json::array();
  if ((r = sd_bus_message_exit_container(m)) >= 0 &&
      (r = sd_bus_message_enter_container(m, 'a', "(qst)")) > 0) {
    for (;;) {
      std::uint16_t id = 0;
      const char* name = nullptr;
      std::uint64_t bytes = 0;
      r = sd_bus_message_read(m, "(qst)", &id, &name, &bytes);
      if (r <= 0) break;
      models.push_back({{"id", id}, {"model", name}, {"bytes", bytes}});
    }
  }
  if (r < 0) fail(fmt::format("malformed reply from thawd (GetNetwork): {}", std::strerror(-r)));
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"enabled", enabled != 0},
                                      {"detail", detail},
                                      {"device", device},
                                      {"link_bytes_per_s", link},
                                      {"rates_from", rates_from},
                                      {"cold_starts", cold_starts},
                                      {"per_cold_start_bytes_per_s", per_cold_start},
                                      {"classes", classes},
                                      {"models", models}}
                           .dump());
    return kExitOk;
  }
  fmt::print("shaping:  {}\n", enabled != 0 ? "on" : "off");
  fmt::print("          {}\n", detail);
  if (*device != '\0') fmt::print("uplink:   {} at {}\n", device, rate(link));
  if (std::string_view(rates_from) == "coordinator") {
    fmt::print("rates:    from the coordinator: {} cold start(s) here, {} each\n", cold_starts,
               rate(per_cold_start));
  } else {
    fmt::print("rates:    from thawd.toml [network]\n");
  }
  fmt::print("\n{:<17} {:>12} {:>12} {:>11} {:>9} {:>11} {:>9}\n", "CLASS", "RATE", "CEIL",
             "RX BYTES", "RX DROPS", "TX BYTES", "TX DROPS");
  for (const auto& c : classes) {
    fmt::print("{:<17} {:>12} {:>12} {:>11} {:>9} {:>11} {:>9}\n", c["class"].get<std::string>(),
               rate(c["rate_bytes_per_s"].get<std::uint64_t>()),
               rate(c["ceil_bytes_per_s"].get<std::uint64_t>()),
               thaw::text::format_bytes(c["ingress"]["bytes"].get<double>()),
               c["ingress"]["drops"].get<std::uint64_t>(),
               thaw::text::format_bytes(c["egress"]["bytes"].get<double>()),
               c["egress"]["drops"].get<std::uint64_t>());
  }
  if (!models.empty()) {
    fmt::print("\n{:<6} {:<40} {:>11}\n", "ID", "MODEL", "BYTES");
    for (const auto& m : models) {
      fmt::print("{:<6} {:<40} {:>11}\n", m["id"].get<std::uint16_t>(),
                 m["model"].get<std::string>(), thaw::text::format_bytes(m["bytes"].get<double>()));
    }
  }
  return kExitOk;
}

}  // namespace thawctl
