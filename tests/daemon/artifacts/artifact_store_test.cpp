// ArtifactStore on a real directory: put then get gives the same bytes under a key made of
// kind + identity (+ configuration); a document that claims another identity, or is not
// JSON, is refused and nothing is stored; a later put replaces atomically; a missing
// artifact says what happens; a diverged or shorter layout never replaces a good one, and
// each configuration keeps its own; records are their user's (0600, got and replaced only
// by the same uid); nothing in the directory — FIFOs, symlinks, documents of the wrong
// shape — blocks a reader or throws past it.
#include "daemon/artifacts/artifact_store.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <vector>

#include "temp_dir.hpp"

namespace {

using namespace thaw::daemon;
namespace fs = std::filesystem;

constexpr uid_t kOwner = 1000;  // the engine's user, as the shim socket's peer credentials say

ArtifactIdentity identity(const std::string& model = "gpt-syn") {
  return {"layout", "/usr/bin/refengine 1 2", model, "Thaw Emulated GPU", "13000"};
}

thaw::UniqueFd memfd_with(const std::string& text) {
  thaw::UniqueFd fd(::memfd_create("artifact-test", MFD_CLOEXEC));
  EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string document(const ArtifactIdentity& id, int allocations = 3) {
  return nlohmann::json{{"identity", id.to_json()}, {"allocations", allocations}}.dump();
}

std::string read_all(int fd, std::uint64_t bytes) {
  std::string s(bytes, '\0');
  EXPECT_EQ(::pread(fd, s.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return s;
}

TEST(ArtifactStore, PutThenGetGivesTheSameBytes) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path() / "state");
  EXPECT_FALSE(fs::exists(dir.path() / "state")) << "created before the first put";
  const std::string doc = document(identity());
  auto put = store.put(kOwner, identity(), memfd_with(doc).get(), doc.size());
  ASSERT_TRUE(put) << put.error().message;
  EXPECT_EQ(put->key, ArtifactStore::key(kOwner, identity()));
  EXPECT_EQ(put->outcome, ArtifactPut::stored);
  EXPECT_EQ(put->key.rfind("layout-", 0), 0u);
  EXPECT_TRUE(fs::exists(dir.path() / "state" / "artifacts" / (put->key + ".json")));
  auto got = store.get(kOwner, identity());
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->bytes, doc.size());
  EXPECT_EQ(read_all(got->fd.get(), got->bytes), doc);
}

TEST(ArtifactStore, EachIdentityHasItsOwnKey) {
  ArtifactIdentity other = identity();
  other.driver = "13010";
  EXPECT_NE(ArtifactStore::key(kOwner, identity()), ArtifactStore::key(kOwner, other));
  other = identity("another-model");
  EXPECT_NE(ArtifactStore::key(kOwner, identity()), ArtifactStore::key(kOwner, other));
  EXPECT_NE(ArtifactStore::key(kOwner, identity(), "cmdline a"),
            ArtifactStore::key(kOwner, identity()));
  EXPECT_NE(ArtifactStore::key(kOwner, identity(), "cmdline a"),
            ArtifactStore::key(kOwner, identity(), "cmdline b"));
}

std::string layout(const ArtifactIdentity& id, std::vector<int> sizes) {
  nlohmann::json allocations = nlohmann::json::array();
  std::uint64_t offset = 0;
  for (int size : sizes) {
    allocations.push_back({size, offset});
    offset += static_cast<std::uint64_t>(size);
  }
  return nlohmann::json{{"identity", id.to_json()}, {"allocations", allocations}}.dump();
}

std::string got_text(const ArtifactStore& store, const std::string& config = {}) {
  auto got = store.get(kOwner, identity(), config);
  return got ? read_all(got->fd.get(), got->bytes) : std::string("(none)");
}

ArtifactPut put_text(ArtifactStore& store, const std::string& text,
                     const std::string& config = {}) {
  auto put = store.put(kOwner, identity(), memfd_with(text).get(), text.size(), config);
  EXPECT_TRUE(put) << put.error().message;
  return put ? put->outcome : ArtifactPut::stored;
}

TEST(ArtifactStore, ADivergedOrShorterRunNeverReplacesAGoodLayout) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string good = layout(identity(), {10, 20, 30});
  ASSERT_EQ(put_text(store, good), ArtifactPut::stored);
  // A run that stopped early (a crash) and reports what it did: nothing new, kept.
  EXPECT_EQ(put_text(store, layout(identity(), {10, 20})), ArtifactPut::kept);
  EXPECT_EQ(got_text(store), good);
  // One that diverged: kept aside, the good record stays what later runs get.
  const std::string odd = layout(identity(), {10, 99});
  EXPECT_EQ(put_text(store, odd), ArtifactPut::candidate);
  EXPECT_EQ(got_text(store), good);
  // Another that diverges another way replaces the candidate, not the record.
  const std::string odd2 = layout(identity(), {10, 77});
  EXPECT_EQ(put_text(store, odd2), ArtifactPut::candidate);
  EXPECT_EQ(got_text(store), good);
  // Two runs in a row that agree: the engine really changed; the record follows it.
  EXPECT_EQ(put_text(store, odd2), ArtifactPut::promoted);
  EXPECT_EQ(got_text(store), odd2);
  std::size_t files = 0;
  for (auto& e : fs::directory_iterator(dir.path() / "artifacts")) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "the candidate is gone once settled";
  // A run that went past the record's end extends it.
  const std::string longer = layout(identity(), {10, 77, 5, 6});
  EXPECT_EQ(put_text(store, longer), ArtifactPut::replaced);
  EXPECT_EQ(got_text(store), longer);
}

