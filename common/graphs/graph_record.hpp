// GraphRecord: the CUDA graphs an engine captured on a run under the shim, materialized so a
// later run of the same engine, model, GPU and driver can restore them instead of capturing
// (MEDUSA §5, Foundry). Kept by thawd as an artifact of kind "graphs" next to the "layout"
// record, whose deterministic layout makes the recorded device pointers valid again.
//
// What is recorded per graph, in capture order: every node (type; for a kernel its identity —
// the digest of the module image it was loaded from and its mangled name — launch dimensions,
// dynamic shared memory, its parameter bytes split as cuFuncGetParamInfo lays them out, and
// the node attributes that change execution; memset and memcpy parameters), the edges, and
// where in the layout's allocation sequence the capture began (a restore is only valid at
// the same point). Module images are recorded by digest when loaded, so a kernel that is in
// no symbol table (cuBLAS's) is found again by loading the image and enumerating it.
//
// The text form is JSON, strict and versioned: graph_record_from_json() refuses any field
// of the wrong type, unknown node types, values out of range and records over the limits
// below, with a message naming the place (the artifact is a file thawd keeps on disk and
// hands to engines: a parser of untrusted input, fuzzed by tests/fuzz/graph_record_fuzz).
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <utility>

#include "common/graphs/graph_record_model.hpp"  // the structs, limits, to_string, the text form

namespace thaw::graphs {

// Defined in graph_record_model.hpp (the core, which builds without std::expected):
//   inline constexpr int kGraphRecordVersion, the kMax* limits, GraphRecord and its parts;
//   std::string_view to_string(NodeType); std::string_view to_string(ImageKind);
//   std::string graph_record_to_json(const GraphRecord& record);  // deterministic bytes
//   std::string parse_graph_record(std::string_view text, GraphRecord& out);

// Parses and checks a record: a message naming the field and what was wrong on any error
// (including a version other than kGraphRecordVersion, a kernel naming a module digest the
// record does not list, an edge naming a node that does not exist, or params outside
// param_bytes).
inline std::expected<GraphRecord, std::string> graph_record_from_json(std::string_view text) {
  GraphRecord record;
  std::string error = parse_graph_record(text, record);
  if (!error.empty()) return std::unexpected(std::move(error));
  return record;
}

}  // namespace thaw::graphs
