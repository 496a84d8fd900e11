#include "common/proto/shim_messages.hpp"

#include <fmt/format.h>

#include <array>
#include <concepts>
#include <cstring>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

namespace thaw::proto {

namespace {

using nlohmann::json;

template <typename M, typename T>
concept Like = std::same_as<std::remove_const_t<M>, T>;

std::uint16_t get_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

bool is_control(unsigned char c) {
  return c < 0x20 || c == 0x7f;
}

// The rules a string field follows.
enum class Str {
  name,         // 1..kMaxNameBytes, no control characters
  maybe_name,   // the same, or empty
  text,         // 1..kMaxTextBytes, no control characters
  maybe_text,   // the same, or empty
  path,         // text, relative, no "." or ".." component, no empty component
  error_name,   // 1..kMaxNameBytes of letters, digits, '.' and '_'
  gpu_uuid,     // 32 hex digits
  label,        // 1..kMaxNameBytes, any characters
  maybe_label,  // the same, or empty
};

// "" when `s` follows `rule`; else what is wrong with it (after the field's name).
std::string check_string(std::string_view s, Str rule) {
  const bool may_be_empty =
      rule == Str::maybe_name || rule == Str::maybe_text || rule == Str::maybe_label;
  if (s.empty()) return may_be_empty ? std::string() : "is empty";
  const std::size_t limit =
      (rule == Str::name || rule == Str::maybe_name || rule == Str::error_name ||
       rule == Str::label || rule == Str::maybe_label)
          ? kMaxNameBytes
          : kMaxTextBytes;
  if (s.size() > limit) return fmt::format("is {} bytes long (at most {})", s.size(), limit);
  if (rule == Str::label || rule == Str::maybe_label) return {};
  for (unsigned char c : s) {
    // Bytes >= 0x80 are allowed: the JSON parsed, so they are UTF-8.
    if (is_control(c)) return fmt::format("{} contains byte 0x{:02x}", proto::quoted(s), c);
  }
  switch (rule) {
    case Str::error_name:
      for (char c : s) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '.' || c == '_';
        if (!ok) return fmt::format("{} is not a D-Bus error name", proto::quoted(s));
      }
      break;
    case Str::gpu_uuid:
      if (s.size() != 32) return fmt::format("{} is not 32 hex digits", proto::quoted(s));
      for (char c : s) {
        const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!ok) return fmt::format("{} is not 32 hex digits", proto::quoted(s));
      }
      break;
    case Str::path: {
      // A file of a model's directory: thawd opens it under that directory.
      if (s.front() == '/') return fmt::format("{} is not a relative path", proto::quoted(s));
      std::size_t at = 0;
      while (at <= s.size()) {
        std::size_t end = s.find('/', at);
        if (end == std::string_view::npos) end = s.size();
        const std::string_view part = s.substr(at, end - at);
        if (part.empty() || part == "." || part == "..") {
          return fmt::format("{} has an empty, \".\" or \"..\" component", proto::quoted(s));
        }
        at = end + 1;
      }
      break;
    }
    default:
      break;
  }
  return {};
}

// Reads a body's fields out of a JSON object, each checked; the first failure is kept and
// the rest of the reads do nothing. finish() refuses fields nobody read.
class Reader {
 public:
  explicit Reader(const json& object, std::string where = {})
      : object_(object), where_(std::move(where)) {}

