// thaw-coordinator: the cluster's control plane (see coordinator/server/coordinator_server.hpp).
//
//   thaw-coordinator keygen PREFIX        a CURVE key pair: PREFIX.key (0600), PREFIX.pub
//   thaw-coordinator serve [options]      serve node agents and frontends until SIGTERM
#include <fmt/format.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <syslog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/zmq/curve_keys.hpp"
#include "coordinator/server/coordinator_server.hpp"

namespace {

// Lines for journald when run under systemd ("<N>" priority prefixes), plain otherwise.
bool verbose = false;

void log_line(int priority, const std::string& line) {
  if (priority >= LOG_DEBUG && !verbose) return;
  static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  if (journal) {
    fmt::print(stderr, "<{}>{}\n", priority, line);
  } else {
    static constexpr const char* kNames[] = {"emerg",   "alert",  "crit", "error",
                                             "warning", "notice", "info", "debug"};
    fmt::print(stderr, "thaw-coordinator: {}: {}\n", kNames[priority & 7], line);
  }
  std::fflush(stderr);
}

double parse_seconds(const std::string& text) {
  std::size_t used = 0;
  double v = std::stod(text, &used);
  const std::string unit = text.substr(used);
  if (unit == "ms") return v / 1000;
  if (unit == "s" || unit.empty()) return v;
  throw std::invalid_argument("unit");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "thaw-coordinator: places cold starts across thawd nodes (HydraServe's Alg. 1), watches "
      "their heartbeats and re-plans a dead node's stages"};
  app.require_subcommand(1);

  std::string prefix;
  auto* keygen = app.add_subcommand("keygen",
                                    "write a CURVE key pair: PREFIX.key (secret, "
                                    "mode 600) and PREFIX.pub");
  keygen->add_option("prefix", prefix, "path without extension, e.g. /etc/thaw/coordinator")
      ->required();

