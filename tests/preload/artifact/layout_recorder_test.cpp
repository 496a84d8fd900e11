// LayoutRecorder with a fake environment (no driver, no thawd): it looks a record up once the
// identity is complete, compares allocation by allocation, checks a prefix allocated before
// the model was known, and stores a record only when there is something new.
#include "preload/artifact/layout_recorder.hpp"

#include <gtest/gtest.h>

#include <map>

namespace {

using namespace thaw::preload;

constexpr std::uint64_t kBase = 0x200000000000;
constexpr std::uint64_t kGranularity = 2 << 20;

struct FakeWorld {
  std::map<std::string, std::string> stored;  // model → JSON
  std::vector<std::string> notices;
  std::vector<std::string> stops;
  int fetches = 0;
  int divergences = 0;

  RecorderEnvironment env() {
    RecorderEnvironment e;
    e.engine = "engine-fingerprint";
    e.gpu_name = [](CUdevice) { return std::optional<std::string>("Fake GPU"); };
    e.driver_version = [] { return std::optional<std::string>("13000"); };
    e.fetch = [this](const LayoutIdentity& id) -> std::optional<std::string> {
      ++fetches;
      auto it = stored.find(id.model);
      return it == stored.end() ? std::nullopt : std::optional(it->second);
    };
    e.store = [this](const LayoutIdentity& id, const std::string& json) {
      stored[id.model] = json;
      return true;
    };
    e.stop_layout = [this](const std::string& why) { stops.push_back(why); };
    e.notice = [this](const std::string& m) { notices.push_back(m); };
    e.diverged = [this] { ++divergences; };
    return e;
  }
};

// Drives a recorder as the layout would: region, then allocations of `sizes` in order.
// Returns the index of the allocation the recorder refused, or -1.
int run(LayoutRecorder& r, const std::vector<std::uint64_t>& sizes) {
  r.region_reserved(0, kBase, kGranularity);
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (r.admit(i, sizes[i], cursor)) return static_cast<int>(i);
    LayoutAllocation a{i, kBase + cursor, sizes[i],
                       (sizes[i] + kGranularity - 1) / kGranularity * kGranularity, 0};
    r.served(a);
    cursor += a.mapped;
  }
  return -1;
}

TEST(LayoutRecorder, FirstRunStoresSecondMatchesAndStoresNothing) {
  FakeWorld world;
  {
    LayoutRecorder first(world.env());
    first.model_opened("gpt-syn");
    EXPECT_EQ(run(first, {100, 5 << 20, 300}), -1);
    first.note_copy({1, 0, "model.safetensors", 8, 4096});
    first.note_mem_info(10, 20);
    EXPECT_EQ(first.finish(), LayoutRecorder::Outcome::stored);
  }
  ASSERT_TRUE(world.stored.contains("gpt-syn"));
  auto doc = nlohmann::json::parse(world.stored["gpt-syn"]);
  EXPECT_EQ(doc["allocations"].size(), 3u);
  EXPECT_EQ(doc["copies"][0][2], "model.safetensors");
  EXPECT_EQ(doc["identity"]["gpu"], "Fake GPU");

  LayoutRecorder second(world.env());
  second.model_opened("gpt-syn");
  EXPECT_EQ(run(second, {100, 5 << 20, 300}), -1);
  EXPECT_TRUE(second.has_record());
  EXPECT_FALSE(second.diverged());
  EXPECT_EQ(second.finish(), LayoutRecorder::Outcome::matched);
  EXPECT_EQ(world.divergences, 0);
}

TEST(LayoutRecorder, AChangedSequenceIsRefusedAtTheFirstDifferenceAndReplacesTheRecord) {
  FakeWorld world;
  {
    LayoutRecorder first(world.env());
    first.model_opened("gpt-syn");
    run(first, {100, 200, 300});
    first.finish();
  }
  LayoutRecorder changed(world.env());
  changed.model_opened("gpt-syn");
  EXPECT_EQ(run(changed, {100, 250, 300}), 1);
  EXPECT_TRUE(changed.diverged());
  EXPECT_EQ(world.divergences, 1);
  ASSERT_EQ(world.notices.size(), 1u);
  EXPECT_NE(world.notices[0].find("allocation #1 asks for 250 bytes; the record has 200"),
            std::string::npos)
      << world.notices[0];
  // Later allocations are not compared again (the layout stopped serving them).
  EXPECT_FALSE(changed.admit(2, 1, 0));
  EXPECT_EQ(changed.finish(), LayoutRecorder::Outcome::stored);
  EXPECT_EQ(nlohmann::json::parse(world.stored["gpt-syn"])["allocations"].size(), 1u);
}

TEST(LayoutRecorder, APrefixAllocatedBeforeTheModelWasKnownIsCheckedWhenItIs) {
  FakeWorld world;
  {
    LayoutRecorder first(world.env());
    first.model_opened("gpt-syn");
    run(first, {100, 200});
    first.finish();
  }
  LayoutRecorder late(world.env());
  EXPECT_EQ(run(late, {100, 999}), -1);  // no model yet: nothing to compare with
  EXPECT_EQ(world.fetches, 1);           // only the first run looked
  late.model_opened("gpt-syn");
  ASSERT_EQ(world.stops.size(), 1u);
  EXPECT_NE(world.stops[0].find("allocation #1"), std::string::npos) << world.stops[0];
  EXPECT_TRUE(late.diverged());
}

TEST(LayoutRecorder, ARunThatGoesPastTheRecordExtendsIt) {
  FakeWorld world;
  {
    LayoutRecorder first(world.env());
    first.model_opened("m");
    run(first, {100});
    first.finish();
  }
  LayoutRecorder longer(world.env());
  longer.model_opened("m");
  EXPECT_EQ(run(longer, {100, 200}), -1);
  EXPECT_FALSE(longer.diverged());
  EXPECT_EQ(longer.finish(), LayoutRecorder::Outcome::stored);
  EXPECT_EQ(nlohmann::json::parse(world.stored["m"])["allocations"].size(), 2u);
}

TEST(LayoutRecorder, NoModelNoRecordAndARecordOfAnotherBaseIsIgnored) {
  FakeWorld world;
  LayoutRecorder anonymous(world.env());
  run(anonymous, {100});
  EXPECT_EQ(anonymous.finish(), LayoutRecorder::Outcome::no_identity);
  EXPECT_TRUE(world.stored.empty());

  LayoutRecord other;
  other.identity = {"engine-fingerprint", "m", "Fake GPU", "13000"};
  other.va_base = kBase + (1ull << 40);
  other.granularity = kGranularity;
  other.allocations = {{1, 0}};
  world.stored["m"] = other.to_json().dump();
  LayoutRecorder r(world.env());
  r.model_opened("m");
  EXPECT_EQ(run(r, {100}), -1);
  EXPECT_FALSE(r.has_record());
  ASSERT_EQ(world.notices.size(), 1u);
  EXPECT_NE(world.notices[0].find("VA base"), std::string::npos);
}

}  // namespace