  void string(const char* key, std::string& out, Str rule) {
    const json* v = field(key);
    if (v == nullptr) return;
    if (!v->is_string()) return fail(key, "is not a string");
    const auto& s = v->get_ref<const std::string&>();
    if (auto e = check_string(s, rule); !e.empty()) return fail(key, e);
    out = s;
  }
  void u64(const char* key, std::uint64_t& out, std::uint64_t lo, std::uint64_t hi) {
    const json* v = field(key);
    if (v == nullptr) return;
    if (!v->is_number_unsigned()) return fail(key, "is not a non-negative integer");
    const auto n = v->get<std::uint64_t>();
    if (n < lo || n > hi) {
      fail(key, fmt::format("is {} (must be {} to {})", n, lo, hi));
      value_error_ = true;
      return;
    }
    out = n;
  }
  template <typename Int>
  void uint(const char* key, Int& out, std::uint64_t lo, std::uint64_t hi) {
    std::uint64_t n = 0;
    u64(key, n, lo, hi);
    if (ok()) out = static_cast<Int>(n);
  }
  void boolean(const char* key, bool& out) {
    const json* v = field(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) return fail(key, "is not true or false");
    out = v->get<bool>();
  }
  void layout_kind(const char* key, LayoutKind& out) {
    std::string s;
    string(key, s, Str::name);
    if (!ok()) return;
    if (auto kind = layout::parse_layout_kind(s)) {
      out = *kind;
    } else {
      fail(key, fmt::format("is {}, not \"{}\" or \"{}\"", proto::quoted(s),
                            layout::to_string(LayoutKind::packed),
                            layout::to_string(LayoutKind::engine)));
    }
  }
  void artifact_kind(const char* key, ArtifactKind& out) {
    std::string s;
    string(key, s, Str::name);
    if (!ok()) return;
    for (ArtifactKind kind : {ArtifactKind::layout, ArtifactKind::kvcache, ArtifactKind::graphs}) {
      if (s == to_string(kind)) {
        out = kind;
        return;
      }
    }
    fail(key, fmt::format("is {}, not \"{}\", \"{}\" or \"{}\"", proto::quoted(s),
                          to_string(ArtifactKind::layout), to_string(ArtifactKind::kvcache),
                          to_string(ArtifactKind::graphs)));
  }
  // A list of 1 to `most` integers, each at most `hi`.
  void u64_list(const char* key, std::vector<std::uint64_t>& out, std::size_t most,
                std::uint64_t hi) {
    const json* v = field(key);
    if (v == nullptr) return;
    if (!v->is_array()) return fail(key, "is not a list");
    if (v->empty() || v->size() > most) {
      return fail(key, fmt::format("has {} entries (1 to {})", v->size(), most));
    }
    out.clear();
    for (const json& e : *v) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() > hi) {
        return fail(key, fmt::format("has an entry that is not an integer from 0 to {}", hi));
      }
      out.push_back(e.get<std::uint64_t>());
    }
  }
  // A nested object, read by `read(Reader&)` with the same rules (its own fields exact).
  template <typename Read>
  void object(const char* key, Read&& read) {
    const json* v = field(key);
    if (v == nullptr) return;
    if (!v->is_object()) return fail(key, "is not an object");
    Reader sub(*v, where_ + key + ".");
    read(sub);
    sub.finish();
    if (!sub.ok()) {
      error_ = std::move(sub.error_);
      value_error_ = sub.value_error_;
    }
  }

  void finish() {
    if (!ok() || read_ == object_.size()) return;
    for (const auto& [name, value] : object_.items()) {
      if (!seen(name)) {
        error_ = fmt::format("unknown field {}{}", where_, proto::quoted(name));
        return;
      }
    }
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  // Whether the error is a value out of its range in a body that is otherwise well formed.
  bool value_error() const { return value_error_; }

 private:
  const json* field(const char* key) {
    if (!ok()) return nullptr;
    auto it = object_.find(key);
    if (it == object_.end()) {
      error_ = fmt::format("missing field {}{}", where_, key);
      return nullptr;
    }
    ++read_;
    keys_.push_back(key);
    return &*it;
  }
  bool seen(const std::string& name) const {
    for (const char* k : keys_)
      if (name == k) return true;
    return false;
  }
  void fail(const char* key, std::string_view what) {
    error_ = fmt::format("field {}{} {}", where_, key, what);
  }

  const json& object_;
  std::string where_;  // "identity." for a nested object's fields
  std::string error_;
  std::size_t read_ = 0;
  std::vector<const char*> keys_;
  bool value_error_ = false;
};

