// HydraServe's resource allocation (Alg. 1, §4.1): for a cold start, how many pipeline stages
// s (1–4), how many of them full-memory workers w, and on which servers — the scheme meeting
// both SLOs with the least GPU sharing, else one full-memory worker. A pure function of a
// cluster snapshot.
//
// Readings where the paper is loose (docs/design/coordinator-policy-math.md, A.1):
// - full-memory workers get `memory_full` (the unparallelised footprint), low-memory ones
//   memory_full/s; a server "fits" m when one of its GPUs has m free;
// - low-memory candidates are the servers that fit M/s but not M, merged with the
//   full-memory-capable servers left over, all ranked by 1/b + 1/p (ties: server order);
// - "minimal GPU sharing": fewest workers on GPUs already running a worker, then least GPU
//   memory w·M + (s−w)·M/s, then smaller s, then smaller w — but only among schemes that can
//   consolidate (s = 1 or w ≥ 1) while one meets the SLOs: a group of low-memory workers has
//   no worker to scale down to (§6), so it is chosen only when nothing else qualifies;
// - a (s, w) without enough servers is skipped; no server for even one full-memory worker:
//   nullopt (the caller queues the request).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coordinator/policy/hydraserve_prediction.hpp"

namespace thaw::coordinator::policy {

struct GpuState {
  double free_bytes = 0;
  bool runs_a_worker = false;  // placing another worker here shares the GPU
};

struct ServerState {
  std::uint32_t id = 0;
  // b_x: what a new worker would get (Eq. 3's B/(N+1)); servers whose Eq. 3 check fails
  // should be left out by the caller.
  double network_bytes_per_s = 0;
  double pcie_bytes_per_s = 0;  // p_x
  std::vector<GpuState> gpus;
};

struct AllocationRequest {
  double model_bytes = 0;  // M, what is fetched
  double memory_full = 0;  // a full-memory worker's GPU memory (0: model_bytes)
  ColdStartCosts costs;
  double slo_ttft = 0;
  double slo_tpot = 0;
  bool overlapped = false;  // TTFT by Eq. 5 (worker-level overlap) instead of Eq. 1
  int max_stages = 4;       // "larger parallelism sizes yield little improvement"
};

struct WorkerPlacement {
  std::uint32_t server = 0;
  std::uint32_t gpu = 0;
  bool full_memory = false;
  bool shares_gpu = false;
};

struct Allocation {
  int stages = 1;                        // s
  int full_memory_workers = 1;           // w
  std::vector<WorkerPlacement> workers;  // full-memory ones first, then by 1/b + 1/p
  double ttft = 0;
  double tpot = 0;
  bool meets_slo = false;  // false only for the single-worker fallback
  int shared_gpus = 0;
  double gpu_memory = 0;  // w·M + (s−w)·M/s
};

std::optional<Allocation> allocate_resources(const AllocationRequest& request,
                                             std::span<const ServerState> servers);

}  // namespace thaw::coordinator::policy
