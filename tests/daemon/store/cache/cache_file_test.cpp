// CacheFile: full-size creation, writes, descriptors for consumers, re-opening, and a
// full filesystem (a tiny tmpfs mounted in a private mount namespace).
#include "daemon/store/cache/cache_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tests/daemon/store/cache/cache_test_support.hpp"

namespace thaw::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Child;
using testing::on_tiny_tmpfs;
using testing::TempDir;

std::vector<std::byte> read_back(int fd, uint64_t offset, size_t size) {
  std::vector<std::byte> out(size);
  EXPECT_EQ(::pread(fd, out.data(), size, static_cast<off_t>(offset)), static_cast<ssize_t>(size));
  return out;
}

using testing::files_under;

TEST(CacheFile, CreatesDataAtFullSizeWithAFillingMap) {
  TempDir dir;
  const fs::path data = dir.path() / "m" / "model.safetensors";
  const fs::path map = dir.path() / "m" / ".thaw" / "ready" / "model.safetensors";
  auto file = CacheFile::create(data, map, CacheFileSpec{1 << 20, 1 << 16});
  ASSERT_TRUE(file) << file.error().message;
  struct stat st {};
  ASSERT_EQ(::stat(data.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  // Sparse by default: space is checked, not zero-filled (see cache_file.hpp).
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 20);
  EXPECT_EQ(st.st_mode & 0777, 0640u) << "engines of the cache's group read it by path";
  EXPECT_TRUE(fs::exists(map));
  EXPECT_EQ(file->size(), uint64_t{1} << 20);
  EXPECT_EQ(file->readiness().chunk_count(), 16u);
  EXPECT_EQ(file->readiness().state(), FillState::filling);
}

void write_and_check(DataWriteMode mode) {
  TempDir dir;
  auto file = CacheFile::create(dir.path() / "f", dir.path() / "f.ready",
                                CacheFileSpec{100000, 4096}, CacheFileOptions{mode});
  ASSERT_TRUE(file) << file.error().message;
  const auto bytes = testing::pattern_bytes(100000, 3);
  // Out of order, in uneven pieces, as several connections deliver them.
  ASSERT_TRUE(file->write_at(50000, std::span(bytes).subspan(50000, 50000)));
  ASSERT_TRUE(file->write_at(0, std::span(bytes).subspan(0, 12345)));
  ASSERT_TRUE(file->write_at(12345, std::span(bytes).subspan(12345, 37655)));
  auto fd = file->reader_data_fd();
  ASSERT_TRUE(fd);
  EXPECT_EQ(read_back(fd->get(), 0, 100000), bytes);

  auto past = file->write_at(99999, std::span(bytes).subspan(0, 2));
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code, CacheErrc::invalid_argument);
  EXPECT_TRUE(file->write_at(100000, {}));
}

TEST(CacheFile, PreallocateReservesTheWholeFile) {
  TempDir dir;
  const fs::path data = dir.path() / "model.safetensors";
  CacheFileOptions options;
  options.space = SpaceReservation::preallocate;
  auto file = CacheFile::create(data, dir.path() / "map", CacheFileSpec{1 << 20, 1 << 16}, options);
  ASSERT_TRUE(file) << file.error().message;
  struct stat st {};
  ASSERT_EQ(::stat(data.c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 20);
}

TEST(CacheFile, SpacePromisedToOtherFilesIsNotOffered) {
  const std::string result = on_tiny_tmpfs("1m", [](const fs::path& root) -> std::string {
    CacheFileOptions options;
    options.promised_elsewhere = 768 << 10;  // 768 KiB of the 1 MiB owed to other fetches
    auto file =
        CacheFile::create(root / "f", root / "f.ready", CacheFileSpec{512 << 10, 4096}, options);
    if (file) return "created a file into space promised to others";
    if (file.error().code != CacheErrc::no_space) return "wrong code: " + file.error().message;
    if (file.error().message.find("promised") == std::string::npos) {
      return "message does not say why: " + file.error().message;
    }
    options.promised_elsewhere = 0;
    auto fits =
        CacheFile::create(root / "f", root / "f.ready", CacheFileSpec{512 << 10, 4096}, options);
    if (!fits) return "without the promise it should fit: " + fits.error().message;
    return "ok";
  });
  if (result.rfind("SKIP:", 0) == 0) GTEST_SKIP() << result;
  EXPECT_EQ(result, "ok");
}

TEST(CacheFile, WritesWithPwrite) {
  write_and_check(DataWriteMode::pwrite);
}
TEST(CacheFile, WritesThroughAMapping) {
  write_and_check(DataWriteMode::mapping);
}

TEST(CacheFile, ConsumerDescriptorsAreReadOnlyAndIndependent) {
  TempDir dir;
  auto file =
      CacheFile::create(dir.path() / "f", dir.path() / "f.ready", CacheFileSpec{8192, 4096});
  ASSERT_TRUE(file);
  auto data = file->reader_data_fd();
  auto map = file->reader_readiness_fd();
  ASSERT_TRUE(data && map);
  for (int fd : {data->get(), map->get()}) {
    EXPECT_EQ(::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    char c = 'x';
    EXPECT_EQ(::pwrite(fd, &c, 1, 0), -1) << "a consumer must not be able to write";
    EXPECT_EQ(errno, EBADF);
  }
  // The consumer's descriptor outlives the writer.
  const auto bytes = testing::pattern_bytes(8192, 9);
  ASSERT_TRUE(file->write_at(0, bytes));
  ASSERT_TRUE(file->readiness().mark_verified(0));
  *file =
      std::move(*CacheFile::create(dir.path() / "g", dir.path() / "g.ready", CacheFileSpec{1, 1}));
  auto reader = ChunkReadiness::open_reader(std::move(*map), "passed");
  ASSERT_TRUE(reader);
  EXPECT_TRUE(reader->is_ready(0, 4096));
  EXPECT_EQ(read_back(data->get(), 0, 4096),
            std::vector<std::byte>(bytes.begin(), bytes.begin() + 4096));
}

TEST(CacheFile, RefusesToCreateOverAnExistingFile) {
  TempDir dir;
  ASSERT_TRUE(CacheFile::create(dir.path() / "f", dir.path() / "f.ready", CacheFileSpec{10, 5}));
  auto again = CacheFile::create(dir.path() / "f", dir.path() / "f2.ready", CacheFileSpec{10, 5});
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, CacheErrc::exists);
  EXPECT_FALSE(fs::exists(dir.path() / "f2.ready")) << "nothing left behind";
}

TEST(CacheFile, RejectsBadGeometry) {
  TempDir dir;
  auto zero = CacheFile::create(dir.path() / "f", dir.path() / "f.ready", CacheFileSpec{10, 0});
  ASSERT_FALSE(zero);
  EXPECT_EQ(zero.error().code, CacheErrc::invalid_argument);
  EXPECT_TRUE(files_under(dir.path()).empty());
}

TEST(CacheFile, ReopensWithVerifiedChunksAndOneWriter) {
  TempDir dir;
  const fs::path data = dir.path() / "f";
  const fs::path map = dir.path() / "f.ready";
  const auto bytes = testing::pattern_bytes(10000, 5);
  {
    auto file = CacheFile::create(data, map, CacheFileSpec{10000, 1000});
    ASSERT_TRUE(file);
    ASSERT_TRUE(file->write_at(3000, std::span(bytes).subspan(3000, 1000)));
    ASSERT_TRUE(file->readiness().mark_verified(3));
    auto second = CacheFile::open(data, map);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.error().code, CacheErrc::locked) << second.error().message;
  }
  auto file = CacheFile::open(data, map);
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ(file->readiness().state(), FillState::filling);
  EXPECT_EQ(file->readiness().missing_chunks(), (std::vector<ChunkRun>{{0, 3}, {4, 6}}));
  EXPECT_EQ(read_back(file->data_fd(), 3000, 1000),
            std::vector<std::byte>(bytes.begin() + 3000, bytes.begin() + 4000));
}

