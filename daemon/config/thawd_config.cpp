#include "daemon/config/thawd_config.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "common/text/byte_size.hpp"

namespace thaw::daemon {

namespace {

using Fail = std::unexpected<ConfigError>;

std::string where(std::string_view origin, const toml::source_region& at) {
  return fmt::format("{}:{}:{}", origin, at.begin.line, at.begin.column);
}

Fail bad(std::string_view origin, const toml::node& node, std::string_view key,
         std::string_view problem) {
  return Fail(ConfigError{fmt::format("{}: {}: {}", where(origin, node.source()), key, problem)});
}

// Reads the keys of one table; refuses keys it does not know.
class Section {
 public:
  Section(const toml::table& root, std::string_view name, std::string_view origin)
      : origin_(origin), name_(name) {
    if (const toml::node* n = root.get(name)) table_ = n->as_table();
  }

  std::expected<void, ConfigError> only(std::initializer_list<std::string_view> known) const {
    if (table_ == nullptr) return {};
    for (const auto& [key, node] : *table_) {
      if (std::find(known.begin(), known.end(), key.str()) == known.end()) {
        std::string list;
        for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        return bad(origin_, node, fmt::format("{}.{}", name_, key.str()),
                   fmt::format("unknown key; [{}] takes {}", name_, list));
      }
    }
    return {};
  }

  const toml::node* get(std::string_view key) const {
    return table_ == nullptr ? nullptr : table_->get(key);
  }
  std::string key(std::string_view k) const { return fmt::format("{}.{}", name_, k); }
  std::string_view origin() const { return origin_; }
  const toml::table* table() const { return table_; }