// The other direction: fields into a JSON object. Same calls as Reader, so each body's
// fields are listed once (describe below) and encoding checks them by reading them back.
class Writer {
 public:
  void string(const char* key, const std::string& v, Str) { out[key] = v; }
  void u64(const char* key, std::uint64_t v, std::uint64_t, std::uint64_t) { out[key] = v; }
  template <typename Int>
  void uint(const char* key, Int v, std::uint64_t, std::uint64_t) {
    out[key] = static_cast<std::uint64_t>(v);
  }
  void boolean(const char* key, bool v) { out[key] = v; }
  void layout_kind(const char* key, LayoutKind v) { out[key] = layout::to_string(v); }
  void artifact_kind(const char* key, ArtifactKind v) { out[key] = to_string(v); }
  void u64_list(const char* key, const std::vector<std::uint64_t>& v, std::size_t, std::uint64_t) {
    out[key] = v;
  }
  template <typename Write>
  void object(const char* key, Write&& write) {
    Writer sub;
    write(sub);
    out[key] = std::move(sub.out);
  }

  json out = json::object();
};

// ---- Each body's fields, once for both directions ----

template <typename F, Like<ArtifactIdentity> M>
void describe(F& f, M& m) {
  f.string("engine", m.engine, Str::text);
  f.string("model", m.model, Str::name);
  f.string("gpu", m.gpu, Str::name);
  f.string("driver", m.driver, Str::name);
}
template <typename F, Like<EngineCounters> M>
void describe(F& f, M& m) {
  f.u64("calls_intercepted", m.calls_intercepted, 0, kMaxCounter);
  f.u64("deterministic_allocations", m.deterministic_allocations, 0, kMaxCounter);
  f.u64("layout_divergences", m.layout_divergences, 0, kMaxCounter);
  f.u64("files_streamed", m.files_streamed, 0, kMaxCounter);
  f.u64("reads_waited", m.reads_waited, 0, kMaxCounter);
  f.u64("bytes_streamed", m.bytes_streamed, 0, kMaxCounter);
  f.u64("graph_records_stored", m.graph_records_stored, 0, kMaxCounter);
  f.u64("graphs_restored", m.graphs_restored, 0, kMaxCounter);
  f.u64("graph_restore_fallbacks", m.graph_restore_fallbacks, 0, kMaxCounter);
  f.u64("kv_restores", m.kv_restores, 0, kMaxCounter);
  f.u64("kv_restore_fallbacks", m.kv_restore_fallbacks, 0, kMaxCounter);
}

