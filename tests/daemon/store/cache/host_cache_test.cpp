// HostCache: layout, create-or-open, pins, LRU eviction under the budget, re-index
// after a restart, and refusing roots it does not own.
#include "daemon/store/cache/host_cache.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/readiness/readiness_layout.hpp"
#include "daemon/store/cache/cache_layout.hpp"
#include "tests/daemon/store/cache/cache_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uint64_t kPage = 4096;
// One data page plus one readiness page per file of this spec.
constexpr CacheFileSpec kSmall{kPage, kPage};

class HostCacheTest : public ::testing::Test {
 protected:
  // A clock that advances one second per reading, so LRU order is exact.
  std::shared_ptr<std::atomic<int64_t>> now =
      std::make_shared<std::atomic<int64_t>>(int64_t{1'700'000'000} * 1'000'000'000);
  TempDir dir;
  fs::path root = dir.path() / "cache";

  HostCacheConfig config(uint64_t budget) {
    HostCacheConfig c;
    c.root = root;
    c.budget_bytes = budget;
    c.clock = [clock = now] { return clock->fetch_add(1'000'000'000); };
    return c;
  }

  HostCache open(uint64_t budget) {
    auto cache = HostCache::open(config(budget));
    EXPECT_TRUE(cache) << cache.error().message;
    return std::move(*cache);
  }

  static std::vector<std::string> keys(const HostCache& cache) {
    std::vector<std::string> out;
    for (const auto& m : cache.models()) out.push_back(m.key);
    return out;
  }

  // Writes and verifies every chunk, then seals the file.
  static void fill(CacheFile& file, uint32_t seed) {
    const auto bytes = testing::pattern_bytes(file.size(), seed);
    ASSERT_TRUE(file.write_at(0, bytes));
    for (uint64_t c = 0; c < file.readiness().chunk_count(); ++c) {
      ASSERT_TRUE(file.readiness().mark_verified(c));
    }
    ASSERT_TRUE(file.readiness().mark_complete());
  }
};

TEST_F(HostCacheTest, LaysFilesOutUnderTheModelWithMapsUnderDotThaw) {
  auto cache = open(1 << 20);
  auto file = cache.open_file("gpt2@main", "onnx/model.safetensors", kSmall);
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ((*file)->data_path(), root / "gpt2@main" / "onnx" / "model.safetensors");
  EXPECT_EQ((*file)->readiness_path(),
            root / "gpt2@main" / ".thaw" / "ready" / "onnx" / "model.safetensors");
  EXPECT_TRUE(fs::exists(root / ".thaw-cache"));
  EXPECT_TRUE(fs::exists(root / "gpt2@main" / ".thaw" / "last-used"));
  // Hidden model files are fine; only .thaw/ is reserved.
  EXPECT_TRUE(cache.open_file("gpt2@main", ".gitattributes", kSmall));
  EXPECT_EQ(cache.bytes_used(), 4 * kPage);
}

TEST_F(HostCacheTest, RejectsKeysAndPathsThatCouldEscapeOrCollide) {
  auto cache = open(1 << 20);
  for (std::string_view key : {"", ".hidden", "a/b", "..", "x y", "-x"}) {
    auto r = cache.open_file(key, "f", kSmall);
    ASSERT_FALSE(r) << key;
    EXPECT_EQ(r.error().code, CacheErrc::invalid_argument);
  }
  for (std::string_view path :
       {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", ".thaw/ready/x", ".thaw"}) {
    auto r = cache.open_file("m", path, kSmall);
    ASSERT_FALSE(r) << path;
    EXPECT_EQ(r.error().code, CacheErrc::invalid_argument);
  }
  EXPECT_TRUE(cache.open_file("m", "sub/.thaw", kSmall)) << ".thaw is reserved only at the top";
}

TEST_F(HostCacheTest, OpenFileReturnsTheOneLiveWriter) {
  auto cache = open(1 << 20);
  auto a = cache.open_file("m", "f", kSmall);
  auto b = cache.open_file("m", "f", kSmall);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->get(), b->get());
  auto found = cache.find_file("m", "f");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->get(), a->get());
  auto missing = cache.find_file("m", "g");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, CacheErrc::not_found);
}

TEST_F(HostCacheTest, ADifferentSizeUnderTheSameNameIsAConflict) {
  auto cache = open(1 << 20);
  ASSERT_TRUE(cache.open_file("m", "f", kSmall));
  auto other = cache.open_file("m", "f", CacheFileSpec{2 * kPage, kPage});
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, CacheErrc::conflict);
  EXPECT_NE(other.error().message.find("m/f"), std::string::npos);
}