TEST(ArtifactStore, EachConfigurationKeepsItsOwnLayout) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string generate = layout(identity(), {10, 20, 30});
  const std::string serve = layout(identity(), {10, 20, 99, 1});
  ASSERT_EQ(put_text(store, generate, "cmdline generate"), ArtifactPut::stored);
  // serve's first run has none of its own: it follows generate's record...
  EXPECT_EQ(got_text(store, "cmdline serve"), generate);
  // ...and what it records is its own, beside generate's.
  EXPECT_EQ(put_text(store, serve, "cmdline serve"), ArtifactPut::stored);
  EXPECT_EQ(got_text(store, "cmdline serve"), serve);
  EXPECT_EQ(got_text(store, "cmdline generate"), generate);
  // Alternating never invalidates either.
  EXPECT_EQ(put_text(store, generate, "cmdline generate"), ArtifactPut::replaced);
  EXPECT_EQ(got_text(store, "cmdline serve"), serve);
}

TEST(ArtifactStore, PrewarmGetsTheLastUsedRecordNeverACandidate) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string a = layout(identity(), {10, 20});
  const std::string b = layout(identity(), {10, 30});
  ASSERT_EQ(put_text(store, a, "cmdline a"), ArtifactPut::stored);
  ASSERT_EQ(put_text(store, b, "cmdline b"), ArtifactPut::stored);
  // A diverged run of a, kept aside, is not what prewarm builds.
  ASSERT_EQ(put_text(store, layout(identity(), {10, 40}), "cmdline a"), ArtifactPut::candidate);
  auto newest = store.newest_for_model("layout", "gpt-syn");
  ASSERT_TRUE(newest);
  EXPECT_TRUE(*newest == a || *newest == b) << *newest;
  // The engine that ran last used a's record: prewarm follows it.
  const auto a_path =
      dir.path() / "artifacts" / (ArtifactStore::key(kOwner, identity(), "cmdline a") + ".json");
  const auto b_path =
      dir.path() / "artifacts" / (ArtifactStore::key(kOwner, identity(), "cmdline b") + ".json");
  fs::last_write_time(a_path, fs::file_time_type::clock::now() - std::chrono::hours(2));
  fs::last_write_time(b_path, fs::file_time_type::clock::now() - std::chrono::hours(1));
  EXPECT_EQ(store.newest_for_model("layout", "gpt-syn"), b);
  ASSERT_TRUE(store.get(kOwner, identity(), "cmdline a"));
  EXPECT_EQ(store.newest_for_model("layout", "gpt-syn"), a);
  EXPECT_FALSE(store.newest_for_model("layout", "another-model"));
}

TEST(ArtifactStore, ALaterPutReplacesTheEarlierOne) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string a = document(identity(), 3), b = document(identity(), 7);
  ASSERT_TRUE(store.put(kOwner, identity(), memfd_with(a).get(), a.size()));
  auto before = store.get(kOwner, identity());  // a reader holding the old one keeps it
  ASSERT_TRUE(store.put(kOwner, identity(), memfd_with(b).get(), b.size()));
  auto after = store.get(kOwner, identity());
  ASSERT_TRUE(before && after);
  EXPECT_EQ(read_all(before->fd.get(), before->bytes), a);
  EXPECT_EQ(read_all(after->fd.get(), after->bytes), b);
  std::size_t files = 0;
  for (auto& e : fs::directory_iterator(dir.path() / "artifacts")) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "no temporary file left behind";
}

TEST(ArtifactStore, BadDocumentsAreRefusedAndNothingIsStored) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string liar = document(identity("someone-else"));
  auto r = store.put(kOwner, identity(), memfd_with(liar).get(), liar.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().name, error_name::kInvalidArgument);
  EXPECT_NE(r.error().message.find("identity"), std::string::npos);
  const std::string junk = "{not json";
  r = store.put(kOwner, identity(), memfd_with(junk).get(), junk.size());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("JSON"), std::string::npos);
  const std::string doc = document(identity());
  r = store.put(kOwner, identity(), memfd_with(doc).get(),
                doc.size() + 10);  // claims more than it has
  EXPECT_FALSE(r);
  r = store.put(kOwner, identity(), memfd_with(doc).get(), ArtifactStore::kMaxArtifactBytes + 1);
  EXPECT_FALSE(r);
  auto got = store.get(kOwner, identity());
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().name, error_name::kUnknownArtifact);
  EXPECT_NE(got.error().message.find("this run records one"), std::string::npos);
}

