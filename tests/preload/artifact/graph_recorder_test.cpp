// GraphRecorder with a fake driver: what it records of a captured graph (node types, kernel
// identity, launch dimensions, parameter bytes as cuFuncGetParamInfo lays them out, memset and
// memcpy parameters, edges, allocation index), how it finds a library's module, and which
// graphs it leaves out and why.
#include "preload/artifact/graph_recorder.hpp"

#include <gtest/gtest.h>

#include "common/graphs/graph_record.hpp"

#include <cstring>
#include <map>

namespace {

using namespace thaw::preload;
using thaw::graphs::NodeType;

template <typename H>
H handle(std::uintptr_t v) {
  return reinterpret_cast<H>(v);
}

struct FakeFunction {
  std::string name;
  CUmodule module = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>> params;  // (offset, size)
};

struct FakeNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  CUDA_KERNEL_NODE_PARAMS kernel{};
  std::vector<void*> pointers;  // kernelParams
  std::optional<CUDA_MEMSET_NODE_PARAMS> memset;
  std::optional<CUDA_MEMCPY3D> memcpy;
  int priority = 0;
  std::map<int, CUkernelNodeAttrValue> attributes;  // besides priority: what the driver answers
};

struct FakeLibrary {
  std::vector<CUkernel> kernels;
  CUmodule module = nullptr;
};

class FakeDriver : public GraphDriver {
 public:
  std::map<CUgraph, std::vector<CUgraphNode>> graphs;
  std::map<CUgraph, std::vector<std::pair<CUgraphNode, CUgraphNode>>> edges;
  std::map<CUgraphNode, FakeNode> nodes;
  std::map<CUfunction, FakeFunction> functions;
  std::map<CUmodule, std::vector<CUfunction>> modules;
  std::map<CUlibrary, FakeLibrary> libraries;
  std::map<CUkernel, std::pair<std::string, CUfunction>> kernels;
  int library_module_calls = 0;
  // What the driver answers for a node that set no attribute (nullopt: it cannot be probed),
  // and how often each function was probed.
  std::optional<thaw::graphs::AttributeDefaults> defaults = thaw::graphs::AttributeDefaults{};
  std::map<CUfunction, int> probes;
  std::map<CUfunction, thaw::graphs::AttributeDefaults> per_function;  // over `defaults`

  CUresult attribute_defaults(CUfunction f, const std::vector<thaw::graphs::ParamSlot>&,
                              thaw::graphs::AttributeDefaults& out) override {
    ++probes[f];
    if (auto it = per_function.find(f); it != per_function.end()) {
      out = it->second;
      return CUDA_SUCCESS;
    }
    if (!defaults) return CUDA_ERROR_NOT_SUPPORTED;
    out = *defaults;
    return CUDA_SUCCESS;
  }

