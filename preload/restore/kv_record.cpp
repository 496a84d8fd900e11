#include "preload/restore/kv_record.hpp"

#include <fmt/format.h>

#include <array>
#include <limits>

#include <nlohmann/json.hpp>

namespace thaw::preload::restore {

namespace {

using nlohmann::json;

constexpr std::size_t kMaxIdentityBytes = 4096;
constexpr int kMaxDepth = 2;  // the document, and its identity / conditions / kv objects

// Refuses nesting deeper than the document has before any parser sees it: the depth of
// untrusted JSON is otherwise bounded only by its size.
bool nested_too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// A value shown in a message: printable, at most 80 characters.
std::string shown(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > 80) out += "...";
  return "'" + out + "'";
}

// `object` has exactly the fields `names` (none missing, none unknown); else why not.
template <std::size_t N>
std::optional<std::string> exact_fields(const json& object, std::string_view what,
                                        const std::array<std::string_view, N>& names) {
  if (!object.is_object()) return fmt::format("{} is not an object", what);
  for (std::string_view name : names) {
    if (!object.contains(name)) return fmt::format("{} lacks \"{}\"", what, name);
  }
  if (object.size() != N) {
    for (const auto& [name, value] : object.items()) {
      bool known = false;
      for (std::string_view n : names) known = known || n == name;
      if (!known) return fmt::format("{} has an unknown field {}", what, shown(name));
    }
  }
  return std::nullopt;
}

std::expected<std::uint64_t, std::string> unsigned_field(const json& object, std::string_view what,
                                                         std::string_view name) {
  const json& v = object.at(name);
  if (!v.is_number_unsigned()) {
    return std::unexpected(fmt::format("{}.{} is not an unsigned integer", what, name));
  }
  return v.get<std::uint64_t>();
}

std::expected<std::string, std::string> identity_field(const json& id, std::string_view name) {
  const json& v = id.at(name);
  if (!v.is_string()) return std::unexpected(fmt::format("identity.{} is not a string", name));
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > kMaxIdentityBytes) {
    return std::unexpected(
        fmt::format("identity.{} is empty or longer than {} bytes", name, kMaxIdentityBytes));
  }
  return s;
}

std::string bytes_text(std::uint64_t b) {
  return fmt::format("{} bytes ({:.1f} MiB)", b, double(b) / (1 << 20));
}

}  // namespace

std::string KvRecord::to_json_text() const {
  json doc = {
      {"version", kVersion},
      {"identity",
       {{"engine", identity.engine},
        {"model", identity.model},
        {"gpu", identity.gpu},
        {"driver", identity.driver}}},
      {"key", key},
      {"conditions",
       {{"device_total", conditions.device_total},
        {"mem_total", conditions.mem_total},
        {"mem_free", conditions.mem_free},
        {"engine_bytes", conditions.engine_bytes}}},
      {"kv",
       {{"kv_bytes", size.kv_bytes},
        {"num_blocks", size.num_blocks},
        {"block_bytes", size.block_bytes}}},
  };
  return doc.dump();
}

std::optional<std::string> invalid_key(std::string_view key) {
  if (key.empty()) return "the configuration key is empty";
  if (key.size() > KvRecord::kMaxKeyBytes) {
    return fmt::format("the configuration key is {} bytes, more than {}", key.size(),
                       KvRecord::kMaxKeyBytes);
  }
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c >= 0x7f) {
      return fmt::format("the configuration key has byte {:#04x} at {}: only printable ASCII", c,
                         i);
    }
  }
  return std::nullopt;
}

std::optional<std::string> invalid_size(const KvSize& s) {
  if (s.num_blocks == 0) return "num_blocks is 0";
  if (s.block_bytes == 0) return "block_bytes is 0";
  if (s.num_blocks > std::numeric_limits<std::uint64_t>::max() / s.block_bytes ||
      s.num_blocks * s.block_bytes != s.kv_bytes) {
    return fmt::format("kv_bytes {} is not num_blocks {} x block_bytes {}", s.kv_bytes,
                       s.num_blocks, s.block_bytes);
  }
  return std::nullopt;
}

std::uint64_t free_tolerance(std::uint64_t mem_total) {
  return mem_total / 256;
}

