// GraphRestore (preload/restore/graph_restore.hpp) with a fake driver and a fake layout: what a
// valid record rebuilds, and each refusal with its code and reason; the background worker: the
// record fetched early, a graph pre-built once its allocation index is reached, checked again
// when it is handed out, discarded when the run changed in between, destroyed when unasked.
#include "preload/restore/graph_restore.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace {

using namespace thaw::preload::restore;
using namespace thaw::graphs;

const std::string kDigest(64, 'a');
constexpr std::uint64_t kBase = 0x2000'0000'0000;

template <typename H>
H handle(std::uintptr_t v) {
  return reinterpret_cast<H>(v);
}

// Records what is built; kernels named "missing" are not in any image.
class FakeDriver : public GraphBuildDriver {
 public:
  CUresult current_context(CUcontext& out) override {
    out = handle<CUcontext>(0xc0);
    return CUDA_SUCCESS;
  }
  CUresult module_function(CUmodule, const char* name, CUfunction& out) override {
    return find(name, out);
  }
  CUresult library_function(CUlibrary, const char* name, CUfunction& out) override {
    return find(name, out);
  }
  CUresult graph_create(CUgraph& out) override {
    out = handle<CUgraph>(0x9);
    ++created;
    return CUDA_SUCCESS;
  }
  CUresult graph_destroy(CUgraph) override {
    ++destroyed;
    return CUDA_SUCCESS;
  }
  CUresult add_kernel_node(CUgraph, const CUDA_KERNEL_NODE_PARAMS& p, CUgraphNode& out) override {
    // The records below have two parameters: a pointer (8 bytes), then a 4-byte scalar.
    std::uint64_t pointer = 0;
    std::uint32_t scalar = 0;
    std::memcpy(&pointer, p.kernelParams[0], sizeof pointer);
    std::memcpy(&scalar, p.kernelParams[1], sizeof scalar);
    const std::vector<std::uint64_t> values{pointer, scalar};
    kernel_params.push_back(values);
    grids.push_back(p.gridDimX);
    return add(out);
  }
  // This run's driver's attribute defaults (nullopt: it cannot be probed); probes counted.
  std::optional<thaw::graphs::AttributeDefaults> defaults;
  int probes = 0;
  CUresult attribute_defaults(CUfunction, const std::vector<thaw::graphs::ParamSlot>&,
                              thaw::graphs::AttributeDefaults& out) override {
    ++probes;
    if (!defaults) return CUDA_ERROR_NOT_SUPPORTED;
    out = *defaults;
    return CUDA_SUCCESS;
  }
  CUresult set_kernel_attribute(CUgraphNode node, CUkernelNodeAttrID id,
                                const CUkernelNodeAttrValue& v) override {
    attributes.push_back({reinterpret_cast<std::uintptr_t>(node) - 1, static_cast<int>(id), v});
    return id == refuse_attribute ? CUDA_ERROR_INVALID_CLUSTER_SIZE : CUDA_SUCCESS;
  }
  CUresult add_memset_node(CUgraph, const CUDA_MEMSET_NODE_PARAMS&, CUcontext,
                           CUgraphNode& out) override {
    return add(out);
  }
  CUresult add_memcpy_node(CUgraph, const CUDA_MEMCPY3D&, CUcontext, CUgraphNode& out) override {
    return add(out);
  }
  CUresult add_empty_node(CUgraph, CUgraphNode& out) override { return add(out); }
  CUresult add_dependency(CUgraph, CUgraphNode from, CUgraphNode to) override {
    edges.emplace_back(reinterpret_cast<std::uintptr_t>(from) - 1,
                       reinterpret_cast<std::uintptr_t>(to) - 1);
    return CUDA_SUCCESS;
  }
  CUresult instantiate(CUgraph, unsigned long long flags, CUgraphExec& out) override {
    instantiated_flags = flags;
    out = exec_handle;
    return instantiate_result;
  }
  CUresult exec_destroy(CUgraphExec exec) override {
    destroyed_execs.push_back(exec);
    return CUDA_SUCCESS;
  }
  CUresult set_current_context(CUcontext ctx) override {
    set_context = ctx;
    return CUDA_SUCCESS;
  }
  CUresult relax_capture_mode() override {
    relaxed = true;
    return CUDA_SUCCESS;
  }

