#include "coordinator/policy/hydraserve_allocation.hpp"

#include <algorithm>
#include <tuple>

namespace thaw::coordinator::policy {

namespace {

double ratio(const ServerState& x) {
  return 1 / x.network_bytes_per_s + 1 / x.pcie_bytes_per_s;
}

// The GPU of `x` a worker needing `bytes` goes on: a free one if any fits (the one with the
// least room that fits, keeping big GPUs for big workers), else the fullest-fitting shared
// one. nullopt: none fits.
std::optional<WorkerPlacement> place_on(const ServerState& x, double bytes, bool full) {
  std::optional<WorkerPlacement> best;
  double best_free = 0;
  for (std::uint32_t g = 0; g < x.gpus.size(); ++g) {
    const GpuState& gpu = x.gpus[g];
    if (gpu.free_bytes < bytes) continue;
    const bool better = !best || (best->shares_gpu && !gpu.runs_a_worker) ||
                        (best->shares_gpu == gpu.runs_a_worker && gpu.free_bytes < best_free);
    if (better) {
      best = WorkerPlacement{x.id, g, full, gpu.runs_a_worker};
      best_free = gpu.free_bytes;
    }
  }
  return best;
}

}  // namespace

std::optional<Allocation> allocate_resources(const AllocationRequest& r,
                                             std::span<const ServerState> servers) {
  const double full_bytes = r.memory_full > 0 ? r.memory_full : r.model_bytes;
  // Server indices ranked by 1/b + 1/p, ties in the snapshot's order.
  std::vector<std::size_t> ranked(servers.size());
  for (std::size_t i = 0; i < ranked.size(); ++i) ranked[i] = i;
  std::ranges::stable_sort(ranked, {}, [&](std::size_t i) { return ratio(servers[i]); });
  std::vector<std::size_t> full_capable;  // {i}: fit a full-memory worker
  for (std::size_t i : ranked) {
    if (place_on(servers[i], full_bytes, true)) full_capable.push_back(i);
  }
  if (full_capable.empty()) return std::nullopt;

  const auto evaluate = [&](int s, int w, const std::vector<WorkerPlacement>& workers) {
    Allocation a;
    a.stages = s;
    a.full_memory_workers = w;
    a.workers = workers;
    std::vector<WorkerLink> links;
    for (const WorkerPlacement& p : workers) {
      const ServerState& x = *std::ranges::find(servers, p.server, &ServerState::id);
      links.push_back({x.network_bytes_per_s, x.pcie_bytes_per_s});
      a.shared_gpus += p.shares_gpu ? 1 : 0;
    }
    a.ttft = r.overlapped ? ttft_overlapped(r.model_bytes, w, links, r.costs)
                          : ttft_sequential(r.model_bytes, w, links, r.costs);
    a.tpot = tpot_pipelined(s, w, r.costs);
    a.meets_slo = a.ttft <= r.slo_ttft && a.tpot <= r.slo_tpot;
    a.gpu_memory = w * full_bytes + (s - w) * full_bytes / s;
    return a;
  };

  std::optional<Allocation> chosen;
  // A group of s > 1 low-memory workers has no worker that can load the rest of the model
  // and serve alone (§6), so it never consolidates: any scheme with a full-memory worker
  // that meets the SLOs comes first, then the paper's "minimal GPU sharing".
  const auto preference = [](const Allocation& a) {
    const bool cannot_consolidate = a.stages > 1 && a.full_memory_workers == 0;
    return std::tuple(cannot_consolidate, a.shared_gpus, a.gpu_memory, a.stages,
                      a.full_memory_workers);
  };
  for (int s = 1; s <= r.max_stages; ++s) {
    const double low_bytes = full_bytes / s;
    for (int w = 0; w <= s; ++w) {
      if (w > static_cast<int>(full_capable.size())) continue;
      std::vector<WorkerPlacement> workers;
      std::vector<bool> used(servers.size(), false);
      for (int k = 0; k < w; ++k) {
        workers.push_back(*place_on(servers[full_capable[k]], full_bytes, true));
        used[full_capable[k]] = true;
      }
      // The merged list: every other server that fits a low-memory worker, by ratio.
      for (std::size_t i : ranked) {
        if (static_cast<int>(workers.size()) == s) break;
        if (used[i]) continue;
        if (auto p = place_on(servers[i], low_bytes, false)) {
          workers.push_back(*p);
          used[i] = true;
        }
      }
      if (static_cast<int>(workers.size()) < s) continue;  // not enough servers
      Allocation a = evaluate(s, w, workers);
      if (a.meets_slo && (!chosen || preference(a) < preference(*chosen))) chosen = std::move(a);
    }
  }
  if (chosen) return chosen;
  // No scheme meets the SLOs: one full-memory worker on the best server.
  return evaluate(1, 1, {*place_on(servers[full_capable[0]], full_bytes, true)});
}

}  // namespace thaw::coordinator::policy
