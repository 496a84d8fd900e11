// Comparing two `refengine --dump-graphs` documents ({"<batch size>": <thawEmuDescribeGraphExec
// description>}) node for node and edge for edge; shared by the parity tests of the
// engine-assisted and the transparent graph restore.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace thaw::testing {

// "kernel layernorm_f32", "memset": what a node is, for messages.
inline std::string node_label(const nlohmann::json& node) {
  std::string label = node.value("type", "?");
  if (node.contains("name")) label += " " + node["name"].get<std::string>();
  return label;
}

// Every way `got` differs from `want`, one line each (empty when identical): sizes missing or
// unexpected, node counts, each differing field of each differing node (positions are the
// description's canonical topological order), edges.
inline std::vector<std::string> graph_dump_differences(const nlohmann::json& want,
                                                       const nlohmann::json& got) {
  std::vector<std::string> out;
  if (!want.is_object() || !got.is_object()) return {"a dump is not a JSON object"};
  for (const auto& [size, g] : want.items()) {
    if (!got.contains(size)) out.push_back(fmt::format("batch size {}: missing", size));
  }
  for (const auto& [size, g] : got.items()) {
    if (!want.contains(size)) out.push_back(fmt::format("batch size {}: unexpected", size));
  }
  auto clip = [](const nlohmann::json& v) {
    std::string s = v.dump();
    return s.size() > 200 ? s.substr(0, 200) + "..." : s;
  };
  for (const auto& [size, w] : want.items()) {
    if (!got.contains(size)) continue;
    const nlohmann::json& g = got.at(size);
    const nlohmann::json& wn = w.at("nodes");
    const nlohmann::json& gn = g.at("nodes");
    if (wn.size() != gn.size())
      out.push_back(fmt::format("batch size {}: {} nodes, not {}", size, gn.size(), wn.size()));
    for (std::size_t i = 0; i < std::min(wn.size(), gn.size()); ++i) {
      if (wn[i] == gn[i]) continue;
      std::vector<std::string> fields;
      for (const auto& [key, value] : wn[i].items()) {
        if (!gn[i].contains(key) || gn[i][key] != value)
          fields.push_back(fmt::format("{} {}, not {}", key,
                                       gn[i].contains(key) ? clip(gn[i][key]) : "absent",
                                       clip(value)));
      }
      for (const auto& [key, value] : gn[i].items()) {
        if (!wn[i].contains(key)) fields.push_back(fmt::format("{} unexpected", key));
      }
      out.push_back(fmt::format("batch size {}: node {} ({}): {}", size, i, node_label(wn[i]),
                                fmt::join(fields, "; ")));
    }
    if (w.at("edges") != g.at("edges"))
      out.push_back(fmt::format("batch size {}: edges {}, not {}", size, clip(g.at("edges")),
                                clip(w.at("edges"))));
  }
  return out;
}

}  // namespace thaw::testing