  CUresult graph_nodes(CUgraph g, std::vector<CUgraphNode>& out) override {
    auto it = graphs.find(g);
    if (it == graphs.end()) return CUDA_ERROR_INVALID_VALUE;
    out = it->second;
    return CUDA_SUCCESS;
  }
  CUresult graph_edges(CUgraph g, std::vector<std::pair<CUgraphNode, CUgraphNode>>& out) override {
    out = edges[g];
    return CUDA_SUCCESS;
  }
  CUresult node_type(CUgraphNode n, CUgraphNodeType& out) override {
    out = nodes.at(n).type;
    return CUDA_SUCCESS;
  }
  CUresult kernel_params(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS& out) override {
    FakeNode& node = nodes.at(n);
    out = node.kernel;
    if (out.extra == nullptr) out.kernelParams = node.pointers.data();
    return CUDA_SUCCESS;
  }
  CUresult kernel_attribute(CUgraphNode n, CUkernelNodeAttrID id,
                            CUkernelNodeAttrValue& out) override {
    const FakeNode& node = nodes.at(n);
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
      out.priority = node.priority;
      return CUDA_SUCCESS;
    }
    auto it = node.attributes.find(static_cast<int>(id));
    if (it == node.attributes.end()) return CUDA_ERROR_NOT_SUPPORTED;
    out = it->second;
    return CUDA_SUCCESS;
  }
  CUresult memset_params(CUgraphNode n, CUDA_MEMSET_NODE_PARAMS& out) override {
    auto& p = nodes.at(n).memset;
    if (!p) return CUDA_ERROR_NOT_SUPPORTED;
    out = *p;
    return CUDA_SUCCESS;
  }
  CUresult memcpy_params(CUgraphNode n, CUDA_MEMCPY3D& out) override {
    auto& p = nodes.at(n).memcpy;
    if (!p) return CUDA_ERROR_NOT_SUPPORTED;
    out = *p;
    return CUDA_SUCCESS;
  }
  CUresult param_info(CUfunction f, std::size_t i, std::size_t& offset,
                      std::size_t& size) override {
    const auto& params = functions.at(f).params;
    if (i >= params.size()) return CUDA_ERROR_INVALID_VALUE;
    offset = params[i].first;
    size = params[i].second;
    return CUDA_SUCCESS;
  }
  CUresult function_name(CUfunction f, std::string& out) override {
    auto it = functions.find(f);
    if (it == functions.end()) return CUDA_ERROR_INVALID_HANDLE;
    out = it->second.name;
    return CUDA_SUCCESS;
  }
  CUresult function_module(CUfunction f, CUmodule& out) override {
    out = functions.at(f).module;
    return CUDA_SUCCESS;
  }
  CUresult module_functions(CUmodule m, std::vector<CUfunction>& out) override {
    auto it = modules.find(m);
    if (it == modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    out = it->second;
    return CUDA_SUCCESS;
  }
  CUresult library_kernels(CUlibrary l, std::vector<CUkernel>& out) override {
    auto it = libraries.find(l);
    if (it == libraries.end()) return CUDA_ERROR_INVALID_HANDLE;
    out = it->second.kernels;
    return CUDA_SUCCESS;
  }
  CUresult kernel_name(CUkernel k, std::string& out) override {
    out = kernels.at(k).first;
    return CUDA_SUCCESS;
  }
  CUresult library_module(CUlibrary l, CUmodule& out) override {
    ++library_module_calls;
    out = libraries.at(l).module;
    return CUDA_SUCCESS;
  }
  CUresult kernel_function(CUkernel k, CUfunction& out) override {
    out = kernels.at(k).second;
    return CUDA_SUCCESS;
  }

  // A module of functions named `names`, each taking (pointer, int).
  CUmodule add_module(std::uintptr_t id, const std::vector<std::string>& names) {
    const auto m = handle<CUmodule>(id);
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto f = handle<CUfunction>(id * 100 + i + 1);
      functions[f] = {names[i], m, {{0, 8}, {8, 4}}};
      modules[m].push_back(f);
    }
    return m;
  }
  CUfunction function(CUmodule m, std::size_t i) { return modules.at(m).at(i); }
  // A library whose module (in the current context) is `m`.
  CUlibrary add_library(std::uintptr_t id, CUmodule m) {
    const auto l = handle<CUlibrary>(id);
    FakeLibrary lib;
    lib.module = m;
    for (CUfunction f : modules.at(m)) {
      const auto k = handle<CUkernel>(id * 1000 + lib.kernels.size() + 1);
      kernels[k] = {functions.at(f).name, f};
      lib.kernels.push_back(k);
    }
    libraries[l] = lib;
    return l;
  }
};

// Parameter values a test passes to a kernel node: kept alive for the node's pointers.
struct KernelArgs {
  std::uint64_t pointer;
  std::int32_t count;
};

class GraphRecorderTest : public ::testing::Test {
 protected:
  FakeDriver driver_;
  std::vector<std::string> notices_;
  GraphRecorder recorder_{driver_, [this](const std::string& m) { notices_.push_back(m); }};
  std::vector<std::unique_ptr<KernelArgs>> args_;
  std::uintptr_t next_node_ = 1;

