// CURVE key files: the modes they are written with, what load refuses and why, and the Z85
// checks every key read from a file or a config goes through.
#include "common/zmq/curve_keys.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "temp_dir.hpp"

namespace thaw::zmqx {
namespace {

using thaw::testing::TempDir;

mode_t mode_of(const std::filesystem::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

std::string first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(CurveKeys, CurveIsAvailable) {
  // Everything else in the control plane depends on it: fail loudly, not skip.
  auto ok = curve_available();
  ASSERT_TRUE(ok) << ok.error();
}

TEST(CurveKeys, WritesTheSecretOwnerOnlyAndThePublicWorldReadable) {
  TempDir dir;
  // A permissive umask must not widen the secret file, a strict one must not narrow the
  // public one: the modes are set explicitly.
  const mode_t old_umask = ::umask(0);
  auto pair = write_key_pair(dir.path() / "node");
  ::umask(077);
  auto strict = write_key_pair(dir.path() / "strict");
  ::umask(old_umask);
  ASSERT_TRUE(pair) << pair.error();
  ASSERT_TRUE(strict) << strict.error();
  for (const char* prefix : {"node", "strict"}) {
    EXPECT_EQ(mode_of(dir.path() / (std::string(prefix) + ".key")), 0600u) << prefix;
    EXPECT_EQ(mode_of(dir.path() / (std::string(prefix) + ".pub")), 0644u) << prefix;
  }
  EXPECT_EQ(first_line(dir.path() / "node.key"), pair->secret_z85);
  EXPECT_EQ(first_line(dir.path() / "node.pub"), pair->public_z85);
  EXPECT_EQ(pair->public_z85.size(), 40u);
  EXPECT_EQ(pair->secret_z85.size(), 40u);
  EXPECT_NE(pair->public_z85, strict->public_z85);
}

TEST(CurveKeys, RefusesToOverwriteEitherFile) {
  TempDir dir;
  const auto prefix = dir.path() / "node";
  auto first = write_key_pair(prefix);
  ASSERT_TRUE(first) << first.error();

  auto again = write_key_pair(prefix);
  ASSERT_FALSE(again);
  EXPECT_TRUE(contains(again.error(), "node.key") || contains(again.error(), "node.pub"))
      << again.error();
  EXPECT_TRUE(contains(again.error(), "remove it first")) << again.error();

  // Only the secret left: still refused, and the old secret is untouched.
  std::filesystem::remove(dir.path() / "node.pub");
  auto secret_only = write_key_pair(prefix);
  ASSERT_FALSE(secret_only);
  EXPECT_TRUE(contains(secret_only.error(), "node.key")) << secret_only.error();
  EXPECT_TRUE(contains(secret_only.error(), "remove it first")) << secret_only.error();
  EXPECT_EQ(first_line(dir.path() / "node.key"), first->secret_z85);
}

TEST(CurveKeys, DerivedPublicKeyEqualsTheWrittenOne) {
  TempDir dir;
  auto pair = write_key_pair(dir.path() / "coordinator");
  ASSERT_TRUE(pair) << pair.error();
  auto loaded = load_secret_key(dir.path() / "coordinator.key");
  ASSERT_TRUE(loaded) << loaded.error();
  auto pub = load_public_key(dir.path() / "coordinator.pub");
  ASSERT_TRUE(pub) << pub.error();
  EXPECT_EQ(loaded->secret_z85, pair->secret_z85);
  EXPECT_EQ(loaded->public_z85, *pub);
  EXPECT_EQ(loaded->public_z85, pair->public_z85);
}

TEST(CurveKeys, RefusesAGroupOrOtherReadableSecretSayingChmod600) {
  TempDir dir;
  ASSERT_TRUE(write_key_pair(dir.path() / "node"));
  const auto secret = dir.path() / "node.key";
  for (mode_t mode : {0640, 0604, 0660}) {
    ASSERT_EQ(::chmod(secret.c_str(), mode), 0);
    auto loaded = load_secret_key(secret);
    ASSERT_FALSE(loaded) << std::oct << mode;
    EXPECT_TRUE(contains(loaded.error(), "chmod 600 " + secret.string())) << loaded.error();
    std::ostringstream shown;
    shown << "mode " << std::oct << mode;
    EXPECT_TRUE(contains(loaded.error(), shown.str())) << loaded.error();
  }
  ASSERT_EQ(::chmod(secret.c_str(), 0400), 0);  // owner-only read is fine
  EXPECT_TRUE(load_secret_key(secret));
}

TEST(CurveKeys, LoadTrimsTheLineEndAndRefusesWhatIsNotAKey) {
  TempDir dir;
  auto pair = generate_key_pair();
  ASSERT_TRUE(pair) << pair.error();
  { std::ofstream(dir.path() / "crlf.pub") << pair->public_z85 << " \r\n"; }
  auto pub = load_public_key(dir.path() / "crlf.pub");
  ASSERT_TRUE(pub) << pub.error();
  EXPECT_EQ(*pub, pair->public_z85);

  { std::ofstream(dir.path() / "short.pub") << "too-short\n"; }
  auto short_key = load_public_key(dir.path() / "short.pub");
  ASSERT_FALSE(short_key);
  EXPECT_TRUE(contains(short_key.error(), "short.pub")) << short_key.error();
  EXPECT_TRUE(contains(short_key.error(), "40 Z85 characters")) << short_key.error();

  auto missing = load_public_key(dir.path() / "absent.pub");
  ASSERT_FALSE(missing);
  EXPECT_TRUE(contains(missing.error(), "cannot read")) << missing.error();
  auto missing_secret = load_secret_key(dir.path() / "absent.key");
  ASSERT_FALSE(missing_secret);
  EXPECT_TRUE(contains(missing_secret.error(), "cannot read")) << missing_secret.error();
}

TEST(CurveKeys, CheckZ85KeyRejectsBadLengthsAndCharacters) {
  auto pair = generate_key_pair();
  ASSERT_TRUE(pair) << pair.error();
  EXPECT_TRUE(check_z85_key(pair->public_z85));
  EXPECT_TRUE(check_z85_key(pair->secret_z85));

  for (std::size_t length : {0u, 5u, 39u, 41u, 45u, 80u}) {
    auto bad = check_z85_key(std::string(length, 'a'));
    ASSERT_FALSE(bad) << length;
    EXPECT_TRUE(contains(bad.error(), "40 Z85 characters")) << bad.error();
    EXPECT_TRUE(contains(bad.error(), std::to_string(length) + " characters")) << bad.error();
  }
  // 40 characters, but not Z85: outside its alphabet (space, '~', '"', '\\', ',', '_'), or a
  // 5-character group worth more than 2^32 ("#####" is 85^5 - 1).
  for (char c : {' ', '~', '"', '\\', ',', '_', '|', ';'}) {
    std::string key = pair->public_z85;
    key[17] = c;
    auto bad = check_z85_key(key);
    ASSERT_FALSE(bad) << "'" << c << "'";
    EXPECT_TRUE(contains(bad.error(), "not a Z85-encoded key")) << bad.error();
  }
  auto overflow = check_z85_key("#####" + pair->public_z85.substr(5));
  ASSERT_FALSE(overflow);
  EXPECT_TRUE(contains(overflow.error(), "not a Z85-encoded key")) << overflow.error();
}

}  // namespace
}  // namespace thaw::zmqx
