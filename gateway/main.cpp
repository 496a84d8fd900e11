// thaw-gateway: the cluster's OpenAI-compatible front door (gateway/gateway_server.hpp).
//
//   thaw-gateway --coordinator ipc:///run/thaw-coordinator/frontend.sock   routes from the
//                coordinator, cold starts asked of it, load reported to it
//   thaw-gateway --route gpt2=http://127.0.0.1:8000 [--route ...]         a fixed table
#include <fmt/format.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <syslog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "gateway/coordinator_link.hpp"
#include "gateway/gateway_server.hpp"
#include "gateway/route_flags.hpp"

namespace {

bool verbose = false;

void log_line(int priority, const std::string& line) {
  if (priority >= LOG_DEBUG && !verbose) return;
  static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  if (journal) {
    fmt::print(stderr, "<{}>{}\n", priority, line);
  } else {
    static constexpr const char* kNames[] = {"emerg",   "alert",  "crit", "error",
                                             "warning", "notice", "info", "debug"};
    fmt::print(stderr, "thaw-gateway: {}: {}\n", kNames[priority & 7], line);
  }
  std::fflush(stderr);
}

std::string default_gateway_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == 0)
    std::snprintf(host, sizeof host, "gw");
  return fmt::format("{}-{}", host, getpid());
}