  static thaw::graphs::RecordedModule image(const std::string& digest_char) {
    return {std::string(64, digest_char[0]), 1234, thaw::graphs::ImageKind::cubin};
  }

  CUgraphNode kernel_node(CUgraph g, CUfunction f, std::uint64_t pointer, std::int32_t count,
                          unsigned grid = 4, unsigned block = 128) {
    const auto n = handle<CUgraphNode>(next_node_++);
    FakeNode node;
    node.type = CU_GRAPH_NODE_TYPE_KERNEL;
    node.kernel.func = f;
    node.kernel.gridDimX = grid;
    node.kernel.gridDimY = node.kernel.gridDimZ = 1;
    node.kernel.blockDimX = block;
    node.kernel.blockDimY = node.kernel.blockDimZ = 1;
    node.kernel.sharedMemBytes = 256;
    args_.push_back(std::make_unique<KernelArgs>(KernelArgs{pointer, count}));
    node.pointers = {&args_.back()->pointer, &args_.back()->count};
    driver_.nodes[n] = node;
    driver_.graphs[g].push_back(n);
    return n;
  }
  CUgraphNode node_of(CUgraph g, FakeNode node) {
    const auto n = handle<CUgraphNode>(next_node_++);
    driver_.nodes[n] = node;
    driver_.graphs[g].push_back(n);
    return n;
  }
  void capture(std::uint64_t id, CUgraph g, std::uint64_t allocations, bool active = true) {
    recorder_.capture_began(id, allocations);
    recorder_.capture_ended(id, g, active);
  }
};

std::vector<std::uint8_t> bytes_of(std::uint64_t pointer, std::int32_t count) {
  std::vector<std::uint8_t> out(12);
  std::memcpy(out.data(), &pointer, 8);
  std::memcpy(out.data() + 8, &count, 4);
  return out;
}

TEST_F(GraphRecorderTest, RecordsNodesParametersAndEdgesOfAModulesKernels) {
  const CUmodule m = driver_.add_module(7, {"_Z6matmulPfi", "_Z4geluPfi"});
  recorder_.module_loaded(m, image("a"));
  const auto g = handle<CUgraph>(1);
  const CUgraphNode a = kernel_node(g, driver_.function(m, 0), 0x200000000000, 64, 8, 256);
  FakeNode ms;
  ms.type = CU_GRAPH_NODE_TYPE_MEMSET;
  ms.memset = CUDA_MEMSET_NODE_PARAMS{0x200000200000, 0, 0xff, 4, 1024, 1};
  const CUgraphNode b = node_of(g, ms);
  const CUgraphNode c = kernel_node(g, driver_.function(m, 1), 0x200000400000, 7);
  driver_.nodes[c].priority = 3;
  driver_.edges[g] = {{a, b}, {b, c}, {a, c}};
  capture(11, g, 42);

  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  const auto& graph = record.graphs[0];
  EXPECT_EQ(graph.index, 0u);
  EXPECT_EQ(graph.allocation_index, 42u);
  ASSERT_EQ(graph.nodes.size(), 3u);
  EXPECT_EQ(graph.nodes[0].type, NodeType::kernel);
  EXPECT_EQ(graph.nodes[1].type, NodeType::memset);
  EXPECT_EQ(graph.nodes[2].type, NodeType::kernel);
  const auto& k = *graph.nodes[0].kernel;
  EXPECT_EQ(k.kernel.name, "_Z6matmulPfi");
  EXPECT_EQ(k.kernel.module_digest, std::string(64, 'a'));
  EXPECT_EQ(k.grid, (std::array<std::uint32_t, 3>{8, 1, 1}));
  EXPECT_EQ(k.block, (std::array<std::uint32_t, 3>{256, 1, 1}));
  EXPECT_EQ(k.shared_bytes, 256u);
  EXPECT_EQ(k.params, (std::vector<thaw::graphs::ParamSlot>{{0, 8}, {8, 4}}));
  EXPECT_EQ(k.param_bytes, bytes_of(0x200000000000, 64));
  EXPECT_EQ(graph.nodes[2].kernel->param_bytes, bytes_of(0x200000400000, 7));
  EXPECT_EQ(graph.nodes[2].kernel->priority, 3u);
  const auto& set = *graph.nodes[1].memset;
  EXPECT_EQ(set.dst, 0x200000200000u);
  EXPECT_EQ(set.value, 0xffu);
  EXPECT_EQ(set.element_size, 4u);
  EXPECT_EQ(set.width, 1024u);
  EXPECT_EQ(graph.edges, (std::vector<thaw::graphs::RecordedEdge>{{0, 1}, {1, 2}, {0, 2}}));
  ASSERT_EQ(record.modules.size(), 1u);
  EXPECT_EQ(record.modules[0], image("a"));

  // What the codec writes of it reads back the same, and passes the codec's checks.
  auto full = record;
  full.identity = {"engine", "model", "gpu", "13000"};
  auto back = thaw::graphs::graph_record_from_json(thaw::graphs::graph_record_to_json(full));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, full);

  const auto s = recorder_.stats();
  EXPECT_EQ(s.captured, 1u);
  EXPECT_EQ(s.recorded, 1u);
  EXPECT_EQ(s.nodes, 3u);
  EXPECT_EQ(s.param_bytes, 24u);
  EXPECT_TRUE(notices_.empty());
}