template <typename F, Like<Hello> M>
void describe(F& f, M& m) {
  // Any characters (a program may be named anything): thawd logs them quoted.
  f.string("client", m.client, Str::label);
  f.string("engine", m.engine, Str::maybe_label);
}
template <typename F, Like<HelloOk> M>
void describe(F& f, M& m) {
  f.uint("protocol", m.protocol, 1, 0xffff);
  f.string("node_id", m.node_id, Str::maybe_name);
  f.string("version", m.version, Str::name);
}
template <typename F, Like<OpenFile> M>
void describe(F& f, M& m) {
  f.string("model", m.model, Str::name);
  f.string("path", m.path, Str::path);
}
template <typename F, Like<File> M>
void describe(F& f, M& m) {
  f.u64("size", m.size, 0, kMaxBytes);
  f.boolean("complete", m.complete);
}
template <typename F, Like<AttachSlot> M>
void describe(F& f, M& m) {
  f.string("model", m.model, Str::name);
}
template <typename F, Like<Slot> M>
void describe(F& f, M& m) {
  f.string("slot", m.slot, Str::name);
  f.u64("token", m.token, 0, UINT64_MAX);
  f.u64("budget_bytes", m.budget_bytes, 0, kMaxBytes);
  f.u64("resident_bytes", m.resident_bytes, 0, kMaxBytes);
  f.u64("page_bytes", m.page_bytes, 4096, 1ull << 30);
  f.layout_kind("layout_kind", m.layout_kind);
  f.string("record_fingerprint", m.record_fingerprint, Str::maybe_text);
  f.u64("layout_bytes", m.layout_bytes, 2, kMaxDocumentBytes);  // "[]" at least
  f.uint("page_messages", m.page_messages, 0, kMaxPageMessages);
}
template <typename F, Like<SlotPages> M>
void describe(F& f, M& m) {
  f.u64_list("pages", m.offsets, kMaxFdsPerMessage, kMaxBytes);
}
template <typename F, Like<Imported> M>
void describe(F& f, M& m) {
  f.string("slot", m.slot, Str::name);
  f.u64("token", m.token, 0, UINT64_MAX);
}
template <typename F, Like<Ok> M>
void describe(F&, M&) {}
template <typename F, Like<Release> M>
void describe(F& f, M& m) {
  f.string("slot", m.slot, Str::name);
  f.boolean("handback", m.handback);
}
template <typename F, Like<ReportArtifact> M>
void describe(F& f, M& m) {
  f.artifact_kind("kind", m.kind);
  f.object("identity", [&](auto& sub) { describe(sub, m.identity); });
  f.u64("bytes", m.bytes, 1, kMaxDocumentBytes);
}
template <typename F, Like<Error> M>
void describe(F& f, M& m) {
  f.string("name", m.name, Str::error_name);
  f.string("message", m.message, Str::maybe_text);
}
template <typename F, Like<GetArtifact> M>
void describe(F& f, M& m) {
  f.artifact_kind("kind", m.kind);
  f.object("identity", [&](auto& sub) { describe(sub, m.identity); });
}
template <typename F, Like<Artifact> M>
void describe(F& f, M& m) {
  f.u64("bytes", m.bytes, 1, kMaxDocumentBytes);
}
template <typename F, Like<ReportCounters> M>
void describe(F& f, M& m) {
  f.object("counters", [&](auto& sub) { describe(sub, m.counters); });
}
template <typename F, Like<ExportIpc> M>
void describe(F& f, M& m) {
  f.u64("bytes", m.bytes, 1, kMaxBytes);
}
template <typename F, Like<IpcExported> M>
void describe(F& f, M& m) {
  f.u64("token", m.token, 0, UINT64_MAX);
}
template <typename F, Like<ImportIpc> M>
void describe(F& f, M& m) {
  f.u64("token", m.token, 0, UINT64_MAX);
}
template <typename F, Like<Ipc> M>
void describe(F& f, M& m) {
  f.u64("bytes", m.bytes, 1, kMaxBytes);
}
template <typename F, Like<FreePages> M>
void describe(F& f, M& m) {
  f.string("slot", m.slot, Str::name);
  f.u64_list("offsets", m.offsets, kMaxFreePagesPerMessage, kMaxBytes);
}
template <typename F, Like<LeaseMemory> M>
void describe(F& f, M& m) {
  f.string("gpu_uuid", m.gpu_uuid, Str::gpu_uuid);
}
template <typename F, Like<MemoryLease> M>
void describe(F& f, M& m) {
  f.u64("budget_bytes", m.budget_bytes, 0, kMaxBytes);
}

// The descriptors a message carries, in wire order.
template <typename M, typename Fn>
void each_fd(M& m, Fn&& fn) {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, File>) {
    fn(m.data);
    fn(m.readiness);
  } else if constexpr (std::is_same_v<T, Slot>) {
    fn(m.layout);
  } else if constexpr (std::is_same_v<T, SlotPages>) {
    for (auto& p : m.pages) fn(p);
  } else if constexpr (std::is_same_v<T, ReportArtifact> || std::is_same_v<T, Artifact>) {
    fn(m.document);
  } else if constexpr (std::is_same_v<T, ExportIpc> || std::is_same_v<T, Ipc>) {
    fn(m.handle);
  }
}