std::expected<KvRecord, std::string> parse_kv_record(std::string_view text) {
  if (text.size() > KvRecord::kMaxDocumentBytes) {
    return std::unexpected(fmt::format("it is {} bytes, more than a KV record's {}", text.size(),
                                       KvRecord::kMaxDocumentBytes));
  }
  if (nested_too_deep(text)) {
    return std::unexpected(fmt::format("it nests deeper than {} levels", kMaxDepth));
  }
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::unexpected("it is not JSON");
  if (!doc.is_object()) return std::unexpected("it is not a JSON object");
  // The version first: a document of another version is refused as such, whatever it holds.
  auto version = doc.find("version");
  if (version == doc.end()) return std::unexpected("it has no \"version\"");
  if (!version->is_number_unsigned() || version->get<std::uint64_t>() != KvRecord::kVersion) {
    std::string v = version->dump(-1, ' ', /*ensure_ascii=*/true);  // printable
    if (v.size() > 24) v = v.substr(0, 24) + "...";
    return std::unexpected(
        fmt::format("its version {} is not one this shim reads ({})", v, KvRecord::kVersion));
  }
  if (auto bad = exact_fields(
          doc, "the record",
          std::array<std::string_view, 5>{"version", "identity", "key", "conditions", "kv"})) {
    return std::unexpected(*bad);
  }
  KvRecord r;
  const json& id = doc.at("identity");
  if (auto bad = exact_fields(
          id, "identity", std::array<std::string_view, 4>{"engine", "model", "gpu", "driver"})) {
    return std::unexpected(*bad);
  }
  for (auto [name, out] :
       {std::pair{"engine", &r.identity.engine}, std::pair{"model", &r.identity.model},
        std::pair{"gpu", &r.identity.gpu}, std::pair{"driver", &r.identity.driver}}) {
    auto v = identity_field(id, name);
    if (!v) return std::unexpected(v.error());
    *out = std::move(*v);
  }
  const json& key = doc.at("key");
  if (!key.is_string()) return std::unexpected("key is not a string");
  r.key = key.get<std::string>();
  if (auto bad = invalid_key(r.key)) return std::unexpected(*bad);

  const json& cond = doc.at("conditions");
  if (auto bad = exact_fields(cond, "conditions",
                              std::array<std::string_view, 4>{"device_total", "mem_total",
                                                              "mem_free", "engine_bytes"})) {
    return std::unexpected(*bad);
  }
  for (auto [name, out] : {std::pair{"device_total", &r.conditions.device_total},
                           std::pair{"mem_total", &r.conditions.mem_total},
                           std::pair{"mem_free", &r.conditions.mem_free},
                           std::pair{"engine_bytes", &r.conditions.engine_bytes}}) {
    auto v = unsigned_field(cond, "conditions", name);
    if (!v) return std::unexpected(v.error());
    *out = *v;
  }
  const json& kv = doc.at("kv");
  if (auto bad = exact_fields(
          kv, "kv", std::array<std::string_view, 3>{"kv_bytes", "num_blocks", "block_bytes"})) {
    return std::unexpected(*bad);
  }
  for (auto [name, out] :
       {std::pair{"kv_bytes", &r.size.kv_bytes}, std::pair{"num_blocks", &r.size.num_blocks},
        std::pair{"block_bytes", &r.size.block_bytes}}) {
    auto v = unsigned_field(kv, "kv", name);
    if (!v) return std::unexpected(v.error());
    *out = *v;
  }
  if (auto bad = invalid_size(r.size)) return std::unexpected(*bad);
  // What no real run records: a cache beyond the memory it was sized in, more free than total.
  if (r.conditions.device_total == 0 || r.conditions.mem_total == 0) {
    return std::unexpected("it records a device of no memory");
  }
  if (r.conditions.mem_free > r.conditions.mem_total) {
    return std::unexpected(fmt::format("its free memory {} exceeds its total {}",
                                       r.conditions.mem_free, r.conditions.mem_total));
  }
  if (r.size.kv_bytes > r.conditions.mem_total) {
    return std::unexpected(fmt::format("its KV cache of {} exceeds the memory budget of {}",
                                       bytes_text(r.size.kv_bytes),
                                       bytes_text(r.conditions.mem_total)));
  }
  return r;
}

std::optional<std::string> staleness(const KvRecord& stored, std::string_view key,
                                     const KvConditions& now) {
  const KvConditions& then = stored.conditions;
  if (stored.key != key) {
    return fmt::format("the configuration key differs (recorded {}, now {})", shown(stored.key),
                       shown(key));
  }
  if (then.device_total != now.device_total) {
    return fmt::format("the device's total memory differs (recorded {}, now {})",
                       bytes_text(then.device_total), bytes_text(now.device_total));
  }
  if (then.mem_total != now.mem_total) {
    return fmt::format("the memory budget cuMemGetInfo answers differs (recorded {}, now {})",
                       bytes_text(then.mem_total), bytes_text(now.mem_total));
  }
  if (then.engine_bytes != now.engine_bytes) {
    return fmt::format(
        "the engine held other device memory before sizing its KV cache (weights and buffers: "
        "recorded {}, now {})",
        bytes_text(then.engine_bytes), bytes_text(now.engine_bytes));
  }
  const std::uint64_t drift =
      then.mem_free > now.mem_free ? then.mem_free - now.mem_free : now.mem_free - then.mem_free;
  if (drift > free_tolerance(now.mem_total)) {
    return fmt::format(
        "cuMemGetInfo's free memory differs by more than 1/256 of the total (recorded {}, now "
        "{})",
        bytes_text(then.mem_free), bytes_text(now.mem_free));
  }
  return std::nullopt;
}

}  // namespace thaw::preload::restore
