// The graph record codec's core (graph_record_model.hpp documents the text form and its rules).
// It includes nothing that needs std::expected: tests/fuzz compiles this file with clang 14.
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "common/graphs/graph_record_model.hpp"

namespace thaw::graphs {

std::string_view to_string(NodeType type) {
  switch (type) {
    case NodeType::kernel:
      return "kernel";
    case NodeType::memset:
      return "memset";
    case NodeType::memcpy:
      return "memcpy";
    case NodeType::empty:
      return "empty";
    case NodeType::event_record:
      return "event_record";
    case NodeType::event_wait:
      return "event_wait";
    case NodeType::host:
      return "host";
    case NodeType::other:
      return "other";
  }
  return "invalid";
}

std::string_view to_string(ImageKind kind) {
  switch (kind) {
    case ImageKind::cubin:
      return "cubin";
    case ImageKind::fatbin:
      return "fatbin";
    case ImageKind::ptx:
      return "ptx";
    case ImageKind::unknown:
      return "unknown";
  }
  return "invalid";
}

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr NodeType kNodeTypes[] = {NodeType::kernel, NodeType::memset,       NodeType::memcpy,
                                   NodeType::empty,  NodeType::event_record, NodeType::event_wait,
                                   NodeType::host,   NodeType::other};
constexpr ImageKind kImageKinds[] = {ImageKind::cubin, ImageKind::fatbin, ImageKind::ptx,
                                     ImageKind::unknown};
constexpr std::size_t kDigestChars = 64;     // SHA-256, lowercase hex
constexpr std::uint32_t kMaxMemoryType = 4;  // CU_MEMORYTYPE_UNIFIED; host 1, device 2, array 3
constexpr char kHexDigits[] = "0123456789abcdef";

// ---- writing ----

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out += kHexDigits[b >> 4];
    out += kHexDigits[b & 0xf];
  }
  return out;
}

ordered_json dims_json(const std::array<std::uint32_t, 3>& d) {
  return ordered_json::array({d[0], d[1], d[2]});
}

// The launch attributes of a KernelNode or the record's AttributeDefaults, in one order.
template <class Attributes>
void add_attributes(ordered_json& out, const Attributes& k) {
  out["cooperative"] = k.cooperative;
  out["priority"] = k.priority;
  out["cluster"] = ordered_json::array({k.cluster[0], k.cluster[1], k.cluster[2]});
  out["cluster_scheduling"] = k.cluster_scheduling;
  out["mem_sync_domain"] = k.mem_sync_domain;
  out["mem_sync_domain_map"] =
      ordered_json::array({k.mem_sync_domain_map[0], k.mem_sync_domain_map[1]});
  out["carveout"] = k.carveout;
}

ordered_json kernel_json(const KernelNode& k) {
  ordered_json params = ordered_json::array();
  for (const ParamSlot& p : k.params) params.push_back(ordered_json::array({p.offset, p.size}));
  ordered_json out = ordered_json::object();
  out["module_digest"] = k.kernel.module_digest;
  out["name"] = k.kernel.name;
  out["grid"] = dims_json(k.grid);
  out["block"] = dims_json(k.block);
  out["shared_bytes"] = k.shared_bytes;
  out["params"] = std::move(params);
  out["param_bytes"] = to_hex(k.param_bytes);
  add_attributes(out, k);
  return out;
}

ordered_json memset_json(const MemsetNode& m) {
  ordered_json out = ordered_json::object();
  out["dst"] = m.dst;
  out["pitch"] = m.pitch;
  out["value"] = m.value;
  out["element_size"] = m.element_size;
  out["width"] = m.width;
  out["height"] = m.height;
  return out;
}

ordered_json memcpy_json(const MemcpyNode& m) {
  ordered_json out = ordered_json::object();
  out["src"] = m.src;
  out["dst"] = m.dst;
  out["bytes"] = m.bytes;
  out["src_memory_type"] = m.src_memory_type;
  out["dst_memory_type"] = m.dst_memory_type;
  return out;
}

