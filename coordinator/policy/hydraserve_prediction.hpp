// HydraServe's latency prediction and network-contention bookkeeping (Lou et al.,
// "HydraServe", §4.1, §4.2, §5.2), as pure functions: the inputs Alg. 1 (resource
// allocation) weighs schemes with. Times in seconds, sizes in bytes, bandwidths in bytes/s.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace thaw::coordinator::policy {

// What one worker of a pipeline group fetches and loads over: server x's network bandwidth
// b_x and PCIe bandwidth p_x.
struct WorkerLink {
  double network_bytes_per_s = 0;  // b_x (what the worker gets: B/(N+1) on a shared server)
  double pcie_bytes_per_s = 0;     // p_x
};

// Historical, per-model costs (the paper measures them on earlier runs).
struct ColdStartCosts {
  double runtime_init = 0;  // t_c: container creation and runtime initialisation (Eq. 1)
  double container = 0;     // t_cc (Eq. 5)
  double cuda_context = 0;  // t_cu (Eq. 5)
  double library_load = 0;  // t_l (Eq. 5)
  double prefill = 0;       // t_p, the whole model on one GPU
  double decode = 0;        // t_d per output token, the whole model on one GPU
  double network_hop = 0;   // t_n between pipeline stages
};

// Compute factor of a group of s stages, w of them full-memory workers: a full-memory
// worker runs its stage in t/s, a low-memory one needs the whole t (§4.1): s − w + w/s.
double pipeline_compute_factor(int stages, int full_memory_workers);

// Eq. 1: TTFT = t_c + (M/s)·max_i(1/b_qi + 1/p_qi) + t_p·(s − w + w/s) + t_n·s — fetch and load
// one after the other, the slowest worker deciding.
double ttft_sequential(double model_bytes, int full_memory_workers,
                       std::span<const WorkerLink> group, const ColdStartCosts& costs);
// Eq. 5: TTFT = max_i(max(t_cc + t_cu + max((M/s)/p_qi, t_l), (M/s)/b_qi)) + t_p·(s − w + w/s)
// + t_n·s — the fetch starts before the container, loading overlaps library loading.
double ttft_overlapped(double model_bytes, int full_memory_workers,
                       std::span<const WorkerLink> group, const ColdStartCosts& costs);
// Eq. 2: worst-case TPOT while the group is pipelined, t_d·(s − w + w/s) + t_n·s.
double tpot_pipelined(int stages, int full_memory_workers, const ColdStartCosts& costs);

// Eq. 3 and Eq. 4: one GPU server's network shared equally by its cold-start workers. Each
// has S_i bytes still to fetch and a deadline D_i by which the fetch must be done.
class ServerNetwork {
 public:
  struct ColdStart {
    double pending_bytes = 0;  // S_i
    double deadline = 0;       // D_i, absolute
  };

  explicit ServerNetwork(double bytes_per_s, double now = 0)
      : bandwidth_(bytes_per_s), last_change_(now) {}

  // Eq. 4 at a bandwidth change (a cold start starts or ends) at time `now`: every pending
  // size drops by B/N·(T − T'), N the workers before the change; a worker below zero has
  // fetched everything and leaves the list.
  void advance(double now);
  // Eq. 3: whether a new worker fits at `now` — every existing worker, and the new one,
  // still meets its deadline at B/(N+1): S_i ≤ B/(N+1)·(D_i − T).
  bool admits(double now, const ColdStart& candidate) const;
  // Adds a worker (after advance(now)); returns the bandwidth it gets, B/(N+1).
  double add(double now, const ColdStart& worker);

  const std::vector<ColdStart>& cold_starts() const { return workers_; }
  double share_for_next() const { return bandwidth_ / static_cast<double>(workers_.size() + 1); }

 private:
  double bandwidth_;
  double last_change_;
  std::vector<ColdStart> workers_;
};

}  // namespace thaw::coordinator::policy
