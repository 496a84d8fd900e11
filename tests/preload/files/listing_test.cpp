// Listings of model directories (preload/files/pending_listing.hpp): which directories a
// listing waits for, the wait itself with a fake thawd and clock, and, through the built
// shim, that every other directory lists exactly as without it. The listing of a model
// directory thawd is filling is tested with a real thawd in
// tests/integration/pending_files_test.cpp.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "preload/files/listing_wait.hpp"
#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::preload::listed_model_directory;
using thaw::preload::ListingWait;
using thaw::preload::wait_for_complete_listing;
using namespace std::chrono_literals;

// A file system whose only cache markers are in `roots`; remembers what was asked.
struct FakeMarkers {
  std::set<fs::path> roots;
  std::vector<fs::path>* asked = nullptr;
  bool operator()(const fs::path& dir) const {
    if (asked != nullptr) asked->push_back(dir);
    return roots.contains(dir);
  }
};

TEST(ListedModelDirectory, TheModelDirectoryAndDirectoriesInsideIt) {
  const FakeMarkers markers{{"/var/cache/thaw"}};
  auto model = listed_model_directory("/var/cache/thaw/gpt2@main", markers);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->root, "/var/cache/thaw");
  EXPECT_EQ(model->model, "gpt2@main");
  EXPECT_EQ(model->relative, "");
  EXPECT_EQ(model->full, "/var/cache/thaw/gpt2@main");

  auto slash = listed_model_directory("/var/cache/thaw/gpt2@main/", markers);
  ASSERT_TRUE(slash);
  EXPECT_EQ(slash->model, "gpt2@main");
  EXPECT_EQ(slash->relative, "");
  auto dot = listed_model_directory("/var/cache/thaw/gpt2@main/.", markers);
  ASSERT_TRUE(dot);
  EXPECT_EQ(dot->relative, "");

  auto inside = listed_model_directory("/var/cache/thaw/gpt2@main/original/sub", markers);
  ASSERT_TRUE(inside);
  EXPECT_EQ(inside->model, "gpt2@main");
  EXPECT_EQ(inside->relative, "original/sub");
  auto normalised = listed_model_directory("/var/cache/thaw/x/../gpt2/a/./b/..", markers);
  ASSERT_TRUE(normalised);
  EXPECT_EQ(normalised->model, "gpt2");
  EXPECT_EQ(normalised->relative, "a");
}

TEST(ListedModelDirectory, NotTheCacheRootItsMetadataOrOtherDirectories) {
  const FakeMarkers markers{{"/var/cache/thaw"}};
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw", markers));
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw/", markers));
  EXPECT_FALSE(listed_model_directory("/var/cache", markers));
  EXPECT_FALSE(listed_model_directory("/", markers));
  EXPECT_FALSE(listed_model_directory("/usr/lib/python3/dist-packages", markers));
  // Keys never start with '.'; <key>/.thaw holds readiness maps, not model files.
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw/.thaw-cache", markers));
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw/.hidden/x", markers));
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw/gpt2/.thaw", markers));
  EXPECT_FALSE(listed_model_directory("/var/cache/thaw/gpt2/.thaw/ready", markers));
  // A model's own hidden directory is the model's.
  EXPECT_TRUE(listed_model_directory("/var/cache/thaw/gpt2/.cache", markers));
  // Relative paths are the caller's to resolve.
  EXPECT_FALSE(listed_model_directory("thaw/gpt2", FakeMarkers{{"thaw"}}));
}

TEST(ListedModelDirectory, AsksForMarkersNearestFirstAndStopsAtTheFirst) {
  std::vector<fs::path> asked;
  const FakeMarkers markers{{"/c", "/c/m"}, &asked};
  auto r = listed_model_directory("/c/m/a/b", markers);
  ASSERT_TRUE(r);
  // The nearest marker wins: /c/m is a cache root (nested in /c's model "m").
  EXPECT_EQ(r->root, "/c/m");
  EXPECT_EQ(r->model, "a");
  EXPECT_EQ(r->relative, "b");
  EXPECT_EQ(asked, (std::vector<fs::path>{"/c/m/a", "/c/m"}));

  asked.clear();
  EXPECT_FALSE(listed_model_directory("/x/y", FakeMarkers{{}, &asked}));
  EXPECT_EQ(asked, (std::vector<fs::path>{"/x", "/"}));
}

// A fake thawd that says "the fetch may still create files" `creating` times, and a clock
// that moves only when the wait sleeps.
struct FakeWait {
  int creating = 0;
  int asked = 0;
  std::chrono::steady_clock::time_point now{};
  std::vector<std::chrono::milliseconds> sleeps;

  ListingWait run(std::chrono::nanoseconds timeout) {
    return wait_for_complete_listing([&] { return asked++ < creating; },
                                     [&](std::chrono::milliseconds d) {
                                       sleeps.push_back(d);
                                       now += d;
                                     },
                                     timeout, [&] { return now; });
  }
};

TEST(WaitForCompleteListing, NoFetchCreatingFilesListsAtOnce) {
  FakeWait w;
  EXPECT_EQ(w.run(10s), ListingWait::complete);
  EXPECT_EQ(w.asked, 1);
  EXPECT_TRUE(w.sleeps.empty());
}

TEST(WaitForCompleteListing, WaitsUntilTheFetchHasCreatedEveryFile) {
  FakeWait w;
  w.creating = 6;
  EXPECT_EQ(w.run(10s), ListingWait::complete_waited);
  EXPECT_EQ(w.asked, 7);
  // Steps double from 5 ms and stop growing at 50 ms.
  EXPECT_EQ(w.sleeps, (std::vector<std::chrono::milliseconds>{5ms, 10ms, 20ms, 40ms, 50ms, 50ms}));
}