ordered_json node_json(const RecordedNode& n) {
  ordered_json out = ordered_json::object();
  out["type"] = to_string(n.type);
  if (n.kernel) out["kernel"] = kernel_json(*n.kernel);
  if (n.memset) out["memset"] = memset_json(*n.memset);
  if (n.memcpy) out["memcpy"] = memcpy_json(*n.memcpy);
  return out;
}

ordered_json graph_json(const RecordedGraph& g) {
  ordered_json nodes = ordered_json::array();
  for (const RecordedNode& n : g.nodes) nodes.push_back(node_json(n));
  ordered_json edges = ordered_json::array();
  for (const RecordedEdge& e : g.edges) edges.push_back(ordered_json::array({e.from, e.to}));
  ordered_json out = ordered_json::object();
  out["index"] = g.index;
  out["allocation_index"] = g.allocation_index;
  out["nodes"] = std::move(nodes);
  out["edges"] = std::move(edges);
  out["label"] = g.label;
  return out;
}

// ---- reading ----

// Where a value is in the document: a chain of stack frames, formatted only for a message.
class Where {
 public:
  Where() = default;  // the document itself
  Where(const Where& parent, const char* field) : parent_(&parent), field_(field) {}
  Where(const Where& parent, std::size_t index) : parent_(&parent), index_(index) {}

  std::string str() const {
    if (parent_ == nullptr) return "record";
    std::string out = parent_->parent_ == nullptr ? std::string() : parent_->str();
    if (field_ != nullptr) {
      if (!out.empty()) out += '.';
      out += field_;
    } else {
      out += fmt::format("[{}]", index_);
    }
    return out;
  }

 private:
  const Where* parent_ = nullptr;
  const char* field_ = nullptr;
  std::size_t index_ = 0;
};

std::string fail(const Where& where, std::string_view what) {
  return fmt::format("{}: {}", where.str(), what);
}

// Text from the document, quoted for a message: bounded, non-printable bytes escaped.
std::string for_message(std::string_view s) {
  constexpr std::size_t kMax = 64;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += s.size() > kMax ? "\"..." : "\"";
  return out;
}

// What a value is, for "is X, not Y" messages.
std::string describe(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return j.get<bool>() ? "true" : "false";
    case json::value_t::number_unsigned:
      return fmt::format("{}", j.get<std::uint64_t>());
    case json::value_t::number_integer:
      return fmt::format("{}", j.get<std::int64_t>());
    case json::value_t::number_float:
      return "a number with a fraction or an exponent";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "no value";
  }
}

#define THAW_TRY(expr)                                   \
  do {                                                   \
    if (std::string e_ = (expr); !e_.empty()) return e_; \
  } while (0)

// An object with exactly these fields: none missing, none other.
std::string exact_fields(const json& j, const Where& where,
                         std::initializer_list<std::string_view> names) {
  if (!j.is_object()) return fail(where, fmt::format("is {}, not an object", describe(j)));
  for (const auto& [key, value] : j.items()) {
    if (std::find(names.begin(), names.end(), key) == names.end())
      return fail(where, fmt::format("unknown field {}", for_message(key)));
  }
  for (std::string_view name : names) {
    if (!j.contains(name)) return fail(where, fmt::format("no field \"{}\"", name));
  }
  return {};
}

std::string read_uint(const json& j, const Where& where, std::uint64_t min, std::uint64_t max,
                      std::uint64_t& out) {
  if (!j.is_number_unsigned())
    return fail(where, fmt::format("is {}, not an unsigned integer", describe(j)));
  const auto v = j.get<std::uint64_t>();
  if (v < min) return fail(where, fmt::format("is {}, below {}", v, min));
  if (v > max) return fail(where, fmt::format("is {}, above {}", v, max));
  out = v;
  return {};
}

std::string read_u64(const json& j, const Where& where, std::uint64_t& out) {
  return read_uint(j, where, 0, ~std::uint64_t{0}, out);
}