std::string plural(std::size_t n, std::string_view one) {
  return fmt::format("{} {}{}", n, one, n == 1 ? "" : "s");
}

// The body of a packet of type T: fields, then descriptors.
template <typename T>
std::string decode_body(const json& body, std::vector<UniqueFd>& fds, ShimMessage& out,
                        bool& value_error) {
  T m;
  Reader r(body);
  describe(r, m);
  r.finish();
  if (!r.ok()) {
    value_error = r.value_error();
    return r.error();
  }
  if constexpr (std::is_same_v<T, SlotPages>) m.pages.resize(m.offsets.size());
  std::size_t want = 0;
  each_fd(m, [&](UniqueFd&) { ++want; });
  if (fds.size() != want) {
    return fmt::format("must carry {}; it came with {}", plural(want, "descriptor"), fds.size());
  }
  std::size_t i = 0;
  each_fd(m, [&](UniqueFd& fd) { fd = std::move(fds[i++]); });
  out = std::move(m);
  return {};
}

using Decoder = std::string (*)(const json&, std::vector<UniqueFd>&, ShimMessage&, bool&);

// Indexed by MessageType - 1; each type at its variant alternative.
template <std::size_t... I>
constexpr std::array<Decoder, sizeof...(I)> decoders(std::index_sequence<I...>) {
  return {&decode_body<std::variant_alternative_t<I, ShimMessage>>...};
}
template <std::size_t... I>
constexpr bool types_in_order(std::index_sequence<I...>) {
  return ((static_cast<std::size_t>(std::variant_alternative_t<I, ShimMessage>::kType) == I + 1) &&
          ...);
}
static_assert(types_in_order(std::make_index_sequence<std::variant_size_v<ShimMessage>>()),
              "ShimMessage's alternatives must be in MessageType order, from 1");

}  // namespace

std::string_view to_string(MessageType type) {
  switch (type) {
    case MessageType::hello:
      return "hello";
    case MessageType::hello_ok:
      return "hello_ok";
    case MessageType::open_file:
      return "open_file";
    case MessageType::file:
      return "file";
    case MessageType::attach_slot:
      return "attach_slot";
    case MessageType::slot:
      return "slot";
    case MessageType::slot_pages:
      return "slot_pages";
    case MessageType::imported:
      return "imported";
    case MessageType::ok:
      return "ok";
    case MessageType::release:
      return "release";
    case MessageType::report_artifact:
      return "report_artifact";
    case MessageType::error:
      return "error";
    case MessageType::get_artifact:
      return "get_artifact";
    case MessageType::artifact:
      return "artifact";
    case MessageType::report_counters:
      return "report_counters";
    case MessageType::export_ipc:
      return "export_ipc";
    case MessageType::import_ipc:
      return "import_ipc";
    case MessageType::ipc:
      return "ipc";
    case MessageType::free_pages:
      return "free_pages";
    case MessageType::lease_memory:
      return "lease_memory";
    case MessageType::memory_lease:
      return "memory_lease";
    case MessageType::ipc_exported:
      return "ipc_exported";
  }
  return "unknown";
}

bool is_known(std::uint16_t type) {
  return type >= static_cast<std::uint16_t>(MessageType::hello) &&
         type <= static_cast<std::uint16_t>(MessageType::ipc_exported);
}

std::string_view to_string(ArtifactKind kind) {
  switch (kind) {
    case ArtifactKind::kvcache:
      return "kvcache";
    case ArtifactKind::graphs:
      return "graphs";
    case ArtifactKind::layout:
      break;
  }
  return "layout";
}

std::string printable(std::string_view s, std::size_t shown) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > shown) out += "...";
  return out;
}

std::string quoted(std::string_view s) {
  constexpr std::size_t kShown = 64;
  std::string out = "\"" + printable(s.substr(0, kShown), kShown) + "\"";
  if (s.size() > kShown) out += "...";
  return out;
}

