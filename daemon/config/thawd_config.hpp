// thawd's configuration: /etc/thaw/thawd.toml (see packaging/thawd.toml for every key with
// its default). Every key is optional; an unknown key, a value of the wrong type or out of
// range is an error naming the file, line, column and key, and saying what is accepted —
// a typo must not silently leave a default in place. Numbers must be finite: `nan` and
// `inf` are valid TOML but never a valid setting.
//
// reloadable() says which settings SIGHUP may change while thawd runs; the others need a
// restart (thawd says so in its log when a reload tries to change them).
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/network/network_config.hpp"

namespace thaw::daemon {

inline constexpr const char* kDefaultConfigPath = "/etc/thaw/thawd.toml";

struct ThawdConfig {
  // [node]
  std::string node_id;  // "" = the machine id (/etc/machine-id), else the hostname
  std::filesystem::path state_dir = "/var/lib/thaw";  // engines' recorded artifacts
  // [store]
  std::filesystem::path cache_dir = "/var/cache/thaw";
  std::uint64_t cache_budget_bytes = 64ull << 30;
  std::string registry;                    // "" = none: Fetch needs a registry argument
  std::uint32_t connections = 8;           // parallel HTTP connections per fetch
  std::uint64_t max_rate_bytes_per_s = 0;  // all of a fetch's downloads together; 0 = no limit
  // Fetch models published without thaw-manifest.json (nothing to check their bytes
  // against); they show as unverified. Off: such a fetch fails saying how to publish.
  bool allow_unverified = false;
  // [gpu]
  double pool_share = 0.9;  // of each GPU's memory, for prewarm slots and KV
  std::uint32_t max_slots = 8;
  // [shim]
  std::filesystem::path socket_path = "/run/thaw/thawd.sock";
  std::vector<std::string> allow_groups = {"thaw"};  // besides root
  // [dbus]
  std::string bus = "system";  // "system", "user", or a D-Bus address ("unix:path=...")
  // [metrics]
  std::string metrics_listen;  // "" = off; "127.0.0.1:PORT" or "[::1]:PORT" (loopback only)
  // [coordinator]: thawd's cluster agent (daemon/agent)
  std::string coordinator_endpoint;  // "" = no coordinator; e.g. "tcp://coord.internal:5570"
  std::filesystem::path coordinator_key = "/etc/thaw/coordinator.pub";  // its public key
  std::filesystem::path node_key = "/etc/thaw/node.key";  // this node's secret key (mode 600)
  std::uint64_t network_bytes_per_s = 0;  // the node's link (HydraServe's B); 0 = unknown
  std::uint64_t pcie_bytes_per_s = 0;     // host → GPU; 0 = unknown
  // launch-worker tasks: argv with {model} {key} {stage} {stages} {gpu} {plan} {pp_rank}
  // {pp_size} {peers} {port} {layer_begin} {layer_end} {timeline} replaced (task_runner.hpp)
  std::vector<std::string> worker_command;
  // This node's address for its workers' pipeline links and HTTP ports, as other nodes and
  // gateways reach it; "" : pipelines are not wired across nodes to it.
  std::string worker_host;
  // The shim, set as each worker's LD_PRELOAD; empty: workers run without it, each launched
  // once its stage's fetch is done (a baseline without thaw's streaming).
  std::filesystem::path worker_preload = "/usr/lib/x86_64-linux-gnu/libthaw-preload.so";
  // [network]: traffic shaping of the uplink (daemon/network/network_config.hpp)
  NetworkSettings network;

  bool operator==(const ThawdConfig&) const = default;
};

struct ConfigError {
  std::string message;  // "<file>:<line>:<column>: <key>: <what is wrong>; <what to do>"
};

std::expected<ThawdConfig, ConfigError> parse_config(std::string_view toml_text,
                                                     std::string_view origin);
// The smallest store.cache_budget accepted: below it no model fits, and the start-up
// re-index would evict everything cached (a budget of "1" is a typo, not a wish).
inline constexpr std::uint64_t kMinCacheBudgetBytes = 1ull << 20;
// The largest configuration file read: thawd.toml is a few KiB; more is a wrong path.
inline constexpr std::uint64_t kMaxConfigBytes = 1ull << 20;

// Whether the file must exist: the compiled-in default path may be missing (a fresh install
// has none: the defaults apply), a path given with -c may not (a typo there must not start
// thawd on the system paths).
enum class ConfigFile { optional, required };

// Reads a regular file of at most kMaxConfigBytes; a FIFO, a device or a directory is refused
// (never read, so /dev/zero or a FIFO cannot hang or exhaust the caller).
std::expected<ThawdConfig, ConfigError> load_config(const std::filesystem::path& path,
                                                    ConfigFile need = ConfigFile::optional);

// Settings that differ between `before` and `after` and cannot change without a restart.
std::vector<std::string> restart_needed(const ThawdConfig& before, const ThawdConfig& after);

}  // namespace thaw::daemon
