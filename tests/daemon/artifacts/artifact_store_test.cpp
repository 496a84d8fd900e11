// ArtifactStore on a real directory: put then get gives the same bytes under a key made of
// kind + identity; a document that claims another identity, or is not JSON, is refused and
// nothing is stored; a later put replaces atomically; a missing artifact says what happens.
#include "daemon/artifacts/artifact_store.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "temp_dir.hpp"

namespace {

using namespace thaw::daemon;
namespace fs = std::filesystem;

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
  auto key = store.put(identity(), memfd_with(doc).get(), doc.size());
  ASSERT_TRUE(key) << key.error().message;
  EXPECT_EQ(*key, ArtifactStore::key(identity()));
  EXPECT_EQ(key->rfind("layout-", 0), 0u);
  EXPECT_TRUE(fs::exists(dir.path() / "state" / "artifacts" / (*key + ".json")));
  auto got = store.get(identity());
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->bytes, doc.size());
  EXPECT_EQ(read_all(got->fd.get(), got->bytes), doc);
}

TEST(ArtifactStore, EachIdentityHasItsOwnKey) {
  ArtifactIdentity other = identity();
  other.driver = "13010";
  EXPECT_NE(ArtifactStore::key(identity()), ArtifactStore::key(other));
  other = identity("another-model");
  EXPECT_NE(ArtifactStore::key(identity()), ArtifactStore::key(other));
}

TEST(ArtifactStore, ALaterPutReplacesTheEarlierOne) {
  thaw::testing::TempDir dir;
  ArtifactStore store(dir.path());
  const std::string a = document(identity(), 3), b = document(identity(), 7);
  ASSERT_TRUE(store.put(identity(), memfd_with(a).get(), a.size()));
  auto before = store.get(identity());  // a reader holding the old one keeps it
  ASSERT_TRUE(store.put(identity(), memfd_with(b).get(), b.size()));
  auto after = store.get(identity());
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
  auto r = store.put(identity(), memfd_with(liar).get(), liar.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().name, error_name::kInvalidArgument);
  EXPECT_NE(r.error().message.find("identity"), std::string::npos);
  const std::string junk = "{not json";
  r = store.put(identity(), memfd_with(junk).get(), junk.size());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("JSON"), std::string::npos);
  const std::string doc = document(identity());
  r = store.put(identity(), memfd_with(doc).get(), doc.size() + 10);  // claims more than it has
  EXPECT_FALSE(r);
  r = store.put(identity(), memfd_with(doc).get(), ArtifactStore::kMaxArtifactBytes + 1);
  EXPECT_FALSE(r);
  auto got = store.get(identity());
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
  auto r = store.put(identity(), memfd_with(doc).get(), doc.size());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().name, error_name::kState);
  EXPECT_NE(r.error().message.find("node.state_dir"), std::string::npos) << r.error().message;
}

}  // namespace
