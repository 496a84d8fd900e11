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

#include <array>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thaw::graphs {

inline constexpr int kGraphRecordVersion = 1;

// Limits of what a record may hold (a capture of a real engine is far below each).
inline constexpr std::size_t kMaxGraphRecordBytes = 32u << 20;  // thawd's artifact limit
inline constexpr std::size_t kMaxModules = 4096;
inline constexpr std::size_t kMaxGraphs = 1024;
inline constexpr std::size_t kMaxNodesPerGraph = 65536;
inline constexpr std::size_t kMaxEdgesPerGraph = 262144;
inline constexpr std::size_t kMaxParamBytes = 32764;  // CUDA's kernel parameter limit
inline constexpr std::size_t kMaxParamsPerKernel = 4096;
inline constexpr std::size_t kMaxNameBytes = 4096;

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

struct KernelNode {
  KernelIdentity kernel;
  std::array<std::uint32_t, 3> grid{1, 1, 1};
  std::array<std::uint32_t, 3> block{1, 1, 1};
  std::uint32_t shared_bytes = 0;
  std::vector<ParamSlot> params;
  std::vector<std::uint8_t> param_bytes;  // the parameter buffer, params laid out in it
  // Node attributes that change execution (cuGraphKernelNodeGetAttribute), by CUlaunchAttributeID
  // value; only those the recorder read and found set.
  std::uint32_t cooperative = 0;
  std::uint32_t priority = 0;
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
  bool operator==(const RecordedGraph&) const = default;
};

struct GraphRecord {
  int version = kGraphRecordVersion;
  GraphIdentity identity;
  std::vector<RecordedModule> modules;
  std::vector<RecordedGraph> graphs;
  bool operator==(const GraphRecord&) const = default;
};

std::string_view to_string(NodeType type);
std::string_view to_string(ImageKind kind);

// The record as JSON text (deterministic: the same record gives the same bytes).
std::string graph_record_to_json(const GraphRecord& record);
// Parses and checks a record: a message naming the field and what was wrong on any error
// (including a version other than kGraphRecordVersion, a kernel naming a module digest the
// record does not list, an edge naming a node that does not exist, or params outside
// param_bytes).
std::expected<GraphRecord, std::string> graph_record_from_json(std::string_view text);

}  // namespace thaw::graphs
