#include "daemon/store/registry/local_registry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "daemon/store/registry/relative_path.hpp"

namespace thaw::store {

namespace fs = std::filesystem;

LocalRegistry::LocalRegistry(fs::path root) : root_(fs::absolute(root).lexically_normal()) {}

std::string LocalRegistry::describe() const {
  return fmt::format("local directory {}", root_.string());
}

std::expected<FileSource, RegistryError> LocalRegistry::source(std::string_view model,
                                                               std::string_view file) const {
  if (auto ok = check_relative_path(model, "model name"); !ok) return std::unexpected(ok.error());
  if (auto ok = check_relative_path(file, "file name"); !ok) return std::unexpected(ok.error());
  return FileSource{FileSource::Kind::local, (root_ / model / file).string()};
}

namespace {

RegistryError io_error(std::string_view what, const fs::path& path, const std::error_code& ec) {
  return RegistryError{RegistryErrc::local_io,
                       fmt::format("{} {}: {}", what, path.string(), ec.message())};
}

std::expected<std::string, RegistryError> read_small_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::unexpected(
        RegistryError{RegistryErrc::local_io, fmt::format("cannot open {}", path.string())});
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::expected<ModelListing, RegistryError> LocalRegistry::list(std::string_view model) {
  if (auto ok = check_relative_path(model, "model name"); !ok) return std::unexpected(ok.error());
  const fs::path dir = root_ / model;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return std::unexpected(RegistryError{
        RegistryErrc::not_found,
        fmt::format("model '{}' not found: {} is not a directory", model, dir.string())});
  }
  ModelListing listing;
  listing.model = std::string(model);
  const fs::path manifest_path = dir / kManifestName;
  if (fs::exists(manifest_path, ec)) {
    auto text = read_small_file(manifest_path);
    if (!text) return std::unexpected(text.error());
    auto manifest = parse_manifest(*text, manifest_path.string());
    if (!manifest) return std::unexpected(manifest.error());
    for (const auto& file : manifest->files) {
      const fs::path path = dir / file.path;
      std::uint64_t size = fs::file_size(path, ec);
      if (ec) return std::unexpected(io_error("manifest lists missing/unreadable", path, ec));
      if (size != file.size) {
        return std::unexpected(
            RegistryError{RegistryErrc::bad_listing,
                          fmt::format("{}: manifest {} says {} bytes, the file has {}",
                                      path.string(), manifest_path.string(), file.size, size)});
      }
      listing.files.push_back(RemoteFile{file.path, file.size, file.sha256});
    }
    listing.manifest = std::move(*manifest);
  } else {
    fs::recursive_directory_iterator it(dir, ec), end;
    if (ec) return std::unexpected(io_error("cannot list", dir, ec));
    for (; it != end; it.increment(ec)) {
      if (ec) return std::unexpected(io_error("cannot list", dir, ec));
      const fs::path& path = it->path();
      if (it->is_directory(ec) && !it->is_symlink(ec)) {
        if (path.filename().string().starts_with('.')) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file(ec)) continue;  // follows symlinks; skips dangling ones
      std::string relative = path.lexically_relative(dir).generic_string();
      if (auto ok = check_relative_path(relative, "local file"); !ok) {
        return std::unexpected(ok.error());
      }
      std::uint64_t size = fs::file_size(path, ec);
      if (ec) return std::unexpected(io_error("cannot size", path, ec));
      listing.files.push_back(RemoteFile{std::move(relative), size, std::nullopt});
    }
  }
  std::sort(listing.files.begin(), listing.files.end(),
            [](const RemoteFile& a, const RemoteFile& b) { return a.path < b.path; });
  return listing;
}

}  // namespace thaw::store
