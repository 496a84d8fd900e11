#include "coordinator/policy/hydraserve_prediction.hpp"

#include <algorithm>

namespace thaw::coordinator::policy {

double pipeline_compute_factor(int stages, int full_memory_workers) {
  if (stages <= 0) return 0;
  return static_cast<double>(stages - full_memory_workers) +
         static_cast<double>(full_memory_workers) / stages;
}

double ttft_sequential(double model_bytes, int full_memory_workers,
                       std::span<const WorkerLink> group, const ColdStartCosts& c) {
  const int s = static_cast<int>(group.size());
  if (s == 0) return 0;
  double slowest = 0;  // seconds per byte
  for (const WorkerLink& x : group) {
    slowest = std::max(slowest, 1 / x.network_bytes_per_s + 1 / x.pcie_bytes_per_s);
  }
  return c.runtime_init + model_bytes / s * slowest +
         c.prefill * pipeline_compute_factor(s, full_memory_workers) + c.network_hop * s;
}

double ttft_overlapped(double model_bytes, int full_memory_workers,
                       std::span<const WorkerLink> group, const ColdStartCosts& c) {
  const int s = static_cast<int>(group.size());
  if (s == 0) return 0;
  const double stage_bytes = model_bytes / s;
  double ready = 0;
  for (const WorkerLink& x : group) {
    const double load =
        c.container + c.cuda_context + std::max(stage_bytes / x.pcie_bytes_per_s, c.library_load);
    ready = std::max(ready, std::max(load, stage_bytes / x.network_bytes_per_s));
  }
  return ready + c.prefill * pipeline_compute_factor(s, full_memory_workers) + c.network_hop * s;
}

double tpot_pipelined(int stages, int full_memory_workers, const ColdStartCosts& c) {
  return c.decode * pipeline_compute_factor(stages, full_memory_workers) + c.network_hop * stages;
}

void ServerNetwork::advance(double now) {
  if (!workers_.empty() && now > last_change_) {
    const double fetched = bandwidth_ / static_cast<double>(workers_.size()) * (now - last_change_);
    for (ColdStart& w : workers_) w.pending_bytes -= fetched;
    std::erase_if(workers_, [](const ColdStart& w) { return w.pending_bytes < 0; });
  }
  last_change_ = std::max(last_change_, now);
}

bool ServerNetwork::admits(double now, const ColdStart& candidate) const {
  const double share = share_for_next();
  const auto meets = [&](const ColdStart& w) {
    return w.pending_bytes <= share * (w.deadline - now);
  };
  return std::ranges::all_of(workers_, meets) && meets(candidate);
}

double ServerNetwork::add(double now, const ColdStart& worker) {
  advance(now);
  const double share = share_for_next();
  workers_.push_back(worker);
  return share;
}

}  // namespace thaw::coordinator::policy
