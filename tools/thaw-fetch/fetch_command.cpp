// `thaw-fetch fetch`: a ModelFetch on its own thread while this one draws progress and
// waits for SIGINT/SIGTERM (blocked in every thread and taken with sigtimedwait, so a
// signal cancels the fetch cleanly instead of killing it mid-write).
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "byte_size.hpp"
#include "commands.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/registry/registry.hpp"
#include "report.hpp"

namespace thaw::fetch_cli {

namespace {

using namespace std::chrono_literals;

std::size_t terminal_width() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col - 1;
  return 100;
}

// Draws progress on stderr until `done`: redrawn in place on a terminal, else one line every
// few seconds (logs of scripted runs stay readable). Cancels the fetch on SIGINT/SIGTERM.
void watch(store::ModelFetch& fetch, const std::atomic<bool>& done, const std::string& model,
           bool quiet, const sigset_t& signals) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const auto line_every = tty ? 200ms : 5s;
  auto next_line = std::chrono::steady_clock::now() + (tty ? 0s : 2s);
  bool drawn = false;
  while (!done.load()) {
    timespec tick{0, 100'000'000};
    const int sig = ::sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGUSR1) continue;  // the fetch ended: see `done`
    if (sig == SIGINT || sig == SIGTERM) {
      fetch.cancel();
      continue;
    }
    if (quiet || std::chrono::steady_clock::now() < next_line) continue;
    next_line = std::chrono::steady_clock::now() + line_every;
    const std::string line = progress_line(model, fetch.progress(), tty ? terminal_width() : 0);
    if (tty) {
      fmt::print(stderr, "\r\033[K{}", line);
      drawn = true;
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }
  if (drawn) {
    fmt::print(stderr, "\r\033[K{}\n", progress_line(model, fetch.progress(), terminal_width()));
  }
}

}  // namespace

int run_fetch(const FetchArgs& args) {
  store::ModelFetchOptions options;
  options.model = args.model;
  options.cache_key = args.key;
  if (!args.stage.empty()) {
    auto stage = store::parse_stage(args.stage);
    if (!stage) return report_error("--stage " + stage.error().message);
    options.stage = *stage;
  }
  options.consolidate = args.consolidate;
  options.tensor_class =
      args.background ? store::FetchClass::background : store::FetchClass::critical;
  options.default_chunk_size = args.chunk_size;
  options.verify_whole_file = !args.no_file_sha256;
  options.verify_threads = args.verify_threads;
  options.fetcher.connections_per_file = args.connections;
  options.fetcher.max_connections = args.connections;
  options.fetcher.rate_limits[static_cast<std::size_t>(store::FetchClass::critical)] =
      store::RateLimit{args.max_rate, 0};
  options.fetcher.http_headers = args.headers;
  // thaw-fetch takes what it is given and says so below; thawd refuses unless
  // store.allow_unverified.
  options.allow_unverified = true;

  store::RegistryOptions registry_options;
  registry_options.revision = args.revision;
  registry_options.headers = args.headers;
  auto registry = store::open_registry(args.registry, registry_options);
  if (!registry) {
    return report_error(fmt::format("--registry {}: {}", args.registry, registry.error().message));
  }
  const std::uint64_t budget =
      args.budget != 0 ? args.budget : std::numeric_limits<std::uint64_t>::max();
  auto cache = store::HostCache::open(store::HostCacheConfig{args.cache, budget, {}, {}});
  if (!cache) return report_error(fmt::format("--cache {}: {}", args.cache, cache.error().message));

  // Block the signals before any thread exists, so every thread inherits the mask and
  // only sigtimedwait() below takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // The runner wakes the watcher with SIGUSR1 when the fetch ends, so the process exits
  // at once rather than at the watcher's next tick (up to 100 ms, 2 % of a stage fetch).
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const pthread_t watcher = pthread_self();

  store::ModelFetch fetch(**registry, *cache, options);
  std::atomic<bool> done{false};
  std::expected<store::ModelFetchResult, store::ModelFetchError> result =
      std::unexpected(store::ModelFetchError{store::ModelFetchErrc::cancelled, "not run"});
  std::thread runner([&] {
    result = fetch.run();
    done.store(true);
    pthread_kill(watcher, SIGUSR1);
  });
  watch(fetch, done, args.model, args.quiet, signals);
  runner.join();
  // A SIGUSR1 the watcher did not take (done was already seen) must not kill us on unblock.
  timespec zero{0, 0};
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGUSR1);
  while (::sigtimedwait(&wake, nullptr, &zero) == SIGUSR1) {
  }
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);

  if (!result) {
    if (args.json) {
      fmt::print("{}\n", fetch_failure(args.model, result.error(), fetch.progress()).dump());
    }
    return report_error(result.error().message);
  }
  if (!result->unverified_files.empty()) {
    fmt::print(stderr,
               "thaw-fetch: warning: {} of {} had no digest to check ({}...): the model was "
               "published without {}; thawd refuses it unless store.allow_unverified = true\n",
               result->unverified_files.size() == 1
                   ? std::string("1 file")
                   : fmt::format("{} files", result->unverified_files.size()),
               args.model, result->unverified_files.front(), store::kManifestName);
  }
  const FetchContext context{(*registry)->describe(), cache->root().string(), args.consolidate};
  if (args.json) {
    fmt::print("{}\n", fetch_summary(*result, context).dump());
  } else if (!args.quiet) {
    fmt::print(
        "{}{}: {} fetched ({} already cached) in {:.2f} s, {}/s; first tensor after {}; "
        "cache {}\n",
        args.model, options.stage ? " stage " + args.stage : "",
        format_bytes(static_cast<double>(result->bytes_fetched)),
        format_bytes(static_cast<double>(result->bytes_cached)), result->seconds,
        format_bytes(result->goodput_bytes_per_s()),
        result->time_to_first_tensor_s ? fmt::format("{:.3f} s", *result->time_to_first_tensor_s)
                                       : std::string("-"),
        cache->root().string());
  }
  return 0;
}

}  // namespace thaw::fetch_cli