TEST_F(GraphRecorderTest, RecordsTheLaunchAttributesOfAClusterGemm) {
  const CUmodule m = driver_.add_module(7, {"sm90_gemm"});
  recorder_.module_loaded(m, image("a"));
  const auto g = handle<CUgraph>(1);
  const CUgraphNode n = kernel_node(g, driver_.function(m, 0), 0x200000000000, 64, 8, 256);
  auto& attrs = driver_.nodes[n].attributes;
  CUkernelNodeAttrValue v{};
  v.clusterDim = {2, 1, 1};
  attrs[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = v;
  v = {};
  v.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  attrs[CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE] = v;
  v = {};
  v.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  attrs[CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN] = v;
  v = {};
  v.memSyncDomainMap.default_ = 0;
  v.memSyncDomainMap.remote = 1;
  attrs[CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP] = v;
  v = {};
  v.sharedMemCarveout = 100;
  attrs[CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = v;
  v = {};
  attrs[CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW] = v;  // answered, but not set: fine
  driver_.nodes[n].priority = -2;
  capture(11, g, 42);

  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  ASSERT_EQ(record.graphs[0].nodes[0].type, NodeType::kernel);
  const auto& k = *record.graphs[0].nodes[0].kernel;
  EXPECT_EQ(k.cluster, (std::array<std::uint32_t, 3>{2, 1, 1}));
  EXPECT_EQ(k.cluster_scheduling, 1u);
  EXPECT_EQ(k.mem_sync_domain, 1u);
  EXPECT_EQ(k.mem_sync_domain_map, (std::array<std::uint32_t, 2>{0, 1}));
  EXPECT_EQ(k.carveout, 100u);
  EXPECT_EQ(k.priority, static_cast<std::uint32_t>(-2));
  EXPECT_EQ(recorder_.stats().unrestorable_kernels, 0u);
  auto full = record;
  full.identity = {"engine", "model", "gpu", "13000"};
  auto back = thaw::graphs::graph_record_from_json(thaw::graphs::graph_record_to_json(full));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, full);
}

// A driver that answers a carveout of 0 and a cluster of [1, 1, 1] for a node that set none
// (not CUDA's -1 and [0, 0, 0]): those answers are its defaults, probed once per function, kept
// in the record's header; only what differs from them is a node's attribute.
TEST_F(GraphRecorderTest, AttributesAreKeptOnlyWhereTheyDifferFromTheProbedDefaults) {
  driver_.defaults->carveout = 0;
  driver_.defaults->cluster = {1, 1, 1};
  const CUmodule m = driver_.add_module(7, {"plain", "carved"});
  recorder_.module_loaded(m, image("a"));
  const auto g = handle<CUgraph>(1);
  const CUfunction plain = driver_.function(m, 0), carved = driver_.function(m, 1);
  const CUgraphNode a = kernel_node(g, plain, 0x200000000000, 64);
  const CUgraphNode b = kernel_node(g, plain, 0x200000000000, 64);
  const CUgraphNode c = kernel_node(g, carved, 0x200000000000, 64);
  CUkernelNodeAttrValue zero{}, ones{}, half{}, two{};
  zero.sharedMemCarveout = 0;
  ones.clusterDim = {1, 1, 1};
  half.sharedMemCarveout = 50;
  two.clusterDim = {2, 1, 1};
  for (CUgraphNode n : {a, b}) {  // what this driver answers for "not set"
    driver_.nodes[n].attributes[CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = zero;
    driver_.nodes[n].attributes[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = ones;
  }
  driver_.nodes[c].attributes[CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = half;
  driver_.nodes[c].attributes[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = two;
  driver_.edges[g] = {{a, b}, {b, c}};
  capture(11, g, 42);

  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  EXPECT_EQ(record.attribute_defaults, *driver_.defaults);
  const thaw::graphs::KernelNode unset;
  for (int i : {0, 1}) {
    const auto& k = *record.graphs[0].nodes[i].kernel;
    EXPECT_EQ(k.carveout, unset.carveout) << i;
    EXPECT_EQ(k.cluster, unset.cluster) << i;
  }
  const auto& k = *record.graphs[0].nodes[2].kernel;
  EXPECT_EQ(k.carveout, 50u);
  EXPECT_EQ(k.cluster, (std::array<std::uint32_t, 3>{2, 1, 1}));
  EXPECT_EQ(driver_.probes, (std::map<CUfunction, int>{{plain, 1}, {carved, 1}}));
  EXPECT_TRUE(notices_.empty()) << ::testing::PrintToString(notices_);
  // The defaults go through the codec with the record.
  auto full = record;
  full.identity = {"engine", "model", "gpu", "13000"};
  auto back = thaw::graphs::graph_record_from_json(thaw::graphs::graph_record_to_json(full));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(back->attribute_defaults, *driver_.defaults);
}

// A kernel compiled with __cluster_dims__(2, 1, 1) may answer its compile-time cluster on a node
// launched without one: its own probe says so, and its nodes record no cluster (a restore
// setting one would be refused: a compile-time cluster cannot be set at run time), while another
// kernel's node with a cluster of 2 keeps it.
TEST_F(GraphRecorderTest, AClusterIsComparedWithItsOwnFunctionsDefault) {
  const CUmodule m = driver_.add_module(7, {"plain", "compiled_cluster"});
  recorder_.module_loaded(m, image("a"));
  const CUfunction plain = driver_.function(m, 0), compiled = driver_.function(m, 1);
  driver_.per_function[compiled].cluster = {2, 1, 1};
  const auto g = handle<CUgraph>(1);
  const CUgraphNode a = kernel_node(g, plain, 0x200000000000, 64);
  const CUgraphNode b = kernel_node(g, compiled, 0x200000000000, 64);
  CUkernelNodeAttrValue two{};
  two.clusterDim = {2, 1, 1};
  driver_.nodes[a].attributes[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = two;  // set at launch
  driver_.nodes[b].attributes[CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION] = two;  // compile-time
  driver_.edges[g] = {{a, b}};
  capture(11, g, 42);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->cluster, (std::array<std::uint32_t, 3>{2, 1, 1}));
  EXPECT_EQ(record.graphs[0].nodes[1].kernel->cluster, (std::array<std::uint32_t, 3>{0, 0, 0}));
  // The header's defaults are the first function's (the restore does not compare clusters).
  EXPECT_EQ(record.attribute_defaults, thaw::graphs::AttributeDefaults{});
}

// A driver that cannot be probed: CUDA's documented defaults are assumed, and said once.
TEST_F(GraphRecorderTest, ADriverThatCannotBeProbedIsAssumedToAnswerTheDocumentedDefaults) {
  driver_.defaults.reset();
  const CUmodule m = driver_.add_module(7, {"k"});
  recorder_.module_loaded(m, image("a"));
  const auto g = handle<CUgraph>(1);
  kernel_node(g, driver_.function(m, 0), 0x200000000000, 64);
  capture(11, g, 42);
  const auto h = handle<CUgraph>(2);
  kernel_node(h, driver_.function(m, 0), 0x200000000000, 64);
  capture(12, h, 42);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 2u);
  EXPECT_EQ(record.attribute_defaults, thaw::graphs::AttributeDefaults{});
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_NE(notices_[0].find("could not be probed"), std::string::npos) << notices_[0];
}

TEST_F(GraphRecorderTest, AKernelWithAnAttributeTheRecordCannotHoldIsRecordedAsOther) {
  const CUmodule m = driver_.add_module(7, {"k", "windowed"});
  recorder_.module_loaded(m, image("a"));
  const auto g = handle<CUgraph>(1);
  const CUgraphNode a = kernel_node(g, driver_.function(m, 0), 0x200000000000, 64);
  const CUgraphNode b = kernel_node(g, driver_.function(m, 1), 0x200000000000, 64);
  CUkernelNodeAttrValue v{};
  v.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(0x200000000000);
  v.accessPolicyWindow.num_bytes = 1 << 20;
  driver_.nodes[b].attributes[CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW] = v;
  driver_.edges[g] = {{a, b}};
  capture(11, g, 42);

  // The graph is recorded (its shape is the run's), the node as one no restore rebuilds.
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u);
  EXPECT_EQ(record.graphs[0].nodes[0].type, NodeType::kernel);
  EXPECT_EQ(record.graphs[0].nodes[1].type, NodeType::other);
  EXPECT_FALSE(record.graphs[0].nodes[1].kernel.has_value());
  EXPECT_EQ(recorder_.stats().unrestorable_kernels, 1u);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_NE(notices_[0].find("kernel windowed: an access policy window"), std::string::npos)
      << notices_[0];
}

TEST_F(GraphRecorderTest, OnlyTheModulesTheKernelsNameAreInTheRecord) {
  const CUmodule used = driver_.add_module(1, {"used"});
  const CUmodule unused = driver_.add_module(2, {"unused"});
  recorder_.module_loaded(used, image("b"));
  recorder_.module_loaded(unused, image("c"));
  const auto g = handle<CUgraph>(1);
  kernel_node(g, driver_.function(used, 0), 1, 1);
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.modules.size(), 1u);
  EXPECT_EQ(record.modules[0].digest, std::string(64, 'b'));
  EXPECT_EQ(recorder_.stats().modules_loaded, 2u);
}

TEST_F(GraphRecorderTest, ALibrarysModuleIsFoundByItsKernelNamesWithoutLoadingAnything) {
  const CUmodule m = driver_.add_module(3, {"k_a", "k_b", "k_c"});
  const CUmodule other = driver_.add_module(4, {"x"});
  recorder_.library_loaded(driver_.add_library(30, m), image("d"));
  recorder_.library_loaded(driver_.add_library(40, other), image("e"));
  const auto g = handle<CUgraph>(1);
  kernel_node(g, driver_.function(m, 2), 5, 6);
  kernel_node(g, driver_.function(m, 0), 5, 6);
  capture(1, g, 3);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->kernel.module_digest, std::string(64, 'd'));
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->kernel.name, "k_c");
  EXPECT_EQ(driver_.library_module_calls, 0) << "cuLibraryGetModule may load a module";
}

