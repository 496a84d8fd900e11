// thawd: the node daemon. See daemon/lifecycle/thawd.hpp for its life cycle and
// packaging/thawd.toml for its configuration.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "daemon/config/thawd_config.hpp"
#include "daemon/lifecycle/thawd.hpp"
#include "daemon/log/log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"thawd: keeps models fetched, streamed and prewarmed on this GPU node"};
  std::string config_path = thaw::daemon::kDefaultConfigPath;
  bool check = false;
  app.add_option("-c,--config", config_path, "configuration file (TOML)")->capture_default_str();
  app.add_flag("--check-config", check, "validate the configuration, print it, and exit");
  app.footer(
      "Run by systemd as thawd.service (Type=notify). Signals: SIGTERM/SIGINT stop cleanly,\n"
      "SIGHUP re-reads the configuration (store.registry, store.connections and\n"
      "shim.allow_groups change live; the rest at the next restart).");
  CLI11_PARSE(app, argc, argv);
  // Only the compiled-in default may be missing (a fresh install has none): a path someone
  // typed that does not exist must stop thawd, not start it on the system paths.
  const auto need = app.count("--config") > 0 ? thaw::daemon::ConfigFile::required
                                              : thaw::daemon::ConfigFile::optional;

  if (check) {
    auto config = thaw::daemon::load_config(config_path, need);
    if (!config) {
      fmt::print(stderr, "thawd: {}\n", config.error().message);
      return 1;
    }
    fmt::print("{}: valid (cache {} at {}, {} GPU pool share, socket {}, bus {})\n", config_path,
               config->cache_budget_bytes, config->cache_dir.string(), config->pool_share,
               config->socket_path.string(), config->bus);
    return 0;
  }
  auto notifier = thaw::daemon::make_systemd_notifier();
  auto daemon = thaw::daemon::Thawd::start(config_path, need, *notifier);
  if (!daemon) {
    thaw::daemon::log(thaw::daemon::LogLevel::error, daemon.error());
    notifier->status("failed to start: " + daemon.error());
    return 1;
  }
  return (*daemon)->run();
}