TEST_F(HostCacheTest, ConcurrentOpensOfOneFileShareOneCreation) {
  auto cache = open(64 << 20);
  std::vector<std::shared_ptr<CacheFile>> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      auto f = cache.open_file("m", "big", CacheFileSpec{16 << 20, 1 << 20});
      if (f) got[i] = *f;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : got) {
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f.get(), got[0].get());
  }
  EXPECT_EQ(cache.bytes_used(), (16u << 20) + kPage);
}

TEST_F(HostCacheTest, EvictsLeastRecentlyUsedWholeModels) {
  auto cache = open(6 * kPage);  // room for three one-file models
  for (const char* key : {"a", "b", "c"}) ASSERT_TRUE(cache.open_file(key, "f", kSmall));
  ASSERT_TRUE(cache.find_file("a", "f"));  // a is now the most recently used
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"b", "c", "a"}));

  ASSERT_TRUE(cache.open_file("d", "f", kSmall));
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"c", "a", "d"}));
  EXPECT_FALSE(fs::exists(root / "b")) << "an evicted model's files are deleted";
  EXPECT_EQ(cache.bytes_used(), 6 * kPage);

  // A two-file model is evicted whole.
  ASSERT_TRUE(cache.open_file("c", "g", CacheFileSpec{1, 1}));
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"d", "c"})) << "evicted a; c is now newest";
}

TEST_F(HostCacheTest, PinnedModelsAreNeverEvicted) {
  auto cache = open(6 * kPage);
  for (const char* key : {"a", "b", "c"}) ASSERT_TRUE(cache.open_file(key, "f", kSmall));
  auto pin_a = cache.pin("a");
  ASSERT_TRUE(pin_a);
  ASSERT_TRUE(cache.find_file("b", "f"));
  ASSERT_TRUE(cache.find_file("c", "f"));
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_TRUE(cache.open_file("d", "f", kSmall));
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"a", "c", "d"}))
      << "a is least recently used but pinned: b goes instead";
  EXPECT_TRUE(fs::exists(root / "a" / "f"));
  auto pin_c = cache.pin("c");
  auto pin_d = cache.pin("d");
  ASSERT_TRUE(pin_c && pin_d);

  auto full = cache.open_file("e", "f", kSmall);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, CacheErrc::over_budget);
  for (const char* part : {"a (", "c (", "d (", "unpin"}) {
    EXPECT_NE(full.error().message.find(part), std::string::npos) << full.error().message;
  }
  EXPECT_EQ(keys(cache).size(), 3u) << "a failed request changes nothing";

  pin_c->release();
  EXPECT_TRUE(cache.open_file("e", "f", kSmall));
  EXPECT_FALSE(fs::exists(root / "c"));
  EXPECT_TRUE(fs::exists(root / "a" / "f"));
}

TEST_F(HostCacheTest, AFileLargerThanTheBudgetIsRefusedOutright) {
  auto cache = open(4 * kPage);
  auto r = cache.open_file("m", "f", CacheFileSpec{4 * kPage, kPage});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, CacheErrc::over_budget);
  EXPECT_NE(r.error().message.find("more than the whole cache budget"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "m"));
}

TEST_F(HostCacheTest, PinsAreCountedAndReleasedByRaii) {
  auto cache = open(1 << 20);
  ASSERT_TRUE(cache.open_file("m", "f", kSmall));
  {
    auto p1 = cache.pin("m");
    ASSERT_TRUE(p1);
    ModelPin p2 = std::move(*cache.pin("m"));
    EXPECT_EQ(cache.models().front().pins, 2u);
    ModelPin moved = std::move(p2);
    EXPECT_FALSE(p2.held());
    EXPECT_TRUE(moved.held());
    auto busy = cache.remove_model("m");
    ASSERT_FALSE(busy);
    EXPECT_EQ(busy.error().code, CacheErrc::busy);
  }
  EXPECT_EQ(cache.models().front().pins, 0u);
  ASSERT_TRUE(cache.remove_model("m"));
  EXPECT_FALSE(fs::exists(root / "m"));
  EXPECT_EQ(cache.bytes_used(), 0u);
  EXPECT_TRUE(cache.models().empty());
}