TEST(CacheFile, OpenRejectsADataFileOfTheWrongSize) {
  TempDir dir;
  ASSERT_TRUE(
      CacheFile::create(dir.path() / "f", dir.path() / "f.ready", CacheFileSpec{10000, 1000}));
  fs::resize_file(dir.path() / "f", 5000);
  auto file = CacheFile::open(dir.path() / "f", dir.path() / "f.ready");
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().code, CacheErrc::corrupt);
  EXPECT_NE(file.error().message.find("5000 bytes"), std::string::npos) << file.error().message;
}

TEST(CacheFile, OpenOfAMissingMapIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(CacheFile::create(dir.path() / "f", dir.path() / "f.ready", CacheFileSpec{10, 5}));
  fs::remove(dir.path() / "f.ready");
  auto file = CacheFile::open(dir.path() / "f", dir.path() / "f.ready");
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().code, CacheErrc::not_found);
}

TEST(CacheFile, FullFilesystemIsAClearErrorAndLeavesNothing) {
  const std::string result = on_tiny_tmpfs("256k", [](const fs::path& root) -> std::string {
    const fs::path dir = root / "gpt2@main";
    auto file = CacheFile::create(dir / "model.safetensors", dir / ".thaw/ready/model.safetensors",
                                  CacheFileSpec{1 << 20, 1 << 16});
    if (file) return "created 1 MiB on a 256 KiB tmpfs";
    const std::string& msg = file.error().message;
    if (file.error().code != CacheErrc::no_space) return "wrong code: " + msg;
    for (const std::string& part : {dir.string(), std::string("1048576"),
                                    std::string("model.safetensors"), std::string("free space")}) {
      if (msg.find(part) == std::string::npos) return "message lacks '" + part + "': " + msg;
    }
    auto left = files_under(root);
    if (!left.empty()) return "left behind: " + left.front();
    // What does fit is still created fine.
    auto small = CacheFile::create(dir / "config.json", dir / ".thaw/ready/config.json",
                                   CacheFileSpec{4096, 4096});
    if (!small) return "small file failed: " + small.error().message;
    return "ok";
  });
  if (result.rfind("SKIP:", 0) == 0) GTEST_SKIP() << result;
  EXPECT_EQ(result, "ok");
}

TEST(CacheFile, NoRoomForTheReadinessMapLeavesNothingEither) {
  // 64 KiB of tmpfs: a 64 KiB data file fits exactly, its map does not.
  const std::string result = on_tiny_tmpfs("64k", [](const fs::path& root) -> std::string {
    auto file = CacheFile::create(root / "f", root / "f.ready", CacheFileSpec{64 << 10, 4096});
    if (file) return "created more than fits";
    if (file.error().code != CacheErrc::no_space) return "wrong code: " + file.error().message;
    if (file.error().message.find("readiness map") == std::string::npos) {
      return "message should say what did not fit: " + file.error().message;
    }
    auto left = files_under(root);
    if (!left.empty()) return "left behind: " + left.front();
    return "ok";
  });
  if (result.rfind("SKIP:", 0) == 0) GTEST_SKIP() << result;
  EXPECT_EQ(result, "ok");
}

}  // namespace
}  // namespace thaw::store
