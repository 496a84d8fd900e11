// The data model of recorded CUDA graphs (graph_record.hpp says what is recorded and why) and
// the codec's core: the JSON text form written and parsed with errors reported as strings ("" =
// valid) and the record through an out-parameter, not std::expected, so that this header and
// graph_record.cpp also build with clang 14 + libstdc++ 12 (the libFuzzer build in tests/fuzz),
// which lacks <expected>. The rest of thaw includes graph_record.hpp, which adds the
// std::expected API over it.
//
// The text form (version 4), one JSON object with exactly these fields (a missing or an unknown
// field is an error at every level: a new field is a new version — version 2 added the graphs'
// "label", version 3 the kernels' cluster and memory-sync attributes, version 4 the driver's
// "attribute_defaults"; a text of another version is refused):
//   {"version": 4,
//    "identity": {"engine": s, "model": s, "gpu": s, "driver": s},
//    "attribute_defaults": {"cooperative": u32, "priority": u32, <the kernel's attribute fields
//                           from "cluster" to "carveout", with their rules>},
//    "modules": [{"digest": hex64, "bytes": u64 >= 1, "kind": "cubin"|"fatbin"|"ptx"|"unknown"}],
//    "graphs": [{"index": u32, "allocation_index": u64,
//                "nodes": [{"type": t, <payload>}],
//                "edges": [[from, to], ...], "label": s}]}
// where t is a NodeType's name (to_string) and the payload is the field named like the type
// for "kernel", "memset" and "memcpy" and nothing for the others:
//   "kernel": {"module_digest": hex64 of a listed module, "name": s (non-empty),
//              "grid": [x, y, z], "block": [x, y, z] (each >= 1), "shared_bytes": u32,
//              "params": [[offset, size], ...], "param_bytes": hex, "cooperative": u32,
//              "priority": u32, "cluster": [x, y, z] (all 0: none; else each >= 1),
//              "cluster_scheduling": 0..2, "mem_sync_domain": 0..1,
//              "mem_sync_domain_map": [default, remote] (each 0..255),
//              "carveout": 0..100 or 4294967295 (CU_SHAREDMEM_CARVEOUT_DEFAULT)}
//   "memset": {"dst": u64, "pitch": u64, "value": u32, "element_size": 1|2|4, "width": u64,
//              "height": u64}
//   "memcpy": {"src": u64, "dst": u64, "bytes": u64, "src_memory_type": 1..4,
//              "dst_memory_type": 1..4}
// Numbers are JSON integers written in decimal (no sign, fraction or exponent; u64 values are
// exact, nlohmann reads them as unsigned 64-bit). Byte arrays (param_bytes) are lowercase hex
// strings, two digits per byte, "" when empty: one spelling per value, so the text of a record
// is unique and parse(write(r)) == r, write(parse(t)) == t for every t that parses and was
// written by graph_record_to_json. Rows (params, edges) are two-element arrays, not objects,
// to keep a large capture's record small. Strings are UTF-8 (the JSON parser checks it) of at
// most kMaxNameBytes bytes.
//
// Beyond the types: the version equals kGraphRecordVersion; the text is at most
// kMaxGraphRecordBytes and nested at most kMaxJsonDepth deep (both checked before parsing);
// module digests are unique; graph indices increase strictly (capture order); a kernel names a
// listed module; its params have a size >= 1, lie inside param_bytes and follow each other
// without overlap (cuFuncGetParamInfo's order); memset values fit element_size; edges name
// existing nodes, no node depends on itself, no edge is listed twice and the graph has no
// cycle (CUDA graphs are DAGs: a restore could not instantiate it). Every count is within the
// limits below.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::graphs {

inline constexpr int kGraphRecordVersion = 4;