TEST_F(HostCacheTest, APinMayPrecedeTheModelsFiles) {
  auto cache = open(4 * kPage);
  ASSERT_TRUE(cache.open_file("old", "f", kSmall));
  auto pin = cache.pin("new");
  ASSERT_TRUE(pin);
  ASSERT_TRUE(cache.open_file("new", "f", kSmall));
  ASSERT_TRUE(cache.open_file("new", "g", kSmall)) << "evicts old, never the pinned new";
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"new"}));
}

TEST_F(HostCacheTest, ReindexKeepsCompleteAndPartialFilesAndDropsTheRest) {
  const auto weights = testing::pattern_bytes(10 * kPage, 11);
  {
    auto cache = open(1 << 20);
    auto done = cache.open_file("done", "model.safetensors", CacheFileSpec{10 * kPage, kPage});
    ASSERT_TRUE(done);
    fill(**done, 11);
    auto partial =
        cache.open_file("partial", "model.safetensors", CacheFileSpec{10 * kPage, kPage});
    ASSERT_TRUE(partial);
    ASSERT_TRUE((*partial)->write_at(2 * kPage, std::span(weights).subspan(2 * kPage, 2 * kPage)));
    ASSERT_TRUE((*partial)->readiness().mark_verified(2));
    ASSERT_TRUE((*partial)->readiness().mark_verified(3));
    auto failed = cache.open_file("failed", "f", kSmall);
    ASSERT_TRUE(failed);
    ASSERT_TRUE((*failed)->readiness().mark_failed("registry returned 404"));
    ASSERT_TRUE(cache.open_file("partial", "config.json", kSmall));
    ASSERT_TRUE(cache.open_file("partial", "orphan-map", kSmall));
    ASSERT_TRUE(cache.open_file("partial", "bad-map", kSmall));
    ASSERT_TRUE(cache.open_file("partial", "short", kSmall));
    // Touch in a known order: done is the most recently used.
    ASSERT_TRUE(cache.find_file("failed", "f"));
    ASSERT_TRUE(cache.find_file("partial", "config.json"));
    ASSERT_TRUE(cache.find_file("done", "model.safetensors"));
  }
  // Damage while "the daemon is down".
  const fs::path p = root / "partial";
  fs::remove(p / "orphan-map");                                         // map without data
  std::ofstream(p / "no-map.bin") << "a file the cache never created";  // data without map
  {
    std::fstream map(p / ".thaw/ready/bad-map", std::ios::in | std::ios::out | std::ios::binary);
    map.write("garbage!", 8);  // corrupt magic
  }
  fs::resize_file(p / "short", 100);          // wrong data size
  fs::create_directory(root / "lost+found");  // not a model: ignored
  std::ofstream(root / "README") << "not ours either";

  auto cache = open(1 << 20);
  const ReindexReport& report = cache.reindex_report();
  EXPECT_EQ(report.models, 3u);
  EXPECT_EQ(report.complete_files, 1u);
  EXPECT_EQ(report.partial_files, 3u) << "partial, config.json (filling) and failed";
  std::vector<std::string> dropped;
  for (const auto& d : report.dropped) {
    dropped.push_back(fs::relative(d.path, root).string());
    EXPECT_FALSE(d.reason.empty());
    EXPECT_FALSE(fs::exists(d.path)) << d.path << " was reported dropped but is still there";
  }
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped,
            (std::vector<std::string>{"partial/.thaw/ready/bad-map",
                                      "partial/.thaw/ready/orphan-map", "partial/.thaw/ready/short",
                                      "partial/bad-map", "partial/no-map.bin", "partial/short"}));
  EXPECT_EQ(report.ignored.size(), 2u);
  EXPECT_TRUE(fs::exists(root / "lost+found")) << "ignored entries are left alone";
  EXPECT_TRUE(report.evicted.empty());
  EXPECT_EQ(cache.bytes_used(), report.bytes_used);
  EXPECT_EQ(cache.bytes_used(), 2 * (10 * kPage + kPage) + 2 * 2 * kPage);

  // The complete file is intact and still complete.
  auto done = cache.find_file("done", "model.safetensors");
  ASSERT_TRUE(done);
  EXPECT_EQ((*done)->readiness().state(), FillState::complete);
  std::vector<std::byte> back(10 * kPage);
  ASSERT_EQ(::pread((*done)->data_fd(), back.data(), back.size(), 0),
            static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, weights);
  // The partial one can be resumed from what is missing.
  auto missing = cache.missing_chunks("partial", "model.safetensors");
  ASSERT_TRUE(missing);
  EXPECT_EQ(*missing, (std::vector<ChunkRun>{{0, 2}, {4, 6}}));
  auto failed = cache.find_file("failed", "f");
  ASSERT_TRUE(failed);
  EXPECT_EQ((*failed)->readiness().failure_reason(), "registry returned 404");
  EXPECT_TRUE((*failed)->readiness().resume_filling());
}