std::string read_u32(const json& j, const Where& where, std::uint32_t& out, std::uint32_t min = 0) {
  std::uint64_t v = 0;
  THAW_TRY(read_uint(j, where, min, 0xffff'ffffu, v));
  out = static_cast<std::uint32_t>(v);
  return {};
}

std::string read_string(const json& j, const Where& where, std::string& out) {
  if (!j.is_string()) return fail(where, fmt::format("is {}, not a string", describe(j)));
  const auto& s = j.get_ref<const std::string&>();
  if (s.size() > kMaxNameBytes)
    return fail(where,
                fmt::format("is {} bytes long, over the limit of {}", s.size(), kMaxNameBytes));
  out = s;
  return {};
}

// "" or printable ASCII of at most kMaxLabelBytes (what the restore ABI accepts as a label).
std::string read_label(const json& j, const Where& where, std::string& out) {
  if (!j.is_string()) return fail(where, fmt::format("is {}, not a string", describe(j)));
  const auto& s = j.get_ref<const std::string&>();
  if (s.size() > kMaxLabelBytes)
    return fail(where,
                fmt::format("is {} bytes long, over the limit of {}", s.size(), kMaxLabelBytes));
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c > 0x7e)
      return fail(where, fmt::format("byte {} is {:#04x}, not printable ASCII", i, c));
  }
  out = s;
  return {};
}

std::string check_array(const json& j, const Where& where, std::size_t max) {
  if (!j.is_array()) return fail(where, fmt::format("is {}, not an array", describe(j)));
  if (j.size() > max)
    return fail(where, fmt::format("has {} entries, over the limit of {}", j.size(), max));
  return {};
}

