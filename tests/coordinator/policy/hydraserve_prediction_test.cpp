// HydraServe's Eq. 1–5 on hand-computed cases (inputs made up; the paper gives the formulas,
// not its measured t_c, t_p, … — see each case's arithmetic).
#include "coordinator/policy/hydraserve_prediction.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace {

using namespace thaw::coordinator::policy;

constexpr double kGB = 1e9;
// Llama2-7B's 12.5 GB; A10 servers at 16 Gbps = 2 GB/s; PCIe 6.25 GB/s.
constexpr double kModel = 12.5 * kGB;
const ColdStartCosts kCosts{.runtime_init = 5,
                            .container = 2,
                            .cuda_context = 1,
                            .library_load = 3,
                            .prefill = 0.2,
                            .decode = 0.03,
                            .network_hop = 0.001};

std::vector<WorkerLink> group(int stages, double net = 2 * kGB, double pcie = 6.25 * kGB) {
  return std::vector<WorkerLink>(stages, WorkerLink{net, pcie});
}

TEST(HydraServeEq1And2, TtftAndTpotOfPipelineSchemes) {
  // s − w + w/s: low-memory workers pay the whole prefill, full-memory ones 1/s of it.
  EXPECT_DOUBLE_EQ(pipeline_compute_factor(4, 3), 1.75);
  EXPECT_DOUBLE_EQ(pipeline_compute_factor(4, 0), 4.0);
  EXPECT_DOUBLE_EQ(pipeline_compute_factor(1, 1), 1.0);
  // s = 1: 5 + 12.5·(1/2 + 1/6.25) + 0.2 + 0.001 = 13.451
  EXPECT_NEAR(ttft_sequential(kModel, 1, group(1), kCosts), 13.451, 1e-9);
  // s = 2, w = 0: 5 + 6.25·0.66 + 0.2·2 + 0.002 = 9.527
  EXPECT_NEAR(ttft_sequential(kModel, 0, group(2), kCosts), 9.527, 1e-9);
  // s = 4, w = 3: 5 + 3.125·0.66 + 0.2·1.75 + 0.004 = 7.4165; TPOT 0.03·1.75 + 0.004 = 0.0565
  EXPECT_NEAR(ttft_sequential(kModel, 3, group(4), kCosts), 7.4165, 1e-9);
  EXPECT_NEAR(tpot_pipelined(4, 3, kCosts), 0.0565, 1e-12);
  EXPECT_NEAR(tpot_pipelined(4, 0, kCosts), 0.124, 1e-12);
  // The slowest worker decides: one server at half the network.
  auto mixed = group(4);
  mixed[2].network_bytes_per_s = 1 * kGB;
  EXPECT_NEAR(ttft_sequential(kModel, 3, mixed, kCosts), 5 + 3.125 * 1.16 + 0.35 + 0.004, 1e-9);
}

TEST(HydraServeEq5, FetchOverlapsStartupAndLoadingOverlapsLibraries) {
  // s = 2, w = 2: per worker max(2 + 1 + max(6.25/6.25, 3), 6.25/2) = max(6, 3.125) = 6;
  // + 0.2·1 + 0.002.
  EXPECT_NEAR(ttft_overlapped(kModel, 2, group(2), kCosts), 6.202, 1e-9);
  // A slow network makes the fetch the longer leg: 6.25/1 = 6.25.
  auto slow = group(2);
  slow[1].network_bytes_per_s = 1 * kGB;
  EXPECT_NEAR(ttft_overlapped(kModel, 2, slow, kCosts), 6.452, 1e-9);
  // Overlap never predicts longer than doing everything in sequence (same t_c).
  ColdStartCosts same = kCosts;
  same.runtime_init = kCosts.container + kCosts.cuda_context + kCosts.library_load;
  EXPECT_LT(ttft_overlapped(kModel, 2, group(2), same), ttft_sequential(kModel, 2, group(2), same));
}

TEST(HydraServeEq3, AServerAdmitsAWorkerOnlyIfEveryoneStillMeetsItsDeadline) {
  ServerNetwork server(2 * kGB, /*now=*/0);
  server.add(0, {3 * kGB, 5});
  server.add(0, {1 * kGB, 2});
  // A third worker leaves each 2/3 GB/s: 3 ≤ 3.33 and 1 ≤ 1.33 — admitted.
  EXPECT_NEAR(server.share_for_next(), 2 * kGB / 3, 1);
  EXPECT_TRUE(server.admits(0, {1 * kGB, 5}));
  // ... unless the newcomer itself cannot make it (2.5 GB in 3 s at 2/3 GB/s).
  EXPECT_FALSE(server.admits(0, {2.5 * kGB, 3}));
  // An existing worker with 4 GB to go would miss (4 > 3.33): refused.
  ServerNetwork busy(2 * kGB, 0);
  busy.add(0, {4 * kGB, 5});
  busy.add(0, {1 * kGB, 2});
  EXPECT_FALSE(busy.admits(0, {1 * kGB, 5}));
  // The bandwidth a new worker is recorded with is B/(N+1).
  ServerNetwork empty(2 * kGB, 0);
  EXPECT_DOUBLE_EQ(empty.add(0, {1 * kGB, 10}), 2 * kGB);
  EXPECT_DOUBLE_EQ(empty.add(0, {1 * kGB, 10}), 1 * kGB);
}

TEST(HydraServeEq4, PendingSizesShrinkAtTheOldShareUntilTheNextChange) {
  ServerNetwork server(2 * kGB, 0);
  server.add(0, {3 * kGB, 5});
  server.add(0, {1 * kGB, 2});
  // 1.5 s at B/N = 1 GB/s each: 3 → 1.5, and 1 → −0.5 (done: it leaves the list).
  server.advance(1.5);
  ASSERT_EQ(server.cold_starts().size(), 1u);
  EXPECT_NEAR(server.cold_starts()[0].pending_bytes, 1.5 * kGB, 1);
  // Alone now: the whole 2 GB/s.
  server.advance(2.0);
  EXPECT_NEAR(server.cold_starts()[0].pending_bytes, 0.5 * kGB, 1);
  // Time never runs backwards for the book.
  server.advance(1.0);
  EXPECT_NEAR(server.cold_starts()[0].pending_bytes, 0.5 * kGB, 1);
}

}  // namespace