 private:
  std::string_view origin_;
  std::string_view name_;
  const toml::table* table_ = nullptr;
};

std::expected<void, ConfigError> read_string(const Section& s, std::string_view k,
                                             std::string& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  auto v = n->value<std::string>();
  if (!v || !n->is_string()) return bad(s.origin(), *n, s.key(k), "must be a string");
  out = *v;
  return {};
}

std::expected<void, ConfigError> read_bool(const Section& s, std::string_view k, bool& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  auto v = n->value<bool>();
  if (!v || !n->is_boolean()) return bad(s.origin(), *n, s.key(k), "must be true or false");
  out = *v;
  return {};
}

std::expected<void, ConfigError> read_path(const Section& s, std::string_view k,
                                           std::filesystem::path& out) {
  std::string text = out.string();
  if (auto ok = read_string(s, k, text); !ok) return ok;
  if (text.empty() || text.front() != '/') {
    return bad(s.origin(), *s.get(k), s.key(k), fmt::format("'{}' is not an absolute path", text));
  }
  out = text;
  return {};
}

// coordinator.worker_preload: the shim's absolute path, or "" for workers launched without it
// (the agent then starts a worker once its stage's fetch is done: nothing would hold its reads).
std::expected<void, ConfigError> read_preload(const Section& s, std::string_view k,
                                              std::filesystem::path& out) {
  if (const toml::node* n = s.get(k);
      n != nullptr && n->is_string() && n->value<std::string>()->empty()) {
    out.clear();
    return {};
  }
  return read_path(s, k, out);
}

std::expected<void, ConfigError> read_count(const Section& s, std::string_view k,
                                            std::uint32_t& out, std::int64_t lo, std::int64_t hi) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  auto v = n->value<std::int64_t>();
  if (!n->is_integer() || !v) return bad(s.origin(), *n, s.key(k), "must be an integer");
  if (*v < lo || *v > hi) {
    return bad(s.origin(), *n, s.key(k), fmt::format("{} is outside {}..{}", *v, lo, hi));
  }
  out = static_cast<std::uint32_t>(*v);
  return {};
}

std::expected<void, ConfigError> read_size(const Section& s, std::string_view k,
                                           std::uint64_t& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  if (n->is_integer() && n->value<std::int64_t>().value_or(0) > 0) {
    out = static_cast<std::uint64_t>(*n->value<std::int64_t>());
    return {};
  }
  if (n->is_string()) {
    if (auto size = text::parse_byte_size(*n->value<std::string>())) {
      out = *size;
      return {};
    }
  }
  return bad(s.origin(), *n, s.key(k),
             "must be a size such as \"64GiB\", \"500GB\" or a number of bytes (> 0)");
}

// A rate: "" (no limit, the default) or a size per second such as "100MB" or "1GiB".
std::expected<void, ConfigError> read_rate(const Section& s, std::string_view k,
                                           std::uint64_t& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  if (n->is_string() && n->value<std::string>()->empty()) {
    out = 0;
    return {};
  }
  if (read_size(s, k, out)) return {};
  return bad(s.origin(), *n, s.key(k),
             "must be a rate in bytes per second such as \"100MB\" or \"1GiB\", or \"\" for "
             "no limit");
}

// A fraction in (0, 1]. NaN fails every comparison, so the range is tested as "inside",
// never as "not outside", and infinities are refused by name.
std::expected<void, ConfigError> read_fraction(const Section& s, std::string_view k, double& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  auto v = n->value<double>();
  if (!v || !(n->is_floating_point() || n->is_integer()) || !std::isfinite(*v) ||
      !(*v > 0 && *v <= 1)) {
    return bad(s.origin(), *n, s.key(k), "must be a finite number in (0, 1], e.g. 0.9");
  }
  out = *v;
  return {};
}

std::expected<void, ConfigError> read_cache_budget(const Section& s, std::uint64_t& out) {
  if (auto ok = read_size(s, "cache_budget", out); !ok) return ok;
  if (out < kMinCacheBudgetBytes) {
    return bad(s.origin(), *s.get("cache_budget"), s.key("cache_budget"),
               fmt::format("{} bytes holds no model, and thawd would evict everything cached "
                           "to fit it; give at least \"1MiB\" (a size such as \"64GiB\")",
                           out));
  }
  return {};
}

std::expected<void, ConfigError> read_metrics_listen(const Section& s, std::string& out) {
  if (auto ok = read_string(s, "listen", out); !ok) return ok;
  if (out.empty()) return {};
  const auto colon = out.rfind(':');
  const std::string host = colon == std::string::npos ? out : out.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : out.substr(colon + 1);
  const bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]";
  int p = 0;
  const bool port_ok = !port.empty() && port.find_first_not_of("0123456789") == std::string::npos &&
                       port.size() <= 5 && (p = std::stoi(port)) > 0 && p < 65536;
  if (!loopback || !port_ok) {
    return bad(s.origin(), *s.get("listen"), s.key("listen"),
               fmt::format("'{}' must be a loopback address and port, e.g. \"127.0.0.1:9400\" "
                           "(metrics are never served off the node), or \"\" for none",
                           out));
  }
  return {};
}

// network.shaping: "auto" (the default), true or false.
std::expected<void, ConfigError> read_shaping(const Section& s, ShapingMode& out) {
  const toml::node* n = s.get("shaping");
  if (n == nullptr) return {};
  if (n->is_boolean()) {
    out = *n->value<bool>() ? ShapingMode::on : ShapingMode::off;
    return {};
  }
  if (n->is_string() && *n->value<std::string>() == "auto") {
    out = ShapingMode::automatic;
    return {};
  }
  return bad(s.origin(), *n, s.key("shaping"),
             "must be \"auto\" (on when the uplink, its rate and thawd's capabilities allow), "
             "true (on, or thawd does not start) or false");
}

