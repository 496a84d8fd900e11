// Per-node class rates from the cold starts placed there (HydraServe §4.2, Eq. 3/4 shares).
#include "coordinator/policy/hydraserve_class_rates.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace thaw::coordinator::policy {
namespace {

constexpr double kB = 1.25e9;  // 10 Gbit/s

double sum_of_rates(const NodeClassRates& r) {
  double sum = 0;
  for (const ClassRate& c : r.classes) sum += c.rate;
  return sum;
}

TEST(ClassRates, NoColdStartLeavesTheNodeOnItsOwnRates) {
  const NodeClassRates r = node_class_rates(kB, 0);
  EXPECT_EQ(r.cold_starts, 0u);
  EXPECT_EQ(r.per_cold_start, 0);
  for (const ClassRate& c : r.classes) {
    EXPECT_EQ(c.rate, 0);
    EXPECT_EQ(c.ceil, 0);
  }
}

TEST(ClassRates, ColdStartsShareTheCriticalClassEqually) {
  for (std::uint32_t n : {1u, 2u, 3u, 7u}) {
    SCOPED_TRACE(n);
    const NodeClassRates r = node_class_rates(kB, n);
    // Default reserves: 10 % inference, 2 % background, 5 % other; the rest is B_c.
    EXPECT_DOUBLE_EQ(r.classes[0].rate, 0.10 * kB);
    EXPECT_DOUBLE_EQ(r.classes[2].rate, 0.02 * kB);
    EXPECT_DOUBLE_EQ(r.classes[3].rate, 0.05 * kB);
    EXPECT_NEAR(r.classes[1].rate, 0.83 * kB, 1);
    EXPECT_NEAR(r.per_cold_start, 0.83 * kB / n, 1e-3);
    // Eq. 4's bookkeeping: N workers at B_c/N fetch B_c per second together.
    EXPECT_NEAR(r.per_cold_start * n, r.classes[1].rate, 1e-3);
    EXPECT_LE(sum_of_rates(r), kB * (1 + 1e-12));
    for (const ClassRate& c : r.classes) EXPECT_EQ(c.ceil, kB);  // nothing idles
  }
  // One more cold start lowers every existing one's share to B_c/(N+1) (Eq. 3).
  EXPECT_NEAR(node_class_rates(kB, 3).per_cold_start,
              node_class_rates(kB, 2).per_cold_start * 2.0 / 3.0, 1e-3);
}

TEST(ClassRates, ReservesAreHonouredAndNonsenseOnesReplaced) {
  const NodeClassRates r = node_class_rates(1000, 4, ClassReserve{0.2, 0.1, 0.1});
  EXPECT_DOUBLE_EQ(r.classes[1].rate, 600);
  EXPECT_DOUBLE_EQ(r.per_cold_start, 150);
  for (const ClassReserve bad :
       {ClassReserve{0.5, 0.3, 0.2}, ClassReserve{-0.1, 0.0, 0.0},
        ClassReserve{std::numeric_limits<double>::quiet_NaN(), 0.0, 0.0}}) {
    const NodeClassRates d = node_class_rates(1000, 1, bad);
    EXPECT_NEAR(d.classes[1].rate, 830, 1e-9) << "defaults replace an unusable reserve";
  }
}

TEST(ClassRates, AnUnknownLinkGivesNothingToSet) {
  for (double link : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    const NodeClassRates r = node_class_rates(link, 3);
    EXPECT_EQ(r.link_bytes_per_s, 0);
    EXPECT_EQ(r.classes[1].rate, 0);
    EXPECT_EQ(r.per_cold_start, 0);
  }
}

TEST(ClassRates, ColdStartFetchesCountOnTheCriticalShareOnlyWhereTheNodeShapes) {
  EXPECT_DOUBLE_EQ(cold_start_fetch_bytes_per_s(1e9, false), 1e9);
  // 1 - 0.10 - 0.02 - 0.05 of the link, whatever the number of cold starts.
  EXPECT_NEAR(cold_start_fetch_bytes_per_s(1e9, true), 0.83e9, 1);
  EXPECT_DOUBLE_EQ(cold_start_fetch_bytes_per_s(1e9, true),
                   node_class_rates(1e9, 3).classes[1].rate);
  EXPECT_NEAR(cold_start_fetch_bytes_per_s(1e9, true, {0.2, 0.1, 0.1}), 0.6e9, 1);
  EXPECT_EQ(cold_start_fetch_bytes_per_s(0, true), 0);
  EXPECT_EQ(cold_start_fetch_bytes_per_s(-1, false), 0);
}

}  // namespace
}  // namespace thaw::coordinator::policy
