// The cache's group (HostCacheConfig::group, thawd: the first of shim.allow_groups): engines
// run as members of it open cached model files by path, so the root and everything under
// it — also what an older thawd left with mode 0600 — become readable by that group, and
// what is created later inherits it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "daemon/store/cache/cache_layout.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "tests/daemon/store/cache/cache_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct stat stat_of(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

TEST(CacheGroup, EnginesOfTheGroupCanReadWhatTheCacheHolds) {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  // What an older thawd left: a cached model with a root-only file.
  {
    HostCache cache = *HostCache::open(HostCacheConfig{root, 1 << 30, {}, {}});
    auto file = cache.open_file("old", "config.json", CacheFileSpec{100, 4096});
    ASSERT_TRUE(file) << file.error().message;
  }
  ASSERT_EQ(::chmod(cache_layout::data_path(root, "old", "config.json").c_str(), 0600), 0);

  // Any process may give its files to its own group: that is the group here.
  const gid_t group = ::getgid();
  HostCacheConfig config{root, 1 << 30, {}, {}};
  config.group = group;
  auto cache = HostCache::open(config);
  ASSERT_TRUE(cache) << cache.error().message;
  const struct stat top = stat_of(root);
  EXPECT_EQ(top.st_gid, group);
  EXPECT_EQ(top.st_mode & 07777, 02750u) << "the group may enter, others may not";
  const struct stat old = stat_of(cache_layout::data_path(root, "old", "config.json"));
  EXPECT_EQ(old.st_mode & 0777, 0640u) << "an older cache's files are opened up on start";
  EXPECT_EQ(old.st_gid, group);

  auto file = cache->open_file("gpt-syn", "sub/model.safetensors", CacheFileSpec{8192, 4096});
  ASSERT_TRUE(file) << file.error().message;
  for (const fs::path& d : {root / "gpt-syn", root / "gpt-syn" / "sub"}) {
    const struct stat st = stat_of(d);
    EXPECT_EQ(st.st_gid, group) << d;
    EXPECT_TRUE(st.st_mode & S_ISGID) << d << ": new directories inherit the group";
    EXPECT_TRUE(st.st_mode & S_IXGRP) << d;
  }
  const struct stat data =
      stat_of(cache_layout::data_path(root, "gpt-syn", "sub/model.safetensors"));
  EXPECT_EQ(data.st_gid, group);
  EXPECT_EQ(data.st_mode & 0777, 0640u) << "readable by the group, writable by thawd only";
}

}  // namespace
}  // namespace thaw::store