  int created = 0, destroyed = 0;
  std::size_t nodes = 0;
  struct Attribute {
    std::size_t node;
    int id;
    CUkernelNodeAttrValue value;
  };
  std::vector<Attribute> attributes;  // set, in order
  int refuse_attribute = -1;          // this one is refused
  std::vector<std::vector<std::uint64_t>> kernel_params;
  std::vector<unsigned> grids;
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  unsigned long long instantiated_flags = 0;
  CUresult instantiate_result = CUDA_SUCCESS;
  CUgraphExec exec_handle = handle<CUgraphExec>(0xe);
  std::vector<CUgraphExec> destroyed_execs;
  CUcontext set_context = nullptr;
  bool relaxed = false;

 private:
  CUresult find(const char* name, CUfunction& out) {
    if (std::string(name) == "missing") return CUDA_ERROR_NOT_FOUND;
    out = handle<CUfunction>(0xf);
    return CUDA_SUCCESS;
  }
  CUresult add(CUgraphNode& out) {
    out = handle<CUgraphNode>(++nodes);  // node i is handle i + 1
    return CUDA_SUCCESS;
  }
};

RecordedNode kernel(const std::string& name, std::uint64_t pointer, std::uint32_t scalar) {
  KernelNode k;
  k.kernel = {kDigest, name};
  k.grid = {7, 1, 1};
  k.params = {{0, 8}, {8, 4}};
  k.param_bytes.resize(12);
  std::memcpy(k.param_bytes.data(), &pointer, 8);
  std::memcpy(k.param_bytes.data() + 8, &scalar, 4);
  return {NodeType::kernel, k, std::nullopt, std::nullopt};
}

GraphRecord record() {
  GraphRecord r;
  r.identity = {"engine", "model", "gpu", "12080"};
  r.modules = {{kDigest, 100, ImageKind::cubin}};
  RecordedGraph g;
  g.index = 0;
  g.allocation_index = 5;
  g.label = "decode batch=1";
  g.nodes.push_back(kernel("layernorm", kBase + 0x100, 768));
  g.nodes.push_back(
      {NodeType::memset, std::nullopt, MemsetNode{kBase + 0x1000, 0, 0, 4, 16, 1}, std::nullopt});
  g.nodes.push_back(kernel("matmul", kBase + 0x200, 3));
  g.edges = {{0, 1}, {1, 2}};
  r.graphs.push_back(g);
  return r;
}

struct Fixture {
  std::optional<std::string> text = graph_record_to_json(record());
  std::optional<std::string> not_following;
  std::uint64_t allocations = 5;
  int fetches = 0;

  GraphRestoreEnvironment env() {
    GraphRestoreEnvironment e;
    e.identity = [] { return GraphIdentity{"engine", "model", "gpu", "12080"}; };
    e.not_following = [this] { return not_following; };
    e.allocations = [this] { return allocations; };
    // One live allocation: the first 1 MiB of the region; the region is 1 GiB.
    e.in_region = [](std::uint64_t a) { return a >= kBase && a < kBase + (1ull << 30); };
    e.live = [](std::uint64_t a, std::uint64_t n) {
      return a >= kBase && a + n <= kBase + (1u << 20);
    };
    e.fetch = [this](const GraphIdentity&) {
      ++fetches;
      return text;
    };
    return e;
  }
};

