#include "daemon/artifacts/artifact_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/proto/document_fd.hpp"
#include "common/proto/shim_messages.hpp"
#include "daemon/log/log.hpp"
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

struct OpenedRecord {
  UniqueFd fd;
  std::uint64_t bytes = 0;
};
struct OpenError {
  int err = 0;  // errno of the open, or 0 when the file is not one thawd reads
  std::string why;
};

// Opens `path` for reading only if it is a regular file within the size cap: never a FIFO
// (whose open blocks until a writer comes, on whatever thread asked), a symbolic link (which
// may point anywhere) or a device. Anyone who could write the directory could plant those.
std::expected<OpenedRecord, OpenError> open_record(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY));
  if (!fd) {
    const int err = errno;
    if (err == ELOOP) return std::unexpected(OpenError{0, "it is a symbolic link"});
    return std::unexpected(OpenError{err, std::strerror(err)});
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return std::unexpected(OpenError{errno, errno_text()});
  if (!S_ISREG(st.st_mode)) return std::unexpected(OpenError{0, "it is not a regular file"});
  if (static_cast<std::uint64_t>(st.st_size) > ArtifactStore::kMaxArtifactBytes) {
    return std::unexpected(OpenError{
        0, fmt::format("it is larger than {} MiB", ArtifactStore::kMaxArtifactBytes >> 20)});
  }
  // A regular file never blocks; the flag goes so that the descriptor a shim is given reads
  // like any file.
  (void)::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return OpenedRecord{std::move(fd), static_cast<std::uint64_t>(st.st_size)};
}

// {engine, model, gpu, driver}, every one a string: what a record's own identity must be
// before any field of it is compared or read.
bool identity_shape_ok(const nlohmann::json& id) {
  if (!id.is_object() || id.size() != 4) return false;
  for (const char* name : {"engine", "model", "gpu", "driver"}) {
    auto it = id.find(name);
    if (it == id.end() || !it->is_string()) return false;
  }
  return true;
}

