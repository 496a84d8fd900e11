// KvRestore with a fake environment (no driver, no thawd): the order of the ABI's calls, what a
// record is made of (the conditions noted at the lookup, not those at the record), and every
// answer a lookup can give.
#include "preload/restore/kv_restore.hpp"

#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

namespace {

using namespace thaw::preload::restore;

const std::string kKey = "gpu_memory_utilization=0.9 max_model_len=32";

// A node: this run's identity and conditions, and thawd's store (keyed by identity).
struct FakeNode {
  KvIdentity identity{"engine-fp", "", "Emulated H100", "12040"};
  KvConditions conditions{6ull << 30, 6ull << 30, 5ull << 30, 300ull << 20};
  std::map<std::string, std::string> stored;  // by model
  bool thawd = true;
  int fetches = 0, stores = 0;

  KvRestoreEnvironment env() {
    KvRestoreEnvironment e;
    e.identity = [this]() -> std::expected<KvIdentity, std::string> { return identity; };
    e.conditions = [this]() -> std::expected<KvConditions, std::string> { return conditions; };
    e.fetch = [this](const KvIdentity& id) -> std::optional<std::string> {
      ++fetches;
      if (!thawd) return std::nullopt;
      auto it = stored.find(id.model);
      if (it == stored.end()) return std::nullopt;
      return it->second;
    };
    e.store = [this](const KvIdentity& id, const std::string& doc) {
      ++stores;
      if (!thawd) return false;
      stored[id.model] = doc;
      return true;
    };
    return e;
  }
};

const KvSize kSize{345 * 49152ull, 345, 49152};

TEST(KvRestore, WithoutAModelFromThawsCacheNothingIsLookedUp) {
  FakeNode node;
  KvRestore kv(node.env());
  const auto l = kv.lookup(kKey);
  EXPECT_EQ(l.status, KvStatus::unavailable);
  EXPECT_NE(l.why.find("no model from thaw's cache"), std::string::npos) << l.why;
  EXPECT_EQ(node.fetches, 0);
  EXPECT_EQ(kv.record(kKey, kSize).status, KvStatus::no_lookup);
}

TEST(KvRestore, FirstRunRecordsSecondRunRestores) {
  FakeNode node;
  {
    KvRestore first(node.env());
    first.model_opened("gpt-syn");
    first.model_opened("other-model");  // only the first model counts
    EXPECT_EQ(first.record(kKey, kSize).status, KvStatus::no_lookup) << "record before lookup";
    const auto l = first.lookup(kKey);
    EXPECT_EQ(l.status, KvStatus::none) << l.why;
    EXPECT_NE(l.why.find("no KV record"), std::string::npos) << l.why;
    // The profiling pass uses memory: the record keeps what the lookup saw.
    const KvConditions at_lookup = node.conditions;
    node.conditions.mem_free -= 1ull << 30;
    const auto r = first.record(kKey, kSize);
    ASSERT_EQ(r.status, KvStatus::ok) << r.why;
    ASSERT_EQ(node.stored.count("gpt-syn"), 1u);
    const auto doc = nlohmann::json::parse(node.stored["gpt-syn"]);
    EXPECT_EQ(doc["conditions"]["mem_free"], at_lookup.mem_free);
    EXPECT_EQ(doc["identity"]["model"], "gpt-syn");
    EXPECT_EQ(doc["key"], kKey);
    node.conditions = at_lookup;
  }
  KvRestore second(node.env());
  second.model_opened("gpt-syn");
  const auto l = second.lookup(kKey);
  ASSERT_EQ(l.status, KvStatus::ok) << l.why;
  EXPECT_EQ(l.size, kSize);
}

TEST(KvRestore, RecordNeedsALookupOfTheSameKey) {
  FakeNode node;
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  (void)kv.lookup(kKey);
  const auto r = kv.record("another key", kSize);
  EXPECT_EQ(r.status, KvStatus::no_lookup);
  EXPECT_NE(r.why.find("look up before the profiling pass"), std::string::npos) << r.why;
  EXPECT_EQ(node.stores, 0);
}

TEST(KvRestore, RefusesBadArguments) {
  FakeNode node;
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  EXPECT_EQ(kv.lookup("").status, KvStatus::invalid_argument);
  EXPECT_EQ(kv.lookup("tab\there").status, KvStatus::invalid_argument);
  (void)kv.lookup(kKey);
  EXPECT_EQ(kv.record(kKey, {10, 3, 4}).status, KvStatus::invalid_argument);
  EXPECT_EQ(kv.record(kKey, {0, 0, 4}).status, KvStatus::invalid_argument);
  // Larger than the budget it was sized in.
  const auto r = kv.record(kKey, {7ull << 30, 7, 1ull << 30});
  EXPECT_EQ(r.status, KvStatus::invalid_argument);
  EXPECT_NE(r.why.find("exceeds the memory budget"), std::string::npos) << r.why;
  EXPECT_EQ(node.stores, 0);
}

// Records a sample for `node` and returns a fresh KvRestore of the next run.
void record_once(FakeNode& node) {
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  (void)kv.lookup(kKey);
  ASSERT_EQ(kv.record(kKey, kSize).status, KvStatus::ok);
}

TEST(KvRestore, StaleRecordsAreNotReturned) {
  FakeNode node;
  record_once(node);
  node.conditions.device_total = 4ull << 30;
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  auto l = kv.lookup(kKey);
  EXPECT_EQ(l.status, KvStatus::stale);
  EXPECT_NE(l.why.find("device's total memory differs"), std::string::npos) << l.why;
  EXPECT_EQ(l.size, KvSize{}) << "nothing returned with a stale record";
  // The engine profiles and records under today's conditions: the next run restores.
  ASSERT_EQ(kv.record(kKey, kSize).status, KvStatus::ok);
  KvRestore next(node.env());
  next.model_opened("gpt-syn");
  EXPECT_EQ(next.lookup(kKey).status, KvStatus::ok);
  // Another configuration key.
  l = next.lookup("gpu_memory_utilization=0.5 max_model_len=32");
  EXPECT_EQ(l.status, KvStatus::stale);
  EXPECT_NE(l.why.find("configuration key differs"), std::string::npos) << l.why;
}

TEST(KvRestore, CorruptOrForeignRecordsAreRefused) {
  FakeNode node;
  record_once(node);
  const std::string good = node.stored["gpt-syn"];
  auto lookup = [&] {
    KvRestore kv(node.env());
    kv.model_opened("gpt-syn");
    return kv.lookup(kKey);
  };
  node.stored["gpt-syn"] = good.substr(0, good.size() / 2);
  auto l = lookup();
  EXPECT_EQ(l.status, KvStatus::corrupt);
  EXPECT_NE(l.why.find("thawd's KV record is refused: it is not JSON"), std::string::npos) << l.why;
  auto doc = nlohmann::json::parse(good);
  doc["version"] = 7;
  node.stored["gpt-syn"] = doc.dump();
  l = lookup();
  EXPECT_EQ(l.status, KvStatus::corrupt);
  EXPECT_NE(l.why.find("version 7 is not one this shim reads"), std::string::npos) << l.why;
  doc = nlohmann::json::parse(good);
  doc["identity"]["gpu"] = "another GPU";
  node.stored["gpt-syn"] = doc.dump();
  l = lookup();
  EXPECT_EQ(l.status, KvStatus::corrupt);
  EXPECT_NE(l.why.find("identity"), std::string::npos) << l.why;
}

TEST(KvRestore, WithoutThawdNothingIsFoundOrStored) {
  FakeNode node;
  node.thawd = false;
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  EXPECT_EQ(kv.lookup(kKey).status, KvStatus::none);
  const auto r = kv.record(kKey, kSize);
  EXPECT_EQ(r.status, KvStatus::unavailable);
  EXPECT_NE(r.why.find("did not store"), std::string::npos) << r.why;
}

TEST(KvRestore, UnknownDriverStateIsUnavailable) {
  FakeNode node;
  auto env = node.env();
  env.conditions = []() -> std::expected<KvConditions, std::string> {
    return std::unexpected("the calling thread has no current CUDA context");
  };
  KvRestore kv(std::move(env));
  kv.model_opened("gpt-syn");
  const auto l = kv.lookup(kKey);
  EXPECT_EQ(l.status, KvStatus::unavailable);
  EXPECT_NE(l.why.find("no current CUDA context"), std::string::npos);
  EXPECT_EQ(kv.record(kKey, kSize).status, KvStatus::no_lookup);
}

TEST(KvRestore, AForkedChildStartsWithoutTheParentsLookup) {
  FakeNode node;
  KvRestore kv(node.env());
  kv.model_opened("gpt-syn");
  (void)kv.lookup(kKey);
  kv.reset_after_fork();
  EXPECT_EQ(kv.record(kKey, kSize).status, KvStatus::no_lookup);
  // The model opened before the fork is the child's too.
  EXPECT_EQ(kv.lookup(kKey).status, KvStatus::none);
  EXPECT_EQ(kv.record(kKey, kSize).status, KvStatus::ok);
}

}  // namespace