TEST(GraphRestore, RebuildsTheRecordedGraphAndInstantiatesIt) {
  Fixture f;
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 1);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  EXPECT_EQ(r.exec, handle<CUgraphExec>(0xe));
  EXPECT_EQ(r.nodes, 3u);
  EXPECT_EQ(r.edges, 2u);
  EXPECT_EQ(d.nodes, 3u);
  EXPECT_EQ(d.edges, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(d.kernel_params[0], (std::vector<std::uint64_t>{kBase + 0x100, 768 | 0ull}));
  EXPECT_EQ(d.grids, (std::vector<unsigned>{7, 7}));
  EXPECT_EQ(d.instantiated_flags, 1u);
  EXPECT_EQ(d.created, 1);
  EXPECT_EQ(d.destroyed, 1) << "the CUgraph goes once instantiated";
  // The record is fetched once; the restored graph is kept for the record stored at exit.
  (void)restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(f.fetches, 1);
  ASSERT_EQ(restore.restored_graphs().size(), 1u);
  EXPECT_EQ(restore.restored_modules().size(), 1u);
}

TEST(GraphRestore, NoRecordOrNoSuchLabelIsNone) {
  Fixture f;
  f.text.reset();
  GraphRestore none(f.env());
  FakeDriver d;
  auto r = none.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::none);
  EXPECT_NE(r.why.find("holds no graphs record"), std::string::npos) << r.why;

  Fixture g;
  GraphRestore restore(g.env());
  restore.module_loaded(handle<CUmodule>(0x12), kDigest);
  r = restore.restore(d, "decode batch=2", 0);
  EXPECT_EQ(r.status, GraphStatus::none);
  EXPECT_EQ(r.why, "thawd's graphs record has no graph labelled \"decode batch=2\"");
  EXPECT_EQ(d.created, 0);
}

TEST(GraphRestore, ACorruptRecordIsRefused) {
  Fixture f;
  f.text = f.text->substr(0, f.text->size() / 2);
  GraphRestore restore(f.env());
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::corrupt);
  EXPECT_NE(r.why.find("thawd's graphs record is refused: record: not JSON"), std::string::npos)
      << r.why;
}

TEST(GraphRestore, ARecordOfAnotherIdentityIsRefused) {
  Fixture f;
  GraphRecord other = record();
  other.identity.driver = "12040";
  f.text = graph_record_to_json(other);
  GraphRestore restore(f.env());
  FakeDriver d;
  EXPECT_EQ(restore.restore(d, "decode batch=1", 0).status, GraphStatus::corrupt);
}

TEST(GraphRestore, ARunThatLeftItsLayoutIsStale) {
  Fixture f;
  f.not_following = "the allocation sequence left it";
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::stale);
  EXPECT_EQ(r.why, "this run does not follow its layout record: the allocation sequence left it");
  EXPECT_EQ(d.created, 0);
}

TEST(GraphRestore, AnotherAllocationIndexIsAMismatch) {
  Fixture f;
  f.allocations = 6;
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(r.why, "the graph was captured after 5 allocations, this run has made 6");
}

TEST(GraphRestore, AKernelOfAnImageNotLoadedOrNotInItIsAMismatch) {
  Fixture f;
  GraphRestore unloaded(f.env());
  FakeDriver d;
  auto r = unloaded.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(r.why, "node 0: kernel layernorm is of a module image (sha256 " + kDigest +
                       ") this run has not loaded");

  GraphRecord missing = record();
  missing.graphs[0].nodes[2] = kernel("missing", kBase, 1);
  f.text = graph_record_to_json(missing);
  GraphRestore restore(f.env());
  restore.module_loaded(handle<CUmodule>(0x12), kDigest);
  r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_NE(r.why.find("node 2: kernel missing is not in the loaded module image"),
            std::string::npos)
      << r.why;
  EXPECT_EQ(d.created, 0) << "refused before anything is built";
}

