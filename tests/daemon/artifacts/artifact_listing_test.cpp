// What operators are shown of the engines' records (ArtifactStore::list, summarize_artifact):
// each kind summarized by its codec — graphs and nodes of a graph record, allocations and
// copies of a layout, the KV-cache size of a kvcache record — every user's records, filtered by
// model; a record its codec refuses, one that is not JSON, one of another identity shape, a
// FIFO or a symlink planted in the directory are listed as unreadable with why, never skipped
// silently and never thrown past; a record rewritten between two listings shows its new
// contents; candidates and temporary files are not records.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/artifacts/artifact_store.hpp"
#include "daemon/artifacts/artifact_summary.hpp"
#include "sample_records.hpp"
#include "temp_dir.hpp"

namespace {

using namespace thaw::daemon;
using thaw::testing::sample_graph_record;
using thaw::testing::sample_kv_record;
using thaw::testing::sample_layout_record;
using thaw::testing::SampleIdentity;
namespace fs = std::filesystem;

ArtifactIdentity identity_of(const std::string& kind, const SampleIdentity& id = {}) {
  return {kind, id.engine, id.model, id.gpu, id.driver};
}

void put(ArtifactStore& store, uid_t owner, const ArtifactIdentity& id, const std::string& text) {
  thaw::UniqueFd fd(::memfd_create("listing-test", MFD_CLOEXEC));
  ASSERT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  auto stored = store.put(owner, id, fd.get(), text.size());
  ASSERT_TRUE(stored) << stored.error().message;
}

void overwrite(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

TEST(ArtifactSummary, EachKindIsSummarizedByItsCodec) {
  const ArtifactSummary graphs = summarize_artifact("graphs", sample_graph_record());
  EXPECT_TRUE(graphs.readable) << graphs.text;
  EXPECT_EQ(graphs.text, "2 graphs, 5 nodes, 1 module");
  const ArtifactSummary layout = summarize_artifact("layout", sample_layout_record());
  EXPECT_TRUE(layout.readable) << layout.text;
  EXPECT_EQ(layout.text, "3 allocations, 3.0 MiB of weights in 2 copies");
  const ArtifactSummary kv = summarize_artifact("kvcache", sample_kv_record());
  EXPECT_TRUE(kv.readable) << kv.text;
  EXPECT_EQ(kv.text, "KV cache of 32.0 MiB in 512 blocks");
  const ArtifactSummary other = summarize_artifact("future", R"({"identity": {}})");
  EXPECT_TRUE(other.readable);
  EXPECT_NE(other.text.find("no summary for kind \"future\""), std::string::npos) << other.text;
}

TEST(ArtifactSummary, WhatItsCodecRefusesIsUnreadableWithTheReason) {
  // A graph record with a node pointing at an edge that does not exist: the codec's message.
  nlohmann::json doc = nlohmann::json::parse(sample_graph_record());
  doc["graphs"][0]["edges"].push_back({0, 9});
  ArtifactSummary s = summarize_artifact("graphs", doc.dump());
  EXPECT_FALSE(s.readable);
  EXPECT_NE(s.text.find("graphs[0]"), std::string::npos) << s.text;
  for (const auto& [kind, text] : std::vector<std::pair<std::string, std::string>>{
           {"graphs", "{\"version\": "},
           {"graphs", std::string(1 << 16, '[')},
           {"layout", "not json"},
           {"layout", R"({"format": "one"})"},
           {"layout", R"({"format": 1, "identity": 3})"},
           {"layout", R"([1, 2])"},
           {"kvcache", R"({"kv": {"kv_bytes": -1, "num_blocks": 2}})"},
           {"kvcache", R"({"identity": {}})"},
           {"kvcache", "\xff\xfe"},
       }) {
    s = summarize_artifact(kind, text);
    EXPECT_FALSE(s.readable) << kind << ": " << text.substr(0, 40);
    EXPECT_FALSE(s.text.empty());
    for (char c : s.text) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << s.text;
  }
}

TEST(ArtifactListing, EveryUsersRecordsWithTheirSummariesFilteredByModel) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path() / "state");
  EXPECT_TRUE(store.list().empty()) << "no directory yet is no records";
  SampleIdentity other;
  other.model = "org/other";
  put(store, 1000, identity_of("graphs"), sample_graph_record());
  put(store, 1000, identity_of("layout"), sample_layout_record());
  put(store, 1001, identity_of("kvcache"), sample_kv_record());
  put(store, 0, identity_of("layout", other), sample_layout_record(other));

