// Issue 10 policy benchmarks: one HydraServe Alg. 1 decision on a 1,000-server snapshot
// (target ≤ 1 ms) and one WarmServe placement round for 100 models on 1,000 GPUs (target
// ≤ 50 ms). Snapshots are random but seeded (the same every run); each measurement is the
// median of repeated runs, printed with its ratio to the target.
//
//   thaw-policy-bench [--json]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "coordinator/policy/hydraserve_allocation.hpp"
#include "coordinator/policy/warmserve_placement.hpp"

using namespace thaw::coordinator::policy;
using Clock = std::chrono::steady_clock;

namespace {

template <typename Fn>
double median_seconds(int runs, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::ranges::sort(t);
  return t[t.size() / 2];
}

std::vector<ServerState> hydraserve_cluster(std::mt19937& rng, int servers) {
  std::vector<ServerState> out;
  for (int i = 0; i < servers; ++i) {
    ServerState s{static_cast<std::uint32_t>(i),
                  (1 + rng() % 4) * 0.5e9,  // 4–16 Gbps, shared by 0–3 cold starts
                  (4 + rng() % 12) * 1e9,   // PCIe
                  {}};
    const int gpus = 1 + static_cast<int>(rng() % 8);
    for (int g = 0; g < gpus; ++g) {
      s.gpus.push_back({static_cast<double>(rng() % 80) * 1e9, rng() % 3 == 0});
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  std::mt19937 rng(20261125);

  // Alg. 1: a 13 GB model with a tight SLO, so every (s, w) is evaluated.
  const auto servers = hydraserve_cluster(rng, 1000);
  AllocationRequest request;
  request.model_bytes = 13e9;
  request.costs = {.runtime_init = 5, .prefill = 0.2, .decode = 0.03, .network_hop = 0.001};
  request.slo_ttft = 8;
  request.slo_tpot = 0.1;
  int stages = 0;
  const double alg1 =
      median_seconds(501, [&] { stages = allocate_resources(request, servers).value().stages; });

  // WarmServe: 125 servers × 8 GPUs, 100 models of 1–8 GPUs, a round placing on top of a
  // previous round's replicas.
  std::vector<ClusterGpu> gpus;
  for (std::uint32_t s = 0; s < 125; ++s) {
    for (int g = 0; g < 8; ++g) gpus.push_back({s, 80e9, rng() % 4 != 0, true});
  }
  std::vector<ModelDemand> models;
  for (std::uint32_t m = 0; m < 100; ++m) {
    const std::uint32_t d = 1u << (rng() % 4);
    const double avg = static_cast<double>(rng() % 200);
    models.push_back({m, static_cast<double>(8 + rng() % 30) * 1e9 * d, d,
                      ReplicaDemand{avg, avg + static_cast<double>(rng() % 200),
                                    static_cast<std::uint32_t>(rng() % 3), 32, 1.0 + rng() % 10}});
  }
  auto existing_placed = place_prewarm_replicas(models, gpus, {});
  std::vector<PrewarmReplica> existing;
  for (const auto& p : existing_placed) {
    for (std::uint32_t j : p.replica.gpus) {
      gpus[j].free_bytes -=
          models[p.replica.model].size_bytes / models[p.replica.model].parallelism;
    }
    existing.push_back(p.replica);
  }
  for (auto& m : models) m.demand.peak_load *= 2;  // the next window's peaks
  std::size_t placed = 0;
  const double placement =
      median_seconds(21, [&] { placed = place_prewarm_replicas(models, gpus, existing).size(); });

  if (json) {
    fmt::print(R"({{"alg1_seconds":{:.9f},"alg1_target":0.001,"alg1_stages":{},)"
               R"("placement_seconds":{:.9f},"placement_target":0.05,"existing":{},"placed":{}}})"
               "\n",
               alg1, stages, placement, existing.size(), placed);
    return 0;
  }
  fmt::print(
      "HydraServe Alg. 1, 1,000 servers:        {:8.3f} ms per decision (target 1 ms: "
      "{:.3f}x of it; chose s = {})\n",
      alg1 * 1e3, alg1 / 1e-3, stages);
  fmt::print(
      "WarmServe placement, 100 models, 1,000 GPUs: {:8.3f} ms per round (target 50 ms: "
      "{:.3f}x of it; {} replicas there, {} placed)\n",
      placement * 1e3, placement / 0.05, existing.size(), placed);
  return 0;
}