TEST_F(GraphRecorderTest, LibrariesWithTheSameKernelNamesAreToldApartByTheDriver) {
  const CUmodule m1 = driver_.add_module(5, {"same"});
  const CUmodule m2 = driver_.add_module(6, {"same"});
  recorder_.library_loaded(driver_.add_library(50, m1), image("f"));
  recorder_.library_loaded(driver_.add_library(60, m2), image("1"));
  const auto g = handle<CUgraph>(1);
  kernel_node(g, driver_.function(m2, 0), 5, 6);
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u);
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->kernel.module_digest, std::string(64, '1'));
  EXPECT_GT(driver_.library_module_calls, 0);
}

TEST_F(GraphRecorderTest, AKernelNodeNamingACUkernelIsResolvedToItsFunction) {
  const CUmodule m = driver_.add_module(8, {"by_kernel"});
  const CUlibrary l = driver_.add_library(80, m);
  recorder_.library_loaded(l, image("2"));
  const auto g = handle<CUgraph>(1);
  const CUgraphNode n = kernel_node(g, driver_.function(m, 0), 9, 9);
  driver_.nodes[n].kernel.func = nullptr;
  driver_.nodes[n].kernel.kern = driver_.libraries[l].kernels[0];
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->kernel.name, "by_kernel");
}