std::string read_digest(const json& j, const Where& where, std::string& out) {
  if (!j.is_string()) return fail(where, fmt::format("is {}, not a string", describe(j)));
  const auto& s = j.get_ref<const std::string&>();
  const bool hex = std::all_of(
      s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (s.size() != kDigestChars || !hex)
    return fail(where, fmt::format("{} is not a digest ({} lowercase hex digits)", for_message(s),
                                   kDigestChars));
  out = s;
  return {};
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string read_hex_bytes(const json& j, const Where& where, std::size_t max,
                           std::vector<std::uint8_t>& out) {
  if (!j.is_string()) return fail(where, fmt::format("is {}, not a string", describe(j)));
  const auto& s = j.get_ref<const std::string&>();
  if (s.size() % 2 != 0)
    return fail(where, fmt::format("has {} hex digits, not two per byte", s.size()));
  if (s.size() / 2 > max)
    return fail(where, fmt::format("holds {} bytes, over the limit of {}", s.size() / 2, max));
  out.clear();
  out.reserve(s.size() / 2);
  for (std::size_t i = 0; i < s.size(); i += 2) {
    const int hi = hex_value(s[i]);
    const int lo = hex_value(s[i + 1]);
    if (hi < 0 || lo < 0)
      return fail(where,
                  fmt::format("{} at character {} is not a lowercase hex digit",
                              for_message(s.substr(hi < 0 ? i : i + 1, 1)), hi < 0 ? i : i + 1));
    out.push_back(static_cast<std::uint8_t>(hi << 4 | lo));
  }
  return {};
}

std::string read_dims(const json& j, const Where& where, std::array<std::uint32_t, 3>& out) {
  if (!j.is_array() || j.size() != 3)
    return fail(where, fmt::format("is {}, not an array [x, y, z]", describe(j)));
  for (std::size_t i = 0; i < 3; ++i) THAW_TRY(read_u32(j[i], Where(where, i), out[i], 1));
  return {};
}

// A two-element row of u32s (a param slot, an edge).
std::string read_pair(const json& j, const Where& where, std::uint32_t& a, std::uint32_t& b) {
  if (!j.is_array() || j.size() != 2)
    return fail(where, fmt::format("is {}, not a row of two numbers", describe(j)));
  THAW_TRY(read_u32(j[0], Where(where, std::size_t{0}), a));
  THAW_TRY(read_u32(j[1], Where(where, std::size_t{1}), b));
  return {};
}

// The launch attributes of version 3 (graph_record_model.hpp): the values the driver takes. A
// KernelNode's or the record's AttributeDefaults (the same fields, the same rules).
template <class Attributes>
std::string read_attributes(const json& j, const Where& where, Attributes& k) {
  const json& cluster = j.at("cluster");
  const Where cluster_at(where, "cluster");
  if (!cluster.is_array() || cluster.size() != 3)
    return fail(cluster_at, fmt::format("is {}, not an array [x, y, z]", describe(cluster)));
  for (std::size_t i = 0; i < 3; ++i)
    THAW_TRY(read_u32(cluster[i], Where(cluster_at, i), k.cluster[i]));
  const bool none = k.cluster == std::array<std::uint32_t, 3>{0, 0, 0};
  if (!none && (k.cluster[0] == 0 || k.cluster[1] == 0 || k.cluster[2] == 0))
    return fail(cluster_at, fmt::format("is [{}, {}, {}]: all 0 (no cluster) or each at least 1",
                                        k.cluster[0], k.cluster[1], k.cluster[2]));
  std::uint64_t v = 0;
  THAW_TRY(read_uint(j.at("cluster_scheduling"), Where(where, "cluster_scheduling"), 0,
                     kMaxClusterSchedulingPolicy, v));
  k.cluster_scheduling = static_cast<std::uint32_t>(v);
  THAW_TRY(
      read_uint(j.at("mem_sync_domain"), Where(where, "mem_sync_domain"), 0, kMaxMemSyncDomain, v));
  k.mem_sync_domain = static_cast<std::uint32_t>(v);
  const json& map = j.at("mem_sync_domain_map");
  const Where map_at(where, "mem_sync_domain_map");
  if (!map.is_array() || map.size() != 2)
    return fail(map_at, fmt::format("is {}, not an array [default, remote]", describe(map)));
  for (std::size_t i = 0; i < 2; ++i) {
    THAW_TRY(read_uint(map[i], Where(map_at, i), 0, 255, v));
    k.mem_sync_domain_map[i] = static_cast<std::uint32_t>(v);
  }
  const Where carveout_at(where, "carveout");
  THAW_TRY(read_u32(j.at("carveout"), carveout_at, k.carveout));
  if (k.carveout > 100 && k.carveout != kCarveoutDefault)
    return fail(carveout_at, fmt::format("is {}, not a percentage (0..100) or {} (the default)",
                                         k.carveout, kCarveoutDefault));
  return {};
}

std::string read_kernel(const json& j, const Where& where,
                        const std::map<std::string, std::size_t, std::less<>>& modules,
                        KernelNode& k) {
  THAW_TRY(exact_fields(j, where,
                        {"module_digest", "name", "grid", "block", "shared_bytes", "params",
                         "param_bytes", "cooperative", "priority", "cluster", "cluster_scheduling",
                         "mem_sync_domain", "mem_sync_domain_map", "carveout"}));
  const Where digest_at(where, "module_digest");
  THAW_TRY(read_digest(j.at("module_digest"), digest_at, k.kernel.module_digest));
  if (!modules.contains(k.kernel.module_digest))
    return fail(digest_at, fmt::format("{} is not one of the record's modules",
                                       for_message(k.kernel.module_digest)));
  const Where name_at(where, "name");
  THAW_TRY(read_string(j.at("name"), name_at, k.kernel.name));
  if (k.kernel.name.empty()) return fail(name_at, "is empty");
  THAW_TRY(read_dims(j.at("grid"), Where(where, "grid"), k.grid));
  THAW_TRY(read_dims(j.at("block"), Where(where, "block"), k.block));
  THAW_TRY(read_u32(j.at("shared_bytes"), Where(where, "shared_bytes"), k.shared_bytes));
  THAW_TRY(read_u32(j.at("cooperative"), Where(where, "cooperative"), k.cooperative));
  THAW_TRY(read_u32(j.at("priority"), Where(where, "priority"), k.priority));
  THAW_TRY(read_attributes(j, where, k));
  THAW_TRY(read_hex_bytes(j.at("param_bytes"), Where(where, "param_bytes"), kMaxParamBytes,
                          k.param_bytes));

  const json& params = j.at("params");
  const Where params_at(where, "params");
  THAW_TRY(check_array(params, params_at, kMaxParamsPerKernel));
  k.params.clear();
  k.params.reserve(params.size());
  std::uint64_t end = 0;  // where the previous parameter ends
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Where at(params_at, i);
    ParamSlot p;
    THAW_TRY(read_pair(params[i], at, p.offset, p.size));
    if (p.size == 0) return fail(at, fmt::format("offset {} has size 0", p.offset));
    if (p.offset < end)
      return fail(
          at, fmt::format("offset {} is before the end of params[{}] at {}", p.offset, i - 1, end));
    end = std::uint64_t{p.offset} + p.size;
    if (end > k.param_bytes.size())
      return fail(at, fmt::format("offset {} + size {} is past the {} parameter bytes", p.offset,
                                  p.size, k.param_bytes.size()));
    k.params.push_back(p);
  }
  return {};
}

std::string read_memset(const json& j, const Where& where, MemsetNode& m) {
  THAW_TRY(exact_fields(j, where, {"dst", "pitch", "value", "element_size", "width", "height"}));
  THAW_TRY(read_u64(j.at("dst"), Where(where, "dst"), m.dst));
  THAW_TRY(read_u64(j.at("pitch"), Where(where, "pitch"), m.pitch));
  THAW_TRY(read_u64(j.at("width"), Where(where, "width"), m.width));
  THAW_TRY(read_u64(j.at("height"), Where(where, "height"), m.height));
  const Where size_at(where, "element_size");
  THAW_TRY(read_u32(j.at("element_size"), size_at, m.element_size));
  if (m.element_size != 1 && m.element_size != 2 && m.element_size != 4)
    return fail(size_at, fmt::format("is {}, not 1, 2 or 4", m.element_size));
  const Where value_at(where, "value");
  THAW_TRY(read_u32(j.at("value"), value_at, m.value));
  if (m.element_size < 4 && m.value >> (8 * m.element_size) != 0)
    return fail(value_at, fmt::format("{} does not fit an element of {} byte{}", m.value,
                                      m.element_size, m.element_size == 1 ? "" : "s"));
  return {};
}

std::string read_memcpy(const json& j, const Where& where, MemcpyNode& m) {
  THAW_TRY(exact_fields(j, where, {"src", "dst", "bytes", "src_memory_type", "dst_memory_type"}));
  THAW_TRY(read_u64(j.at("src"), Where(where, "src"), m.src));
  THAW_TRY(read_u64(j.at("dst"), Where(where, "dst"), m.dst));
  THAW_TRY(read_u64(j.at("bytes"), Where(where, "bytes"), m.bytes));
  std::uint64_t type = 0;
  THAW_TRY(
      read_uint(j.at("src_memory_type"), Where(where, "src_memory_type"), 1, kMaxMemoryType, type));
  m.src_memory_type = static_cast<std::uint32_t>(type);
  THAW_TRY(
      read_uint(j.at("dst_memory_type"), Where(where, "dst_memory_type"), 1, kMaxMemoryType, type));
  m.dst_memory_type = static_cast<std::uint32_t>(type);
  return {};
}

// The payload field a node of this type carries, or nullptr.
const char* payload_field(NodeType type) {
  switch (type) {
    case NodeType::kernel:
      return "kernel";
    case NodeType::memset:
      return "memset";
    case NodeType::memcpy:
      return "memcpy";
    default:
      return nullptr;
  }
}

std::string read_node(const json& j, const Where& where,
                      const std::map<std::string, std::size_t, std::less<>>& modules,
                      RecordedNode& n) {
  if (!j.is_object()) return fail(where, fmt::format("is {}, not an object", describe(j)));
  const auto type_it = j.find("type");
  if (type_it == j.end()) return fail(where, "no field \"type\"");
  const Where type_at(where, "type");
  if (!type_it->is_string())
    return fail(type_at, fmt::format("is {}, not a string", describe(*type_it)));
  const auto& type = type_it->get_ref<const std::string&>();
  const auto known = std::find_if(std::begin(kNodeTypes), std::end(kNodeTypes),
                                  [&](NodeType t) { return to_string(t) == type; });
  if (known == std::end(kNodeTypes))
    return fail(type_at, fmt::format("unknown node type {}", for_message(type)));
  n.type = *known;
  const char* payload = payload_field(n.type);
  for (const auto& [key, value] : j.items()) {
    if (key == "type" || (payload != nullptr && key == payload)) continue;
    if (key == "kernel" || key == "memset" || key == "memcpy")
      return fail(where, fmt::format("a node of type {} carries no {}", type, key));
    return fail(where, fmt::format("unknown field {}", for_message(key)));
  }
  if (payload == nullptr) return {};
  const auto it = j.find(payload);
  if (it == j.end())
    return fail(where, fmt::format("a node of type {} has no field \"{}\"", type, payload));
  const Where at(where, payload);
  switch (n.type) {
    case NodeType::kernel:
      return read_kernel(*it, at, modules, n.kernel.emplace());
    case NodeType::memset:
      return read_memset(*it, at, n.memset.emplace());
    default:
      return read_memcpy(*it, at, n.memcpy.emplace());
  }
}

// Kahn's algorithm: "" when the edges leave the graph acyclic.
std::string check_acyclic(const RecordedGraph& g, const Where& edges_at) {
  const std::size_t n = g.nodes.size();
  std::vector<std::uint32_t> indegree(n, 0);
  std::vector<std::size_t> first(n + 1, 0);  // edges by source, counting sort
  for (const RecordedEdge& e : g.edges) {
    ++indegree[e.to];
    ++first[e.from + 1];
  }
  for (std::size_t i = 0; i < n; ++i) first[i + 1] += first[i];
  std::vector<std::uint32_t> targets(g.edges.size());
  std::vector<std::size_t> fill(first.begin(), first.end() - 1);
  for (const RecordedEdge& e : g.edges) targets[fill[e.from]++] = e.to;
  std::vector<std::uint32_t> ready;
  for (std::uint32_t i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.push_back(i);
  std::size_t done = 0;
  while (!ready.empty()) {
    const std::uint32_t v = ready.back();
    ready.pop_back();
    ++done;
    for (std::size_t k = first[v]; k < first[v + 1]; ++k)
      if (--indegree[targets[k]] == 0) ready.push_back(targets[k]);
  }
  if (done == n) return {};
  const auto stuck = std::find_if(indegree.begin(), indegree.end(), [](auto d) { return d != 0; });
  return fail(edges_at,
              fmt::format("form a cycle: {} nodes are on a cycle or depend on one (node {} first)",
                          n - done, stuck - indegree.begin()));
}

std::string read_graph(const json& j, const Where& where,
                       const std::map<std::string, std::size_t, std::less<>>& modules,
                       RecordedGraph& g) {
  THAW_TRY(exact_fields(j, where, {"index", "allocation_index", "nodes", "edges", "label"}));
  THAW_TRY(read_u32(j.at("index"), Where(where, "index"), g.index));
  THAW_TRY(
      read_u64(j.at("allocation_index"), Where(where, "allocation_index"), g.allocation_index));
  THAW_TRY(read_label(j.at("label"), Where(where, "label"), g.label));

  const json& nodes = j.at("nodes");
  const Where nodes_at(where, "nodes");
  THAW_TRY(check_array(nodes, nodes_at, kMaxNodesPerGraph));
  g.nodes.resize(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i)
    THAW_TRY(read_node(nodes[i], Where(nodes_at, i), modules, g.nodes[i]));

  const json& edges = j.at("edges");
  const Where edges_at(where, "edges");
  THAW_TRY(check_array(edges, edges_at, kMaxEdgesPerGraph));
  g.edges.resize(edges.size());
  for (std::size_t i = 0; i < edges.size(); ++i) {
    const Where at(edges_at, i);
    RecordedEdge& e = g.edges[i];
    THAW_TRY(read_pair(edges[i], at, e.from, e.to));
    for (const std::uint32_t node : {e.from, e.to}) {
      if (node >= g.nodes.size())
        return fail(at, fmt::format("node {} does not exist (the graph has {} node{})", node,
                                    g.nodes.size(), g.nodes.size() == 1 ? "" : "s"));
    }
    if (e.from == e.to) return fail(at, fmt::format("node {} depends on itself", e.from));
  }
  // Duplicates: sorted by (from, to, position), equal neighbours are the same edge twice.
  std::vector<std::tuple<std::uint32_t, std::uint32_t, std::size_t>> sorted;
  sorted.reserve(g.edges.size());
  for (std::size_t i = 0; i < g.edges.size(); ++i)
    sorted.emplace_back(g.edges[i].from, g.edges[i].to, i);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    const auto& [from, to, at] = sorted[i];
    const auto& [prev_from, prev_to, prev_at] = sorted[i - 1];
    if (from == prev_from && to == prev_to)
      return fail(Where(edges_at, at),
                  fmt::format("{} -> {} is listed already as edges[{}]", from, to, prev_at));
  }
  return check_acyclic(g, edges_at);
}

std::string read_record(const json& doc, GraphRecord& r) {
  const Where root;
  THAW_TRY(
      exact_fields(doc, root, {"version", "identity", "attribute_defaults", "modules", "graphs"}));
  const json& version = doc.at("version");
  if (!version.is_number_unsigned() ||
      version.get<std::uint64_t>() != static_cast<std::uint64_t>(kGraphRecordVersion)) {
    return fail(Where(root, "version"), fmt::format("is {}, not {} (the version this build reads)",
                                                    describe(version), kGraphRecordVersion));
  }
  r.version = kGraphRecordVersion;

  const json& identity = doc.at("identity");
  const Where identity_at(root, "identity");
  THAW_TRY(exact_fields(identity, identity_at, {"engine", "model", "gpu", "driver"}));
  const json& defaults = doc.at("attribute_defaults");
  const Where defaults_at(root, "attribute_defaults");
  THAW_TRY(exact_fields(defaults, defaults_at,
                        {"cooperative", "priority", "cluster", "cluster_scheduling",
                         "mem_sync_domain", "mem_sync_domain_map", "carveout"}));
  AttributeDefaults& d = r.attribute_defaults;
  THAW_TRY(read_u32(defaults.at("cooperative"), Where(defaults_at, "cooperative"), d.cooperative));
  THAW_TRY(read_u32(defaults.at("priority"), Where(defaults_at, "priority"), d.priority));
  THAW_TRY(read_attributes(defaults, defaults_at, d));
  THAW_TRY(read_string(identity.at("engine"), Where(identity_at, "engine"), r.identity.engine));
  THAW_TRY(read_string(identity.at("model"), Where(identity_at, "model"), r.identity.model));
  THAW_TRY(read_string(identity.at("gpu"), Where(identity_at, "gpu"), r.identity.gpu));
  THAW_TRY(read_string(identity.at("driver"), Where(identity_at, "driver"), r.identity.driver));

  const json& modules = doc.at("modules");
  const Where modules_at(root, "modules");
  THAW_TRY(check_array(modules, modules_at, kMaxModules));
  std::map<std::string, std::size_t, std::less<>> digests;  // digest -> its index in modules
  r.modules.resize(modules.size());
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const Where at(modules_at, i);
    RecordedModule& m = r.modules[i];
    THAW_TRY(exact_fields(modules[i], at, {"digest", "bytes", "kind"}));
    const Where digest_at(at, "digest");
    THAW_TRY(read_digest(modules[i].at("digest"), digest_at, m.digest));
    if (const auto [it, added] = digests.emplace(m.digest, i); !added)
      return fail(digest_at, fmt::format("is listed already as modules[{}]", it->second));
    THAW_TRY(read_uint(modules[i].at("bytes"), Where(at, "bytes"), 1, ~std::uint64_t{0}, m.bytes));
    const json& kind = modules[i].at("kind");
    const Where kind_at(at, "kind");
    if (!kind.is_string()) return fail(kind_at, fmt::format("is {}, not a string", describe(kind)));
    const auto& name = kind.get_ref<const std::string&>();
    const auto known = std::find_if(std::begin(kImageKinds), std::end(kImageKinds),
                                    [&](ImageKind k) { return to_string(k) == name; });
    if (known == std::end(kImageKinds))
      return fail(kind_at, fmt::format("unknown image kind {}", for_message(name)));
    m.kind = *known;
  }

  const json& graphs = doc.at("graphs");
  const Where graphs_at(root, "graphs");
  THAW_TRY(check_array(graphs, graphs_at, kMaxGraphs));
  r.graphs.resize(graphs.size());
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const Where at(graphs_at, i);
    THAW_TRY(read_graph(graphs[i], at, digests, r.graphs[i]));
    if (i > 0 && r.graphs[i].index <= r.graphs[i - 1].index)
      return fail(Where(at, "index"),
                  fmt::format("is {}, not after graphs[{}].index {} (capture order)",
                              r.graphs[i].index, i - 1, r.graphs[i - 1].index));
  }
  return {};
}