// Limits of what a record may hold (a capture of a real engine is far below each).
inline constexpr std::size_t kMaxGraphRecordBytes = 32u << 20;  // thawd's artifact limit
inline constexpr std::size_t kMaxModules = 4096;
inline constexpr std::size_t kMaxGraphs = 1024;
inline constexpr std::size_t kMaxNodesPerGraph = 65536;
inline constexpr std::size_t kMaxEdgesPerGraph = 262144;
inline constexpr std::size_t kMaxParamBytes = 32764;  // CUDA's kernel parameter limit
inline constexpr std::size_t kMaxParamsPerKernel = 4096;
inline constexpr std::size_t kMaxNameBytes = 4096;
inline constexpr std::size_t kMaxLabelBytes = 4096;  // the restore ABI's key limit

struct GraphIdentity {
  std::string engine;  // fingerprint of the program (as the layout record's)
  std::string model;   // model key in thawd's cache
  std::string gpu;     // device name
  std::string driver;  // cuDriverGetVersion, as a string
  bool operator==(const GraphIdentity&) const = default;
};

// A module image as loaded (cuModuleLoadData*, cuLibraryLoadData, files): its digest is
// how kernels refer to it.
enum class ImageKind { cubin, fatbin, ptx, unknown };
struct RecordedModule {
  std::string digest;  // lowercase hex SHA-256 of the image bytes as passed to the driver
  std::uint64_t bytes = 0;
  ImageKind kind = ImageKind::unknown;
  bool operator==(const RecordedModule&) const = default;
};

struct KernelIdentity {
  std::string module_digest;  // a RecordedModule's digest
  std::string name;           // mangled name, as cuFuncGetName answers
  bool operator==(const KernelIdentity&) const = default;
};

// One kernel parameter as cuFuncGetParamInfo describes it: its place in param_bytes.
struct ParamSlot {
  std::uint32_t offset = 0;
  std::uint32_t size = 0;
  bool operator==(const ParamSlot&) const = default;
};

inline constexpr std::uint32_t kCarveoutDefault = 0xffff'ffffu;  // CU_SHAREDMEM_CARVEOUT_DEFAULT
inline constexpr std::uint32_t kMaxClusterSchedulingPolicy = 2;  // LOAD_BALANCING
inline constexpr std::uint32_t kMaxMemSyncDomain = 1;            // REMOTE

// What the recording run's driver answered cuGraphKernelNodeGetAttribute for a kernel node
// that never had an attribute set (probed: a driver need not answer what CUDA's headers call the
// default — a carveout of 0 rather than -1, a cluster of [1, 1, 1] rather than none). A kernel
// node's attributes below hold a value only where it differs from these; where it equals them
// the node holds the canonical "not set" value (what KernelNode's initializers say). A restore
// whose own driver answers other defaults is a mismatch: that driver behaves differently.
struct AttributeDefaults {
  std::uint32_t cooperative = 0;
  std::uint32_t priority = 0;
  std::array<std::uint32_t, 3> cluster{0, 0, 0};
  std::uint32_t cluster_scheduling = 0;
  std::uint32_t mem_sync_domain = 0;
  std::array<std::uint32_t, 2> mem_sync_domain_map{0, 0};
  std::uint32_t carveout = 0xffff'ffffu;  // CU_SHAREDMEM_CARVEOUT_DEFAULT
  bool operator==(const AttributeDefaults&) const = default;
};

struct KernelNode {
  KernelIdentity kernel;
  std::array<std::uint32_t, 3> grid{1, 1, 1};
  std::array<std::uint32_t, 3> block{1, 1, 1};
  std::uint32_t shared_bytes = 0;
  std::vector<ParamSlot> params;
  std::vector<std::uint8_t> param_bytes;  // the parameter buffer, params laid out in it
  // Node attributes that change execution (cuGraphKernelNodeGetAttribute), by CUlaunchAttributeID
  // value; only those the recorder read and found to differ from the driver's defaults (the
  // record's attribute_defaults); the others hold these initial values ("not set").
  std::uint32_t cooperative = 0;
  std::uint32_t priority = 0;
  // CLUSTER_DIMENSION: {0, 0, 0} when the node has none (CUTLASS 3 / cuBLAS GEMMs on sm_90 have
  // one; rebuilt without it the kernel runs in another configuration, or fails to launch).
  std::array<std::uint32_t, 3> cluster{0, 0, 0};
  std::uint32_t cluster_scheduling = 0;  // CUclusterSchedulingPolicy, 0 = the default
  std::uint32_t mem_sync_domain = 0;     // CUlaunchMemSyncDomain
  std::array<std::uint32_t, 2> mem_sync_domain_map{0, 0};  // default, remote (bytes)
  // PREFERRED_SHARED_MEMORY_CARVEOUT in percent; kCarveoutDefault when not set.
  std::uint32_t carveout = kCarveoutDefault;
  bool operator==(const KernelNode&) const = default;
};