TEST_F(GraphRecorderTest, ParametersPassedInAnExtraBufferAreRecordedToo) {
  const CUmodule m = driver_.add_module(9, {"packed"});
  recorder_.module_loaded(m, image("3"));
  const auto g = handle<CUgraph>(1);
  const CUgraphNode n = kernel_node(g, driver_.function(m, 0), 0, 0);
  static std::vector<std::uint8_t> buffer = bytes_of(0xabcdef, -1);
  static std::size_t size = buffer.size();
  static void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer.data(),
                          CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  driver_.nodes[n].kernel.extra = extra;
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  EXPECT_EQ(record.graphs[0].nodes[0].kernel->param_bytes, buffer);
}

TEST_F(GraphRecorderTest, OneDimensionalCopiesAreMemcpyNodesOthersAreOther) {
  const auto g = handle<CUgraph>(1);
  FakeNode copy;
  copy.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = 0x200000000000;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = 0x200000100000;
  p.WidthInBytes = 4096;
  p.Height = p.Depth = 1;
  copy.memcpy = p;
  node_of(g, copy);
  p.Height = 4;  // 2-D
  copy.memcpy = p;
  node_of(g, copy);
  FakeNode host;
  host.type = CU_GRAPH_NODE_TYPE_HOST;
  node_of(g, host);
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u) << ::testing::PrintToString(recorder_.omissions());
  const auto& nodes = record.graphs[0].nodes;
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].type, NodeType::memcpy);
  EXPECT_EQ(nodes[0].memcpy->src, 0x200000000000u);
  EXPECT_EQ(nodes[0].memcpy->dst, 0x200000100000u);
  EXPECT_EQ(nodes[0].memcpy->bytes, 4096u);
  EXPECT_EQ(nodes[0].memcpy->src_memory_type, static_cast<std::uint32_t>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(nodes[1].type, NodeType::other);
  EXPECT_FALSE(nodes[1].memcpy.has_value());
  EXPECT_EQ(nodes[2].type, NodeType::host);
  EXPECT_TRUE(record.modules.empty());
}

