#include "daemon/store/registry/relative_path.hpp"

#include <fmt/format.h>

namespace thaw::store {

std::expected<void, RegistryError> check_relative_path(std::string_view path,
                                                       std::string_view what) {
  auto reject = [&](std::string_view rule) {
    return std::unexpected(
        RegistryError{RegistryErrc::bad_spec, fmt::format("{} '{}': {}", what, path, rule)});
  };
  if (path.empty()) return reject("empty name");
  if (path.front() == '/') return reject("absolute path (must be relative to the model)");
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return reject("control character in name");
    }
    if (c == '\\') return reject("backslash in name");
  }
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view segment = path.substr(start, slash - start);
    if (segment.empty()) return reject("empty path segment");
    if (segment == "." || segment == "..") return reject("'.' or '..' segment");
    start = slash + 1;
  }
  return {};
}

std::string url_escape_path(std::string_view relative_path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(relative_path.size());
  for (char c : relative_path) {
    auto u = static_cast<unsigned char>(c);
    bool unreserved = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~' || c == '/';
    if (unreserved) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  return out;
}

std::string join_url(std::string_view base, std::string_view relative) {
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  while (!relative.empty() && relative.front() == '/') relative.remove_prefix(1);
  return fmt::format("{}/{}", base, relative);
}

}  // namespace thaw::store
