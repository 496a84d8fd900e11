// The layout record's logic: its JSON form round-trips, rejects what is not a record, merges
// contiguous copies, and SequenceCheck finds the first allocation that differs.
#include "common/layout/layout_record.hpp"

#include <gtest/gtest.h>

namespace {

using namespace thaw::layout;

LayoutRecord sample() {
  LayoutRecord r;
  r.identity = {"/usr/bin/engine 123 4.5", "gpt-syn", "Thaw Emulated GPU", "13000"};
  r.va_base = 0x200000000000;
  r.granularity = 2 << 20;
  r.allocations = {{100, 0}, {4 << 20, 2 << 20}};
  r.add_copy({0, 0, "model.safetensors", 128, 64});
  r.mem_info = {{1000, 2000}};
  return r;
}

TEST(LayoutRecord, JsonRoundTrips) {
  const LayoutRecord r = sample();
  auto back = layout_record_from_json(nlohmann::json::parse(r.to_json().dump()));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->identity, r.identity);
  EXPECT_EQ(back->va_base, r.va_base);
  EXPECT_EQ(back->granularity, r.granularity);
  EXPECT_EQ(back->allocations, r.allocations);
  EXPECT_EQ(back->copies, r.copies);
  EXPECT_EQ(back->mem_info, r.mem_info);
  EXPECT_FALSE(back->truncated);
}

TEST(LayoutRecord, WhatIsNotARecordIsRefusedSayingWhy) {
  EXPECT_FALSE(layout_record_from_json(nlohmann::json::array()));
  nlohmann::json doc = sample().to_json();
  doc["format"] = 2;
  auto r = layout_record_from_json(doc);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("format"), std::string::npos);
  doc = sample().to_json();
  doc["allocations"][0] = {1};  // a row too short
  r = layout_record_from_json(doc);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("allocations"), std::string::npos);
  doc = sample().to_json();
  doc["identity"].erase("gpu");
  EXPECT_FALSE(layout_record_from_json(doc));
}

TEST(LayoutRecord, ContiguousCopiesMergeIntoOneEntry) {
  LayoutRecord r;
  r.add_copy({3, 0, "a.safetensors", 1000, 100});
  r.add_copy({3, 100, "a.safetensors", 1100, 50});  // continues both offsets: merged
  r.add_copy({3, 150, "b.safetensors", 1150, 10});  // another file
  r.add_copy({3, 400, "b.safetensors", 1160, 10});  // a gap on the device side
  ASSERT_EQ(r.copies.size(), 3u);
  EXPECT_EQ(r.copies[0].bytes, 150u);
  EXPECT_EQ(r.copies[1].file, "b.safetensors");
  EXPECT_EQ(r.copies[2].offset, 400u);
}

TEST(SequenceCheck, TheFirstDifferentAllocationIsNamed) {
  const SequenceCheck check({{100, 0}, {200, 0x200000}, {300, 0x400000}});
  EXPECT_FALSE(check.check(0, 100, 0));
  EXPECT_FALSE(check.check(1, 200, 0x200000));
  auto size = check.check(2, 301, 0x400000);
  ASSERT_TRUE(size);
  EXPECT_NE(size->find("allocation #2 asks for 301 bytes; the record has 300"), std::string::npos)
      << *size;
  auto offset = check.check(2, 300, 0x600000);
  ASSERT_TRUE(offset);
  EXPECT_NE(offset->find("offset"), std::string::npos);
  // Past the record's end there is nothing to compare with.
  EXPECT_FALSE(check.check(3, 999, 0x800000));
}

}  // namespace