TEST(GraphRestore, APointerOutsideTheLiveAllocationsIsAMismatch) {
  Fixture f;
  GraphRecord outside = record();
  outside.graphs[0].nodes[2] = kernel("matmul", kBase + (2u << 20), 3);  // in the region, freed
  f.text = graph_record_to_json(outside);
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(r.why,
            "node 2 (matmul): parameter 0 is 0x200000200000, in the layout's region but in no "
            "allocation live now");

  // A memset running past the live allocation.
  GraphRecord memset = record();
  memset.graphs[0].nodes[1].memset->width = 1u << 20;
  f.text = graph_record_to_json(memset);
  GraphRestore m(f.env());
  m.library_loaded(handle<CUlibrary>(0x11), kDigest);
  r = m.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_NE(r.why.find("node 1 (memset): 4194304 bytes at 0x200000001000 are not in one live"),
            std::string::npos)
      << r.why;
  // A value outside the region is not a pointer of the layout's: accepted.
  GraphRecord scalar = record();
  scalar.graphs[0].nodes[0] = kernel("layernorm", 0xffff'0000'0000'0000, 1);
  f.text = graph_record_to_json(scalar);
  GraphRestore s(f.env());
  s.library_loaded(handle<CUlibrary>(0x11), kDigest);
  EXPECT_EQ(s.restore(d, "decode batch=1", 0).status, GraphStatus::ok);
  EXPECT_EQ(d.created, 1);
}

TEST(GraphRestore, NodesARestoreCannotRebuildAreAMismatch) {
  Fixture f;
  GraphRecord host = record();
  host.graphs[0].nodes.push_back({NodeType::host, std::nullopt, std::nullopt, std::nullopt});
  f.text = graph_record_to_json(host);
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(r.why, "node 3 is a host node, which a restore does not rebuild");
}

GraphRecord clustered() {
  GraphRecord r = record();
  KernelNode& k = *r.graphs[0].nodes[2].kernel;
  k.grid = {8, 1, 1};
  k.cluster = {2, 1, 1};
  k.cluster_scheduling = 1;
  k.priority = static_cast<std::uint32_t>(-1);
  k.mem_sync_domain = 1;
  k.carveout = 50;
  return r;
}

TEST(GraphRestore, TheRecordedLaunchAttributesAreSetOnTheRebuiltNode) {
  Fixture f;
  f.text = graph_record_to_json(clustered());
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  // Node 0 has none but the defaults: nothing set. Node 2: each one recorded, nothing else.
  ASSERT_EQ(d.attributes.size(), 5u);
  for (const auto& a : d.attributes) EXPECT_EQ(a.node, 2u);
  EXPECT_EQ(d.attributes[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  EXPECT_EQ(d.attributes[0].value.clusterDim.x, 2u);
  EXPECT_EQ(d.attributes[0].value.clusterDim.y, 1u);
  EXPECT_EQ(d.attributes[0].value.clusterDim.z, 1u);
  EXPECT_EQ(d.attributes[1].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
  EXPECT_EQ(d.attributes[1].value.clusterSchedulingPolicyPreference,
            CU_CLUSTER_SCHEDULING_POLICY_SPREAD);
  EXPECT_EQ(d.attributes[2].id, CU_LAUNCH_ATTRIBUTE_PRIORITY);
  EXPECT_EQ(d.attributes[2].value.priority, -1);
  EXPECT_EQ(d.attributes[3].id, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN);
  EXPECT_EQ(d.attributes[3].value.memSyncDomain, CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);
  EXPECT_EQ(d.attributes[4].id, CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT);
  EXPECT_EQ(d.attributes[4].value.sharedMemCarveout, 50u);
}

TEST(GraphRestore, AnAttributeTheDriverRefusesIsAMismatchSayingWhich) {
  Fixture f;
  f.text = graph_record_to_json(clustered());
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  d.refuse_attribute = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_NE(r.why.find("node 2 (matmul): the driver refused its cluster dimension"),
            std::string::npos)
      << r.why;
  EXPECT_EQ(d.destroyed, 1) << "the half-built graph is destroyed";
}

// The record's defaults against this run's driver's (probed once): equal, the graph is rebuilt
// with only the recorded attributes; a cluster default alone may differ (it is the function's);
// another carveout default is a mismatch naming both.
TEST(GraphRestore, ARecordMadeUnderOtherAttributeDefaultsIsAMismatch) {
  auto record = clustered();
  record.attribute_defaults.carveout = 0;
  record.attribute_defaults.cluster = {1, 1, 1};
  Fixture f;
  f.text = graph_record_to_json(record);
  {
    GraphRestore restore(f.env());
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    FakeDriver d;
    d.defaults = thaw::graphs::AttributeDefaults{};
    d.defaults->carveout = 0;
    const auto r = restore.restore(d, "decode batch=1", 0);
    ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
    EXPECT_EQ(d.probes, 1);
    EXPECT_EQ(d.attributes.size(), 5u);  // node 2's, as on a driver with CUDA's defaults
  }
  for (std::optional<thaw::graphs::AttributeDefaults> now :
       {std::optional(thaw::graphs::AttributeDefaults{}),
        std::optional<thaw::graphs::AttributeDefaults>()}) {
    GraphRestore restore(f.env());
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    FakeDriver d;
    d.defaults = now;  // answers -1, or cannot be asked (-1 is assumed)
    const auto r = restore.restore(d, "decode batch=1", 0);
    EXPECT_EQ(r.status, GraphStatus::mismatch);
    EXPECT_NE(r.why.find("other kernel attribute defaults than the recording run's"),
              std::string::npos)
        << r.why;
    EXPECT_NE(r.why.find("recorded cooperative 0, priority 0, cluster scheduling 0, memory sync "
                         "domain 0, map [0, 0], carveout 0; now "),
              std::string::npos)
        << r.why;
    EXPECT_NE(r.why.find("carveout -1"), std::string::npos) << r.why;
    EXPECT_EQ(d.created, 0) << "nothing built";
  }
}

TEST(GraphRestore, AGraphTheDriverWillNotInstantiateIsAMismatch) {
  Fixture f;
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  d.instantiate_result = CUDA_ERROR_INVALID_VALUE;
  const auto r = restore.restore(d, "decode batch=1", 0);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(d.destroyed, 1);
  EXPECT_TRUE(restore.restored_graphs().empty());
}

// --- The background worker ---

// PyTorch's instantiate flags: what the worker guesses before an engine has asked.
constexpr unsigned long long kPyTorchFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
const CUgraphExec kPrebuilt = handle<CUgraphExec>(0xb0);

// The run as the worker sees it from its own thread: atomics.
struct Background {
  std::string text = graph_record_to_json(record());
  std::atomic<bool> left{false};
  std::atomic<std::uint64_t> allocations{4};
  std::atomic<int> fetches{0};
  FakeDriver* worker = nullptr;  // owned by the GraphRestore
  std::mutex log_mutex;
  std::vector<std::string> log;

  GraphRestoreEnvironment env() {
    GraphRestoreEnvironment e;
    e.identity = [] { return GraphIdentity{"engine", "model", "gpu", "12080"}; };
    e.not_following = [this]() -> std::optional<std::string> {
      if (left) return "the allocation sequence left it";
      return std::nullopt;
    };
    e.allocations = [this] { return allocations.load(); };
    e.in_region = [](std::uint64_t a) { return a >= kBase && a < kBase + (1ull << 30); };
    e.live = [](std::uint64_t a, std::uint64_t n) {
      return a >= kBase && a + n <= kBase + (1u << 20);
    };
    e.fetch = [this](const GraphIdentity&) -> std::optional<std::string> {
      ++fetches;
      return text;
    };
    e.worker_driver = [this]() -> std::unique_ptr<GraphBuildDriver> {
      auto d = std::make_unique<FakeDriver>();
      d->exec_handle = kPrebuilt;
      worker = d.get();
      return d;
    };
    e.current_context = [] { return handle<CUcontext>(0xc0); };
    e.log = [this](const std::string& line) {
      std::lock_guard lock(log_mutex);
      log.push_back(line);
    };
    e.poll = std::chrono::microseconds(100);
    return e;
  }
  std::vector<std::string> lines() {
    std::lock_guard lock(log_mutex);
    return log;
  }
};

template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 5000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// The engine as the ABI sees it: it loads its kernels, asks for the ABI, the identity completes.
void start(GraphRestore& restore) {
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  restore.engine_uses_abi();
  restore.identity_known();
}

TEST(GraphRestoreBackground, TheRecordIsFetchedAsSoonAsTheIdentityIsComplete) {
  Background b;
  GraphRestore restore(b.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  restore.identity_known();  // no engine_uses_abi: fetched, nothing pre-built
  ASSERT_TRUE(eventually([&] { return b.fetches == 1; }));
  b.allocations = 5;
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", kPyTorchFlags);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  EXPECT_FALSE(r.prebuilt);
  EXPECT_EQ(b.fetches, 1) << "the request used the record the worker fetched";
  EXPECT_EQ(d.created, 1);
  EXPECT_TRUE(restore.prebuilt_labels().empty());
}

TEST(GraphRestoreBackground, AGraphIsPrebuiltOnceItsIndexIsReachedAndHandedOut) {
  Background b;
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return b.fetches == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(restore.prebuilt_labels().empty()) << "4 allocations: the graph's 5th is ahead";
  b.allocations = 5;  // reached: the worker sees it at its next look
  ASSERT_TRUE(eventually([&] { return !restore.prebuilt_labels().empty(); }));
  EXPECT_EQ(restore.prebuilt_labels(), std::vector<std::string>{"decode batch=1"});
  EXPECT_TRUE(b.worker->relaxed) << "the worker's capture mode is RELAXED";
  EXPECT_EQ(b.worker->set_context, handle<CUcontext>(0xc0)) << "in the engine's context";
  EXPECT_EQ(b.worker->instantiated_flags, kPyTorchFlags);

  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", kPyTorchFlags);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  EXPECT_TRUE(r.prebuilt);
  EXPECT_EQ(r.exec, kPrebuilt);
  EXPECT_EQ(r.nodes, 3u);
  EXPECT_EQ(r.edges, 2u);
  EXPECT_EQ(d.created, 0) << "nothing built on the engine's thread";
  EXPECT_EQ(restore.restored_graphs().size(), 1u);
  // Handed out: not destroyed at shutdown.
  restore.shutdown();
  EXPECT_TRUE(b.worker->destroyed_execs.empty());
  EXPECT_TRUE(d.destroyed_execs.empty());
  // A second request builds anew on the caller's thread.
  const auto again = restore.restore(d, "decode batch=1", kPyTorchFlags);
  ASSERT_EQ(again.status, GraphStatus::ok) << again.why;
  EXPECT_FALSE(again.prebuilt);
  EXPECT_EQ(d.created, 1);
}

TEST(GraphRestoreBackground, APrebuiltGraphIsCheckedAgainWhenAskedFor) {
  Background b;
  b.allocations = 5;
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return !restore.prebuilt_labels().empty(); }));
  b.allocations = 6;  // the engine allocated after the pre-build
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", kPyTorchFlags);
  EXPECT_EQ(r.status, GraphStatus::mismatch);
  EXPECT_EQ(r.why, "the graph was captured after 5 allocations, this run has made 6");
  EXPECT_EQ(d.destroyed_execs, std::vector<CUgraphExec>{kPrebuilt}) << "discarded";
  EXPECT_EQ(d.created, 0);
  EXPECT_TRUE(restore.restored_graphs().empty());
}

TEST(GraphRestoreBackground, APrebuiltGraphIsDiscardedWhenTheRunLeftItsLayout) {
  Background b;
  b.allocations = 5;
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return !restore.prebuilt_labels().empty(); }));
  b.left = true;
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", kPyTorchFlags);
  EXPECT_EQ(r.status, GraphStatus::stale);
  EXPECT_EQ(d.destroyed_execs, std::vector<CUgraphExec>{kPrebuilt});
  bool said = false;
  for (const auto& line : b.lines()) said |= line.find("discarded") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(GraphRestoreBackground, OtherFlagsRebuildOnTheCallersThread) {
  Background b;
  b.allocations = 5;
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return !restore.prebuilt_labels().empty(); }));
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", 0);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  EXPECT_FALSE(r.prebuilt);
  EXPECT_EQ(r.exec, handle<CUgraphExec>(0xe));
  EXPECT_EQ(d.instantiated_flags, 0u);
  EXPECT_EQ(d.destroyed_execs, std::vector<CUgraphExec>{kPrebuilt});
}

