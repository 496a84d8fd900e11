// HydraServe's Alg. 1 on testbed (i) of the paper (§8.1): four A10 servers, one 24 GB A10 each,
// 16 Gbps per server — do the pipeline sizes it picks agree with what §8 reports?
//
// What the paper gives and what it does not (papers/hydraserve.md, §8.1–§8.3; our reading in
// docs/design/coordinator-policy-math.md A.6):
// - §8.2 reports NO per-model pipeline size chosen by Alg. 1: "HydraServe is configured at a
//   parallelism size of 4" (fixed), plus a "single worker" variant. Figure 7's model list and
//   TTFTs are in the figure only; the text names Llama2-7B (Table 2) and OPT-6.7B. So this file
//   asserts only the qualitative claims §4.1/§8.2/§8.3 make, never a per-model stage count:
//   (a) the shortest cold start on testbed (i) needs all four stages (what §8.2 runs),
//   (b) a loose TTFT SLO (summarization) needs no pipeline; the stringent ones (chatbot, code
//       completion) get one, (c) never more than 4 stages, minimum resources for the SLO,
//   (d) Llama2-13B does not go on an A10 (the paper runs it on V100s only).
// - t_c (container + runtime init) and t_n are NOT IN PAPER, and t_p is given only for a
//   batch of 8 × 1024 tokens, so every assertion is checked over a grid of them (kProfiles)
//   rather than at one fitted point.
// - Eq. 1 (sequential) is used, as Alg. 1 is printed with it.
// A fixed stage count fails here: s ≡ 1 fails (a) and the chatbot/code checks of (b); s ≡ 4
// fails the summarization check of (b).
#include "coordinator/policy/hydraserve_allocation.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace thaw::coordinator::policy;

// Model sizes: the paper writes "12.5GB" / "24.2GB" (Table 2). Llama2-7B has 6.74e9 and
// Llama2-13B 13.0e9 parameters, i.e. 13.5e9 and 26.0e9 bytes at fp16 — 12.55 and 24.24 GiB, so
// the paper's "GB" is read as GiB.
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kLlama2_7B = 12.5 * kGiB;   // Table 2
constexpr double kLlama2_13B = 24.2 * kGiB;  // Table 2
// A10 GPU memory: 24 GB, stated for the A10s of §8.5 ("NVIDIA A10 GPUs with 24 GB GPU
// memory"); read as 24 GiB, the larger reading, so the 13B check below is not an artefact of
// the unit.
constexpr double kA10Memory = 24 * kGiB;
// §8.1: "The network bandwidth per server is 16 Gbps." 16e9 bit/s = 2e9 B/s.
constexpr double kNetwork = 16e9 / 8;
// p_x: NOT IN PAPER as a bandwidth. §2.2 gives the effective host-to-GPU rate for this very
// model and GPU: "transferring model weights to the GPU, which takes approximately 2 seconds in
// our setup" (Llama2-7B on A10). 12.5 GiB / 2 s ≈ 6.7 GB/s — what Eq. 1's M/p needs; the A10's
// PCIe 4.0 x16 peak (~32 GB/s) would understate the load time.
constexpr double kPcie = kLlama2_7B / 2.0;
// Table 2, Llama2-7B on A10, warm: TPOT 42 ms → t_d.
constexpr double kDecode = 0.042;

// The constants the paper leaves open, as a grid:
// - t_c: NOT IN PAPER (Figure 1's breakdown is a chart); 0.5–3 s.
// - t_p: Table 2's warm TTFT, 1.5 s, is a batch of 8 × 1024 tokens; a single cold-start
//   request is shorter — assumed 0.2 s. Both are tried.
// - t_n: NOT IN PAPER ("the latency of the TCP network between GPU servers"); 1 ms assumed
//   (intra-datacenter TCP; "Llama2-7B incurs only 8 KB of inter-layer results per token").
struct Profile {
  double runtime_init;
  double prefill;
};
constexpr Profile kProfiles[] = {{0.5, 0.2}, {1, 0.2}, {2, 0.2}, {3, 0.2},
                                 {0.5, 1.5}, {1, 1.5}, {2, 1.5}, {3, 1.5}};
