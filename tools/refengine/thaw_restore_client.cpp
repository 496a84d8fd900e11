#include "thaw_restore_client.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace refengine {

std::string ThawRestore::status_name(int status) {
  switch (status) {
    case kOk:
      return "ok";
    case kNone:
      return "none";
    case kStale:
      return "stale";
    case kCorrupt:
      return "corrupt";
    case kUnavailable:
      return "unavailable";
    case kInvalidArgument:
      return "invalid argument";
    case kNoLookup:
      return "no lookup";
    case kMismatch:
      return "mismatch";
  }
  return fmt::format("status {}", status);
}

std::expected<ThawRestore, std::string> ThawRestore::find() {
  auto version = reinterpret_cast<VersionFn>(dlsym(RTLD_DEFAULT, "thaw_restore_abi_version"));
  if (version == nullptr) {
    return std::unexpected("thaw's restore ABI is not in this process (no libthaw-preload.so)");
  }
  const std::uint32_t v = version();
  if (v < kKvVersion) {
    return std::unexpected(
        fmt::format("thaw's restore ABI is version {}; this engine needs {}", v, kKvVersion));
  }
  ThawRestore abi;
  abi.version_ = v;
  if (v >= kGraphVersion) {
    abi.graph_ = reinterpret_cast<GraphFn>(dlsym(RTLD_DEFAULT, "thaw_restore_graph"));
    abi.graph_label_ =
        reinterpret_cast<GraphLabelFn>(dlsym(RTLD_DEFAULT, "thaw_restore_graph_label"));
  }
  abi.lookup_ = reinterpret_cast<LookupFn>(dlsym(RTLD_DEFAULT, "thaw_restore_kv_lookup"));
  abi.record_ = reinterpret_cast<RecordFn>(dlsym(RTLD_DEFAULT, "thaw_restore_kv_record"));
  if (abi.lookup_ == nullptr || abi.record_ == nullptr) {
    return std::unexpected("thaw's restore ABI lacks its KV calls");
  }
  return abi;
}

ThawRestore::Lookup ThawRestore::lookup_kv(const std::string& key) const {
  Lookup l;
  char why[512] = {};
  l.status = lookup_(key.c_str(), &l.kv, why, sizeof why);
  if (l.status != kOk) l.why = why;
  return l;
}

std::optional<std::string> ThawRestore::record_kv(const std::string& key,
                                                  const ThawRestoreKv& kv) const {
  char why[512] = {};
  const int status = record_(key.c_str(), &kv, why, sizeof why);
  if (status == kOk) return std::nullopt;
  return fmt::format("{}: {}", status_name(status), why);
}

std::optional<std::string> ThawRestore::graphs_unsupported() const {
  if (version_ < kGraphVersion)
    return fmt::format("thaw's restore ABI is version {}; graphs need {}", version_, kGraphVersion);
  if (graph_ == nullptr || graph_label_ == nullptr)
    return std::string("thaw's restore ABI lacks its graph calls");
  return std::nullopt;
}

ThawRestore::Graph ThawRestore::graph(const std::string& label,
                                      unsigned long long instantiate_flags) const {
  Graph g;
  if (auto why = graphs_unsupported()) {
    g.why = *why;
    return g;
  }
  char why[512] = {};
  g.status = graph_(label.c_str(), instantiate_flags, &g.exec, why, sizeof why);
  if (g.status != kOk) {
    g.exec = nullptr;
    g.why = why;
  }
  return g;
}

std::optional<std::string> ThawRestore::label_graph(const std::string& label) const {
  if (auto why = graphs_unsupported()) return why;
  char why[512] = {};
  const int status = graph_label_(label.c_str(), why, sizeof why);
  if (status == kOk) return std::nullopt;
  return fmt::format("{}: {}", status_name(status), why);
}

}  // namespace refengine
