// HydraServe's Alg. 1 on hand-computed clusters (the numbers of hydraserve_prediction_test:
// 12.5 GB model, 2 GB/s network, 6.25 GB/s PCIe, t_c 5 s, t_p 0.2 s, t_d 0.03 s, t_n 1 ms).
#include "coordinator/policy/hydraserve_allocation.hpp"

#include <gtest/gtest.h>

namespace {

using namespace thaw::coordinator::policy;

constexpr double kGB = 1e9;

std::vector<ServerState> a10_servers(int n, double net = 2 * kGB) {
  std::vector<ServerState> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({static_cast<std::uint32_t>(i), net, 6.25 * kGB, {GpuState{24 * kGB, false}}});
  }
  return out;
}

AllocationRequest llama7b(double slo_ttft, double slo_tpot) {
  AllocationRequest r;
  r.model_bytes = 12.5 * kGB;
  r.costs = {.runtime_init = 5, .prefill = 0.2, .decode = 0.03, .network_hop = 0.001};
  r.slo_ttft = slo_ttft;
  r.slo_tpot = slo_tpot;
  return r;
}

TEST(HydraServeAlg1, PicksTheCheapestSchemeThatMeetsBothSlos) {
  // TTFT ≤ 7.5 s, TPOT ≤ 84 ms: only (4, 3) at 7.4165 s / 56.5 ms and (4, 4) at 7.2665 s /
  // 34 ms qualify; neither shares a GPU, (4, 3) needs less memory (40.6 GB vs 50 GB).
  const auto servers = a10_servers(6);
  const auto a = allocate_resources(llama7b(7.5, 0.084), servers);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->meets_slo);
  EXPECT_EQ(a->stages, 4);
  EXPECT_EQ(a->full_memory_workers, 3);
  EXPECT_NEAR(a->ttft, 7.4165, 1e-9);
  EXPECT_NEAR(a->tpot, 0.0565, 1e-12);
  EXPECT_NEAR(a->gpu_memory, 40.625 * kGB, 1);
  ASSERT_EQ(a->workers.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a->workers[i].full_memory);
  EXPECT_FALSE(a->workers[3].full_memory);
  EXPECT_EQ(a->shared_gpus, 0);
}

TEST(HydraServeAlg1, ALooseSloNeedsNoPipeline) {
  const auto servers = a10_servers(4);
  const auto a = allocate_resources(llama7b(20, 0.1), servers);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stages, 1);
  EXPECT_EQ(a->full_memory_workers, 0) << "s = 1: w = 0 and w = 1 are the same scheme";
  EXPECT_NEAR(a->ttft, 13.451, 1e-9);
}

TEST(HydraServeAlg1, FallsBackToOneWorkerOnTheFastestServerWhenNothingMeetsTheSlos) {
  auto servers = a10_servers(4);
  servers[2].network_bytes_per_s = 3 * kGB;  // the fastest
  const auto a = allocate_resources(llama7b(1, 0.001), servers);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->meets_slo);
  EXPECT_EQ(a->stages, 1);
  EXPECT_EQ(a->full_memory_workers, 1);
  ASSERT_EQ(a->workers.size(), 1u);
  EXPECT_EQ(a->workers[0].server, 2u);
}

TEST(HydraServeAlg1, PrefersFreeGpusAndSkipsSchemesWithoutEnoughServers) {
  // Two free servers and four whose only GPU already runs a worker, all equally fast: (4, ·)
  // would share two GPUs, (2, ·) none — with an SLO both meet, the free pair wins.
  auto servers = a10_servers(6);
  for (int i = 2; i < 6; ++i) servers[i].gpus[0].runs_a_worker = true;
  const auto a = allocate_resources(llama7b(9.6, 0.2), servers);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->shared_gpus, 0);
  EXPECT_EQ(a->stages, 2);
  for (const auto& w : a->workers) EXPECT_LT(w.server, 2u);
  // Only one server at all: no pipeline is possible, the single worker it is.
  const auto one = allocate_resources(llama7b(7.5, 0.084), a10_servers(1));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->stages, 1);
  EXPECT_FALSE(one->meets_slo);
}