Error Error::make(std::string name, std::string_view message) {
  Error e;
  e.name = std::move(name);
  e.message.assign(message.substr(0, kMaxTextBytes));
  // (Bytes that are not UTF-8, e.g. a cut sequence or a path's, are replaced at encoding.)
  for (char& c : e.message)
    if (is_control(static_cast<unsigned char>(c))) c = ' ';
  return e;
}

std::string read_frame_header(std::span<const std::byte> packet, FrameHeader& out,
                              FrameErrc& code) {
  out = FrameHeader{};
  code = FrameErrc::none;
  if (packet.size() > kMaxMessageBytes) {
    code = FrameErrc::too_large;
    return fmt::format("message of {} bytes exceeds {} bytes", packet.size(), kMaxMessageBytes);
  }
  if (packet.size() < kHeaderBytes) {
    code = FrameErrc::short_header;
    return fmt::format("message of {} bytes has no full header", packet.size());
  }
  if (get_u32(packet.data()) != kMagic) {
    code = FrameErrc::bad_magic;
    return "message does not start with THAW";
  }
  out.version = get_u16(packet.data() + 4);
  out.type = get_u16(packet.data() + 6);
  out.request_id = get_u32(packet.data() + 8);
  out.length = get_u32(packet.data() + 12);
  if (out.length != packet.size() - kHeaderBytes) {
    code = FrameErrc::bad_length;
    return fmt::format("header says {} payload bytes, packet has {}", out.length,
                       packet.size() - kHeaderBytes);
  }
  return {};
}

void write_frame_header(const FrameHeader& header, std::byte* out) {
  std::memcpy(out, &kMagic, 4);
  std::memcpy(out + 4, &header.version, 2);
  std::memcpy(out + 6, &header.type, 2);
  std::memcpy(out + 8, &header.request_id, 4);
  std::memcpy(out + 12, &header.length, 4);
}

MessageType type_of(const ShimMessage& message) {
  return std::visit([](const auto& m) { return std::remove_cvref_t<decltype(m)>::kType; }, message);
}

std::string decode_message(std::span<const std::byte> packet, std::vector<UniqueFd> fds,
                           Envelope& out, bool* value_error) {
  bool out_of_range = false;
  if (value_error != nullptr) *value_error = false;
  static constexpr auto kDecoders =
      decoders(std::make_index_sequence<std::variant_size_v<ShimMessage>>());
  FrameHeader header;
  FrameErrc code;
  if (auto e = read_frame_header(packet, header, code); !e.empty()) return e;
  if (header.version != kProtocolVersion) {
    return fmt::format("message of protocol version {}; this build speaks {}", header.version,
                       kProtocolVersion);
  }
  if (!is_known(header.type)) return fmt::format("unknown message type {}", header.type);
  const auto type = static_cast<MessageType>(header.type);
  const auto* text = reinterpret_cast<const char*>(packet.data() + kHeaderBytes);
  const json body = json::parse(text, text + header.length, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return fmt::format("{} message: payload is not a JSON object", to_string(type));
  }
  out.request_id = header.request_id;
  if (auto e = kDecoders[header.type - 1](body, fds, out.message, out_of_range); !e.empty()) {
    if (value_error != nullptr) *value_error = out_of_range;
    return fmt::format("{} message: {}", to_string(type), e);
  }
  return {};
}

