// The "kvcache" record's document and checks, without a driver or thawd: what is written is
// read back; what comes from disk is refused unless it is exactly a version-1 record whose
// values agree; and which differences make a record stale.
#include "preload/restore/kv_record.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace {

using namespace thaw::preload::restore;
using nlohmann::json;

KvRecord sample() {
  KvRecord r;
  r.identity = {"/usr/bin/engine 123 1.000000000", "gpt-syn", "NVIDIA H100 80GB HBM3", "12040"};
  r.key = "gpu_memory_utilization=0.9 max_model_len=32";
  r.conditions = {80ull << 30, 80ull << 30, 70ull << 30, 2ull << 30};
  r.size = {1000ull * 98304, 1000, 98304};
  return r;
}

json doc_of(const KvRecord& r) {
  return json::parse(r.to_json_text());
}

std::string refusal(const json& doc) {
  auto r = parse_kv_record(doc.dump());
  return r ? std::string() : r.error();
}

TEST(KvRecord, RoundTrips) {
  const KvRecord r = sample();
  auto back = parse_kv_record(r.to_json_text());
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, r);
  // thawd's store requires the document's own identity, {engine, model, gpu, driver}.
  const json doc = doc_of(r);
  EXPECT_EQ(doc["identity"]["model"], "gpt-syn");
  EXPECT_EQ(doc["identity"].size(), 4u);
  EXPECT_EQ(doc["version"], 1);
}

TEST(KvRecord, RefusesWhatIsNotAVersionOneRecord) {
  EXPECT_NE(parse_kv_record("").error().find("not JSON"), std::string::npos);
  EXPECT_NE(parse_kv_record("{\"version\": 1,").error().find("not JSON"), std::string::npos);
  EXPECT_NE(parse_kv_record("[1]").error().find("not a JSON object"), std::string::npos);
  json doc = doc_of(sample());
  doc.erase("version");
  EXPECT_NE(refusal(doc).find("no \"version\""), std::string::npos);
  for (json v : {json(2), json(0), json("1"), json(1.0), json(-1)}) {
    json d = doc_of(sample());
    d["version"] = v;
    EXPECT_NE(refusal(d).find("is not one this shim reads (1)"), std::string::npos) << v;
  }
  // A later version's document is refused as such, even when it has more fields.
  json later = doc_of(sample());
  later["version"] = 2;
  later["graphs"] = json::array();
  EXPECT_NE(refusal(later).find("version 2 is not one"), std::string::npos) << refusal(later);
}

TEST(KvRecord, RefusesUnknownAndMissingFields) {
  json doc = doc_of(sample());
  doc["extra"] = 1;
  EXPECT_NE(refusal(doc).find("unknown field 'extra'"), std::string::npos) << refusal(doc);
  doc = doc_of(sample());
  doc["conditions"]["mem_peak"] = 1;
  EXPECT_NE(refusal(doc).find("conditions has an unknown field 'mem_peak'"), std::string::npos);
  doc = doc_of(sample());
  doc["kv"].erase("num_blocks");
  EXPECT_NE(refusal(doc).find("kv lacks \"num_blocks\""), std::string::npos);
  doc = doc_of(sample());
  doc["identity"].erase("driver");
  EXPECT_NE(refusal(doc).find("identity lacks \"driver\""), std::string::npos);
  doc = doc_of(sample());
  doc["identity"] = "gpt-syn";
  EXPECT_NE(refusal(doc).find("identity is not an object"), std::string::npos);
}

TEST(KvRecord, RefusesValuesOfTheWrongTypeOrRange) {
  for (json v : {json(-1), json(1.5), json("12"), json(nullptr), json(1e30)}) {
    json doc = doc_of(sample());
    doc["conditions"]["mem_free"] = v;
    EXPECT_NE(refusal(doc).find("conditions.mem_free is not an unsigned integer"),
              std::string::npos)
        << v;
  }
  json doc = doc_of(sample());
  doc["identity"]["gpu"] = "";
  EXPECT_NE(refusal(doc).find("identity.gpu is empty"), std::string::npos);
  doc = doc_of(sample());
  doc["identity"]["engine"] = std::string(5000, 'e');
  EXPECT_NE(refusal(doc).find("identity.engine is empty or longer"), std::string::npos);
  doc = doc_of(sample());
  doc["key"] = "a\nb";
  EXPECT_NE(refusal(doc).find("only printable ASCII"), std::string::npos);
  doc = doc_of(sample());
  doc["key"] = "";
  EXPECT_NE(refusal(doc).find("key is empty"), std::string::npos);
  doc = doc_of(sample());
  doc["key"] = 7;
  EXPECT_NE(refusal(doc).find("key is not a string"), std::string::npos);
}

