// WarmServe's workload prediction and prewarming demand (Lou et al., "WarmServe", §4.1 and
// §5.1–5.2), as pure functions of numbers: no clock, no I/O, deterministic — the coordinator
// and the simulator call the same code.
//
// Notation follows the paper; where a symbol means two things there, the C++ name says which.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace thaw::coordinator::policy {

// The corrective seasonal predictor (CSP, §5.1). Time is cut into windows of fixed size W
// (5 minutes by default, 288 per day); a series holds one load per window — the average or
// the peak number of concurrent requests in it — on a continuous timeline (index t = k·WPD + i
// for window i of day k).
struct CspConfig {
  std::size_t windows_per_day = 288;  // 86400 s / W, W = 300 s (§7.5: 5–10 min work best)
  std::size_t history_days = 7;       // D in Eq. 2 (the paper names no value)
  std::size_t lookback = 10;          // N in Eq. 3 ("typically set to 10")
  // Eq. 3 as printed weighs the error j windows back by 2^(j−1), i.e. the OLDEST most, while
  // its text says recent errors matter more; the authors' code weighs by recency. Default:
  // recency (2^(N−j)); `false` gives the printed formula.
  bool recent_errors_weigh_most = true;
};

// Eq. 2: P_{k,i} = (1/D) Σ_{j=1..D} L_{k−j,i} — the same window on the previous D days
// (fewer while history is shorter). nullopt before a whole day of history.
std::optional<double> seasonal_component(std::span<const double> series, std::size_t t,
                                         const CspConfig& config);

// Eq. 3: Δ_{k,i} = Σ_{j=1..N} (L_{k,i−j} − P_{k,i−j}) · w_j / Σ w_j over the last N windows
// that have a seasonal component (windows before midnight are the previous day's). With all
// N present, Σ w_j = 2^N − 1 as in the paper. 0 when there is no such window.
double correction(std::span<const double> series, std::size_t t, const CspConfig& config);

// Eq. 4: L̂_{k,i} = P_{k,i} + Δ_{k,i}, clamped at 0 (a load is never negative). `series`
// holds the observed windows 0 .. t−1; nullopt before a whole day of history.
std::optional<double> predict_load(std::span<const double> series, std::size_t t,
                                   const CspConfig& config);

// Eq. 5–8 (§5.2): how many replicas of a model to keep prewarmed and how much each is worth.
struct ReplicaDemand {
  double average_load = 0;             // L_A, predicted concurrent requests
  double peak_load = 0;                // L_P
  std::uint32_t active_instances = 0;  // K (serving or starting; not in grace period)
  std::uint32_t batch_size = 32;       // B, requests one instance serves (§7.1: 32)
  double cold_start_seconds = 0;       // T_c, loading all weights into the GPUs
};

struct ReplicaScore {
  bool burst = false;      // basic replicas (average load) before burst ones (peaks), always
  std::uint32_t rank = 0;  // i, zero-based within its kind
  double score = 0;        // S
};

// Basic replicas: N_basic = max(⌈L_A/B⌉ − K, 0), scores S = exp(−i/(N_basic+N_burst))·T_c;
// then burst replicas: N_burst = max(⌈L_P/B⌉ − N_basic − K, 0),
// S = exp(−(N_basic+i)/(N_basic+N_burst))·T_c·(L_P − L_A)/L_A. L_A below one request counts as
// one in the burstiness factor (Eq. 8 divides by L_A; the paper does not say what L_A = 0
// means). Basic replicas come first, each kind in rank order.
std::vector<ReplicaScore> prewarm_replicas(const ReplicaDemand& demand);

// Eq. 1 (§4.1): the KV cache a dedicated instance in its grace period keeps,
// max(M·R/C, K + M/C) — the rest of its reservation can go to proactive prewarm. M: its
// whole KV capacity, R: requests still running, C: its maximum batch size, K: KV in use
// (M and K in the same unit: bytes or blocks).
double kv_reservation_target(double kv_capacity, std::uint32_t running_requests,
                             std::uint32_t max_batch, double kv_in_use);

}  // namespace thaw::coordinator::policy