struct MemsetNode {
  std::uint64_t dst = 0;
  std::uint64_t pitch = 0;
  std::uint32_t value = 0;
  std::uint32_t element_size = 0;  // 1, 2 or 4
  std::uint64_t width = 0;         // in elements
  std::uint64_t height = 0;
  bool operator==(const MemsetNode&) const = default;
};

// 1-D device/host copies as stream capture records them (cuMemcpy*Async); anything else is
// recorded as `other`, which no restore replays.
struct MemcpyNode {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
  std::uint32_t src_memory_type = 0;  // CUmemorytype
  std::uint32_t dst_memory_type = 0;
  bool operator==(const MemcpyNode&) const = default;
};

enum class NodeType { kernel, memset, memcpy, empty, event_record, event_wait, host, other };

struct RecordedNode {
  NodeType type = NodeType::other;
  std::optional<KernelNode> kernel;  // type == kernel
  std::optional<MemsetNode> memset;  // type == memset
  std::optional<MemcpyNode> memcpy;  // type == memcpy
  bool operator==(const RecordedNode&) const = default;
};

struct RecordedEdge {
  std::uint32_t from = 0;  // node indices
  std::uint32_t to = 0;
  bool operator==(const RecordedEdge&) const = default;
};

struct RecordedGraph {
  std::uint32_t index = 0;  // capture order in the run, from 0
  // Allocations the deterministic layout had served when the capture began.
  std::uint64_t allocation_index = 0;
  std::vector<RecordedNode> nodes;
  std::vector<RecordedEdge> edges;
  // What the engine called the graph before capturing it (thaw_restore_graph_label: e.g.
  // "decode batch=8"), by which a later run asks for it; "" when it said nothing. Several
  // graphs may carry one label: a restore takes the last (a later capture replaces).
  std::string label;
  bool operator==(const RecordedGraph&) const = default;
};

struct GraphRecord {
  int version = kGraphRecordVersion;
  GraphIdentity identity;
  AttributeDefaults attribute_defaults;
  std::vector<RecordedModule> modules;
  std::vector<RecordedGraph> graphs;
  bool operator==(const GraphRecord&) const = default;
};

// Deepest nesting of arrays and objects in a record's text (root object, graphs, a graph,
// nodes, a node, its kernel, params, a param row).
inline constexpr std::size_t kMaxJsonDepth = 8;

std::string_view to_string(NodeType type);
std::string_view to_string(ImageKind kind);

// The record as JSON text (deterministic: the same record gives the same bytes; keys in the
// order of the structs). It writes what it is given: parse_graph_record checks, so a record
// built wrong in memory (a kernel node without its payload, a bad digest) is written but
// refused when read back. Strings that are not valid UTF-8 are written with U+FFFD in place of
// the bad bytes (never an exception).
std::string graph_record_to_json(const GraphRecord& record);

// Parses and checks a record's text (the rules at the top of this file): "" and `out` set on
// success; otherwise one line of printable ASCII naming the place and what was wrong, e.g.
// "graphs[3].nodes[17].kernel.params[2]: offset 40 + size 8 is past the 44 parameter bytes",
// and `out` unspecified. Never throws.
std::string parse_graph_record(std::string_view text, GraphRecord& out);

}  // namespace thaw::graphs