  const auto all = store.list();
  ASSERT_EQ(all.size(), 4u);
  // Sorted by model, then kind.
  EXPECT_EQ(all[0].identity.model, "gpt-syn");
  EXPECT_EQ(all[0].identity.kind, "graphs");
  EXPECT_EQ(all[0].owner, 1000u);
  EXPECT_EQ(all[0].summary.text, "2 graphs, 5 nodes, 1 module");
  EXPECT_TRUE(all[0].summary.readable);
  EXPECT_EQ(all[0].identity.engine, SampleIdentity{}.engine);
  EXPECT_EQ(all[0].identity.gpu, "Thaw Emulated GPU");
  EXPECT_EQ(all[0].identity.driver, "12040");
  EXPECT_EQ(all[0].bytes, sample_graph_record().size());
  EXPECT_GT(all[0].modified_usec, 0);
  EXPECT_EQ(all[0].key + ".json",
            fs::path(ArtifactStore::key(1000, identity_of("graphs")) + ".json").string());
  EXPECT_EQ(all[1].identity.kind, "kvcache");
  EXPECT_EQ(all[1].owner, 1001u);
  EXPECT_EQ(all[2].identity.kind, "layout");
  EXPECT_EQ(all[3].identity.model, "org/other");
  EXPECT_EQ(all[3].owner, 0u);

  const auto one = store.list("org/other");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].identity.kind, "layout");
  EXPECT_TRUE(store.list("no-such-model").empty());
}

TEST(ArtifactListing, UnreadableRecordsAreListedAsSuchAndRewrittenOnesReadAgain) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path() / "state");
  put(store, 1000, identity_of("graphs"), sample_graph_record());
  const fs::path artifacts = dir.path() / "state" / "artifacts";
  const fs::path graphs = artifacts / (ArtifactStore::key(1000, identity_of("graphs")) + ".json");
  ASSERT_TRUE(store.list()[0].summary.readable);

  // Corrupted in place (same inode, another size): read again, unreadable, model still known
  // when the identity is intact.
  std::string text = sample_graph_record();
  text.insert(text.find("\"graphs\""), "\"extra\": 1, ");
  overwrite(graphs, text);
  auto listed = store.list("gpt-syn");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].summary.readable);
  EXPECT_EQ(listed[0].identity.kind, "graphs");
  EXPECT_FALSE(listed[0].summary.text.empty());

  // Not JSON at all: no model to filter by, so only the full listing shows it.
  overwrite(graphs, "\x01garbage");
  EXPECT_TRUE(store.list("gpt-syn").empty());
  listed = store.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].summary.readable);
  EXPECT_NE(listed[0].summary.text.find("not JSON"), std::string::npos) << listed[0].summary.text;
  EXPECT_EQ(listed[0].owner, 1000u);

  // Repaired: readable again.
  overwrite(graphs, sample_graph_record());
  listed = store.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].summary.readable) << listed[0].summary.text;

  // Planted things: a FIFO (never blocked on), a symlink (never followed), a directory, an
  // oversized file, a record of before owners, junk names, a candidate and a temporary file.
  const std::string hex(32, 'b');
  ASSERT_EQ(::mkfifo((artifacts / ("layout-1000-" + hex + ".json")).c_str(), 0600), 0);
  fs::create_symlink(graphs, artifacts / ("graphs-1000-" + std::string(32, 'c') + ".json"));
  fs::create_directory(artifacts / ("kvcache-1000-" + std::string(32, 'd') + ".json"));
  {
    std::ofstream big(artifacts / ("layout-7-" + std::string(32, 'e') + ".json"));
    big.seekp(static_cast<std::streamoff>(ArtifactStore::kMaxArtifactBytes) + 1);
    big << ' ';
  }
  fs::copy_file(graphs, artifacts / ("graphs-" + std::string(32, 'f') + ".json"));
  overwrite(artifacts / "notes.json", "{}");
  overwrite(artifacts / ("Graphs-1-" + hex + ".json"), "{}");
  overwrite(artifacts / ("layout-1-" + hex + ".candidate"), "{}");
  overwrite(artifacts / ("layout-1-" + hex + ".json.tmp"), "{}");
  listed = store.list();
  ASSERT_EQ(listed.size(), 6u);
  int unreadable = 0;
  for (const ListedArtifact& a : listed) {
    if (!a.summary.readable) ++unreadable;
    if (a.key == "graphs-" + std::string(32, 'f')) {
      EXPECT_FALSE(a.owner) << "a record of before owners has none";
      EXPECT_TRUE(a.summary.readable) << a.summary.text;
    }
    if (a.key.starts_with("layout-7-")) {
      EXPECT_NE(a.summary.text.find("larger than"), std::string::npos) << a.summary.text;
    }
    if (a.key.starts_with("graphs-1000-c")) {
      EXPECT_EQ(a.summary.text, "it is a symbolic link");
    }
  }
  EXPECT_EQ(unreadable, 4) << "the FIFO, the symlink, the directory and the oversized file";
  // The filtered listing leaves out what has no readable model.
  EXPECT_EQ(store.list("gpt-syn").size(), 2u);
}

}  // namespace