TEST(HydraServeAlg1, NeverPicksAGroupWithoutAFullMemoryWorkerWhenOneMeetsTheSlos) {
  // TTFT <= 9.6 s, TPOT <= 100 ms on four free servers: (2, 0) 9.527 s / 62 ms, (2, 1) 9.427 s /
  // 47 ms, (3, 0) 8.353 s / 93 ms ... all meet. (2, 0) and (3, 0) need the least memory (M), but
  // a group of low-memory workers can never consolidate into one worker with the whole model
  // (§6: the worker that loads the rest must hold the full model's memory), so it would stay
  // pipelined for its whole life. The cheapest scheme with a full-memory worker is (2, 1).
  const auto a = allocate_resources(llama7b(9.6, 0.1), a10_servers(4));
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->meets_slo);
  EXPECT_EQ(a->stages, 2);
  EXPECT_EQ(a->full_memory_workers, 1);
  ASSERT_EQ(a->workers.size(), 2u);
  EXPECT_TRUE(a->workers[0].full_memory);
  EXPECT_FALSE(a->workers[1].full_memory);
  EXPECT_NEAR(a->ttft, 9.427, 1e-9);
}

TEST(HydraServeAlg1, LowMemoryWorkersGoWhereOnlyAStageFits) {
  // Two servers hold the whole model, two only a quarter of it: (4, 2) uses all four.
  auto servers = a10_servers(4);
  servers[2].gpus[0].free_bytes = 4 * kGB;
  servers[3].gpus[0].free_bytes = 4 * kGB;
  auto r = llama7b(7.6, 0.084);  // (4, 2): 7.5665 s, 79 ms
  const auto a = allocate_resources(r, servers);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stages, 4);
  EXPECT_EQ(a->full_memory_workers, 2);
  EXPECT_TRUE(a->workers[0].full_memory && a->workers[1].full_memory);
  EXPECT_LT(a->workers[0].server, 2u);
  EXPECT_LT(a->workers[1].server, 2u);
  // No server holds the whole model: nothing to fall back to.
  servers[0].gpus[0].free_bytes = servers[1].gpus[0].free_bytes = 4 * kGB;
  EXPECT_FALSE(allocate_resources(r, servers));
}

// bench/cluster/cold_start.sh's setting (420 MB over 1 Gbit/s links, fixed start-up t_cc 0.1,
// t_cu 0.1, t_l 0.3, thaw's overlapped Eq. 5): T(s) = max(0.5, M/(s b)) = 3.36, 1.68, 1.12,
// 0.84 s. An SLO of 0.5 s + 1.15 M/(4b) = 1.47 s (the start-up added to the fetch, which Eq. 5
// overlaps) is met by 3 stages, and 3 take less GPU memory than 4 (M + 2M/3 < M + 3M/4): Alg. 1
// chose 3 for the "PP=4" row. An SLO between T(4) and T(3) leaves 4 the only qualifying size.
TEST(HydraServeAlg1, TheClusterBenchsSloForFourStagesGetsFour) {
  std::vector<ServerState> servers;
  for (std::uint32_t i = 0; i < 4; ++i) servers.push_back({i, 125e6, 16e9, {{3 * kGB, false}}});
  AllocationRequest r;
  r.model_bytes = 420420137;
  r.costs = {.container = 0.1, .cuda_context = 0.1, .library_load = 0.3};
  r.overlapped = true;
  r.slo_tpot = 1e9;
  const double t3 = r.model_bytes / 3 / 125e6, t4 = r.model_bytes / 4 / 125e6;
  r.slo_ttft = 0.5 + 1.15 * t4;
  auto a = allocate_resources(r, servers);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stages, 3);
  EXPECT_NEAR(a->ttft, t3, 1e-9);
  r.slo_ttft = (t3 + t4) / 2;
  a = allocate_resources(r, servers);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->stages, 4);
  EXPECT_EQ(a->full_memory_workers, 1);
  EXPECT_NEAR(a->ttft, t4, 1e-9);
}

}  // namespace
