#include "daemon/store/fetch/manifest_publish.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/safetensors/header.hpp"
#include "common/safetensors/model.hpp"
#include "daemon/store/cache/unique_fd.hpp"
#include "daemon/store/fetch/sha256.hpp"
#include "daemon/store/fetch/sha256_chain.hpp"

namespace thaw::store {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempSuffix = ".tmp";

std::unexpected<PublishError> failure(std::string message) {
  return std::unexpected(PublishError{std::move(message)});
}

// One pass over the file: the whole-file digest, one digest per chunk, and (when the chunk
// size allows it) the chaining states that let a fetch check both in one pass.
std::expected<ManifestFile, PublishError> hash_file(const fs::path& path, std::string relative,
                                                    std::uint64_t chunk_size, bool chain,
                                                    std::vector<std::byte>& buffer) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return failure(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  ManifestFile file;
  file.path = std::move(relative);
  file.chunk_size = chunk_size;
  const bool chained = chain && chunk_size % kSha256BlockBytes == 0;
  Sha256ChainBuilder whole(chained ? chunk_size : kSha256BlockBytes);
  Sha256 chunk;
  std::uint64_t in_chunk = 0;
  for (;;) {
    // Never read across a chunk boundary, so each read feeds one chunk digest.
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), chunk_size - in_chunk));
    const ssize_t n = ::read(fd.get(), buffer.data(), want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return failure(fmt::format("{}: read: {}", path.string(), std::strerror(errno)));
    if (n == 0) break;
    const auto bytes = std::span(buffer).first(static_cast<std::size_t>(n));
    whole.update(bytes);
    if (!chained) chunk.update(bytes);
    file.size += static_cast<std::uint64_t>(n);
    in_chunk += static_cast<std::uint64_t>(n);
    if (in_chunk == chunk_size) {
      if (!chained) file.chunk_sha256.push_back(chunk.hex_digest());
      in_chunk = 0;
    }
  }
  if (in_chunk > 0 && !chained) file.chunk_sha256.push_back(chunk.hex_digest());
  auto result = whole.finish();
  file.sha256 = std::move(result.sha256);
  if (chained) {
    file.chained = true;
    file.chunk_chain_sha256 = std::move(result.chain);
  }
  return file;
}

// The fetch side's checks, run before anything is hashed: every *.safetensors file's header
// must pass the strict parser (offsets inside the file, no overlap or gap, known dtypes,
// sizes that match shapes), and the model as a whole (index against shards, config.json)
// must assemble. A manifest vouches for a model; it must never vouch for one no fetch can
// use.
std::expected<void, PublishError> check_weights(
    const fs::path& dir, const std::vector<std::pair<std::string, fs::path>>& files) {
  const auto refuse = [&](const std::string& problem) {
    return failure(
        fmt::format("{}; a fetch refuses such a model, so no manifest was written — "
                    "regenerate or re-download the file, then publish again",
                    problem));
  };
  for (const auto& [relative, path] : files) {
    if (!relative.ends_with(".safetensors")) continue;
    auto header = safetensors::read_header(path, relative);
    if (!header) {
      return refuse(fmt::format("{}/{} ({})", dir.string(), header.error().message,
                                safetensors::errc_name(header.error().code)));
    }
  }
  std::error_code ec;
  if (fs::is_regular_file(dir / safetensors::kSingleFileName, ec) ||
      fs::is_regular_file(dir / safetensors::kIndexFileName, ec)) {
    if (auto model = safetensors::Model::open(dir); !model) {
      return refuse(fmt::format("{} ({})", model.error().message,
                                safetensors::errc_name(model.error().code)));
    }
  }
  return {};
}

}  // namespace

std::expected<Manifest, PublishError> make_manifest(const fs::path& dir,
                                                    const PublishOptions& options) {
  if (options.chunk_size == 0) return failure("the manifest's chunk size must be > 0 bytes");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return failure(fmt::format("{} is not a directory; give the model's directory", dir.string()));
  }
  std::vector<std::pair<std::string, fs::path>> files;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) return failure(fmt::format("cannot list {}: {}", dir.string(), ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) return failure(fmt::format("cannot list {}: {}", dir.string(), ec.message()));
    const fs::path& path = it->path();
    const std::string name = path.filename().string();
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      if (name.starts_with('.')) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;  // follows symlinks; skips dangling ones
    std::string relative = path.lexically_relative(dir).generic_string();
    if (relative == kManifestName ||
        relative == std::string(kManifestName) + std::string(kTempSuffix)) {
      continue;
    }
    files.emplace_back(std::move(relative), path);
  }
  std::sort(files.begin(), files.end());
  if (auto ok = check_weights(dir, files); !ok) return std::unexpected(ok.error());

  Manifest manifest;
  std::vector<std::byte> buffer(static_cast<std::size_t>(
      std::min<std::uint64_t>(options.chunk_size, std::uint64_t{4} << 20)));
  for (auto& [relative, path] : files) {
    auto file = hash_file(path, relative, options.chunk_size, options.chain, buffer);
    if (!file) return std::unexpected(file.error());
    if (options.on_file) options.on_file(file->path, file->size);
    manifest.files.push_back(std::move(*file));
  }
  // The format's own check, so nothing is published that a fetch would refuse.
  if (auto parsed = parse_manifest(manifest_to_json(manifest).dump(), dir.string()); !parsed) {
    return failure(parsed.error().message);
  }
  return manifest;
}

std::expected<Manifest, PublishError> publish_manifest(const fs::path& dir,
                                                       const PublishOptions& options) {
  auto manifest = make_manifest(dir, options);
  if (!manifest) return manifest;
  const fs::path target = dir / kManifestName;
  const fs::path temp = dir / (std::string(kManifestName) + std::string(kTempSuffix));
  const std::string text = manifest_to_json(*manifest).dump(1) + "\n";
  {
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) {
      return failure(fmt::format("{}: cannot create: {}; is the directory writable?", temp.string(),
                                 std::strerror(errno)));
    }
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        return failure(fmt::format("{}: write: {}", temp.string(), std::strerror(err)));
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      const int err = errno;
      ::unlink(temp.c_str());
      return failure(fmt::format("{}: fsync: {}", temp.string(), std::strerror(err)));
    }
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return failure(
        fmt::format("renaming {} to {}: {}", temp.string(), target.string(), std::strerror(err)));
  }
  return manifest;
}

}  // namespace thaw::store
