// WarmServe's prediction and prewarm demand, on hand-computed cases and on a synthetic week:
// a daily pattern plus a linear drift plus ±1 % noise is predicted within 2 % once the
// predictor has a day of history and its lookback.
#include "coordinator/policy/warmserve_prediction.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace {

using namespace thaw::coordinator::policy;

TEST(CorrectiveSeasonalPredictor, SeasonalComponentIsTheSameWindowOnThePreviousDays) {
  // Eq. 2 with D = 3: L(k−1,i) = 10, L(k−2,i) = 12, L(k−3,i) = 14 → P = 12.
  const CspConfig c{.windows_per_day = 4, .history_days = 3, .lookback = 2};
  const std::vector<double> s = {14, 0, 0, 0, 12, 0, 0, 0, 10, 0, 0, 0};
  EXPECT_DOUBLE_EQ(seasonal_component(s, 12, c).value(), 12.0);
  // Fewer days than D: the days there are. None: no prediction.
  EXPECT_DOUBLE_EQ(seasonal_component(s, 8, c).value(), 13.0);
  EXPECT_FALSE(seasonal_component(s, 3, c));
  EXPECT_FALSE(predict_load(s, 3, c));
}

TEST(CorrectiveSeasonalPredictor, CorrectionWeighsRecentErrorsMostUnlessAskedForEq3AsPrinted) {
  // Window-of-day series with P = 0 everywhere on day 0 ... built so that the errors of the
  // three windows before t are e1 = +6 (most recent), e2 = +2, e3 = −1.
  CspConfig c{.windows_per_day = 4, .history_days = 1, .lookback = 3};
  // Day 0: seasonal bases; day 1: base + error for windows 0..2, window 3 predicted.
  const std::vector<double> s = {10, 10, 10, 10, 10 - 1, 10 + 2, 10 + 6};
  // Recency (the authors' code): (6·4 + 2·2 − 1·1) / 7 = 27/7.
  EXPECT_NEAR(correction(s, 7, c), 27.0 / 7.0, 1e-12);
  EXPECT_NEAR(predict_load(s, 7, c).value(), 10 + 27.0 / 7.0, 1e-12);
  // Eq. 3 as printed: (6·1 + 2·2 − 1·4) / 7 = 6/7.
  c.recent_errors_weigh_most = false;
  EXPECT_NEAR(correction(s, 7, c), 6.0 / 7.0, 1e-12);
}

TEST(CorrectiveSeasonalPredictor, PredictionsAreNeverNegative) {
  const CspConfig c{.windows_per_day = 2, .history_days = 1, .lookback = 1};
  // The last window fell far below its season: P = 1, Δ = −9.
  const std::vector<double> s = {10, 1, 1};
  EXPECT_DOUBLE_EQ(predict_load(s, 3, c).value(), 0.0);
}

TEST(CorrectiveSeasonalPredictor, RecoversADailyPatternWithDriftWithinTwoPercent) {
  const CspConfig c;  // 288 windows of 5 minutes, D = 7, N = 10
  const std::size_t day = c.windows_per_day;
  const std::size_t days = 14;
  std::vector<double> s;
  std::uint64_t rng = 12345;
  auto noise = [&] {  // deterministic, uniform in [−1, 1]
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(rng >> 11) / static_cast<double>(1ull << 53) * 2 - 1;
  };
  for (std::size_t t = 0; t < days * day; ++t) {
    const double phase = 2 * std::numbers::pi * static_cast<double>(t % day) / day;
    const double truth = 100 + 60 * std::sin(phase) + 0.01 * static_cast<double>(t);  // drift
    s.push_back(truth * (1 + 0.01 * noise()));
  }
  // After a week of history (Eq. 2's D days) and the lookback: mean relative error.
  double error = 0;
  std::size_t n = 0;
  for (std::size_t t = 7 * day + c.lookback; t < s.size(); ++t) {
    const double predicted = predict_load(std::span(s).first(t), t, c).value();
    error += std::abs(predicted - s[t]) / s[t];
    ++n;
  }
  EXPECT_LT(error / n, 0.02) << "mean relative error over " << n << " windows";
  // Without the correction (Δ) the drift shows: the seasonal mean lags it.
  double seasonal_error = 0;
  for (std::size_t t = 7 * day + c.lookback; t < s.size(); ++t) {
    seasonal_error += std::abs(seasonal_component(s, t, c).value() - s[t]) / s[t];
  }
  EXPECT_GT(seasonal_error / n, error / n);
  RecordProperty("mean_relative_error", std::to_string(error / n));
  RecordProperty("seasonal_only_error", std::to_string(seasonal_error / n));
}

TEST(PrewarmReplicas, BasicThenBurstWithTheirScores) {
  // L_A = 40, L_P = 100, B = 32, K = 0, T_c = 1: N_basic = ⌈1.25⌉ = 2, N_burst = ⌈3.125⌉ − 2 = 2.
  const auto r = prewarm_replicas({40, 100, 0, 32, 1.0});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_FALSE(r[0].burst);
  EXPECT_NEAR(r[0].score, 1.0, 1e-9);
  EXPECT_NEAR(r[1].score, 0.778801, 1e-6);  // e^(−1/4)
  EXPECT_TRUE(r[2].burst);
  EXPECT_EQ(r[2].rank, 0u);
  EXPECT_NEAR(r[2].score, 0.909796, 1e-6);  // e^(−2/4) · (100 − 40)/40
  EXPECT_NEAR(r[3].score, 0.708550, 1e-6);  // e^(−3/4) · 1.5
  // Burst[0] outscores basic[1], and basic still comes first (the order is the priority).
  EXPECT_GT(r[2].score, r[1].score);
  // Scores scale with the cold start they save.
  EXPECT_NEAR(prewarm_replicas({40, 100, 0, 32, 2.5})[1].score, 2.5 * 0.778801, 1e-5);
}

TEST(PrewarmReplicas, ActiveInstancesCoverDemandFirst) {
  // K = 3 covers the average: no basic replica, one burst (⌈100/32⌉ = 4).
  const auto r = prewarm_replicas({40, 100, 3, 32, 1.0});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].burst);
  EXPECT_NEAR(r[0].score, 1.5, 1e-9);  // e^0 · 1 · 1.5
  EXPECT_TRUE(prewarm_replicas({40, 100, 4, 32, 1.0}).empty());
  EXPECT_TRUE(prewarm_replicas({0, 0, 0, 32, 1.0}).empty());
  // No average load but a peak: burst replicas, the burstiness factor divides by one request.
  const auto idle = prewarm_replicas({0, 40, 0, 32, 1.0});
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_NEAR(idle[0].score, 40.0, 1e-9);
}

TEST(KvReservationTarget, KeepsTheLargerOfExpectedUseAndUsePlusOneRequest) {
  // M = 1000 blocks, C = 32.
  EXPECT_DOUBLE_EQ(kv_reservation_target(1000, 4, 32, 200), 231.25);  // K + M/C
  EXPECT_DOUBLE_EQ(kv_reservation_target(1000, 20, 32, 500), 625.0);  // M·R/C
  EXPECT_DOUBLE_EQ(kv_reservation_target(1000, 0, 32, 0), 31.25);     // one request's worth
  EXPECT_DOUBLE_EQ(kv_reservation_target(1000, 4, 0, 200), 1000.0);   // unknown batch: all
}

}  // namespace