TEST(KvRecord, RefusesValuesThatContradictOneAnother) {
  json doc = doc_of(sample());
  doc["kv"]["kv_bytes"] = 12345;
  EXPECT_NE(refusal(doc).find("is not num_blocks 1000 x block_bytes 98304"), std::string::npos);
  doc = doc_of(sample());
  doc["kv"]["num_blocks"] = 0;
  doc["kv"]["kv_bytes"] = 0;
  EXPECT_NE(refusal(doc).find("num_blocks is 0"), std::string::npos);
  doc = doc_of(sample());
  doc["kv"] = {{"kv_bytes", 0}, {"num_blocks", 1ull << 40}, {"block_bytes", 1ull << 40}};
  EXPECT_NE(refusal(doc).find("is not num_blocks"), std::string::npos) << "overflow";
  doc = doc_of(sample());
  doc["conditions"]["mem_free"] = (81ull << 30);
  EXPECT_NE(refusal(doc).find("exceeds its total"), std::string::npos);
  doc = doc_of(sample());
  doc["conditions"]["mem_total"] = 1ull << 20;
  doc["conditions"]["mem_free"] = 0;
  EXPECT_NE(refusal(doc).find("exceeds the memory budget"), std::string::npos);
  doc = doc_of(sample());
  doc["conditions"]["device_total"] = 0;
  EXPECT_NE(refusal(doc).find("a device of no memory"), std::string::npos);
}

TEST(KvRecord, RefusesOversizedOrDeepDocumentsBeforeParsing) {
  std::string big = doc_of(sample()).dump();
  big.insert(1, std::string(KvRecord::kMaxDocumentBytes, ' '));
  EXPECT_NE(parse_kv_record(big).error().find("more than a KV record's"), std::string::npos);
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  EXPECT_NE(parse_kv_record(deep).error().find("nests deeper than 2"), std::string::npos);
  json doc = doc_of(sample());
  doc["conditions"]["device_total"] = json::array({json::array()});
  EXPECT_NE(refusal(doc).find("nests deeper"), std::string::npos);
  // Brackets inside strings are not nesting.
  KvRecord r = sample();
  r.key = "[[[[{{{{ \\\" ]]]";
  auto back = parse_kv_record(r.to_json_text());
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->key, r.key);
}

TEST(KvRecord, KeysArePrintableAsciiWithinTheLimit) {
  EXPECT_FALSE(invalid_key("a=1 b=2"));
  EXPECT_FALSE(invalid_key(std::string(KvRecord::kMaxKeyBytes, 'k')));
  EXPECT_TRUE(invalid_key(std::string(KvRecord::kMaxKeyBytes + 1, 'k')));
  EXPECT_TRUE(invalid_key(""));
  EXPECT_TRUE(invalid_key("caf\xc3\xa9"));
  EXPECT_TRUE(invalid_key(std::string("a\0b", 3)));
}

TEST(KvRecordStaleness, AFreshRecordHolds) {
  const KvRecord r = sample();
  EXPECT_FALSE(staleness(r, r.key, r.conditions));
}

TEST(KvRecordStaleness, EachThingTheEngineSizedFromMakesItStale) {
  const KvRecord r = sample();
  auto why = staleness(r, "gpu_memory_utilization=0.8 max_model_len=32", r.conditions);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("configuration key differs"), std::string::npos) << *why;
  EXPECT_NE(why->find("0.8"), std::string::npos) << *why;

  KvConditions c = r.conditions;
  c.device_total = 40ull << 30;
  why = staleness(r, r.key, c);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("device's total memory differs"), std::string::npos) << *why;

  c = r.conditions;
  c.mem_total = 60ull << 30;  // thawd lent another budget
  why = staleness(r, r.key, c);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("memory budget cuMemGetInfo answers differs"), std::string::npos) << *why;

  c = r.conditions;
  c.engine_bytes += 2 << 20;  // other weights
  why = staleness(r, r.key, c);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("weights and buffers"), std::string::npos) << *why;
}

TEST(KvRecordStaleness, FreeMemoryMayDriftWithinATolerance) {
  const KvRecord r = sample();
  const std::uint64_t tolerance = free_tolerance(r.conditions.mem_total);
  EXPECT_EQ(tolerance, (80ull << 30) / 256);
  KvConditions c = r.conditions;
  c.mem_free = r.conditions.mem_free - tolerance;
  EXPECT_FALSE(staleness(r, r.key, c));
  c.mem_free = r.conditions.mem_free + tolerance;
  EXPECT_FALSE(staleness(r, r.key, c));
  c.mem_free = r.conditions.mem_free - tolerance - 1;
  auto why = staleness(r, r.key, c);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("free memory differs"), std::string::npos) << *why;
  c.mem_free = r.conditions.mem_free + tolerance + 1;
  EXPECT_TRUE(staleness(r, r.key, c));
}

}  // namespace
