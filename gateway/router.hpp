// Router: the gateway's per-model route table and hold queue.
//
// The table maps each model the gateway knows to its workers, each cold-starting, serving or
// draining (the coordinator's route pushes, or --route flags). A request takes a Lease on one
// serving worker — the least outstanding, round-robin among ties — and holds it until its
// answer is written. Leases keep their worker's counter alive across table changes, so a route
// switch (consolidation) sends only new requests elsewhere: in-flight ones finish where they
// are.
//
// A model with no serving worker holds the request in a bounded queue until one appears or
// its deadline passes; when nothing is even cold-starting, the first held request asks for a
// cold start (the callback; at most once per `cold_start_retry`).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace thaw::gateway {

enum class WorkerState { cold_starting, serving, draining };
std::string_view to_string(WorkerState state);

struct WorkerRoute {
  std::string url;  // http://host:port; "" for a cold start with no endpoint yet
  WorkerState state = WorkerState::serving;
  std::string plan_id;
  std::uint32_t stage = 0;
  std::string node_id;
};

// model → workers; a model with no workers is deployed but has nothing running.
using RouteMap = std::map<std::string, std::vector<WorkerRoute>>;

enum class Balance { least_outstanding, round_robin };

struct RouterOptions {
  std::size_t hold_queue = 64;                         // held requests per model
  std::chrono::milliseconds hold_deadline{30'000};     // longest a request is held
  std::chrono::milliseconds cold_start_retry{10'000};  // between cold-start asks per model
  Balance balance = Balance::least_outstanding;
};

// One worker's share of the gateway's requests; shared by the table and by the leases on it.
struct Endpoint {
  std::string url;
  std::atomic<std::uint64_t> outstanding{0};
  std::atomic<std::uint64_t> served{0};
  // Until then the worker is passed over (it refused a connection): a dead worker costs one
  // failed connect, not one per request, until the coordinator's next table drops it.
  std::atomic<std::chrono::steady_clock::rep> avoid_until{0};
};

class Lease {
 public:
  explicit Lease(std::shared_ptr<Endpoint> endpoint);
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  const std::string& url() const { return endpoint_->url; }

 private:
  std::shared_ptr<Endpoint> endpoint_;
};

struct RouteError {
  enum class Kind { unknown_model, queue_full, deadline, stopping, cold_start_refused };
  Kind kind;
  std::string message;  // for the client's error body
};

// What the load reports carry for one model (HydraServe §6.1's window inputs).
struct ModelLoadSample {
  std::string model;
  std::uint64_t concurrent = 0;    // requests in flight now (held or proxied)
  std::uint64_t queue_length = 0;  // of those, held for want of a serving worker
  std::uint64_t arrivals = 0;      // requests that arrived in the window
  double window_s = 0;
  std::uint32_t active_instances = 0;  // workers cold-starting or serving
};

class Router {
 public:
  using ColdStartFn = std::function<void(const std::string& model)>;
  Router(RouterOptions options, ColdStartFn ask_cold_start);

  // Replaces the table (a route push). Wakes held requests.
  void replace(RouteMap routes);
  // Whether a table was ever set (the gateway's readiness).
  bool has_table() const;

  // A serving worker of `model` for one request: at once, or after holding until `deadline`.
  std::expected<std::unique_ptr<Lease>, RouteError> acquire(
      const std::string& model, std::chrono::steady_clock::time_point deadline);
  // The same with the configured hold deadline from now.
  std::expected<std::unique_ptr<Lease>, RouteError> acquire(const std::string& model);

  // A worker refused a connection: pass it over for `for_how_long` while others serve.
  void mark_unreachable(const std::string& url, std::chrono::milliseconds for_how_long);

  // The cold start asked for `model` was refused (`why`): its held requests fail now with that
  // reason, unless a worker of it is starting or serving after all.
  void cold_start_refused(const std::string& model, const std::string& why);

  // Fails every held request and every later acquire (shutdown).
  void stop();

  std::vector<std::string> models() const;
  bool knows(const std::string& model) const;
  RouteMap routes() const;
  std::uint64_t outstanding(const std::string& url) const;

  // Counts a request of `model` as in flight (arrivals and concurrency) while the token lives.
  class InFlight {
   public:
    InFlight(Router& router, std::string model);
    ~InFlight();
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    Router& router_;
    std::string model_;
    bool counted_ = false;
  };

  // The load of every known model over the window that ends now; starts the next window.
  std::vector<ModelLoadSample> take_window(std::chrono::steady_clock::time_point now);

  const RouterOptions& options() const { return options_; }

 private:
  struct ModelEntry {
    std::vector<WorkerRoute> workers;
    std::vector<std::shared_ptr<Endpoint>> serving;  // the serving workers' endpoints
    std::size_t next = 0;                            // round-robin cursor
    std::size_t held = 0;
    std::uint64_t in_flight = 0;
    std::uint64_t arrivals = 0;
    std::chrono::steady_clock::time_point last_cold_start_ask{};
    bool asked = false;
    bool listed = true;          // in the current table (an unlisted entry lives while requests do)
    std::uint64_t refusals = 0;  // cold starts refused: held requests compare it to theirs
    std::string refusal;         // the last one's reason
  };
  std::unique_ptr<Lease> pick_locked(ModelEntry& entry);
  bool cold_starting_locked(const ModelEntry& entry) const;

  RouterOptions options_;
  ColdStartFn ask_cold_start_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, ModelEntry> models_;
  std::map<std::string, std::shared_ptr<Endpoint>> endpoints_;  // by URL, across tables
  bool has_table_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point window_start_ = std::chrono::steady_clock::now();
};

}  // namespace thaw::gateway
