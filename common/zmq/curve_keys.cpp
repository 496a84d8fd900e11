#include "common/zmq/curve_keys.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace thaw::zmqx {
namespace {

std::expected<std::string, std::string> read_key_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    return std::unexpected(
        fmt::format("{}: cannot read ({})", path.string(), std::strerror(errno)));
  }
  std::string text;
  std::getline(in, text);
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (auto ok = check_z85_key(text); !ok) {
    return std::unexpected(fmt::format("{}: {}", path.string(), ok.error()));
  }
  return text;
}

std::expected<void, std::string> write_new(const std::filesystem::path& path,
                                           const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return std::unexpected(
        fmt::format("{}: cannot create ({}){}", path.string(), std::strerror(errno),
                    errno == EEXIST ? "; remove it first to make a new key" : ""));
  }
  const std::string line = text + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  ::fchmod(fd, mode) == 0 && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return std::unexpected(fmt::format("{}: cannot write", path.string()));
  return {};
}

}  // namespace

std::expected<void, std::string> curve_available() {
  if (zmq_has("curve") == 0) {
    return std::unexpected(
        "this libzmq has no CURVE support (it needs libsodium): install Debian's libzmq5");
  }
  return {};
}

std::expected<void, std::string> check_z85_key(const std::string& text) {
  if (text.size() != 40) {
    return std::unexpected(
        fmt::format("a key is 40 Z85 characters; this is {} characters", text.size()));
  }
  std::uint8_t decoded[32];
  // zmq_z85_decode reads up to a NUL: one inside would pass a shorter, different key.
  if (text.find('\0') != std::string::npos || zmq_z85_decode(decoded, text.c_str()) == nullptr) {
    return std::unexpected("not a Z85-encoded key");
  }
  return {};
}

std::expected<CurveKeyPair, std::string> generate_key_pair() {
  if (auto ok = curve_available(); !ok) return std::unexpected(ok.error());
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return std::unexpected(fmt::format("cannot make a key pair: {}", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, sec};
}

std::expected<CurveKeyPair, std::string> write_key_pair(const std::filesystem::path& prefix) {
  auto pair = generate_key_pair();
  if (!pair) return pair;
  const auto secret = std::filesystem::path(prefix.string() + ".key");
  const auto pub = std::filesystem::path(prefix.string() + ".pub");
  for (const auto& path : {secret, pub}) {
    if (std::filesystem::exists(path)) {
      return std::unexpected(
          fmt::format("{} exists; remove it first to make a new key", path.string()));
    }
  }
  if (auto ok = write_new(secret, pair->secret_z85, 0600); !ok) return std::unexpected(ok.error());
  if (auto ok = write_new(pub, pair->public_z85, 0644); !ok) {
    std::error_code ec;
    std::filesystem::remove(secret, ec);  // no half pair left behind to block the next try
    return std::unexpected(ok.error());
  }
  return pair;
}

std::expected<CurveKeyPair, std::string> load_secret_key(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    return std::unexpected(
        fmt::format("{}: a secret key must be readable by its owner only (mode {:o}); chmod 600 {}",
                    path.string(), st.st_mode & 0777, path.string()));
  }
  auto secret = read_key_text(path);
  if (!secret) return std::unexpected(secret.error());
  char pub[41] = {};
  if (zmq_curve_public(pub, secret->c_str()) != 0) {
    return std::unexpected(
        fmt::format("{}: not a CURVE secret key ({})", path.string(), zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, *secret};
}

std::expected<std::string, std::string> load_public_key(const std::filesystem::path& path) {
  return read_key_text(path);
}

}  // namespace thaw::zmqx