// A class's rate: a share of the link ("20%") or a rate in bytes per second ("100MB").
std::expected<void, ConfigError> read_class_rate(const Section& s, std::string_view k,
                                                 RateSetting& out) {
  const toml::node* n = s.get(k);
  if (n == nullptr) return {};
  if (n->is_string()) {
    const std::string text = *n->value<std::string>();
    if (!text.empty() && text.back() == '%') {
      const std::string number = text.substr(0, text.size() - 1);
      char* end = nullptr;
      const double percent = std::strtod(number.c_str(), &end);
      if (!number.empty() && end == number.c_str() + number.size() && std::isfinite(percent) &&
          percent > 0 && percent <= 100) {
        out = RateSetting{0, percent / 100};
        return {};
      }
    } else if (auto size = text::parse_byte_size(text)) {
      out = RateSetting{*size, 0};
      return {};
    }
  } else if (n->is_integer() && n->value<std::int64_t>().value_or(0) > 0) {
    out = RateSetting{static_cast<std::uint64_t>(*n->value<std::int64_t>()), 0};
    return {};
  }
  return bad(s.origin(), *n, s.key(k),
             "must be a share of the link such as \"20%\" (0 to 100 %) or a rate in bytes per "
             "second such as \"100MB\"");
}

std::expected<void, ConfigError> read_network(const Section& s, NetworkSettings& out) {
  if (auto ok = read_shaping(s, out.mode); !ok) return ok;
  if (auto ok = read_string(s, "uplink", out.uplink); !ok) return ok;
  if (auto ok = read_rate(s, "link_rate", out.link_rate); !ok) return ok;
  if (auto ok = read_bool(s, "clamp_fetch_windows", out.clamp_fetch_windows); !ok) return ok;
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    const std::string name(to_string(static_cast<NetClass>(i)));
    if (auto ok = read_class_rate(s, name + "_rate", out.classes[i].guaranteed); !ok) return ok;
    if (auto ok = read_class_rate(s, name + "_ceil", out.classes[i].ceil); !ok) return ok;
  }
  if (const toml::node* n = s.get("inference_ports")) {
    const toml::array* ports = n->as_array();
    if (ports == nullptr) {
      return bad(s.origin(), *n, s.key("inference_ports"),
                 "must be an array of port numbers, e.g. [8000, 8080]");
    }
    for (const toml::node& p : *ports) {
      const auto v = p.value<std::int64_t>();
      if (!p.is_integer() || !v || *v < 1 || *v > 65535) {
        return bad(s.origin(), p, s.key("inference_ports"),
                   "every entry must be a port number in 1..65535");
      }
      out.inference_ports.push_back(static_cast<std::uint16_t>(*v));
    }
  }
  if (auto ok = validate_network_settings(out); !ok) {
    // Cross-key: the section's place, and the keys the message names.
    return Fail(ConfigError{fmt::format(
        "{}: {}", s.table() ? where(s.origin(), s.table()->source()) : std::string(s.origin()),
        ok.error())});
  }
  return {};
}

