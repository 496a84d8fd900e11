// WarmServe's evict-aware placement (Alg. 1) and claim choice: hand-computed cases, and a
// property test over random clusters — GPU sets of replicas are always disjoint or nested,
// each on one server, within each GPU's free memory, never two replicas of a model on a GPU.
#include "coordinator/policy/warmserve_placement.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>

namespace {

using namespace thaw::coordinator::policy;

std::vector<ClusterGpu> server_of(int gpus, double free, std::uint32_t server = 0) {
  return std::vector<ClusterGpu>(gpus, ClusterGpu{server, free, true, true});
}

ModelDemand model(std::uint32_t id, double size, std::uint32_t d, double avg, double peak,
                  double cold_start) {
  return {id, size, d, ReplicaDemand{avg, peak, 0, 32, cold_start}};
}

TEST(WarmServeAlg1, HighScoresGetGpusOfTheirOwnLowerOnesNestWhereTheyEvictLeast) {
  const auto gpus = server_of(4, 100);
  // Model 1: two basic replicas (scores 10 and 10·e^(−1/2) = 6.07) on one GPU each; model 2:
  // one basic replica (score 5) on two GPUs.
  const std::vector<ModelDemand> models = {model(1, 50, 1, 64, 64, 10), model(2, 50, 2, 32, 32, 5)};
  const auto placed = place_prewarm_replicas(models, gpus, {});
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_EQ(placed[0].replica.model, 1u);
  EXPECT_EQ(placed[0].replica.gpus, (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(placed[1].replica.gpus, (std::vector<std::uint32_t>{1})) << "not beside its twin";
  EXPECT_EQ(placed[2].replica.model, 2u);
  EXPECT_EQ(placed[2].replica.gpus, (std::vector<std::uint32_t>{2, 3})) << "the free pair";
  EXPECT_NEAR(placed[1].replica.score, 10 * std::exp(-0.5), 1e-9);

  // With only GPUs 0–2 there is no free pair: model 2 nests on a pair holding one of model
  // 1's replicas — the one evicting less if claimed (the 6.07 one on GPU 1).
  const auto three = server_of(3, 100);
  const auto tight = place_prewarm_replicas(models, three, {});
  ASSERT_EQ(tight.size(), 3u);
  EXPECT_EQ(tight[2].replica.gpus, (std::vector<std::uint32_t>{1, 2}));
}

TEST(WarmServeAlg1, BasicReplicasComeBeforeBurstOnesWhateverTheirScores) {
  // Model 1: basic score 1; model 2: no average load, a burst with factor 40 (score 40).
  const std::vector<ModelDemand> models = {model(1, 60, 1, 32, 32, 1), model(2, 60, 1, 0, 40, 1)};
  const auto placed = place_prewarm_replicas(models, server_of(1, 100), {});
  ASSERT_EQ(placed.size(), 1u) << "one GPU, room for one replica";
  EXPECT_EQ(placed[0].replica.model, 1u);
  EXPECT_FALSE(placed[0].burst);
}

TEST(WarmServeAlg1, AGroupThatWouldPartlyOverlapAReplicaIsNeverChosen) {
  // Existing replica of model 9 on GPUs {0, 1}; a 2-GPU model on a 3-GPU server may only
  // take {0, 1} itself ({0, 2} and {1, 2} would overlap it partly).
  const std::vector<PrewarmReplica> existing = {{9, {0, 1}, 1.0}};
  const auto placed =
      place_prewarm_replicas(std::vector{model(1, 100, 2, 32, 32, 2)}, server_of(3, 100), existing);
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].replica.gpus, (std::vector<std::uint32_t>{0, 1}));
  // Not enough memory per GPU (S/D = 50 each): nothing.
  EXPECT_TRUE(place_prewarm_replicas(std::vector{model(1, 100, 2, 32, 32, 2)}, server_of(3, 40), {})
                  .empty());
  // A group never spans servers.
  auto two_servers = server_of(1, 100, 0);
  two_servers.push_back({1, 100, true, true});
  EXPECT_TRUE(
      place_prewarm_replicas(std::vector{model(1, 100, 2, 32, 32, 2)}, two_servers, {}).empty());
}

TEST(WarmServeAlg1, RandomClustersKeepEveryInvariant) {
  std::mt19937 rng(7);
  std::size_t placed_total = 0, nested_pairs = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<ClusterGpu> gpus;
    const int servers = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < servers; ++s) {
      for (int g = 0; g < 8; ++g) {
        gpus.push_back({static_cast<std::uint32_t>(s), static_cast<double>(20 + rng() % 80),
                        rng() % 5 != 0, true});
      }
    }
    const std::vector<ClusterGpu> initial = gpus;
    std::vector<PrewarmReplica> all;
    for (int round = 0; round < 3; ++round) {
      std::vector<ModelDemand> models;
      for (std::uint32_t m = 0; m < 6; ++m) {
        const std::uint32_t d = 1u << (rng() % 4);  // 1, 2, 4, 8 GPUs
        const double avg = static_cast<double>(rng() % 100);
        models.push_back(model(m, static_cast<double>(10 + rng() % 100) * d, d, avg,
                               avg + static_cast<double>(rng() % 100), 1 + rng() % 10));
      }
      for (const PlacedReplica& p : place_prewarm_replicas(models, gpus, all)) {
        for (std::uint32_t j : p.replica.gpus) {
          gpus[j].free_bytes -=
              models[p.replica.model].size_bytes / models[p.replica.model].parallelism;
        }
        all.push_back(p.replica);
      }
    }
    SCOPED_TRACE(trial);
    EXPECT_TRUE(disjoint_or_nested(all));
    placed_total += all.size();
    for (std::size_t a = 0; a < all.size(); ++a) {
      for (std::size_t b = a + 1; b < all.size(); ++b) {
        std::vector<std::uint32_t> common;
        std::ranges::set_intersection(all[a].gpus, all[b].gpus, std::back_inserter(common));
        nested_pairs += common.empty() ? 0 : 1;
      }
    }
    std::set<std::pair<std::uint32_t, std::uint32_t>> model_on_gpu;
    for (const PrewarmReplica& r : all) {
      std::set<std::uint32_t> servers_used;
      for (std::uint32_t j : r.gpus) {
        servers_used.insert(gpus[j].server);
        EXPECT_TRUE(initial[j].prewarm_candidate);
        EXPECT_TRUE(model_on_gpu.insert({r.model, j}).second) << "two replicas of a model on a GPU";
      }
      EXPECT_EQ(servers_used.size(), 1u);
    }
    for (const ClusterGpu& g : gpus) EXPECT_GE(g.free_bytes, 0);
  }
  // The clusters were busy enough to test something: many replicas, many of them nested.
  EXPECT_GT(placed_total, 300u);
  EXPECT_GT(nested_pairs, 100u);
  RecordProperty("replicas", std::to_string(placed_total));
  RecordProperty("nested_pairs", std::to_string(nested_pairs));
}