#undef THAW_TRY

// A first pass over the text that builds nothing: it refuses nesting beyond kMaxJsonDepth
// (before any document is built: a text of 32 MiB of '[' would otherwise become millions of
// nested arrays) and duplicate keys (which one counts would be up to the parser; a strict
// reader has no such question). Not nlohmann's parser callback, which does the same checks
// while building: its end_object walks the whole enclosing container each time, so an array
// of n objects cost O(n^2) — 65536 nodes took over 5 minutes under ASan, a hostile record
// far longer.
class StructureCheck {
 public:
  std::string error;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    if (!open()) return false;
    keys_.emplace_back();
    return true;
  }
  bool key(json::string_t& name) {
    if (keys_.back().insert(name).second) return true;
    error = fmt::format("record: field {} appears twice in one object", for_message(name));
    return false;
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return open(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    error = fmt::format("record: not JSON: {}", e.what());
    return false;
  }

 private:
  bool open() {
    if (depth_ >= kMaxJsonDepth) {
      error = fmt::format("record: nested deeper than {} levels", kMaxJsonDepth);
      return false;
    }
    ++depth_;
    return true;
  }
  std::size_t depth_ = 0;
  std::vector<std::set<std::string, std::less<>>> keys_;  // one set per open object
};

// The document, once StructureCheck passed.
std::string parse_document(std::string_view text, json& doc) {
  StructureCheck check;
  if (!json::sax_parse(text.begin(), text.end(), &check)) {
    return check.error.empty() ? std::string("record: not JSON") : check.error;
  }
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return fmt::format("record: not JSON: {}", e.what());
  }
  return {};
}

