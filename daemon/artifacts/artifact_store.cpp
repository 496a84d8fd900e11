#include "daemon/artifacts/artifact_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/proto/document_fd.hpp"
#include "daemon/store/fetch/sha256.hpp"

namespace thaw::daemon {

namespace {

namespace fs = std::filesystem;

bool valid_kind(std::string_view kind) {
  if (kind.empty() || kind.size() > 32) return false;
  for (char c : kind) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string errno_text() {
  return std::strerror(errno);
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

nlohmann::json ArtifactIdentity::to_json() const {
  return {{"engine", engine}, {"model", model}, {"gpu", gpu}, {"driver", driver}};
}

ServiceResult<ArtifactIdentity> parse_artifact_identity(const nlohmann::json& kind,
                                                        const nlohmann::json& identity) {
  if (!kind.is_string() || !valid_kind(kind.get<std::string>())) {
    return service_error(error_name::kInvalidArgument,
                         "an artifact's kind must be a short name of [a-z0-9_-], e.g. \"layout\"");
  }
  if (!identity.is_object()) {
    return service_error(error_name::kInvalidArgument,
                         "an artifact needs identity {engine, model, gpu, driver}");
  }
  ArtifactIdentity id;
  id.kind = kind.get<std::string>();
  for (auto [name, field] : {std::pair{"engine", &id.engine}, std::pair{"model", &id.model},
                             std::pair{"gpu", &id.gpu}, std::pair{"driver", &id.driver}}) {
    auto it = identity.find(name);
    if (it == identity.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
      return service_error(error_name::kInvalidArgument,
                           fmt::format("an artifact's identity needs a non-empty string {}", name));
    }
    *field = it->get<std::string>();
  }
  if (identity.size() != 4) {
    return service_error(error_name::kInvalidArgument,
                         "an artifact's identity has exactly engine, model, gpu and driver");
  }
  return id;
}

ArtifactStore::ArtifactStore(fs::path state_dir) : dir_(std::move(state_dir) / "artifacts") {}

std::string ArtifactStore::key(const ArtifactIdentity& identity) {
  const std::string canonical = identity.kind + "\n" + identity.to_json().dump();
  const std::string digest = store::sha256_hex(std::as_bytes(std::span(canonical)));
  return identity.kind + "-" + digest.substr(0, 32);
}

ServiceResult<std::string> ArtifactStore::put(const ArtifactIdentity& identity, int fd,
                                              std::uint64_t bytes) {
  if (bytes == 0 || bytes > kMaxArtifactBytes) {
    return service_error(error_name::kInvalidArgument,
                         fmt::format("an artifact must be 1 byte to {} MiB; this one says {} bytes",
                                     kMaxArtifactBytes >> 20, bytes));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || std::uint64_t(st.st_size) < bytes) {
    return service_error(error_name::kInvalidArgument,
                         "the artifact's descriptor must be a file (a memfd) holding its bytes");
  }
  auto text = proto::read_document(fd, bytes);
  if (!text) {
    return service_error(error_name::kInvalidArgument,
                         "cannot read the artifact's descriptor: " + text.error());
  }
  const nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  if (!doc.is_object()) {
    return service_error(error_name::kInvalidArgument, "an artifact must be a JSON object");
  }
  auto own = doc.find("identity");
  if (own == doc.end() || *own != identity.to_json()) {
    return service_error(error_name::kInvalidArgument,
                         "the artifact's own \"identity\" differs from the one it was sent under");
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return service_error(error_name::kState,
                         fmt::format("cannot create {}: {}; check node.state_dir in thawd.toml",
                                     dir_.string(), ec.message()));
  }
  const std::string k = key(identity);
  const fs::path final_path = dir_ / (k + ".json");
  const fs::path temp_path = dir_ / (k + ".json.tmp");
  UniqueFd out(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out || !write_all(out.get(), *text) || ::fsync(out.get()) != 0) {
    const std::string why = errno_text();
    fs::remove(temp_path, ec);
    return service_error(error_name::kState,
                         fmt::format("cannot write {}: {}", temp_path.string(), why));
  }
  out.reset();
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const std::string why = errno_text();
    fs::remove(temp_path, ec);
    return service_error(error_name::kState,
                         fmt::format("cannot rename into {}: {}", final_path.string(), why));
  }
  if (UniqueFd d(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) {
    (void)::fsync(d.get());
  }
  return k;
}

ServiceResult<StoredArtifact> ArtifactStore::get(const ArtifactIdentity& identity) const {
  const std::string k = key(identity);
  const fs::path path = dir_ / (k + ".json");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) {
      return service_error(error_name::kUnknownArtifact,
                           fmt::format("no {} artifact recorded for this engine, model, GPU and "
                                       "driver yet ({}): this run records one",
                                       identity.kind, k));
    }
    return service_error(error_name::kState,
                         fmt::format("cannot open {}: {}", path.string(), errno_text()));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return service_error(error_name::kState,
                         fmt::format("cannot stat {}: {}", path.string(), errno_text()));
  }
  return StoredArtifact{k, std::move(fd), static_cast<std::uint64_t>(st.st_size)};
}

std::optional<std::string> ArtifactStore::newest_for_model(const std::string& kind,
                                                           const std::string& model) const {
  std::error_code ec;
  std::optional<std::string> best;
  fs::file_time_type best_time{};
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kind + "-") || !name.ends_with(".json")) continue;
    std::error_code stat_ec;
    const auto size = e.file_size(stat_ec);
    const auto time = e.last_write_time(stat_ec);
    if (stat_ec || size > kMaxArtifactBytes || (best && time <= best_time)) continue;
    UniqueFd fd(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) continue;
    auto text = proto::read_document(fd.get(), size);
    if (!text) continue;
    auto doc = nlohmann::json::parse(*text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) continue;
    auto id = doc.find("identity");
    if (id == doc.end() || !id->is_object() || id->value("model", std::string()) != model) continue;
    best = std::move(*text);
    best_time = time;
  }
  return best;
}

}  // namespace thaw::daemon
