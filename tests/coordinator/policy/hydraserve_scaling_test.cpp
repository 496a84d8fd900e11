// HydraServe §6.1 scaling rules on hand-computed cases.
#include "coordinator/policy/hydraserve_scaling.hpp"

#include <gtest/gtest.h>

namespace {

using namespace thaw::coordinator::policy;

TEST(HydraServeScaling, NewWorkersCoverTheQueueBeyondStartingWorkersPlusTheNextWindow) {
  EXPECT_EQ(new_workers_needed({.waiting = 0, .arrivals_last_window = 50}), 0u);
  EXPECT_EQ(new_workers_needed({.waiting = 8, .starting_capacity = 8, .arrivals_last_window = 9}),
            0u)
      << "what is starting takes the queue";
  // (10 − 2 + 7) / 8 → 2 workers.
  EXPECT_EQ(new_workers_needed({10, 2, 7, 8}), 2u);
  EXPECT_EQ(new_workers_needed({1, 0, 0, 8}), 1u);
  EXPECT_EQ(new_workers_needed({240, 0, 0, 8}), 30u);
}

TEST(HydraServeScaling, GroupsOfFourThenTheRemainder) {
  EXPECT_EQ(pipeline_groups(30), (std::vector<std::uint32_t>{4, 4, 4, 4, 4, 4, 4, 2}));
  EXPECT_EQ(pipeline_groups(3), (std::vector<std::uint32_t>{3}));
  EXPECT_TRUE(pipeline_groups(0).empty());
  EXPECT_EQ(pipeline_groups(5, 2), (std::vector<std::uint32_t>{2, 2, 1}));
}

TEST(HydraServeScaling, AGroupScalesDownByDefaultAndUpForALoadSpike) {
  const Consolidation down = consolidate(4, 1);
  EXPECT_FALSE(down.scale_up);
  EXPECT_EQ(down.standalone, 1u);
  EXPECT_EQ(down.terminated, 3u);
  EXPECT_EQ(consolidate(4, 0).standalone, 1u) << "the model keeps one worker";
  const Consolidation up = consolidate(4, 3);
  EXPECT_TRUE(up.scale_up);
  EXPECT_EQ(up.standalone, 3u);
  EXPECT_EQ(up.terminated, 1u);
  EXPECT_EQ(consolidate(2, 9).standalone, 2u) << "never more than the group has";
}

}  // namespace