constexpr double kNetworkHop = 0.001;

// §8.1: "(i) A GPU cluster that contains 4 A10 servers and 4 V100 servers. Each A10 server has
// a single NVIDIA A10 GPU and 188 GB memory [...]. The network bandwidth per server is 16
// Gbps." Only the A10 part: §8.2's A10 runs use it alone (the V100s' memory and PCIe are not
// given). All GPUs free, no other cold start (b_x = B/(0+1)).
std::vector<ServerState> testbed_i_a10() {
  std::vector<ServerState> out;
  for (std::uint32_t i = 0; i < 4; ++i) {
    out.push_back({i, kNetwork, kPcie, {GpuState{kA10Memory, false}}});
  }
  return out;
}

AllocationRequest request(double model_bytes, const Profile& p, double slo_ttft, double slo_tpot) {
  AllocationRequest r;
  r.model_bytes = model_bytes;
  r.costs = {.runtime_init = p.runtime_init,
             .prefill = p.prefill,
             .decode = kDecode,
             .network_hop = kNetworkHop};
  r.slo_ttft = slo_ttft;
  r.slo_tpot = slo_tpot;
  return r;
}

// Eq. 1 with all s workers full-memory on identical servers: the shortest TTFT any s-stage
// scheme can have here.
double fastest_ttft(int stages, const Profile& p) {
  const std::vector<WorkerLink> group(stages, WorkerLink{kNetwork, kPcie});
  return ttft_sequential(kLlama2_7B, stages, group,
                         {.runtime_init = p.runtime_init,
                          .prefill = p.prefill,
                          .decode = kDecode,
                          .network_hop = kNetworkHop});
}

std::string describe(const Profile& p) {
  return "t_c=" + std::to_string(p.runtime_init) + " t_p=" + std::to_string(p.prefill);
}

TEST(HydraServeTestbedI, TheShortestColdStartTakesFourStagesOnAllFourA10s) {
  const auto servers = testbed_i_a10();
  for (const Profile& p : kProfiles) {
    SCOPED_TRACE(describe(p));
    // §4.1 (Figure 5(a), same four A10 servers at 16 Gbps): "Larger parallelism sizes reduce
    // model fetching time, resulting in shorter TTFT."
    for (int s = 2; s <= 4; ++s) EXPECT_LT(fastest_ttft(s, p), fastest_ttft(s - 1, p));
    // §8.2: "We evaluate the cold start latency for systems on testbed (i), while HydraServe is
    // configured at a parallelism size of 4. [...] HydraServe achieves the shortest cold start
    // latency across all models." — with a TTFT SLO only a 4-stage group can meet, Alg. 1 must
    // choose that group, one worker on each A10 server.
    const double slo = (fastest_ttft(4, p) + fastest_ttft(3, p)) / 2;
    const auto a = allocate_resources(request(kLlama2_7B, p, slo, 0.2), servers);
    ASSERT_TRUE(a);
    EXPECT_TRUE(a->meets_slo);
    EXPECT_EQ(a->stages, 4);
    ASSERT_EQ(a->workers.size(), 4u);
    for (std::uint32_t i = 0; i < 4; ++i) EXPECT_EQ(a->workers[i].server, i);
    EXPECT_EQ(a->shared_gpus, 0);
  }
}

