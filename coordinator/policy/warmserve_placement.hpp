// WarmServe's evict-aware placement of prewarm replicas (Alg. 1, §5.2) and the choice of
// which prewarmed replica an instance claims (§5.2, last paragraph). Pure functions of a
// cluster snapshot.
//
// The invariant (placement guideline 1): the GPU sets of any two replicas are disjoint or
// nested — never partially overlapping — so claiming one replica's GPUs invalidates only
// replicas nested in it or containing it. Every replica sits on one server.
//
// Readings where the paper is loose (docs/design/coordinator-policy-math.md, B.3, B.5):
// replicas of all models are ranked together (basic before burst, then score); a replica
// needs S/D free bytes on each of D GPUs; a GPU never holds two replicas of one model; ties
// go to the earlier server and the lexicographically first GPU set; a claim may use a
// replica whose GPUs are all claimable and evicts every other replica touching them,
// choosing the replica that evicts the least total score (then the lower own score).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "coordinator/policy/warmserve_prediction.hpp"

namespace thaw::coordinator::policy {

struct ClusterGpu {
  std::uint32_t server = 0;
  double free_bytes = 0;  // M_j: what a prewarm may still use
  // Idle, universal, or a dedicated worker in its grace period (its KV surplus, Eq. 1):
  // a prewarm may go here.
  bool prewarm_candidate = true;
  // Idle or universal (not serving): an instance may claim it.
  bool claimable = true;
};

struct PrewarmReplica {
  std::uint32_t model = 0;
  std::vector<std::uint32_t> gpus;  // indices into the cluster's GPUs, ascending
  double score = 0;
};

struct ModelDemand {
  std::uint32_t model = 0;
  double size_bytes = 0;          // S
  std::uint32_t parallelism = 1;  // D: GPUs per instance, on one server
  ReplicaDemand demand;           // L_A, L_P, K, B, T_c
};

struct PlacedReplica {
  PrewarmReplica replica;
  bool burst = false;
  std::uint32_t rank = 0;
};

// Alg. 1: the replicas to prewarm now and where, given the replicas already there. An existing
// replica of a model counts as that model's highest-ranked wanted replica (so a round places
// only what is missing); all existing replicas constrain where new ones may go.
std::vector<PlacedReplica> place_prewarm_replicas(std::span<const ModelDemand> models,
                                                  std::span<const ClusterGpu> gpus,
                                                  std::span<const PrewarmReplica> existing);

// Whether every pair of GPU sets is disjoint or nested.
bool disjoint_or_nested(std::span<const PrewarmReplica> replicas);

struct Claim {
  std::size_t replica = 0;           // index into the replicas given
  std::vector<std::size_t> evicted;  // every other replica touching its GPUs
  double evicted_score = 0;
};

// An instance of `model` starts on a prewarmed replica: the one whose GPUs are all
// claimable and whose claim evicts the least total score. nullopt: none of its replicas can
// be claimed (a cold launch).
std::optional<Claim> choose_claim(std::uint32_t model, std::span<const PrewarmReplica> replicas,
                                  std::span<const ClusterGpu> gpus);

}  // namespace thaw::coordinator::policy
