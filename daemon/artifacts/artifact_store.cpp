#include "daemon/artifacts/artifact_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
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

// The document's allocation sequence, when it has one (layout records).
const nlohmann::json* sequence_of(const nlohmann::json& doc) {
  auto it = doc.find("allocations");
  return it != doc.end() && it->is_array() ? &*it : nullptr;
}

bool is_prefix(const nlohmann::json& shorter, const nlohmann::json& longer) {
  return shorter.size() <= longer.size() &&
         std::equal(shorter.begin(), shorter.end(), longer.begin());
}

// The document at `path` as JSON, or a discarded value when it is absent or unreadable.
nlohmann::json read_json(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) > ArtifactStore::kMaxArtifactBytes) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  auto text = proto::read_document(fd.get(), static_cast<std::uint64_t>(st.st_size));
  if (!text) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(*text, nullptr, false);
}

// Writes `text` to `final_path` atomically (temporary file, fsync, rename, fsync of the dir).
ServiceResult<void> write_atomically(const fs::path& dir, const fs::path& final_path,
                                     std::string_view text) {
  std::error_code ec;
  const fs::path temp_path = final_path.string() + ".tmp";
  UniqueFd out(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out || !write_all(out.get(), text) || ::fsync(out.get()) != 0) {
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
  if (UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) {
    (void)::fsync(d.get());
  }
  return {};
}

constexpr std::string_view kCandidateSuffix = ".candidate";

}  // namespace

std::string_view to_string(ArtifactPut outcome) {
  switch (outcome) {
    case ArtifactPut::stored:
      return "stored";
    case ArtifactPut::replaced:
      return "replaced the earlier record";
    case ArtifactPut::kept:
      return "kept the record (this run went no further)";
    case ArtifactPut::candidate:
      return "kept the record (this run diverged from it; its sequence is kept aside and "
             "replaces the record if the next diverging run agrees)";
    case ArtifactPut::promoted:
      return "replaced the record (two runs in a row diverged from it the same way)";
  }
  return "unknown";
}

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

std::string ArtifactStore::key(const ArtifactIdentity& identity, std::string_view config) {
  // No config: the key records had before configurations were told apart.
  std::string canonical = identity.kind + "\n" + identity.to_json().dump();
  if (!config.empty()) canonical += fmt::format("\nconfig {}", config);
  const std::string digest = store::sha256_hex(std::as_bytes(std::span(canonical)));
  return identity.kind + "-" + digest.substr(0, 32);
}

ServiceResult<ArtifactPutResult> ArtifactStore::put(const ArtifactIdentity& identity, int fd,
                                                    std::uint64_t bytes, std::string_view config) {
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
  ArtifactPutResult result{key(identity, config), ArtifactPut::stored};
  const fs::path record_path = dir_ / (result.key + ".json");
  const fs::path candidate_path = dir_ / (result.key + std::string(kCandidateSuffix));
  fs::path target = record_path;
  const nlohmann::json stored = read_json(record_path);
  const nlohmann::json* now = sequence_of(doc);
  if (!stored.is_discarded()) {
    const nlohmann::json* before = stored.is_object() ? sequence_of(stored) : nullptr;
    result.outcome = ArtifactPut::replaced;
    if (now != nullptr && before != nullptr && !is_prefix(*before, *now)) {
      if (is_prefix(*now, *before)) {
        result.outcome = ArtifactPut::kept;
        return result;
      }
      const nlohmann::json candidate = read_json(candidate_path);
      const nlohmann::json* aside = candidate.is_object() ? sequence_of(candidate) : nullptr;
      if (aside != nullptr && *aside == *now) {
        result.outcome = ArtifactPut::promoted;
      } else {
        result.outcome = ArtifactPut::candidate;
        target = candidate_path;
      }
    }
  }
  if (auto ok = write_atomically(dir_, target, *text); !ok) return std::unexpected(ok.error());
  if (target == record_path) fs::remove(candidate_path, ec);  // settled: nothing aside
  return result;
}

ServiceResult<StoredArtifact> ArtifactStore::get(const ArtifactIdentity& identity,
                                                 std::string_view config) const {
  std::string k = key(identity, config);
  fs::path path = dir_ / (k + ".json");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd && errno == ENOENT && !config.empty()) {
    // A configuration's first run follows the record of another configuration of the same
    // engine, if any: its weights are usually laid out alike (zero-copy still works), and
    // where it diverges it records its own without touching that one.
    if (auto other = newest_path(
            identity.kind, [&](const nlohmann::json& id) { return id == identity.to_json(); })) {
      path = *other;
      k = path.stem().string();
      fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    } else {
      errno = ENOENT;
    }
  }
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
  // The record an engine just ran by is the one prewarm should build a slot in next
  // (newest_for_model goes by modification time). Best effort: a read-only state dir
  // only loses that preference.
  (void)::futimens(fd.get(), nullptr);
  return StoredArtifact{k, std::move(fd), static_cast<std::uint64_t>(st.st_size)};
}

std::optional<fs::path> ArtifactStore::newest_path(
    const std::string& kind, const std::function<bool(const nlohmann::json&)>& wanted) const {
  std::error_code ec;
  std::optional<fs::path> best;
  fs::file_time_type best_time{};
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    // Records only: candidates (".candidate") and temporary files (".json.tmp") end otherwise.
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kind + "-") || !name.ends_with(".json")) continue;
    std::error_code stat_ec;
    const auto time = e.last_write_time(stat_ec);
    if (stat_ec || (best && time <= best_time)) continue;
    const nlohmann::json doc = read_json(e.path());
    if (!doc.is_object()) continue;
    auto id = doc.find("identity");
    if (id == doc.end() || !id->is_object() || !wanted(*id)) continue;
    best = e.path();
    best_time = time;
  }
  return best;
}

std::optional<std::string> ArtifactStore::newest_for_model(const std::string& kind,
                                                           const std::string& model) const {
  auto path = newest_path(
      kind, [&](const nlohmann::json& id) { return id.value("model", std::string()) == model; });
  if (!path) return std::nullopt;
  UniqueFd fd(::open(path->c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return std::nullopt;
  auto text = proto::read_document(fd.get(), static_cast<std::uint64_t>(st.st_size));
  if (!text) return std::nullopt;
  return std::move(*text);
}

}  // namespace thaw::daemon
