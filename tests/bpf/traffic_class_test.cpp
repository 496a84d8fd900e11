// The arithmetic the BPF classifier and thawd share (bpf/traffic_class.h).
#include "bpf/traffic_class.h"

#include <gtest/gtest.h>

TEST(TrafficClassHeader, MarkRoundTripsClassAndModel) {
  for (thaw_u32 c = 0; c < THAW_CLASS_COUNT; ++c) {
    thaw_u32 mark = thaw_mark_make(c, 513);
    EXPECT_EQ(thaw_mark_class(mark), static_cast<int>(c));
    EXPECT_EQ(thaw_mark_model(mark), 513u);
  }
}

TEST(TrafficClassHeader, ForeignMarksAreNotThaws) {
  EXPECT_EQ(thaw_mark_class(0), -1);
  EXPECT_EQ(thaw_mark_class(0x1234), -1);               // someone's iptables mark
  EXPECT_EQ(thaw_mark_class(0x75000001u), -1);          // wrong magic byte
  EXPECT_EQ(thaw_mark_class(THAW_MARK_MAGIC | 7), -1);  // thaw's magic, no such class
}

TEST(TrafficClassHeader, PriorityNamesThawsHtbLeaf) {
  EXPECT_EQ(thaw_skb_priority(THAW_CLASS_INFERENCE), 0x74680010u);
  EXPECT_EQ(thaw_skb_priority(THAW_CLASS_OTHER), 0x74680013u);
  EXPECT_EQ(thaw_skb_priority(99), thaw_skb_priority(THAW_CLASS_OTHER));
  EXPECT_LT(thaw_htb_prio(THAW_CLASS_INFERENCE), thaw_htb_prio(THAW_CLASS_CRITICAL_FETCH));
  EXPECT_LT(thaw_htb_prio(THAW_CLASS_CRITICAL_FETCH), thaw_htb_prio(THAW_CLASS_BACKGROUND_FETCH));
}

TEST(TrafficClassHeader, FetchesOfModelsGoToSlotLeaves) {
  EXPECT_EQ(thaw_skb_priority_model(THAW_CLASS_CRITICAL_FETCH, 11), 0x74680113u);  // 11 % 4 = 3
  EXPECT_EQ(thaw_skb_priority_model(THAW_CLASS_CRITICAL_FETCH, 12), 0x74680110u);
  EXPECT_EQ(thaw_skb_priority_model(THAW_CLASS_BACKGROUND_FETCH, 1), 0x74680121u);
  // Inference and other have no slots: their own leaf whatever the model.
  EXPECT_EQ(thaw_skb_priority_model(THAW_CLASS_INFERENCE, 5),
            thaw_skb_priority(THAW_CLASS_INFERENCE));
  EXPECT_EQ(thaw_skb_priority_model(THAW_CLASS_OTHER, 5), thaw_skb_priority(THAW_CLASS_OTHER));
}

TEST(TrafficClassHeader, RatesCheckNamesTheBrokenRule) {
  thaw_class_rate ok[2] = {{60, 100}, {40, 100}};
  EXPECT_EQ(thaw_rates_check(100, ok, 2), 0);
  EXPECT_EQ(thaw_rates_check(0, ok, 2), 1);
  thaw_class_rate zero[1] = {{0, 100}};
  EXPECT_EQ(thaw_rates_check(100, zero, 1), 2);
  thaw_class_rate above_ceil[1] = {{50, 40}};
  EXPECT_EQ(thaw_rates_check(100, above_ceil, 1), 3);
  thaw_class_rate ceil_above_link[1] = {{50, 101}};
  EXPECT_EQ(thaw_rates_check(100, ceil_above_link, 1), 4);
  thaw_class_rate oversubscribed[2] = {{60, 100}, {41, 100}};
  EXPECT_EQ(thaw_rates_check(100, oversubscribed, 2), 5);
}

TEST(TrafficClassHeader, HtbBurstAndQuantum) {
  // 100 Mbit/s = 12.5 MB/s: a 1 ms tick is 12500 bytes, plus one frame.
  EXPECT_EQ(thaw_htb_burst_bytes(12'500'000, 1514), 12'500u + 1514u);
  EXPECT_EQ(thaw_htb_burst_bytes(1000, 1514), 2u * 1514u);  // never below two frames
  // 14014 bytes at 12.5 MB/s = 1121120 ns = 17517 ticks of 64 ns.
  EXPECT_EQ(thaw_htb_burst_ticks(12'500'000, 14'014), 1'121'120u / 64u);
  EXPECT_EQ(thaw_htb_quantum(12'500'000, 1514), 200'000u);
  EXPECT_EQ(thaw_htb_quantum(100'000, 1514), 10'000u);
  EXPECT_EQ(thaw_htb_quantum(1'000, 1514), 1514u);
}

TEST(TrafficClassHeader, EdtDepartureTimes) {
  // 1500 bytes at 1.5 MB/s take 1 ms.
  EXPECT_EQ(thaw_edt_next(10'000'000, 0, 1500, 1'500'000), 11'000'000u);
  // Queued behind a packet that leaves later than now.
  EXPECT_EQ(thaw_edt_next(10'000'000, 12'000'000, 1500, 1'500'000), 13'000'000u);
  EXPECT_EQ(thaw_edt_next(5, 0, 1500, 0), 5u);
}

TEST(TrafficClassHeader, FetchWindowIsRateTimesRoundTripAboveTheFloor) {
  // 22.5 MB/s over a 40 ms WAN round trip: 900 KB in flight keeps the fetch at its rate.
  EXPECT_EQ(thaw_fetch_window_bytes(22'500'000, 40'000, 8192), 900'000u);
  // A 30 us veth round trip gives 675 B, less than a segment: the floor holds.
  EXPECT_EQ(thaw_fetch_window_bytes(22'500'000, 30, 8192), 8192u);
  EXPECT_EQ(thaw_fetch_window_bytes(0, 30, 8192), 8192u);
  EXPECT_EQ(thaw_fetch_window_bytes(22'500'000, 0, 8192), 8192u);
  // No overflow at absurd inputs: saturates instead of wrapping to a tiny window.
  EXPECT_EQ(thaw_fetch_window_bytes(~0ull / 2, 1'000'000'000, 8192), ~0ull);
}