// The file's text, or why it is not a configuration file thawd will read. Opened without
// blocking (a FIFO's open waits for a writer otherwise) and checked before any read.
std::expected<std::string, ConfigError> read_config_file(const std::filesystem::path& path) {
  auto fail = [&](std::string_view why) {
    return Fail(ConfigError{fmt::format("{}: {}", path.string(), why)});
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == EACCES)
      return fail("cannot be read; check its permissions (thawd reads it as root)");
    return fail(fmt::format("cannot be opened: {}", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(fmt::format("cannot be read: {}", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) return fail("is a directory; give the path of the TOML file");
  if (!S_ISREG(st.st_mode)) {
    return fail(
        "is not a regular file (a FIFO, socket or device); give the path of the TOML "
        "file");
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
    return fail(
        fmt::format("is {} bytes, more than a configuration file can be ({}); is it "
                    "the right file?",
                    st.st_size, kMaxConfigBytes));
  }
  // The size is checked again while reading: a file may grow, and some (in /proc) report 0.
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(fmt::format("cannot be read: {}", std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigBytes) {
      return fail(
          fmt::format("is more than {} bytes, more than a configuration file can be; is "
                      "it the right file?",
                      kMaxConfigBytes));
    }
  }
  return text;
}

}  // namespace

std::expected<ThawdConfig, ConfigError> parse_config(std::string_view text,
                                                     std::string_view origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return Fail(ConfigError{fmt::format("{}: {}; fix the TOML syntax there",
                                        where(origin, e.source()), e.description())});
  }
  static const std::set<std::string_view> kSections = {"node", "store",   "gpu",         "shim",
                                                       "dbus", "metrics", "coordinator", "network"};
  for (const auto& [key, node] : root) {
    if (!kSections.contains(key.str()) || !node.is_table()) {
      return bad(origin, node, key.str(),
                 node.is_table() ? "unknown section; thawd.toml has [node], [store], [gpu], "
                                   "[shim], [dbus], [metrics], [coordinator] and [network]"
                                 : "top-level keys belong in a section such as [store]");
    }
  }
  ThawdConfig c;
  const Section node(root, "node", origin), store(root, "store", origin), gpu(root, "gpu", origin),
      shim(root, "shim", origin), dbus(root, "dbus", origin), metrics(root, "metrics", origin),
      coordinator(root, "coordinator", origin), network(root, "network", origin);
  for (auto ok :
       {node.only({"id", "state_dir"}),
        store.only({"cache_dir", "cache_budget", "registry", "connections", "max_rate",
                    "allow_unverified"}),
        gpu.only({"pool_share", "max_slots"}), shim.only({"socket", "allow_groups"}),
        dbus.only({"bus"}), metrics.only({"listen"}),
        coordinator.only({"endpoint", "server_key", "key", "network", "pcie", "worker_command",
                          "worker_preload", "worker_host"}),
        network.only({"shaping", "uplink", "link_rate", "inference_rate", "inference_ceil",
                      "critical_rate", "critical_ceil", "background_rate", "background_ceil",
                      "other_rate", "other_ceil", "inference_ports", "clamp_fetch_windows"})}) {
    if (!ok) return Fail(ok.error());
  }
  for (auto ok :
       {read_string(node, "id", c.node_id), read_path(node, "state_dir", c.state_dir),
        read_path(store, "cache_dir", c.cache_dir), read_cache_budget(store, c.cache_budget_bytes),
        read_string(store, "registry", c.registry),
        read_count(store, "connections", c.connections, 1, 256),
        read_rate(store, "max_rate", c.max_rate_bytes_per_s),
        read_bool(store, "allow_unverified", c.allow_unverified),
        read_count(gpu, "max_slots", c.max_slots, 1, 64), read_path(shim, "socket", c.socket_path),
        read_string(dbus, "bus", c.bus), read_metrics_listen(metrics, c.metrics_listen),
        read_string(coordinator, "endpoint", c.coordinator_endpoint),
        read_path(coordinator, "server_key", c.coordinator_key),
        read_path(coordinator, "key", c.node_key),
        read_rate(coordinator, "network", c.network_bytes_per_s),
        read_rate(coordinator, "pcie", c.pcie_bytes_per_s),
        read_preload(coordinator, "worker_preload", c.worker_preload),
        read_string(coordinator, "worker_host", c.worker_host)}) {
    if (!ok) return Fail(ok.error());
  }
  if (auto ok = read_fraction(gpu, "pool_share", c.pool_share); !ok) return Fail(ok.error());
  if (auto ok = read_network(network, c.network); !ok) return Fail(ok.error());
  if (const toml::node* n = shim.get("allow_groups")) {
    const toml::array* groups = n->as_array();
    if (groups == nullptr) {
      return bad(origin, *n, "shim.allow_groups", "must be an array of group names");
    }
    c.allow_groups.clear();
    for (const toml::node& g : *groups) {
      auto name = g.value<std::string>();
      if (!g.is_string() || !name || name->empty()) {
        return bad(origin, g, "shim.allow_groups", "every entry must be a group name");
      }
      c.allow_groups.push_back(*name);
    }
  }
  if (const toml::node* n = coordinator.get("worker_command")) {
    const toml::array* argv = n->as_array();
    if (argv == nullptr || argv->empty()) {
      return bad(origin, *n, "coordinator.worker_command",
                 "must be a non-empty array: the program's absolute path, then its arguments");
    }
    for (const toml::node& a : *argv) {
      if (!a.is_string()) {
        return bad(origin, a, "coordinator.worker_command", "every entry must be a string");
      }
      c.worker_command.push_back(*a.value<std::string>());
    }
    if (c.worker_command.front().empty() || c.worker_command.front().front() != '/') {
      return bad(origin, *n, "coordinator.worker_command",
                 fmt::format("'{}' is not an absolute path", c.worker_command.front()));
    }
  }
  if (!c.coordinator_endpoint.empty() && !c.coordinator_endpoint.starts_with("tcp://") &&
      !c.coordinator_endpoint.starts_with("ipc://")) {
    return bad(origin, *coordinator.get("endpoint"), "coordinator.endpoint",
               fmt::format("'{}' is not a ZeroMQ address such as \"tcp://coord.internal:5570\"",
                           c.coordinator_endpoint));
  }
  if (c.bus != "system" && c.bus != "user" && c.bus.find(':') == std::string::npos) {
    return bad(origin, *dbus.get("bus"), "dbus.bus",
               fmt::format("'{}' is not \"system\", \"user\" or a D-Bus address such as "
                           "\"unix:path=/run/thaw/test-bus\"",
                           c.bus));
  }
  return c;
}

std::expected<ThawdConfig, ConfigError> load_config(const std::filesystem::path& path,
                                                    ConfigFile need) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    if (need == ConfigFile::optional) return ThawdConfig{};
    return Fail(ConfigError{
        fmt::format("{}: no such file; give the path of an existing TOML file (without -c, "
                    "thawd reads {} and uses the defaults if it is missing)",
                    path.string(), kDefaultConfigPath)});
  }
  auto text = read_config_file(path);
  if (!text) return Fail(text.error());
  return parse_config(*text, path.string());
}

