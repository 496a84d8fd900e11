#include "config.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string_view>

namespace emu {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// An on/off setting: 0/off/false or 1/on/true.
std::expected<bool, std::string> parse_switch(const char* var, const char* text) {
  const std::string s(text);
  if (s == "0" || s == "off" || s == "false") return false;
  if (s == "1" || s == "on" || s == "true") return true;
  return std::unexpected(fmt::format("{}='{}' must be 0 or 1", var, text));
}

std::expected<double, std::string> parse_positive(const char* var, const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v > 0) || !std::isfinite(v)) {
    return std::unexpected(fmt::format("{}='{}' is not a positive number", var, text));
  }
  return v;
}

}  // namespace

std::expected<std::uint64_t, std::string> parse_size(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(v > 0)) return std::unexpected("not a size");
  std::string suffix(end);
  double mult = 1;
  if (suffix == "" || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "k") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "GiB") {
    mult = 1ull << 30;
  } else if (suffix == "T" || suffix == "TiB") {
    mult = 1ull << 40;
  } else {
    return std::unexpected("unknown suffix '" + suffix + "'");
  }
  return static_cast<std::uint64_t>(v * mult);
}

std::expected<Config, std::string> config_from_env() {
  Config c;
  if (const char* v = env("THAW_EMU_DEVICES")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 64) {
      return std::unexpected(fmt::format("THAW_EMU_DEVICES='{}' is not a device count (0..64)", v));
    }
    c.device_count = static_cast<int>(n);
  }
  std::vector<std::uint64_t> sizes;
  if (const char* v = env("THAW_EMU_DEVICE_MEMORY")) {
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto s = parse_size(item);
      if (!s || *s < (2u << 20)) {
        return std::unexpected(fmt::format(
            "THAW_EMU_DEVICE_MEMORY='{}': '{}' is not a size of at least 2M (use e.g. 80G, 512M, "
            "or one size per device separated by commas)",
            v, item));
      }
      sizes.push_back(*s);
    }
    if (sizes.size() > 1 && static_cast<int>(sizes.size()) != c.device_count) {
      return std::unexpected(fmt::format(
          "THAW_EMU_DEVICE_MEMORY='{}' lists {} sizes for {} devices (THAW_EMU_DEVICES)", v,
          sizes.size(), c.device_count));
    }
  }
  if (sizes.empty()) sizes.push_back(80ull << 30);
  for (int i = 0; i < c.device_count; ++i) {
    // Round down to the 2 MiB granularity: a device's memory is a whole number of pages.
    std::uint64_t s = sizes.size() == 1 ? sizes[0] : sizes[i];
    c.device_memory.push_back(s & ~((2ull << 20) - 1));
  }
  if (const char* v = env("THAW_EMU_DEVICE_NAME")) c.device_name = v;
  if (const char* v = env("THAW_EMU_STATE_DIR")) c.state_dir = v;
  for (auto [var, field] :
       {std::pair{"THAW_EMU_TIMING", &c.timing}, std::pair{"THAW_EMU_PREFAULT", &c.prefault}}) {
    if (const char* v = env(var)) {
      auto b = parse_switch(var, v);
      if (!b) return std::unexpected(b.error());
      *field = *b;
    }
  }
  if (const char* v = env("THAW_EMU_PCIE_GBPS")) {
    auto g = parse_positive("THAW_EMU_PCIE_GBPS", v);
    if (!g) return std::unexpected(g.error());
    c.pcie_bytes_per_s = *g * 1e9;
  }
  if (const char* v = env("THAW_EMU_D2D_GBPS")) {
    auto g = parse_positive("THAW_EMU_D2D_GBPS", v);
    if (!g) return std::unexpected(g.error());
    c.d2d_bytes_per_s = *g * 1e9;
  }
  for (auto [var, field] : {std::pair{"THAW_EMU_PAGE_LATENCY_US", &c.page_latency},
                            std::pair{"THAW_EMU_LAUNCH_LATENCY_US", &c.launch_latency},
                            std::pair{"THAW_EMU_CAPTURE_NODE_US", &c.capture_node_cost},
                            std::pair{"THAW_EMU_INSTANTIATE_NODE_US", &c.instantiate_node_cost},
                            std::pair{"THAW_EMU_GRAPH_NODE_LATENCY_US", &c.graph_node_latency}}) {
    if (const char* v = env(var)) {
      char* end = nullptr;
      double us = std::strtod(v, &end);
      if (end == v || *end != '\0' || us < 0 || !std::isfinite(us)) {
        return std::unexpected(fmt::format("{}='{}' is not a number of microseconds", var, v));
      }
      *field = std::chrono::nanoseconds(static_cast<std::int64_t>(us * 1000));
    }
  }
  if (const char* v = env("THAW_EMU_CARVEOUT_DEFAULT")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < -1 || n > 100) {
      return std::unexpected(fmt::format(
          "THAW_EMU_CARVEOUT_DEFAULT='{}' is not a carveout: a percentage 0..100, or -1 "
          "(CU_SHAREDMEM_CARVEOUT_DEFAULT, what the emulator answers without it)",
          v));
    }
    c.reported_carveout_default = static_cast<std::uint32_t>(n);  // -1 is 0xffffffff
  }
  if (const char* v = env("THAW_EMU_CLUSTER_DEFAULT")) {
    if (std::string_view(v) != "0" && std::string_view(v) != "1") {
      return std::unexpected(fmt::format(
          "THAW_EMU_CLUSTER_DEFAULT='{}' is not 0 (a node without a cluster answers [0, 0, 0]) "
          "or 1 (it answers [1, 1, 1])",
          v));
    }
    c.reported_cluster_default = v[0] == '1' ? 1 : 0;
  }
  if (const char* v = env("THAW_EMU_TRACE")) c.trace_path = v;
  if (const char* v = env("THAW_EMU_FAULTS")) c.faults_spec = v;
  return c;
}

}  // namespace emu