// Each connection is a socket, and a proxied request one more to its worker: the soft limit on
// open files is raised to what --max-connections and --pending need (up to the hard limit).
// Where the hard limit is lower (a container's), --max-connections is lowered to fit, with a
// warning, rather than letting accept() fail with EMFILE under load.
void fit_file_limit(thaw::gateway::GatewayOptions& options) {
  constexpr rlim_t kOther = 64;  // listening socket, coordinator link, logs
  const auto needed = [&] {
    return 2 * static_cast<rlim_t>(options.max_connections + options.pending_connections) + kOther;
  };
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= needed()) return;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < needed()) {
    const std::size_t asked = options.max_connections;
    const rlim_t pairs = lim.rlim_max > kOther ? (lim.rlim_max - kOther) / 2 : 0;
    options.max_connections = std::max<std::size_t>(
        options.threads,
        pairs > options.pending_connections ? pairs - options.pending_connections : 0);
    log_line(
        LOG_WARNING,
        fmt::format("the open-file hard limit ({}) is too low for --max-connections {} and "
                    "--pending {}: serving at most {} connections (raise LimitNOFILE= or "
                    "ulimit -Hn)",
                    lim.rlim_max, asked, options.pending_connections, options.max_connections));
  }
  lim.rlim_cur = std::min(lim.rlim_max, needed());
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    log_line(LOG_WARNING, fmt::format("cannot raise the open-file limit to {}: {}", lim.rlim_cur,
                                      std::strerror(errno)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace thaw::gateway;
  CLI::App app{
      "thaw-gateway: the OpenAI-compatible front door of a thaw cluster. It routes "
      "POST /v1/completions (streaming or not) to a serving worker of the request's model, holds "
      "requests while a cold start is under way (503 with Retry-After past the deadline), asks "
      "the coordinator for a cold start when a model has no worker and reports each model's "
      "load to it. Also GET /v1/models, /health, /ready and /gateway/routes."};
  std::string listen = "127.0.0.1:8080";
  std::string coordinator;
  std::vector<std::string> route_flags;
  std::string gateway_id = default_gateway_id();
  std::string hold_deadline = "30s", report_interval = "1s", client_timeout = "10s",
              upstream_timeout = "300s", cold_start_retry = "10s", max_body = "1MiB",
              keep_alive = "5s";
  std::size_t hold_queue = 64, threads = 64, pending = 256, max_connections = 1024,
              keep_alive_max = 100;
  std::string api_key_file, tls_cert, tls_key;
  int retry_after = 5;
  std::string balance = "least-outstanding";
  app.add_option("--listen", listen, "HOST:PORT to serve HTTP on")->capture_default_str();
  app.add_option("--coordinator", coordinator,
                 "the coordinator's frontend endpoint (thaw-coordinator serve --frontend), e.g. "
                 "ipc:///run/thaw-coordinator/frontend.sock or tcp://10.0.0.1:5571");
  app.add_option("--route", route_flags,
                 "MODEL=http://HOST:PORT: a serving worker of MODEL, without a coordinator "
                 "(repeat for several workers or models)");
  app.add_option("--gateway-id", gateway_id,
                 "this gateway's name in load reports (several gateways may run)")
      ->capture_default_str();
  app.add_option("--hold-queue", hold_queue,
                 "requests held per model while it has no serving worker; more get 503")
      ->capture_default_str();
  app.add_option("--hold-deadline", hold_deadline,
                 "longest a request is held for a cold start before 503 (e.g. 30s, 500ms)")
      ->capture_default_str();
  app.add_option("--retry-after", retry_after, "seconds the Retry-After header of a 503 says")
      ->capture_default_str();
  app.add_option("--cold-start-retry", cold_start_retry,
                 "how long before a cold start that did not begin is asked for again")
      ->capture_default_str();
  app.add_option("--report-interval", report_interval,
                 "load reports to the coordinator (concurrency, queue, arrivals) every this")
      ->capture_default_str();
  app.add_option("--balance", balance, "least-outstanding or round-robin among a model's workers")
      ->capture_default_str();
  app.add_option("--max-body", max_body, "largest request body (413 above it): 1048576, 4MiB")
      ->capture_default_str();
  app.add_option("--threads", threads,
                 "threads kept ready for connections (more are started as connections come, "
                 "up to --max-connections)")
      ->capture_default_str();
  app.add_option("--max-connections", max_connections,
                 "connections served at once, held requests included (one thread each); a "
                 "connection past this is answered 503 too_many_connections and closed")
      ->capture_default_str();
  app.add_option("--pending", pending,
                 "connections past --max-connections waiting for their 503 (then new ones wait "
                 "in the kernel's listen queue)")
      ->capture_default_str();
  app.add_option("--keep-alive-timeout", keep_alive,
                 "a connection without a request for this long is closed (whole seconds)")
      ->capture_default_str();
  app.add_option("--keep-alive-max", keep_alive_max, "requests per connection before it is closed")
      ->capture_default_str();
  app.add_option("--api-key-file", api_key_file,
                 "bearer keys, one per line, no other user may read the file: then /v1/* and "
                 "/gateway/* need 'Authorization: Bearer KEY' (401 otherwise); /health and "
                 "/ready stay open");
  app.add_option("--tls-cert", tls_cert, "serve HTTPS with this PEM certificate (chain)");
  app.add_option("--tls-key", tls_key, "the PEM private key of --tls-cert (unencrypted)");
  app.add_option("--client-timeout", client_timeout,
                 "a client that sends or reads slower than this is dropped")
      ->capture_default_str();
  app.add_option("--upstream-timeout", upstream_timeout,
                 "longest wait for a worker's answer (or its next streamed event)")
      ->capture_default_str();
  app.add_flag("-v,--verbose", verbose, "log route tables and reports too");
  app.footer(
      "Examples:\n"
      "  thaw-gateway --route gpt2=http://127.0.0.1:8000 --listen 0.0.0.0:8080\n"
      "  thaw-gateway --coordinator ipc:///run/thaw-coordinator/frontend.sock\n"
      "  thaw-gateway --route gpt2=http://10.0.0.7:8000 --listen 0.0.0.0:8443 \\\n"
      "      --tls-cert /etc/thaw/gateway.crt --tls-key /etc/thaw/gateway.key \\\n"
      "      --api-key-file /etc/thaw/gateway.keys\n"
      "  curl localhost:8080/v1/completions -d '{\"model\":\"gpt2\",\"prompt\":\"Hi\"}'");
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const std::string& message) {
    log_line(LOG_ERR, message);
    return 2;
  };
  if (coordinator.empty() == route_flags.empty()) {
    return fail("give either --coordinator ENDPOINT or one --route MODEL=URL per worker");
  }
  RouterOptions router_options;
  router_options.hold_queue = hold_queue;
  GatewayOptions options;
  auto host_port = listen.rfind(':');
  if (host_port == std::string::npos)
    return fail(fmt::format("--listen {}: expected HOST:PORT", listen));
  options.host = listen.substr(0, host_port);
  try {
    options.port = std::stoi(listen.substr(host_port + 1));
  } catch (const std::exception&) {
    return fail(fmt::format("--listen {}: the port is not a number", listen));
  }
  struct {
    const char* flag;
    const std::string& text;
    std::chrono::milliseconds* out;
  } durations[] = {{"--hold-deadline", hold_deadline, &router_options.hold_deadline},
                   {"--cold-start-retry", cold_start_retry, &router_options.cold_start_retry},
                   {"--report-interval", report_interval, &options.report_interval},
                   {"--client-timeout", client_timeout, &options.client_timeout},
                   {"--keep-alive-timeout", keep_alive, &options.keep_alive_timeout},
                   {"--upstream-timeout", upstream_timeout, &options.upstream_timeout}};
  for (auto& d : durations) {
    auto v = parse_duration(d.text);
    if (!v) return fail(fmt::format("{} {}", d.flag, v.error()));
    *d.out = *v;
  }
  if (options.report_interval < std::chrono::milliseconds(10)) {
    return fail("--report-interval must be at least 10ms");
  }
  auto body = parse_bytes(max_body);
  if (!body) return fail("--max-body " + body.error());
  options.max_body_bytes = *body;
  if (balance == "round-robin") {
    router_options.balance = Balance::round_robin;
  } else if (balance != "least-outstanding") {
    return fail(fmt::format("--balance {}: least-outstanding or round-robin", balance));
  }
  if (options.keep_alive_timeout < std::chrono::seconds(1)) {
    return fail("--keep-alive-timeout must be at least 1s (cpp-httplib counts whole seconds)");
  }
  options.threads = threads;
  options.max_connections = max_connections;
  options.pending_connections = pending;
  options.keep_alive_max_requests = keep_alive_max;
  options.retry_after_s = retry_after;
  options.tls_cert = tls_cert;
  options.tls_key = tls_key;
  if (!api_key_file.empty()) {
    auto keys = ApiKeys::load(api_key_file);
    if (!keys) return fail(keys.error());
    log_line(LOG_INFO, fmt::format("{} API key(s) from {}", keys->size(), api_key_file));
    options.api_keys = std::move(*keys);
  }
  fit_file_limit(options);

  // Signals are taken on a thread of their own (signalfd), which stops the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<ControlPlane> control;
  ControlPlane* control_ptr = nullptr;
  // The router asks the control plane for cold starts; the link exists after the router.
  Router router(router_options, [&](const std::string& model) {
    if (control_ptr != nullptr) control_ptr->request_cold_start(model);
  });
  if (!route_flags.empty()) {
    auto routes = parse_route_flags(route_flags);
    if (!routes) return fail(routes.error());
    router.replace(std::move(*routes));
    control = std::make_unique<StaticControlPlane>();
  } else {
    auto link = CoordinatorLink::start({coordinator, gateway_id, options.report_interval, log_line},
                                       router);
    if (!link) return fail(link.error());
    control = std::move(*link);
  }
  control_ptr = control.get();
  auto server = GatewayServer::start(options, router, *control);
  if (!server) return fail(server.error());
  const int stop_fd = signalfd(-1, &signals, SFD_CLOEXEC);
  std::thread watcher([&] {
    signalfd_siginfo info;
    if (read(stop_fd, &info, sizeof info) == sizeof info) {
      log_line(LOG_NOTICE, fmt::format("signal {}: stopping", info.ssi_signo));
    }
    (*server)->stop();
  });
  log_line(
      LOG_NOTICE,
      fmt::format("serving on {}://{}:{} ({}{})", tls_cert.empty() ? "http" : "https", options.host,
                  (*server)->port(), options.api_keys ? "API keys required, " : "",
                  coordinator.empty() ? "static routes" : "coordinator " + coordinator));
  (*server)->run();
  // run() returns after stop(): from the watcher, or a listen failure (then wake the watcher).
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  close(stop_fd);
  server->reset();
  control.reset();
  return 0;
}