// One line of printable ASCII, of bounded length, whatever the document held.
std::string printable(std::string message) {
  constexpr std::size_t kMax = 1000;
  if (message.size() > kMax) {
    message.resize(kMax);
    message += "...";
  }
  for (char& c : message) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return message;
}

}  // namespace

std::string graph_record_to_json(const GraphRecord& record) {
  ordered_json modules = ordered_json::array();
  for (const RecordedModule& m : record.modules) {
    ordered_json row = ordered_json::object();
    row["digest"] = m.digest;
    row["bytes"] = m.bytes;
    row["kind"] = to_string(m.kind);
    modules.push_back(std::move(row));
  }
  ordered_json graphs = ordered_json::array();
  for (const RecordedGraph& g : record.graphs) graphs.push_back(graph_json(g));
  ordered_json identity = ordered_json::object();
  identity["engine"] = record.identity.engine;
  identity["model"] = record.identity.model;
  identity["gpu"] = record.identity.gpu;
  identity["driver"] = record.identity.driver;
  ordered_json doc = ordered_json::object();
  doc["version"] = record.version;
  doc["identity"] = std::move(identity);
  ordered_json defaults = ordered_json::object();
  add_attributes(defaults, record.attribute_defaults);
  doc["attribute_defaults"] = std::move(defaults);
  doc["modules"] = std::move(modules);
  doc["graphs"] = std::move(graphs);
  return doc.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string parse_graph_record(std::string_view text, GraphRecord& out) {
  if (text.size() > kMaxGraphRecordBytes) {
    return fmt::format("record: {} bytes, over the limit of {}", text.size(), kMaxGraphRecordBytes);
  }
  try {
    json doc;
    if (std::string e = parse_document(text, doc); !e.empty()) return printable(std::move(e));
    GraphRecord record;
    if (std::string e = read_record(doc, record); !e.empty()) return printable(std::move(e));
    out = std::move(record);
    return {};
  } catch (const std::exception& e) {  // std::bad_alloc; nothing else is expected
    return printable(fmt::format("record: {}", e.what()));
  }
}

}  // namespace thaw::graphs