TEST_F(GraphRecorderTest, AGraphWithAKernelOfAnUnseenModuleIsLeftOutAndSaidWhy) {
  const CUmodule known = driver_.add_module(10, {"known"});
  const CUmodule unseen = driver_.add_module(11, {"_Z6hiddenv"});
  recorder_.module_loaded(known, image("4"));
  const auto g1 = handle<CUgraph>(1), g2 = handle<CUgraph>(2);
  kernel_node(g1, driver_.function(known, 0), 1, 1);
  kernel_node(g1, driver_.function(unseen, 0), 1, 1);
  kernel_node(g2, driver_.function(known, 0), 1, 1);
  capture(1, g1, 5);
  capture(2, g2, 9);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u);
  EXPECT_EQ(record.graphs[0].index, 1u) << "indices are the capture order, gaps and all";
  EXPECT_EQ(record.graphs[0].allocation_index, 9u);
  ASSERT_EQ(recorder_.omissions().size(), 1u);
  EXPECT_NE(recorder_.omissions()[0].find("_Z6hiddenv"), std::string::npos);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_NE(notices_[0].find("not seen loaded"), std::string::npos) << notices_[0];
  EXPECT_EQ(recorder_.stats().captured, 2u);
  EXPECT_EQ(recorder_.stats().recorded, 1u);
  // The same reason again is counted, not said again.
  capture(3, g1, 9);
  EXPECT_EQ(notices_.size(), 1u);
  EXPECT_NE(recorder_.omissions()[0].find("(2 graphs)"), std::string::npos)
      << recorder_.omissions()[0];
}

