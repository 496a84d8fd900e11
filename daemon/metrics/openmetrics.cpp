#include "daemon/metrics/openmetrics.hpp"

#include <fmt/format.h>

#include <map>

namespace thaw::daemon {

namespace {

class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# TYPE {} {}\n# HELP {} {}\n", name, type, name, help);
  }
  template <typename T>
  void sample(std::string_view name, T value, std::string_view labels = "") {
    if (labels.empty()) {
      out_ += fmt::format("{} {}\n", name, value);
    } else {
      out_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
    }
  }
  std::string finish() { return std::move(out_) + "# EOF\n"; }
  std::string text() { return std::move(out_); }

 private:
  std::string out_;
};

// A label value as OpenMetrics escapes it (a cache key is a path: no quotes expected, but
// nothing stops a registry naming a model so).
std::string label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string render_network_openmetrics(const NetStatus& n) {
  // The classifier's class names (network::traffic_class_name).
  static constexpr const char* kNames[kNetClassCount] = {"inference", "critical_fetch",
                                                         "background_fetch", "other"};
  static constexpr const char* kDirections[2] = {"egress", "ingress"};
  Writer w;
  w.family("thaw_net_shaping_enabled", "gauge",
           "1 when thawd's traffic classes shape the uplink, else 0 (the log says why).");
  w.sample("thaw_net_shaping_enabled", n.enabled ? 1 : 0);
  w.family("thaw_net_link_bytes_per_second", "gauge", "The uplink's rate shaping runs at.");
  w.sample("thaw_net_link_bytes_per_second", n.link_bytes_per_s);
  if (n.fetch_windows_clamped) {
    w.family("thaw_net_fetch_windows_clamped", "gauge",
             "1 while fetch sockets' receive windows are clamped (inference traffic or other "
             "models' fetches compete), 0 while they are the kernel's.");
    w.sample("thaw_net_fetch_windows_clamped", *n.fetch_windows_clamped ? 1 : 0);
  }
  w.family("thaw_net_cold_starts", "gauge",
           "Cold starts the coordinator placed on this node (its rates' N).");
  w.sample("thaw_net_cold_starts", n.cold_starts);
  w.family("thaw_net_class_rate_bytes_per_second", "gauge",
           "Guaranteed rate of each traffic class now.");
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    w.sample("thaw_net_class_rate_bytes_per_second", n.classes[i].rate_bytes_per_s,
             fmt::format("class=\"{}\"", kNames[i]));
  }
  w.family("thaw_net_class_ceil_bytes_per_second", "gauge",
           "Most each traffic class may borrow up to now.");
  for (std::size_t i = 0; i < kNetClassCount; ++i) {
    w.sample("thaw_net_class_ceil_bytes_per_second", n.classes[i].ceil_bytes_per_s,
             fmt::format("class=\"{}\"", kNames[i]));
  }
  struct Counter {
    const char* name;
    const char* help;
    const std::array<std::uint64_t, 2> NetClassStatus::*field;
  };
  for (const Counter& c :
       {Counter{"thaw_net_class_bytes", "Bytes of each traffic class on the uplink.",
                &NetClassStatus::bytes},
        Counter{"thaw_net_class_packets", "Packets of each traffic class on the uplink.",
                &NetClassStatus::packets},
        Counter{"thaw_net_class_drops", "Packets of each traffic class dropped by its queue.",
                &NetClassStatus::drops}}) {
    w.family(c.name, "counter", c.help);
    for (std::size_t i = 0; i < kNetClassCount; ++i) {
      for (std::size_t d = 0; d < 2; ++d) {
        w.sample(fmt::format("{}_total", c.name), (n.classes[i].*c.field)[d],
                 fmt::format("class=\"{}\",direction=\"{}\"", kNames[i], kDirections[d]));
      }
    }
  }
  if (!n.models.empty()) {
    w.family("thaw_net_model_bytes", "counter",
             "Bytes of each fetched model's fetch sockets on the uplink, both directions.");
    for (const NetModelStatus& m : n.models) {
      w.sample("thaw_net_model_bytes_total", m.bytes, fmt::format("model=\"{}\"", label(m.name)));
    }
  }
  return w.text();
}