std::vector<std::string> restart_needed(const ThawdConfig& a, const ThawdConfig& b) {
  std::vector<std::string> out;
  if (a.node_id != b.node_id) out.push_back("node.id");
  if (a.state_dir != b.state_dir) out.push_back("node.state_dir");
  if (a.cache_dir != b.cache_dir) out.push_back("store.cache_dir");
  if (a.cache_budget_bytes != b.cache_budget_bytes) out.push_back("store.cache_budget");
  if (a.pool_share != b.pool_share) out.push_back("gpu.pool_share");
  if (a.max_slots != b.max_slots) out.push_back("gpu.max_slots");
  if (a.socket_path != b.socket_path) out.push_back("shim.socket");
  if (a.bus != b.bus) out.push_back("dbus.bus");
  if (a.metrics_listen != b.metrics_listen) out.push_back("metrics.listen");
  if (a.coordinator_endpoint != b.coordinator_endpoint) out.push_back("coordinator.endpoint");
  if (a.coordinator_key != b.coordinator_key) out.push_back("coordinator.server_key");
  if (a.node_key != b.node_key) out.push_back("coordinator.key");
  if (a.network_bytes_per_s != b.network_bytes_per_s) out.push_back("coordinator.network");
  if (a.pcie_bytes_per_s != b.pcie_bytes_per_s) out.push_back("coordinator.pcie");
  if (a.worker_command != b.worker_command) out.push_back("coordinator.worker_command");
  if (a.worker_preload != b.worker_preload) out.push_back("coordinator.worker_preload");
  if (a.worker_host != b.worker_host) out.push_back("coordinator.worker_host");
  if (a.network != b.network) out.push_back("network");
  return out;
}

}  // namespace thaw::daemon