TEST(GraphRestoreBackground, NothingIsPrebuiltForAGraphThatDoesNotPassItsChecks) {
  Background b;
  b.allocations = 5;
  GraphRecord bad = record();
  bad.graphs[0].nodes[0] = kernel("layernorm", kBase + (2u << 20), 768);  // not live
  b.text = graph_record_to_json(bad);
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return b.fetches == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(restore.prebuilt_labels().empty());
  EXPECT_EQ(b.worker->created, 0);
}

TEST(GraphRestoreBackground, AnUnaskedGraphIsDestroyedAtShutdown) {
  Background b;
  b.allocations = 5;
  GraphRestore restore(b.env());
  start(restore);
  ASSERT_TRUE(eventually([&] { return !restore.prebuilt_labels().empty(); }));
  restore.shutdown();
  EXPECT_EQ(b.worker->destroyed_execs, std::vector<CUgraphExec>{kPrebuilt});
  restore.shutdown();  // idempotent
  EXPECT_EQ(b.worker->destroyed_execs.size(), 1u);
}

TEST(GraphRestoreBackground, WithoutAWorkerDriverEverythingHappensAtTheRequest) {
  Background b;
  b.allocations = 5;
  GraphRestoreEnvironment e = b.env();
  e.worker_driver = nullptr;
  GraphRestore restore(std::move(e));
  start(restore);
  EXPECT_EQ(b.fetches, 0);
  FakeDriver d;
  const auto r = restore.restore(d, "decode batch=1", kPyTorchFlags);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  EXPECT_FALSE(r.prebuilt);
  EXPECT_EQ(b.fetches, 1);
}

}  // namespace