TEST(HydraServeTestbedI, LooseSloRunsOneWorkerStringentSlosGetAPipeline) {
  // Table 3 (§8.3), Llama2-7B: chatbot 7.5 s / 200 ms, code completion 7.5 s / 84 ms,
  // summarization 15 s / 84 ms. §8.3 does not name its testbed; these are the paper's only
  // SLOs, applied here to testbed (i)'s A10s.
  const auto servers = testbed_i_a10();
  for (const Profile& p : kProfiles) {
    SCOPED_TRACE(describe(p));
    const double single_worker_tpot = tpot_pipelined(1, 1, request(0, p, 0, 0).costs);
    // §8.3: "Since the summarization application has loose SLOs, it has few SLO violations for
    // all systems." and §8.2: "Even with a single worker, HydraServe also performs better than
    // ServerlessLLM." — the loose SLO is met by one worker, and Alg. 1 (minimum resources)
    // spends no more.
    const auto summarization = allocate_resources(request(kLlama2_7B, p, 15, 0.084), servers);
    ASSERT_TRUE(summarization);
    EXPECT_TRUE(summarization->meets_slo);
    EXPECT_EQ(summarization->stages, 1);
    EXPECT_DOUBLE_EQ(summarization->tpot, single_worker_tpot);
    // §8.3: "Regarding TPOT, HydraServe exhibits only a 1.06× average increase compared to
    // serverless vLLM, with most increases occurring in chatbot and code models that have
    // stringent TTFT requirements." — those get a pipeline group (s > 1, worst-case TPOT above a
    // single worker's) that meets both SLOs, within §4.1's cap: "The maximum pipeline
    // parallelism size is limited to 4".
    for (const double slo_tpot : {0.2, 0.084}) {  // chatbot, code completion
      SCOPED_TRACE(slo_tpot);
      const auto a = allocate_resources(request(kLlama2_7B, p, 7.5, slo_tpot), servers);
      ASSERT_TRUE(a);
      EXPECT_TRUE(a->meets_slo);
      EXPECT_GE(a->stages, 2);
      EXPECT_LE(a->stages, 4);
      EXPECT_GT(a->tpot, single_worker_tpot);
      EXPECT_LE(a->tpot, slo_tpot);
    }
  }
}

TEST(HydraServeTestbedI, TighterTtftSlosCostMoreButNeverExceedFourStages) {
  // §4.1: "we select the optimal choice that satisfies user SLOs with minimum resource usage.
  // The maximum pipeline parallelism size is limited to 4 as larger parallelism sizes yield
  // little improvement." and §8.3: "HydraServe selects appropriate pipeline parallelism size
  // based on user SLOs". Sweeping the TTFT SLO from loose to tight (TPOT 200 ms, chatbot): the
  // GPU memory chosen never falls, the stage count stays in 1..4, the loosest SLO uses one
  // worker and the tightest one still met uses four (§8.2's configuration). The stage count
  // itself is NOT monotone — a cheaper 3-stage group with one full-memory worker can lose to a
  // 2-stage all-full-memory one as the SLO tightens — and the paper claims no such thing.
  const auto servers = testbed_i_a10();
  for (const Profile& p : kProfiles) {
    SCOPED_TRACE(describe(p));
    double last_memory = 0;
    int first_stages = 0;
    int tightest_met_stages = 0;
    for (double slo = 20; slo > fastest_ttft(4, p) - 0.5; slo -= 0.01) {
      const auto a = allocate_resources(request(kLlama2_7B, p, slo, 0.2), servers);
      ASSERT_TRUE(a);
      EXPECT_GE(a->stages, 1);
      EXPECT_LE(a->stages, 4);
      if (!a->meets_slo) continue;
      if (first_stages == 0) first_stages = a->stages;
      EXPECT_GE(a->gpu_memory, last_memory) << "SLO " << slo;
      last_memory = a->gpu_memory;
      tightest_met_stages = a->stages;
    }
    EXPECT_EQ(first_stages, 1);
    EXPECT_EQ(tightest_met_stages, 4);
  }
}

TEST(HydraServeTestbedI, Llama2_13BFindsNoA10) {
  // §8.1: "Due to the lack of NVLink [65], all evaluated models can reside in a single GPU";
  // Table 2 pairs "Llama2-13B 24.2GB V100", and §8.4: "We deploy Llama2-13B on V100 servers in
  // testbed (i)". 24.2 GiB fits no 24 GB A10, so Alg. 1 has no server for a full-memory worker
  // (its fallback (1, 1, (i_1)) needs one): nullopt, the caller looks elsewhere.
  const auto servers = testbed_i_a10();
  for (const Profile& p : kProfiles) {
    SCOPED_TRACE(describe(p));
    EXPECT_FALSE(allocate_resources(request(kLlama2_13B, p, 12, 0.116), servers));
  }
}

}  // namespace