TEST(WarmServeClaim, TheReplicaWhoseClaimEvictsTheLeastScore) {
  const auto gpus = server_of(4, 100);
  const std::vector<PrewarmReplica> replicas = {
      {1, {0}, 3}, {1, {2}, 2}, {2, {0, 1}, 5}, {3, {2, 3}, 1}};
  // Claiming model 1 on GPU 0 evicts model 2 (5); on GPU 2, model 3 (1).
  auto claim = choose_claim(1, replicas, gpus);
  ASSERT_TRUE(claim);
  EXPECT_EQ(claim->replica, 1u);
  EXPECT_EQ(claim->evicted, (std::vector<std::size_t>{3}));
  EXPECT_DOUBLE_EQ(claim->evicted_score, 1.0);
  // GPU 2 is busy serving: the other one, whatever it costs.
  auto busy = gpus;
  busy[2].claimable = false;
  claim = choose_claim(1, replicas, busy);
  ASSERT_TRUE(claim);
  EXPECT_EQ(claim->replica, 0u);
  EXPECT_EQ(claim->evicted, (std::vector<std::size_t>{2}));
  // Claiming model 2's pair evicts the replica nested in it.
  claim = choose_claim(2, replicas, gpus);
  ASSERT_TRUE(claim);
  EXPECT_EQ(claim->evicted, (std::vector<std::size_t>{0}));
  EXPECT_FALSE(choose_claim(4, replicas, gpus)) << "no replica: a cold launch";
}

}  // namespace