// --- Transparent restore (transparent_candidate / transparent_take / chain_of) ---

GraphRecord kernel_chain_record(std::uint64_t allocation_index) {
  GraphRecord r = record();
  RecordedGraph& g = r.graphs[0];
  g.allocation_index = allocation_index;
  g.label.clear();  // an engine that never used the ABI
  g.nodes[1] = kernel("gelu", kBase + 0x300, 9);
  return r;
}

TEST(GraphRestoreTransparent, ChainOfAcceptsOnlyASingleConnectedChain) {
  RecordedGraph g;
  g.nodes.resize(3);
  g.edges = {{2, 0}, {0, 1}};
  EXPECT_EQ(GraphRestore::chain_of(g), (std::vector<std::uint32_t>{2, 0, 1}));
  g.edges = {{0, 1}, {0, 2}};  // a fork: two streams
  EXPECT_FALSE(GraphRestore::chain_of(g));
  g.edges = {{0, 2}, {1, 2}};  // a join
  EXPECT_FALSE(GraphRestore::chain_of(g));
  g.edges = {{0, 1}};  // node 2 apart
  EXPECT_FALSE(GraphRestore::chain_of(g));
  g.nodes.resize(1);
  g.edges.clear();
  EXPECT_EQ(GraphRestore::chain_of(g), (std::vector<std::uint32_t>{0}));
  g.nodes.clear();
  EXPECT_FALSE(GraphRestore::chain_of(g)) << "an empty capture has nothing to elide";
}

