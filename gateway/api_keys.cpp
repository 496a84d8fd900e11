#include "gateway/api_keys.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace thaw::gateway {
namespace {

// A key shorter than this is guessable by a client that may try as often as it likes.
constexpr std::size_t kMinKeyLength = 16;

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

}  // namespace

ApiKeys::Digest ApiKeys::digest(std::string_view text) {
  Digest out{};
  unsigned int n = 0;
  EVP_Digest(text.data(), text.size(), out.data(), &n, EVP_sha256(), nullptr);
  return out;
}

std::expected<ApiKeys, std::string> ApiKeys::load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return std::unexpected(fmt::format("--api-key-file {}: {}", path, strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return std::unexpected(fmt::format("--api-key-file {}: not a regular file", path));
  }
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    return std::unexpected(
        fmt::format("--api-key-file {}: other users can read or write it (mode {:04o}); "
                    "chmod o-rw {} (or hand it to the unit with LoadCredential=)",
                    path, st.st_mode & 07777, path));
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(fmt::format("--api-key-file {}: {}", path, strerror(errno)));
    }
    text.append(buf, n);
    if (text.size() > (1u << 20)) {
      return std::unexpected(fmt::format("--api-key-file {}: over 1 MiB", path));
    }
  }
  ApiKeys keys;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string_view key = trim(line);
    if (key.empty() || key.front() == '#') continue;
    if (key.size() < kMinKeyLength || key.find_first_of(" \t") != std::string_view::npos) {
      return std::unexpected(
          fmt::format("--api-key-file {} line {}: a key is one word of at least {} characters "
                      "(make one with: openssl rand -hex 32)",
                      path, number, kMinKeyLength));
    }
    keys.digests_.push_back(digest(key));
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (keys.digests_.empty()) {
    return std::unexpected(fmt::format(
        "--api-key-file {}: no keys in it (one per line; make one with: openssl rand -hex 32)",
        path));
  }
  return keys;
}

ApiKeys ApiKeys::from_keys(const std::vector<std::string>& keys) {
  ApiKeys out;
  for (const auto& k : keys) out.digests_.push_back(digest(k));
  return out;
}

bool ApiKeys::accepts(std::string_view authorization) const {
  // "Bearer" is case-insensitive (RFC 6750 via RFC 7235); one or more spaces after it.
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  }
  const std::string_view token = trim(authorization.substr(kScheme.size()));
  if (token.empty()) return false;
  // Every key is compared, digest against digest (fixed length), without stopping early.
  const Digest presented = digest(token);
  int matched = 0;
  for (const Digest& d : digests_) {
    matched |= CRYPTO_memcmp(presented.data(), d.data(), d.size()) == 0;
  }
  return matched != 0;
}

}  // namespace thaw::gateway