TEST(WaitForCompleteListing, GivesUpAtTheTimeout) {
  FakeWait w;
  w.creating = 1'000'000;
  EXPECT_EQ(w.run(1s), ListingWait::timed_out);
  std::chrono::milliseconds slept{};
  for (auto s : w.sleeps) slept += s;
  EXPECT_GE(slept, 1s);
  EXPECT_LT(slept, 1s + 50ms);
}

// --- through the built shim ----------------------------------------------------------------

struct Output {
  int status = -1;
  std::string text;
};

Output capture(const std::string& command) {
  Output out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = ::fread(buf, 1, sizeof buf, p)) > 0) out.text.append(buf, n);
  out.status = ::pclose(p);
  return out;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// In the ASan build the sanitizer's runtime is preloaded with the shim into Debian's Python,
// whose own allocations still held at exit LeakSanitizer reports (exit status 1: every Python
// lister failed there). Those are not the shim's; its leaks are checked in thaw's own programs.
#define kForeignAsanOptions "ASAN_OPTIONS=detect_leaks=0"

// Every way the probe and Python list `dir`; stderr is kept apart (the shim may log there).
const std::vector<std::string> kListers = {
    LIST_DIR_PROBE_BIN " readdir",
    LIST_DIR_PROBE_BIN " readdir64",
    LIST_DIR_PROBE_BIN " rewind",
    LIST_DIR_PROBE_BIN " fdopendir",
    LIST_DIR_PROBE_BIN " scandir",
    "/usr/bin/python3 -c 'import os,sys; print(sorted(os.listdir(sys.argv[1])))'",
    "/usr/bin/python3 -c 'import os,sys; print(sorted((e.name, e.is_file(), e.is_dir(), "
    "e.is_symlink(), e.inode()) for e in os.scandir(sys.argv[1])))'",
    "/usr/bin/python3 -c 'import glob,sys; print(sorted(glob.glob(sys.argv[1] + \"/*\")), "
    "sorted(glob.glob(sys.argv[1] + \"/**\", recursive=True)))'",
    "/usr/bin/python3 -c 'import pathlib,sys; print(sorted(str(p) for p in "
    "pathlib.Path(sys.argv[1]).rglob(\"*\")))'"};

void expect_same_listing_with_and_without_shim(const fs::path& dir, const std::string& env) {
  for (const std::string& lister : kListers) {
    const std::string cmd = lister + " " + quoted(dir.string()) + " 2>/dev/null";
    const Output plain = capture(cmd);
    const Output shimmed =
        capture("env LD_PRELOAD=" THAW_PRELOAD_LIB " " kForeignAsanOptions " " + env + " " + cmd);
    ASSERT_EQ(plain.status, 0) << cmd;
    EXPECT_EQ(shimmed.status, 0) << cmd;
    EXPECT_FALSE(plain.text.empty()) << cmd;
    EXPECT_EQ(shimmed.text, plain.text) << cmd;
  }
}

// A directory with one entry of every kind a listing reports.
void fill(const fs::path& dir) {
  fs::create_directories(dir / "sub" / "deeper");
  std::ofstream(dir / "model.safetensors") << "not really";
  std::ofstream(dir / ".hidden") << "x";
  std::ofstream(dir / "sub" / "deeper" / "f.json") << "{}";
  fs::create_symlink("model.safetensors", dir / "link");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
}

TEST(ListingUnderTheShim, AnUnrelatedDirectoryListsExactlyAsWithoutIt) {
  thaw::testing::TempDir tmp("thaw-listing");
  fill(tmp.path() / "plain");
  // What makes the comparison mean anything: the shim is loaded in the runs under it.
  const Output loaded = capture("env LD_PRELOAD=" THAW_PRELOAD_LIB
                                " THAW_PRELOAD_LOG=1 " LIST_DIR_PROBE_BIN " readdir " +
                                quoted((tmp.path() / "plain").string()) + " 2>&1");
  ASSERT_NE(loaded.text.find("thaw-preload["), std::string::npos) << loaded.text;
  expect_same_listing_with_and_without_shim(tmp.path() / "plain", "");
  // A system directory too, through a relative path.
  const Output a = capture("cd /usr/include && " LIST_DIR_PROBE_BIN " readdir .");
  const Output b = capture("cd /usr/include && env LD_PRELOAD=" THAW_PRELOAD_LIB
                           " " LIST_DIR_PROBE_BIN " readdir . 2>/dev/null");
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(b.text, a.text);
}

// A model directory in a cache, with no thawd: what is on disk, at once (no fetch to wait for).
TEST(ListingUnderTheShim, AModelDirectoryWithoutThawdListsWhatIsOnDiskAtOnce) {
  thaw::testing::TempDir tmp("thaw-listing");
  const fs::path cache = tmp.path() / "cache";
  fs::create_directories(cache);
  std::ofstream(cache / ".thaw-cache");
  fill(cache / "gpt-syn");
  const auto start = std::chrono::steady_clock::now();
  expect_same_listing_with_and_without_shim(
      cache / "gpt-syn", "THAW_SOCKET=" + quoted((tmp.path() / "no-thawd.sock").string()));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  // A missing model directory is missing (ENOENT), not waited for.
  const Output missing =
      capture("env LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" +
              quoted((tmp.path() / "no-thawd.sock").string()) + " " LIST_DIR_PROBE_BIN " readdir " +
              quoted((cache / "absent").string()) + " 2>&1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.text.find("No such file"), std::string::npos) << missing.text;
}

}  // namespace