std::string encode_message(std::uint32_t request_id, const ShimMessage& message,
                           std::vector<std::byte>& bytes, std::vector<int>& fds) {
  bytes.clear();
  fds.clear();
  std::string error;
  json body;
  std::visit(
      [&](const auto& m) {
        using T = std::remove_cvref_t<decltype(m)>;
        Writer w;
        describe(w, m);
        // What we send must pass what we would accept: read it back.
        T check;
        Reader r(w.out);
        describe(r, check);
        r.finish();  // (a value out of range is as much an error here)
        if (!r.ok()) {
          error = r.error();
          return;
        }
        if constexpr (std::is_same_v<T, SlotPages>) {
          if (m.pages.size() != m.offsets.size()) {
            error = fmt::format("{} for {}", plural(m.pages.size(), "descriptor"),
                                plural(m.offsets.size(), "page"));
            return;
          }
        }
        each_fd(m, [&](const UniqueFd& fd) {
          if (!fd && error.empty()) error = "a descriptor it carries is missing";
          fds.push_back(fd.get());
        });
        body = std::move(w.out);
      },
      message);
  const MessageType type = type_of(message);
  if (!error.empty()) return fmt::format("{} message: {}", to_string(type), error);
  // Strings thawd took from file names need not be UTF-8: such bytes become U+FFFD rather
  // than an exception.
  const std::string payload = body.dump(-1, ' ', false, json::error_handler_t::replace);
  if (kHeaderBytes + payload.size() > kMaxMessageBytes) {
    fds.clear();
    return fmt::format("{} message of {} bytes exceeds the protocol's {} bytes", to_string(type),
                       kHeaderBytes + payload.size(), kMaxMessageBytes);
  }
  bytes.resize(kHeaderBytes + payload.size());
  write_frame_header(FrameHeader{kProtocolVersion, static_cast<std::uint16_t>(type), request_id,
                                 static_cast<std::uint32_t>(payload.size())},
                     bytes.data());
  std::memcpy(bytes.data() + kHeaderBytes, payload.data(), payload.size());
  return {};
}

std::string encode_slot_layout(const std::vector<LayoutRow>& rows, std::string& text) {
  text.clear();
  if (rows.size() > kMaxLayoutRows) {
    return fmt::format("a layout of {} rows (at most {})", rows.size(), kMaxLayoutRows);
  }
  json out = json::array();
  for (const LayoutRow& r : rows) {
    if (auto e = check_string(r.file, Str::path); !e.empty()) {
      return fmt::format("layout row file {}", e);
    }
    if (r.slot_offset > kMaxBytes || r.file_offset > kMaxBytes || r.bytes > kMaxBytes) {
      return fmt::format("layout row of {} has an offset or size over {}", proto::quoted(r.file),
                         kMaxBytes);
    }
    out.push_back({r.slot_offset, r.file, r.file_offset, r.bytes});
  }
  text = out.dump(-1, ' ', false, json::error_handler_t::replace);
  return {};
}

std::string decode_slot_layout(std::string_view text, std::vector<LayoutRow>& out) {
  out.clear();
  if (text.size() > kMaxDocumentBytes) {
    return fmt::format("layout of {} bytes (at most {})", text.size(), kMaxDocumentBytes);
  }
  const json rows = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (rows.is_discarded() || !rows.is_array()) return "layout is not a JSON array";
  if (rows.size() > kMaxLayoutRows) {
    return fmt::format("layout of {} rows (at most {})", rows.size(), kMaxLayoutRows);
  }
  std::vector<LayoutRow> parsed;
  parsed.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const json& r = rows[i];
    auto number = [&](std::size_t k) {
      return r[k].is_number_unsigned() && r[k].get<std::uint64_t>() <= kMaxBytes;
    };
    if (!r.is_array() || r.size() != 4 || !number(0) || !r[1].is_string() || !number(2) ||
        !number(3)) {
      return fmt::format("layout row {} is not [slot_offset, file, file_offset, bytes]", i);
    }
    LayoutRow row{r[0].get<std::uint64_t>(), r[1].get<std::string>(), r[2].get<std::uint64_t>(),
                  r[3].get<std::uint64_t>()};
    if (auto e = check_string(row.file, Str::path); !e.empty()) {
      return fmt::format("layout row {}: file {}", i, e);
    }
    parsed.push_back(std::move(row));
  }
  out = std::move(parsed);
  return {};
}

}  // namespace thaw::proto