TEST(ArtifactStore, IdentitiesFromTheWireAreChecked) {
  const nlohmann::json good = identity().to_json();
  EXPECT_TRUE(parse_artifact_identity("layout", good));
  EXPECT_FALSE(parse_artifact_identity("../etc", good));
  EXPECT_FALSE(parse_artifact_identity(42, good));
  nlohmann::json missing = good;
  missing.erase("gpu");
  EXPECT_FALSE(parse_artifact_identity("layout", missing));
  nlohmann::json empty = good;
  empty["model"] = "";
  EXPECT_FALSE(parse_artifact_identity("layout", empty));
  nlohmann::json extra = good;
  extra["what"] = "x";
  EXPECT_FALSE(parse_artifact_identity("layout", extra));
}

TEST(ArtifactStore, AnUnwritableStateDirIsAnErrorThatSaysWhere) {
  // Under a regular file (root may write anywhere else).
  thaw::testing::TempDir dir;
  std::ofstream(dir.path() / "file") << "x";
  ArtifactStore store(dir.path() / "file");
  const std::string doc = document(identity());
  auto r = store.put(kOwner, identity(), memfd_with(doc).get(), doc.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().name, error_name::kState);
  EXPECT_NE(r.error().message.find("node.state_dir"), std::string::npos) << r.error().message;
}

TEST(ArtifactStore, RecordsAreTheirOwnersAndPrivate) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string mine = layout(identity(), {10, 20}), theirs = layout(identity(), {10, 99});
  ASSERT_TRUE(store.put(kOwner, identity(), memfd_with(mine).get(), mine.size()));
  // Another user (root included) neither gets nor replaces it, even with the same config.
  auto other = store.get(0, identity());
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().name, error_name::kUnknownArtifact);
  EXPECT_FALSE(store.get(0, identity(), "cmdline a")) << "the other-config fallback crossed users";
  auto put = store.put(0, identity(), memfd_with(theirs).get(), theirs.size());
  ASSERT_TRUE(put);
  EXPECT_EQ(put->outcome, ArtifactPut::stored);
  EXPECT_EQ(got_text(store), mine);
  for (const auto& e : fs::directory_iterator(dir.path() / "artifacts")) {
    EXPECT_EQ(e.status().permissions() & (fs::perms::group_all | fs::perms::others_all),
              fs::perms::none)
        << e.path();
  }
  EXPECT_EQ(fs::status(dir.path() / "artifacts").permissions() & fs::perms::others_all,
            fs::perms::none);
}

TEST(ArtifactStore, AHostileDirectoryNeitherBlocksNorThrows) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string doc = layout(identity(), {10, 20});
  ASSERT_TRUE(store.put(kOwner, identity(), memfd_with(doc).get(), doc.size()));
  const fs::path artifacts = dir.path() / "artifacts";
  const fs::path record = artifacts / (ArtifactStore::key(kOwner, identity()) + ".json");
  // Newer than the good record, each of them, so every reader looks at them first.
  auto newer = [&](const fs::path& p) {
    timespec t[2];
    ::clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec += 3600;
    t[1] = t[0];
    ::utimensat(AT_FDCWD, p.c_str(), t, AT_SYMLINK_NOFOLLOW);
  };
  int n = 0;
  auto next = [&] { return artifacts / fmt::format("layout-{}-{:032x}.json", kOwner, ++n); };
  fs::path p = next();
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  newer(p);
  fs::create_symlink(record, p = next());
  newer(p);
  fs::create_directory(p = next());
  newer(p);
  for (const char* bad :
       {R"({"identity": {"engine": "e", "model": 5, "gpu": "g", "driver": "1"}})",
        R"({"identity": {"model": ["gpt-syn"]}})", R"({"identity": "gpt-syn"})", "[1, 2]",
        R"({"identity": {"engine": 1, "model": "gpt-syn", "gpu": {}, "driver": null}})"}) {
    std::ofstream(p = next()) << bad;
    newer(p);
  }
  EXPECT_EQ(store.newest_for_model("layout", "gpt-syn"), doc);
  EXPECT_EQ(got_text(store, "cmdline new"), doc) << "the other-config fallback";
  // The record itself becomes a FIFO, then a symlink: get fails at once, and says why.
  fs::remove(record);
  ASSERT_EQ(::mkfifo(record.c_str(), 0600), 0);
  auto got = store.get(kOwner, identity());
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("not a regular file"), std::string::npos)
      << got.error().message;
  // A put replaces it with a real record.
  ASSERT_TRUE(store.put(kOwner, identity(), memfd_with(doc).get(), doc.size()));
  EXPECT_EQ(got_text(store), doc);
  fs::remove(record);
  fs::create_symlink("/etc/passwd", record);
  EXPECT_FALSE(store.get(kOwner, identity()));
}

}  // namespace