TEST_F(HostCacheTest, AFileDroppedAtStartUpLeavesItsModelIncompleteUntilCreatedAgain) {
  // A model whose damaged file the re-index deleted was listed with its other files only,
  // all complete: thawd called it complete and a prewarm failed instead of refetching.
  auto state_of = [](const HostCache& cache, const std::string& path) {
    for (const auto& m : cache.models()) {
      for (const auto& f : m.files) {
        if (m.key == "m" && f.relative_path == path) return std::pair{f.state, f.dropped};
      }
    }
    return std::pair{FillState::filling, false};
  };
  {
    auto cache = open(1 << 20);
    for (const char* path : {"a", "b"}) {
      auto f = cache.open_file("m", path, kSmall);
      ASSERT_TRUE(f);
      fill(**f, 3);
    }
  }
  {
    std::fstream map(root / "m/.thaw/ready/b", std::ios::in | std::ios::out | std::ios::binary);
    map.write("garbage!", 8);
  }
  {
    auto cache = open(1 << 20);
    EXPECT_EQ(cache.reindex_report().incomplete, std::vector<std::string>{"m"});
    ASSERT_EQ(cache.models().size(), 1u);
    EXPECT_EQ(cache.models()[0].files.size(), 2u) << "the dropped file is still listed";
    EXPECT_EQ(state_of(cache, "a"), std::pair(FillState::complete, false));
    EXPECT_EQ(state_of(cache, "b"), std::pair(FillState::failed, true));
    EXPECT_FALSE(cache.find_file("m", "b")) << "nothing to read until it is fetched again";
  }
  {
    // A restart before any refetch still knows the model lacks b.
    auto cache = open(1 << 20);
    EXPECT_EQ(cache.reindex_report().incomplete, std::vector<std::string>{"m"});
    EXPECT_TRUE(cache.reindex_report().dropped.empty()) << "nothing new was deleted";
    EXPECT_EQ(state_of(cache, "b"), std::pair(FillState::failed, true));
    // The fetch creates it afresh (no conflict with the mark) and the mark goes.
    auto b = cache.open_file("m", "b", kSmall);
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_EQ((*b)->readiness().verified_chunks(), 0u);
    EXPECT_EQ(state_of(cache, "b"), std::pair(FillState::filling, false));
    fill(**b, 3);
  }
  auto cache = open(1 << 20);
  EXPECT_TRUE(cache.reindex_report().incomplete.empty());
  EXPECT_EQ(state_of(cache, "b"), std::pair(FillState::complete, false));
  EXPECT_FALSE(fs::exists(root / "m/.thaw/dropped/b"));
}

TEST_F(HostCacheTest, AFileDamagedWhileRunningLeavesItsModelIncomplete) {
  auto cache = open(1 << 20);
  for (const char* path : {"a", "b"}) {
    auto f = cache.open_file("m", path, kSmall);
    ASSERT_TRUE(f);
    fill(**f, 5);
  }
  fs::resize_file(root / "m/.thaw/ready/a", 10);
  EXPECT_FALSE(cache.find_file("m", "a"));  // found damaged: deleted
  const auto models = cache.models();
  ASSERT_EQ(models.size(), 1u);
  ASSERT_EQ(models[0].files.size(), 2u);
  EXPECT_TRUE(models[0].files[0].dropped);
  EXPECT_EQ(models[0].files[0].state, FillState::failed);
}

TEST_F(HostCacheTest, LruOrderSurvivesARestart) {
  {
    auto cache = open(1 << 20);
    for (const char* key : {"a", "b", "c"}) ASSERT_TRUE(cache.open_file(key, "f", kSmall));
    ASSERT_TRUE(cache.find_file("a", "f"));
  }
  auto cache = open(1 << 20);
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"b", "c", "a"}));
}