std::string render_openmetrics(const NodeService& service, const ShimSocketCounters& shim,
                               std::uint64_t cache_bytes_used, std::uint64_t cache_budget_bytes,
                               const NetStatus& network) {
  const NodeCounters& c = service.counters();
  Writer w;
  w.family("thaw_fetched_bytes", "counter",
           "Bytes fetched and verified into the host cache, by traffic class.");
  w.sample("thaw_fetched_bytes_total", c.fetched_bytes_critical.load(), "class=\"critical\"");
  w.sample("thaw_fetched_bytes_total", c.fetched_bytes_background.load(), "class=\"background\"");
  w.family("thaw_fetches", "counter", "Model fetches started.");
  w.sample("thaw_fetches_total", c.fetches_started.load());
  w.family("thaw_fetch_failures", "counter", "Model fetches that failed or were cancelled.");
  w.sample("thaw_fetch_failures_total", c.fetches_failed.load());
  w.family("thaw_prewarm_hits", "counter", "Engine attaches that found a prewarmed slot.");
  w.sample("thaw_prewarm_hits_total", c.prewarm_hits.load());
  w.family("thaw_prewarm_misses", "counter", "Engine attaches that found no prewarmed slot.");
  w.sample("thaw_prewarm_misses_total", c.prewarm_misses.load());
  w.family("thaw_engine_layout_hits", "counter",
           "Engine attaches whose slot holds that engine's recorded layout (zero-copy).");
  w.sample("thaw_engine_layout_hits_total", c.engine_layout_hits.load());
  w.family("thaw_slot_handbacks", "counter",
           "Engines that exited leaving their slot prewarmed for the next.");
  w.sample("thaw_slot_handbacks_total", c.handbacks.load());
  w.family("thaw_slot_discards", "counter",
           "Engines' slots evicted at their exit (crash, or pages given back).");
  w.sample("thaw_slot_discards_total", c.discards.load());
  w.family("thaw_activations", "counter", "Slot activations.");
  w.sample("thaw_activations_total", c.activations.load());

  double rate = 0;
  for (const ModelStatus& m : service.models()) rate += m.rate_bytes_per_s;
  w.family("thaw_fetch_rate_bytes_per_second", "gauge",
           "Current fetch rate over every running fetch.");
  w.sample("thaw_fetch_rate_bytes_per_second", rate);

  std::map<std::string, int> by_state;
  for (const char* s :
       {"empty", "loading", "prewarmed", "active", "draining", "evicting", "failed"}) {
    by_state[s] = 0;
  }
  for (const SlotStatus& s : service.slots()) ++by_state[s.state];
  w.family("thaw_slots", "gauge", "Prewarm slots by state.");
  for (const auto& [state, n] : by_state)
    w.sample("thaw_slots", n, fmt::format("state=\"{}\"", state));

  w.family("thaw_gpu_pool_bytes", "gauge", "GPU memory thaw manages, per GPU.");
  for (const GpuStatus& g : service.gpus())
    w.sample("thaw_gpu_pool_bytes", g.pool_bytes, fmt::format("gpu=\"{}\"", g.index));
  w.family("thaw_gpu_free_bytes", "gauge", "Of it, pages no slot holds.");
  for (const GpuStatus& g : service.gpus())
    w.sample("thaw_gpu_free_bytes", g.free_bytes, fmt::format("gpu=\"{}\"", g.index));

  w.family("thaw_cache_used_bytes", "gauge", "Host cache in use.");
  w.sample("thaw_cache_used_bytes", cache_bytes_used);
  w.family("thaw_cache_budget_bytes", "gauge", "Host cache budget.");
  w.sample("thaw_cache_budget_bytes", cache_budget_bytes);

  w.family("thaw_shim_connections", "counter", "Shim socket connections accepted.");
  w.sample("thaw_shim_connections_total", shim.connections_accepted.load());
  w.family("thaw_shim_refused", "counter", "Shim clients refused by the allow rule.");
  w.sample("thaw_shim_refused_total", shim.connections_refused.load());
  w.family("thaw_shim_dropped", "counter", "Shim connections closed for malformed messages.");
  w.sample("thaw_shim_dropped_total", shim.connections_dropped.load());
  w.family("thaw_shim_requests", "counter", "Shim requests handled.");
  w.sample("thaw_shim_requests_total", shim.requests.load());
  w.family("thaw_shim_request_errors", "counter", "Shim requests answered with an error.");
  w.sample("thaw_shim_request_errors_total", shim.request_errors.load());
  w.family("thaw_artifacts_stored", "counter", "Artifacts engines recorded (layout, ...).");
  w.sample("thaw_artifacts_stored_total", shim.artifacts_reported.load());
  w.family("thaw_artifacts_served", "counter", "Recorded artifacts read back by engines.");
  w.sample("thaw_artifacts_served_total", shim.artifacts_served.load());
  w.family("thaw_ipc_exports", "counter", "CUDA IPC exports of layout memory carried.");
  w.sample("thaw_ipc_exports_total", shim.ipc_exports.load());
  w.family("thaw_ipc_imports", "counter", "CUDA IPC handles opened through thawd.");
  w.sample("thaw_ipc_imports_total", shim.ipc_imports.load());

  // What engines' shims reported when they exited, summed over engines.
  w.family("thaw_engine_reports", "counter", "Engines whose shim reported its counters.");
  w.sample("thaw_engine_reports_total", shim.engine_reports.load());
  w.family("thaw_engine_calls_intercepted", "counter", "Driver calls engines' shims handled.");
  w.sample("thaw_engine_calls_intercepted_total", shim.engine_calls_intercepted.load());
  w.family("thaw_engine_deterministic_allocations", "counter",
           "Engine allocations served from the deterministic layout.");
  w.sample("thaw_engine_deterministic_allocations_total",
           shim.engine_deterministic_allocations.load());
  w.family("thaw_engine_layout_divergences", "counter",
           "Engine runs that left deterministic mode on diverging from their record.");
  w.sample("thaw_engine_layout_divergences_total", shim.engine_layout_divergences.load());
  w.family("thaw_engine_files_streamed", "counter", "Managed model files engines opened.");
  w.sample("thaw_engine_files_streamed_total", shim.engine_files_streamed.load());
  w.family("thaw_engine_reads_waited", "counter",
           "Engine reads and page faults that waited for bytes still arriving.");
  w.sample("thaw_engine_reads_waited_total", shim.engine_reads_waited.load());
  w.family("thaw_engine_streamed_bytes", "counter",
           "Bytes installed into engines' streamed mappings.");
  w.sample("thaw_engine_streamed_bytes_total", shim.engine_bytes_streamed.load());
  w.family("thaw_engine_graph_records_stored", "counter",
           "CUDA graph records engines' shims stored in thawd (artifact kind graphs).");
  w.sample("thaw_engine_graph_records_stored_total", shim.engine_graph_records_stored.load());
  w.family("thaw_engine_graphs_restored", "counter",
           "CUDA graphs engines were given from a record instead of capturing them.");
  w.sample("thaw_engine_graphs_restored_total", shim.engine_graphs_restored.load());
  w.family("thaw_engine_graph_restore_fallbacks", "counter",
           "CUDA graphs asked for from a record that could not be restored (captured instead).");
  w.sample("thaw_engine_graph_restore_fallbacks_total", shim.engine_graph_restore_fallbacks.load());
  w.family("thaw_engine_kv_restores", "counter",
           "KV-cache sizings engines were given from a record (their profiling pass skipped).");
  w.sample("thaw_engine_kv_restores_total", shim.engine_kv_restores.load());
  w.family("thaw_engine_kv_restore_fallbacks", "counter",
           "KV-cache lookups with no usable record (none, stale, corrupt): engines profiled.");
  w.sample("thaw_engine_kv_restore_fallbacks_total", shim.engine_kv_restore_fallbacks.load());
  return w.text() + render_network_openmetrics(network) + "# EOF\n";
}

}  // namespace thaw::daemon
