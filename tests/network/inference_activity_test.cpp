// InferenceActivity: from samples of the classifier's inference packet counter, whether
// inference runs now (thawd clamps fetch windows while it does).
#include "daemon/network/inference_activity.hpp"

#include <gtest/gtest.h>

namespace thaw::network {
namespace {

using namespace std::chrono_literals;

TEST(InferenceActivity, ActiveFromNewPacketsUntilTheHoldPassesWithoutAny) {
  InferenceActivity a(2000ms);
  const auto t0 = InferenceActivity::Clock::time_point{} + 100s;
  EXPECT_FALSE(a.sample(500, t0)) << "the first sample is only the baseline";
  EXPECT_FALSE(a.sample(500, t0 + 50ms));
  EXPECT_TRUE(a.sample(501, t0 + 100ms));
  EXPECT_TRUE(a.sample(501, t0 + 2000ms)) << "held between two requests";
  EXPECT_TRUE(a.sample(530, t0 + 2050ms));
  EXPECT_TRUE(a.sample(530, t0 + 4000ms));
  EXPECT_FALSE(a.sample(530, t0 + 4050ms)) << "2 s without a packet";
  EXPECT_FALSE(a.active(t0 + 5s));
}

TEST(InferenceActivity, ACounterThatWentBackIsANewBaseline) {
  InferenceActivity a(1000ms);
  const auto t0 = InferenceActivity::Clock::time_point{} + 100s;
  a.sample(900, t0);
  EXPECT_FALSE(a.sample(3, t0 + 50ms)) << "the classifier restarted: no traffic implied";
  EXPECT_TRUE(a.sample(4, t0 + 100ms));
}

}  // namespace
}  // namespace thaw::network