TEST_F(HostCacheTest, ALoweredBudgetEvictsAtStartUpInLruOrder) {
  {
    auto cache = open(1 << 20);
    for (const char* key : {"a", "b", "c", "d"}) ASSERT_TRUE(cache.open_file(key, "f", kSmall));
    ASSERT_TRUE(cache.find_file("a", "f"));
  }
  auto cache = open(4 * kPage);
  EXPECT_EQ(cache.reindex_report().evicted, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(keys(cache), (std::vector<std::string>{"d", "a"}));
  EXPECT_EQ(cache.bytes_used(), 4 * kPage);
}

TEST_F(HostCacheTest, OneCachePerRoot) {
  auto first = open(1 << 20);
  auto second = HostCache::open(config(1 << 20));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, CacheErrc::locked);
  EXPECT_NE(second.error().message.find(root.string()), std::string::npos);
}

TEST_F(HostCacheTest, RefusesANonEmptyDirectoryItDidNotCreate) {
  fs::create_directories(root / "photos");
  std::ofstream(root / "photos" / "cat.jpg") << "meow";
  auto cache = HostCache::open(config(1 << 20));
  ASSERT_FALSE(cache);
  EXPECT_EQ(cache.error().code, CacheErrc::not_a_cache);
  EXPECT_TRUE(fs::exists(root / "photos" / "cat.jpg")) << "nothing of it was touched";
  EXPECT_FALSE(fs::exists(root / ".thaw-cache"));
}

TEST_F(HostCacheTest, AFileDamagedWhileCachedIsRecreatedByOpenFile) {
  auto cache = open(1 << 20);
  {
    auto f = cache.open_file("m", "f", kSmall);
    ASSERT_TRUE(f);
    ASSERT_TRUE((*f)->readiness().mark_verified(0));
  }
  fs::resize_file(root / "m" / ".thaw/ready/f", 10);
  auto f = cache.open_file("m", "f", kSmall);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->readiness().verified_chunks(), 0u) << "created afresh, nothing trusted";
  EXPECT_EQ(cache.bytes_used(), 2 * kPage);
}

TEST_F(HostCacheTest, ModelsReportsStateOfEveryFile) {
  auto cache = open(1 << 20);
  auto f = cache.open_file("m", "f", CacheFileSpec{3 * kPage, kPage});
  ASSERT_TRUE(f);
  ASSERT_TRUE((*f)->readiness().mark_verified(1));
  f->reset();  // no live writer: read from disk
  auto models = cache.models();
  ASSERT_EQ(models.size(), 1u);
  ASSERT_EQ(models[0].files.size(), 1u);
  EXPECT_EQ(models[0].files[0].relative_path, "f");
  EXPECT_EQ(models[0].files[0].state, FillState::filling);
  EXPECT_EQ(models[0].files[0].verified_chunks, 1u);
  EXPECT_EQ(models[0].files[0].chunk_count, 3u);
  EXPECT_EQ(models[0].bytes, 4 * kPage);
}

TEST(HostCacheFullFilesystem, EvictsWhenTheFilesystemIsFullerThanTheBudgetSays) {
  // Budget 1 MiB on a 64 KiB tmpfs: the budget promises more than the disk holds.
  const std::string result =
      testing::on_tiny_tmpfs("64k", [](const fs::path& mount) -> std::string {
        HostCacheConfig config;
        config.root = mount / "cache";
        config.budget_bytes = 1 << 20;
        auto cache = HostCache::open(config);
        if (!cache) return "open: " + cache.error().message;
        if (!cache->open_file("old", "f", CacheFileSpec{8 * kPage, kPage})) return "old failed";
        auto fresh = cache->open_file("new", "f", CacheFileSpec{8 * kPage, kPage});
        if (!fresh) return "new failed instead of evicting old: " + fresh.error().message;
        if (fs::exists(mount / "cache" / "old")) return "old was not evicted";

        auto huge = cache->open_file("new", "g", CacheFileSpec{20 * kPage, kPage});
        if (huge) return "created more than the filesystem holds";
        if (huge.error().code != CacheErrc::no_space) return "wrong code: " + huge.error().message;
        if (huge.error().message.find((mount / "cache" / "new").string()) == std::string::npos) {
          return "message does not name the directory: " + huge.error().message;
        }
        if (fs::exists(mount / "cache" / "new" / "g")) return "a failed file was left behind";
        if (cache->bytes_used() != 9 * kPage) {
          return "accounting off after a failure: " + std::to_string(cache->bytes_used());
        }
        return "ok";
      });
  if (result.rfind("SKIP:", 0) == 0) GTEST_SKIP() << result;
  EXPECT_EQ(result, "ok");
}

}  // namespace
}  // namespace thaw::store