TEST(GraphRestoreTransparent, AKernelChainAtTheAllocationIndexIsTakenOnceAndBuiltAtTheEnd) {
  Fixture f;
  f.text = graph_record_to_json(kernel_chain_record(5));
  GraphRestore restore(f.env());
  restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
  FakeDriver d;
  // Off: nothing, and no record counted.
  auto off = restore.transparent_candidate(d);
  ASSERT_FALSE(off);
  EXPECT_FALSE(off.error().record);
  restore.enable_transparent(true);
  auto m = restore.transparent_candidate(d);
  ASSERT_TRUE(m) << m.error().why;
  EXPECT_EQ(m->position, 0u);
  EXPECT_EQ(m->chain, (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(m->functions.size(), 3u);
  // Taken: a second capture at the same point finds no unused graph.
  auto again = restore.transparent_candidate(d);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().reason, "allocation index");
  EXPECT_TRUE(again.error().record);
  // The end: built now (no worker), not instantiated (the engine does that).
  auto taken = restore.transparent_take(d, *m);
  ASSERT_TRUE(taken) << taken.error();
  EXPECT_NE(taken->graph, nullptr);
  EXPECT_EQ(taken->exec, nullptr);
  EXPECT_EQ(d.nodes, 3u);
  EXPECT_EQ(d.edges, (std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(d.instantiated_flags, 0u);
}

TEST(GraphRestoreTransparent, RefusalsSayWhy) {
  FakeDriver d;
  {  // another allocation index
    Fixture f;
    f.text = graph_record_to_json(kernel_chain_record(4));
    GraphRestore restore(f.env());
    restore.enable_transparent(true);
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    auto m = restore.transparent_candidate(d);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().reason, "allocation index") << m.error().why;
  }
  {  // a copy from host memory: not elided (only device-to-device copies are)
    Fixture f;
    GraphRecord r = kernel_chain_record(5);
    r.graphs[0].nodes[1] = {
        NodeType::memcpy, std::nullopt, std::nullopt,
        MemcpyNode{kBase, kBase + 0x100, 16, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE}};
    f.text = graph_record_to_json(r);
    GraphRestore restore(f.env());
    restore.enable_transparent(true);
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    auto m = restore.transparent_candidate(d);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().reason, "node kind") << m.error().why;
  }
  {  // a fork: not a chain
    Fixture f;
    GraphRecord r = kernel_chain_record(5);
    r.graphs[0].edges = {{0, 1}, {0, 2}};
    f.text = graph_record_to_json(r);
    GraphRestore restore(f.env());
    restore.enable_transparent(true);
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    auto m = restore.transparent_candidate(d);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().reason, "not a chain") << m.error().why;
  }
  {  // a stale run; a corrupt record
    Fixture f;
    f.text = graph_record_to_json(kernel_chain_record(5));
    f.not_following = "the allocation sequence left it";
    GraphRestore restore(f.env());
    restore.enable_transparent(true);
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    auto m = restore.transparent_candidate(d);
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().reason, "stale") << m.error().why;
    Fixture c;
    c.text = "{\"version\":2,";
    GraphRestore corrupt(c.env());
    corrupt.enable_transparent(true);
    auto k = corrupt.transparent_candidate(d);
    ASSERT_FALSE(k);
    EXPECT_EQ(k.error().reason, "corrupt");
    EXPECT_TRUE(k.error().record);
  }
  {  // pointers no longer live at the end: refused then, with why
    Fixture f;
    f.text = graph_record_to_json(kernel_chain_record(5));
    GraphRestore restore(f.env());
    restore.enable_transparent(true);
    restore.library_loaded(handle<CUlibrary>(0x11), kDigest);
    auto m = restore.transparent_candidate(d);
    ASSERT_TRUE(m) << m.error().why;
    f.not_following = "the layout stopped";
    auto taken = restore.transparent_take(d, *m);
    ASSERT_FALSE(taken);
    EXPECT_NE(taken.error().find("does not follow its layout record"), std::string::npos)
        << taken.error();
  }
}
