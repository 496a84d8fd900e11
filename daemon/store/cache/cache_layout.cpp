#include "daemon/store/cache/cache_layout.hpp"

#include <fmt/format.h>

namespace thaw::store::cache_layout {
namespace fs = std::filesystem;
namespace {

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '@' || c == '=' || c == '-';
}

bool alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

CacheResult<void> check_model_key(std::string_view key) {
  auto bad = [&](std::string_view rule) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("model key \"{}\": {}", key, rule));
  };
  if (key.empty() || key.size() > kMaxKeyBytes) return bad("must be 1 to 200 characters");
  if (!alnum(key.front())) return bad("must start with a letter or digit");
  for (char c : key) {
    if (!key_char(c)) return bad("may only hold letters, digits and . _ @ = -");
  }
  return {};
}

CacheResult<void> check_relative_path(std::string_view path) {
  auto bad = [&](std::string_view rule) {
    return cache_failure(CacheErrc::invalid_argument,
                         fmt::format("model file path \"{}\": {}", path, rule));
  };
  if (path.empty() || path.size() > kMaxPathBytes) return bad("must be 1 to 1024 bytes");
  if (path.front() == '/') return bad("must be relative");
  if (path.find('\0') != std::string_view::npos) return bad("must not contain NUL");
  size_t start = 0;
  bool first = true;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return bad("components must not be empty, \".\" or \"..\"");
    }
    if (part.size() > 255) return bad("components must be at most 255 bytes");
    if (first && part == kMetaDir) return bad("\".thaw/\" is reserved for the cache's metadata");
    first = false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return {};
}

fs::path marker_path(const fs::path& root) {
  return root / kMarker;
}

fs::path model_dir(const fs::path& root, std::string_view key) {
  return root / key;
}

fs::path data_path(const fs::path& root, std::string_view key, std::string_view relative_path) {
  return root / key / relative_path;
}

fs::path readiness_dir(const fs::path& root, std::string_view key) {
  return root / key / kMetaDir / kReadyDir;
}

fs::path readiness_path(const fs::path& root, std::string_view key,
                        std::string_view relative_path) {
  return readiness_dir(root, key) / relative_path;
}

fs::path last_used_path(const fs::path& root, std::string_view key) {
  return root / key / kMetaDir / kLastUsed;
}

fs::path unverified_path(const fs::path& root, std::string_view key) {
  return root / key / kMetaDir / kUnverified;
}

fs::path dropped_dir(const fs::path& root, std::string_view key) {
  return root / key / kMetaDir / kDroppedDir;
}

fs::path dropped_path(const fs::path& root, std::string_view key, std::string_view relative_path) {
  return dropped_dir(root, key) / relative_path;
}

}  // namespace thaw::store::cache_layout