  thaw::coordinator::ServerOptions options;
  std::string key_file = "/etc/thaw/coordinator.key";
  std::string heartbeat = "1s";
  int liveness = 3;
  auto* serve = app.add_subcommand("serve", "serve node agents and frontends until SIGTERM");
  serve->add_option("--nodes", options.node_endpoint, "ZeroMQ endpoint for node agents (CURVE)")
      ->capture_default_str();
  serve
      ->add_option("--frontend", options.frontend_endpoint,
                   "ZeroMQ endpoint for frontends and thawctl cluster (not encrypted: loopback "
                   "or ipc://)")
      ->capture_default_str();
  serve->add_option("--key", key_file, "the coordinator's secret key file (keygen)")
      ->capture_default_str();
  options.allowed_nodes = "/etc/thaw/nodes.d";
  serve
      ->add_option("--allow", options.allowed_nodes,
                   "directory of admitted nodes' public keys, one <node-id>.pub each")
      ->capture_default_str();
  serve->add_option("--heartbeat", heartbeat, "heartbeat interval (e.g. 1s, 250ms)")
      ->capture_default_str();
  serve->add_option("--liveness", liveness, "heartbeats missed before a node is declared dead")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  std::string window = "300s";
  serve
      ->add_option("--window", window,
                   "WarmServe's load window: load reports are averaged per window and the "
                   "prewarmed replicas re-planned at each window's end")
      ->capture_default_str();
  serve
      ->add_option("--batch-size", options.cluster.batch_size,
                   "requests one instance serves at once (WarmServe's B)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  serve->add_flag("--verbose", verbose, "also log debug lines (sends to disconnected nodes...)");
  serve->add_flag("--launch-workers", options.cluster.launch_workers,
                  "plans also launch an engine per stage (the agents' worker command)");
  std::uint32_t port_base = options.cluster.worker_port_base;
  std::uint32_t port_count = options.cluster.worker_port_count;
  serve
      ->add_option("--worker-ports", port_base,
                   "first port handed to workers for pipeline links and HTTP (on every node)")
      ->check(CLI::Range(1024, 65535))
      ->capture_default_str();
  serve->add_option("--worker-port-count", port_count, "how many ports from --worker-ports on")
      ->check(CLI::Range(16, 60000))
      ->capture_default_str();
  std::string handover = "drain";
  serve
      ->add_option("--handover", handover,
                   "how in-flight requests leave a consolidating pipeline: drain (any engine) or "
                   "kv-transfer (the engine's KV-transfer endpoints; falls back to drain)")
      ->check(CLI::IsMember({"drain", "kv-transfer"}))
      ->capture_default_str();
  // Alg. 1's start-up costs until the nodes have measured some (HydraServe §4.1, Eq. 5).
  auto& costs = options.cluster.startup;
  costs = {.runtime_init = 4, .container = 1, .cuda_context = 1, .library_load = 2};
  serve->add_option("--t-cc", costs.container, "seconds: container/process creation (t_cc)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  serve->add_option("--t-cu", costs.cuda_context, "seconds: CUDA context initialisation (t_cu)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  serve->add_option("--t-l", costs.library_load, "seconds: library loading / engine init (t_l)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  serve->add_option("--t-n", costs.network_hop, "seconds: one hop between pipeline stages (t_n)")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  bool fixed_costs = false;
  serve->add_flag("--fixed-startup-costs", fixed_costs,
                  "use the --t-* costs even when nodes report measured start-ups");
  serve
      ->add_option("--keep-alive", options.cluster.keep_alive_s,
                   "seconds an idle consolidated worker is kept before it is released")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (port_base + port_count > 65536) {
    fmt::print(stderr, "thaw-coordinator: --worker-ports {} + --worker-port-count {} pass 65535\n",
               port_base, port_count);
    return 2;
  }
  options.cluster.worker_port_base = port_base;
  options.cluster.worker_port_count = port_count;
  options.cluster.handover = handover == "kv-transfer"
                                 ? thaw::coordinator::ClusterConfig::Handover::kv_transfer
                                 : thaw::coordinator::ClusterConfig::Handover::drain;
  costs.runtime_init = costs.container + costs.cuda_context + costs.library_load;
  options.cluster.measured_startup = !fixed_costs;

  if (keygen->parsed()) {
    auto pair = thaw::zmqx::write_key_pair(prefix);
    if (!pair) {
      fmt::print(stderr, "thaw-coordinator keygen: {}\n", pair.error());
      return 1;
    }
    fmt::print("{}.key (secret) and {}.pub written; public key {}\n", prefix, prefix,
               pair->public_z85);
    return 0;
  }

  try {
    options.cluster.heartbeat_interval_s = parse_seconds(heartbeat);
  } catch (const std::exception&) {
    fmt::print(stderr, "thaw-coordinator: --heartbeat {}: not a duration (e.g. 1s, 250ms)\n",
               heartbeat);
    return 2;
  }
  if (options.cluster.heartbeat_interval_s < 0.01 || options.cluster.heartbeat_interval_s > 600) {
    fmt::print(stderr, "thaw-coordinator: --heartbeat {}: must be 10ms to 600s\n", heartbeat);
    return 2;
  }
  options.cluster.liveness = liveness;
  try {
    options.cluster.window_s = parse_seconds(window);
  } catch (const std::exception&) {
    options.cluster.window_s = 0;
  }
  if (options.cluster.window_s < 1 || options.cluster.window_s > 86400) {
    fmt::print(stderr, "thaw-coordinator: --window {}: must be a duration from 1s to 86400s\n",
               window);
    return 2;
  }
  auto key = thaw::zmqx::load_secret_key(key_file);
  if (!key) {
    fmt::print(stderr,
               "thaw-coordinator: --key: {} (make one with: thaw-coordinator keygen "
               "/etc/thaw/coordinator)\n",
               key.error());
    return 1;
  }
  options.key = *key;
  // Plan ids stay unique across restarts: a restarted coordinator rebuilds older plans.
  options.cluster.plan_prefix = fmt::format("p{:x}", static_cast<unsigned long>(::time(nullptr)));
  options.log = log_line;

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);  // before ZeroMQ starts its threads
  const int stop_fd = signalfd(-1, &mask, SFD_CLOEXEC);

  auto server = thaw::coordinator::CoordinatorServer::start(std::move(options));
  if (!server) {
    fmt::print(stderr, "thaw-coordinator: {}\n", server.error());
    return 1;
  }
  log_line(LOG_NOTICE, fmt::format("serving nodes on {} (public key {}), frontends on {}",
                                   (*server)->node_endpoint(), key->public_z85,
                                   (*server)->frontend_endpoint()));
  try {
    (*server)->run(stop_fd);
  } catch (const std::exception& e) {
    log_line(LOG_ERR, fmt::format("stopping on an unexpected error: {}", e.what()));
    ::close(stop_fd);
    return 1;
  }
  log_line(LOG_NOTICE, "stopping");
  ::close(stop_fd);
  return 0;
}