// Writes `text` to `final_path` atomically (temporary file, fsync, rename, fsync of the dir).
ServiceResult<void> write_atomically(const fs::path& dir, const fs::path& final_path,
                                     std::string_view text) {
  std::error_code ec;
  const fs::path temp_path = final_path.string() + ".tmp";
  // 0600: records are their owner's business (thawd hands them out as descriptors). A FIFO or
  // symlink in the way fails the open instead of blocking or redirecting it.
  UniqueFd out(::open(temp_path.c_str(),
                      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600));
  if (!out || ::fchmod(out.get(), 0600) != 0 || !write_all(out.get(), text) ||
      ::fsync(out.get()) != 0) {
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
constexpr std::string_view kRecordSuffix = ".json";

struct RecordName {
  std::string kind;
  std::optional<uid_t> owner;
};

bool all_of(std::string_view s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}
bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// "<kind>-<uid>-<32 hex>.json" (key()), or "<kind>-<32 hex>.json" (a record of before records
// had owners); anything else in the directory is not a record (".json.tmp", ".candidate").
std::optional<RecordName> parse_record_name(std::string_view name) {
  constexpr std::size_t kDigest = 32;
  if (!name.ends_with(kRecordSuffix)) return std::nullopt;
  name.remove_suffix(kRecordSuffix.size());
  if (name.size() < kDigest + 2 || name[name.size() - kDigest - 1] != '-' ||
      !all_of(name.substr(name.size() - kDigest), is_hex)) {
    return std::nullopt;
  }
  name.remove_suffix(kDigest + 1);
  RecordName out;
  if (const auto dash = name.rfind('-'); dash != std::string_view::npos) {
    const std::string_view uid = name.substr(dash + 1);
    if (all_of(uid, is_digit) && uid.size() <= 10) {
      const unsigned long long value = std::stoull(std::string(uid));
      if (value <= std::numeric_limits<uid_t>::max()) {
        out.owner = static_cast<uid_t>(value);
        name = name.substr(0, dash);
      }
    }
  }
  if (!valid_kind(name)) return std::nullopt;
  out.kind = std::string(name);
  return out;
}

std::int64_t nsec_of(const timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

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

std::string ArtifactStore::key(uid_t owner, const ArtifactIdentity& identity,
                               std::string_view config) {
  // No config: the key records had before configurations were told apart.
  std::string canonical = identity.kind + "\n" + identity.to_json().dump();
  if (!config.empty()) canonical += fmt::format("\nconfig {}", config);
  const std::string digest = store::sha256_hex(std::as_bytes(std::span(canonical)));
  return fmt::format("{}-{}-{}", identity.kind, owner, digest.substr(0, 32));
}

void ArtifactStore::invalid(const fs::path& path, std::string_view why) const {
  {
    std::lock_guard lock(logged_mutex_);
    // Bounded: a directory full of junk costs a bounded set, and logs that many lines.
    if (logged_.size() >= 4096 || !logged_.insert(path).second) return;
  }
  log(LogLevel::warning,
      fmt::format("artifact {} is not used: {}; remove it (engines record a new one)",
                  path.string(), why));
}

nlohmann::json ArtifactStore::read_record(const fs::path& path) const {
  const nlohmann::json none(nlohmann::json::value_t::discarded);
  auto opened = open_record(path);
  if (!opened) {
    if (opened.error().err != ENOENT) invalid(path, opened.error().why);
    return none;
  }
  auto text = proto::read_document(opened->fd.get(), opened->bytes);
  if (!text) {
    invalid(path, text.error());
    return none;
  }
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  if (doc.is_discarded()) invalid(path, "it is not JSON");
  return doc;
}

ServiceResult<ArtifactPutResult> ArtifactStore::put(uid_t owner, const ArtifactIdentity& identity,
                                                    int fd, std::uint64_t bytes,
                                                    std::string_view config) try {
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
  (void)::chmod(dir_.c_str(), 0700);  // only thawd reads records; engines get descriptors
  ArtifactPutResult result{key(owner, identity, config), ArtifactPut::stored};
  const fs::path record_path = dir_ / (result.key + ".json");
  const fs::path candidate_path = dir_ / (result.key + std::string(kCandidateSuffix));
  fs::path target = record_path;
  const nlohmann::json stored = read_record(record_path);
  const nlohmann::json* now = sequence_of(doc);
  if (!stored.is_discarded()) {
    const nlohmann::json* before = stored.is_object() ? sequence_of(stored) : nullptr;
    result.outcome = ArtifactPut::replaced;
    if (now != nullptr && before != nullptr && !is_prefix(*before, *now)) {
      if (is_prefix(*now, *before)) {
        result.outcome = ArtifactPut::kept;
        return result;
      }
      const nlohmann::json candidate = read_record(candidate_path);
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
} catch (const std::exception& e) {
  // A document of an odd shape (nlohmann::json's type errors) or a failing allocation: the
  // put fails, thawd does not.
  return service_error(error_name::kState, fmt::format("cannot store the artifact: {}", e.what()));
}

ServiceResult<StoredArtifact> ArtifactStore::get(uid_t owner, const ArtifactIdentity& identity,
                                                 std::string_view config) const try {
  std::string k = key(owner, identity, config);
  fs::path path = dir_ / (k + ".json");
  auto opened = open_record(path);
  if (!opened && opened.error().err == ENOENT && !config.empty()) {
    // A configuration's first run follows the record of another configuration of the same
    // engine (and user), if any: its weights are usually laid out alike (zero-copy still
    // works), and where it diverges it records its own without touching that one.
    if (auto other =
            newest_path(fmt::format("{}-{}-", identity.kind, owner),
                        [&](const nlohmann::json& id) { return id == identity.to_json(); })) {
      path = *other;
      k = path.stem().string();
      opened = open_record(path);
    }
  }
  if (!opened) {
    if (opened.error().err == ENOENT) {
      return service_error(error_name::kUnknownArtifact,
                           fmt::format("no {} artifact recorded for this engine, model, GPU and "
                                       "driver yet ({}): this run records one",
                                       identity.kind, k));
    }
    invalid(path, opened.error().why);
    return service_error(error_name::kState, fmt::format("cannot use {}: {}; remove it",
                                                         path.string(), opened.error().why));
  }
  // The record an engine just ran by is the one prewarm should build a slot in next
  // (newest_for_model goes by modification time). Best effort: a read-only state dir
  // only loses that preference.
  (void)::futimens(opened->fd.get(), nullptr);
  return StoredArtifact{k, std::move(opened->fd), opened->bytes};
} catch (const std::exception& e) {
  return service_error(error_name::kState, fmt::format("cannot read the artifact: {}", e.what()));
}

std::optional<fs::path> ArtifactStore::newest_path(
    const std::string& prefix, const std::function<bool(const nlohmann::json&)>& wanted) const {
  std::optional<fs::path> best;
  timespec best_time{};
  std::error_code ec;
  // increment(ec), not ++: a directory that changes or fails while read ends the walk
  // instead of throwing.
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    // Records only: candidates (".candidate") and temporary files (".json.tmp") end otherwise.
    const std::string name = path.filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".json")) continue;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (!S_ISREG(st.st_mode)) {
      invalid(path, "it is not a regular file");
      continue;
    }
    const timespec time = st.st_mtim;
    if (best &&
        std::pair(time.tv_sec, time.tv_nsec) <= std::pair(best_time.tv_sec, best_time.tv_nsec)) {
      continue;
    }
    const nlohmann::json doc = read_record(path);
    if (doc.is_discarded()) continue;
    auto id = doc.is_object() ? doc.find("identity") : doc.end();
    if (!doc.is_object() || id == doc.end() || !identity_shape_ok(*id)) {
      invalid(path, "its identity is not {engine, model, gpu, driver}, all strings");
      continue;
    }
    if (!wanted(*id)) continue;
    best = path;
    best_time = time;
  }
  return best;
}

std::optional<std::string> ArtifactStore::newest_for_model(const std::string& kind,
                                                           const std::string& model) const try {
  // Every user's records (and ones from before records had owners): see the header.
  auto path = newest_path(kind + "-", [&](const nlohmann::json& id) {
    return id["model"].get_ref<const std::string&>() == model;  // a string: identity_shape_ok
  });
  if (!path) return std::nullopt;
  auto opened = open_record(*path);
  if (!opened) return std::nullopt;
  auto text = proto::read_document(opened->fd.get(), opened->bytes);
  if (!text) return std::nullopt;
  return std::move(*text);
} catch (const std::exception& e) {
  // Runs on prewarm threads: an exception here would end thawd.
  log(LogLevel::warning,
      fmt::format("reading {} records for {}: {}; prewarming without one", kind, model, e.what()));
  return std::nullopt;
}

}  // namespace thaw::daemon

namespace thaw::daemon {

ArtifactStore::ReadForListing ArtifactStore::read_for_listing(const fs::path& path,
                                                              std::string kind) {
  ReadForListing r;
  r.identity.kind = std::move(kind);
  auto opened = open_record(path);
  if (!opened) {
    r.summary = {false, opened.error().why};
    return r;
  }
  auto text = proto::read_document(opened->fd.get(), opened->bytes);
  if (!text) {
    r.summary = {false, proto::printable(text.error(), 512)};
    return r;
  }
  const nlohmann::json doc = nlohmann::json::parse(*text, nullptr, false);
  auto id = doc.is_object() ? doc.find("identity") : doc.end();
  if (doc.is_object() && id != doc.end() && identity_shape_ok(*id)) {
    r.identity.engine = (*id)["engine"].get<std::string>();
    r.identity.model = (*id)["model"].get<std::string>();
    r.identity.gpu = (*id)["gpu"].get<std::string>();
    r.identity.driver = (*id)["driver"].get<std::string>();
  }
  r.summary = summarize_artifact(r.identity.kind, *text);
  if (r.summary.readable && r.identity.model.empty()) {
    r.summary = {false, "its identity is not {engine, model, gpu, driver}, all strings"};
  }
  return r;
}

std::vector<ListedArtifact> ArtifactStore::list(std::string_view model) const try {
  std::vector<ListedArtifact> out;
  std::lock_guard lock(listed_mutex_);
  std::map<fs::path, ReadForListing> seen;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    auto name = parse_record_name(path.filename().string());
    if (!name) continue;
    ListedArtifact a;
    a.key = path.stem().string();
    a.owner = name->owner;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // removed while listed
    // Read again only when the file changed since the last listing (a put renames a new
    // inode in; an engine's get touches the time).
    auto cached = listed_.find(path);
    if (cached == listed_.end() || cached->second.inode != st.st_ino ||
        cached->second.bytes != static_cast<std::uint64_t>(st.st_size) ||
        cached->second.modified_nsec != nsec_of(st.st_mtim) || !S_ISREG(st.st_mode)) {
      ReadForListing fresh = read_for_listing(path, name->kind);
      fresh.inode = st.st_ino;
      fresh.bytes = S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0;
      fresh.modified_nsec = nsec_of(st.st_mtim);
      cached = listed_.insert_or_assign(path, std::move(fresh)).first;
    }
    const ReadForListing& r = cached->second;
    seen.emplace(path, r);
    if (!model.empty() && r.identity.model != model) continue;
    a.identity = r.identity;
    a.bytes = r.bytes;
    a.modified_usec = r.modified_nsec / 1000;
    a.summary = r.summary;
    out.push_back(std::move(a));
  }
  listed_ = std::move(seen);  // files gone since are forgotten
  std::ranges::sort(out, [](const ListedArtifact& a, const ListedArtifact& b) {
    return std::tie(a.identity.model, a.identity.kind, a.identity.engine, a.key) <
           std::tie(b.identity.model, b.identity.kind, b.identity.engine, b.key);
  });
  return out;
} catch (const std::exception& e) {
  // A failing allocation: the listing is empty, thawd goes on.
  log(LogLevel::warning, fmt::format("listing the artifacts in {}: {}", dir_.string(), e.what()));
  return {};
}

}  // namespace thaw::daemon