TEST_F(GraphRecorderTest, NodesTheDriverWillNotDescribeLeaveTheGraphOut) {
  const auto g = handle<CUgraph>(1);
  FakeNode ms;
  ms.type = CU_GRAPH_NODE_TYPE_MEMSET;  // no parameters to be had (the emulator's case)
  node_of(g, ms);
  capture(1, g, 0);
  EXPECT_TRUE(recorder_.record().graphs.empty());
  ASSERT_EQ(recorder_.omissions().size(), 1u);
  EXPECT_NE(recorder_.omissions()[0].find("memset"), std::string::npos);
}

TEST_F(GraphRecorderTest, ACaptureWhoseBeginningWasNotSeenIsLeftOut) {
  const auto g = handle<CUgraph>(1);
  node_of(g, FakeNode{});
  recorder_.capture_ended(77, g, true);
  EXPECT_TRUE(recorder_.record().graphs.empty());
  EXPECT_EQ(recorder_.omissions().size(), 1u);
}

TEST_F(GraphRecorderTest, EdgesOfSeveralPortsBetweenTwoNodesAreOneEdge) {
  const auto g = handle<CUgraph>(1);
  const CUgraphNode a = node_of(g, FakeNode{});
  const CUgraphNode b = node_of(g, FakeNode{});
  driver_.edges[g] = {{a, b}, {a, b}};
  capture(1, g, 0);
  const auto record = recorder_.record();
  ASSERT_EQ(record.graphs.size(), 1u);
  EXPECT_EQ(record.graphs[0].edges.size(), 1u);
  EXPECT_EQ(record.graphs[0].nodes[0].type, NodeType::empty);
}

TEST_F(GraphRecorderTest, AGraphCapturedWhileTheLayoutWasOffIsFlagged) {
  const auto g = handle<CUgraph>(1);
  node_of(g, FakeNode{});
  capture(1, g, 0, true);
  EXPECT_FALSE(recorder_.captured_outside_layout());
  capture(2, g, 0, false);
  EXPECT_TRUE(recorder_.captured_outside_layout());
}

TEST_F(GraphRecorderTest, AForkedChildStartsAfresh) {
  const CUmodule m = driver_.add_module(12, {"k"});
  recorder_.module_loaded(m, image("5"));
  const auto g = handle<CUgraph>(1);
  kernel_node(g, driver_.function(m, 0), 1, 1);
  capture(1, g, 0);
  ASSERT_EQ(recorder_.record().graphs.size(), 1u);
  recorder_.fork_mutex().lock();
  recorder_.reset_after_fork();
  EXPECT_TRUE(recorder_.record().graphs.empty());
  EXPECT_EQ(recorder_.stats().modules_loaded, 0u);
  // The parent's module handles mean nothing in the child.
  capture(2, g, 0);
  EXPECT_TRUE(recorder_.record().graphs.empty());
}

}  // namespace
