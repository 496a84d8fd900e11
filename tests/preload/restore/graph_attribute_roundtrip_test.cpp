// The engine-assisted restore of a kernel node with launch attributes, end to end on the
// emulator (in process, no shim): a stream capture of cuLaunchKernelEx with a cluster of 2 and
// priority -1 is walked by the GraphRecorder (the driver's own queries), written and read back
// by the codec, and rebuilt by GraphRestore (the builder both restores share); the restored
// executable graph describes as the live one (thawEmuDescribeGraphExec, attributes included)
// and computes the same. A record whose cluster was edited to 4 rebuilds with 4: the attribute
// set is the record's, not a default.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/graphs/graph_record.hpp"
#include "emu_kernels_cubins.h"
#include "preload/artifact/graph_recorder.hpp"
#include "preload/restore/graph_restore.hpp"
#include "thaw/emu_inspect.h"

namespace {

using namespace thaw;
using namespace thaw::preload;
using namespace thaw::preload::restore;

#define ASSERT_CU(x) ASSERT_EQ((x), CUDA_SUCCESS) << #x

// The probe of the driver's attribute defaults, on the emulator (as the shim's drivers do it).
CUresult probe(CUfunction f, const std::vector<graphs::ParamSlot>& params,
               graphs::AttributeDefaults& out) {
  KernelNodeProbe p;
  p.graph_create = [](CUgraph& g) { return cuGraphCreate(&g, 0); };
  p.add_kernel_node = [](CUgraph g, const CUDA_KERNEL_NODE_PARAMS& k, CUgraphNode& n) {
    return cuGraphAddKernelNode(&n, g, nullptr, 0, &k);
  };
  p.get_attribute = [](CUgraphNode n, CUkernelNodeAttrID id, CUkernelNodeAttrValue& v) {
    return cuGraphKernelNodeGetAttribute(n, id, &v);
  };
  p.graph_destroy = [](CUgraph g) { return cuGraphDestroy(g); };
  return probe_kernel_node_defaults(p, f, params, out);
}

// The recorder's queries, straight to the driver (the emulator).
class Queries final : public GraphDriver {
 public:
  CUresult graph_nodes(CUgraph g, std::vector<CUgraphNode>& out) override {
    size_t n = 0;
    if (CUresult r = cuGraphGetNodes(g, nullptr, &n); r != CUDA_SUCCESS) return r;
    out.resize(n);
    return n == 0 ? CUDA_SUCCESS : cuGraphGetNodes(g, out.data(), &n);
  }
  CUresult graph_edges(CUgraph g, std::vector<std::pair<CUgraphNode, CUgraphNode>>& out) override {
    size_t n = 0;
    if (CUresult r = cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n); r != CUDA_SUCCESS) return r;
    std::vector<CUgraphNode> from(n), to(n);
    if (n > 0) {
      if (CUresult r = cuGraphGetEdges(g, from.data(), to.data(), nullptr, &n); r != CUDA_SUCCESS)
        return r;
    }
    out.clear();
    for (size_t i = 0; i < n; ++i) out.emplace_back(from[i], to[i]);
    return CUDA_SUCCESS;
  }
  CUresult node_type(CUgraphNode n, CUgraphNodeType& out) override {
    return cuGraphNodeGetType(n, &out);
  }
  CUresult kernel_params(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS& out) override {
    return cuGraphKernelNodeGetParams(n, &out);
  }
  CUresult kernel_attribute(CUgraphNode n, CUkernelNodeAttrID id,
                            CUkernelNodeAttrValue& out) override {
    return cuGraphKernelNodeGetAttribute(n, id, &out);
  }
  CUresult memset_params(CUgraphNode n, CUDA_MEMSET_NODE_PARAMS& out) override {
    return cuGraphMemsetNodeGetParams(n, &out);
  }
  CUresult memcpy_params(CUgraphNode n, CUDA_MEMCPY3D& out) override {
    return cuGraphMemcpyNodeGetParams(n, &out);
  }
  CUresult param_info(CUfunction f, std::size_t i, std::size_t& offset,
                      std::size_t& size) override {
    return cuFuncGetParamInfo(f, i, &offset, &size);
  }
  CUresult function_name(CUfunction f, std::string& out) override {
    const char* name = nullptr;
    CUresult r = cuFuncGetName(&name, f);
    if (r == CUDA_SUCCESS) out = name;
    return r;
  }
  CUresult function_module(CUfunction f, CUmodule& out) override {
    return cuFuncGetModule(&out, f);
  }
  CUresult module_functions(CUmodule, std::vector<CUfunction>&) override {
    return CUDA_ERROR_NOT_SUPPORTED;  // the module is known by handle
  }
  CUresult library_kernels(CUlibrary, std::vector<CUkernel>&) override {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUresult kernel_name(CUkernel, std::string&) override { return CUDA_ERROR_NOT_SUPPORTED; }
  CUresult library_module(CUlibrary, CUmodule&) override { return CUDA_ERROR_NOT_SUPPORTED; }
  CUresult kernel_function(CUkernel k, CUfunction& out) override {
    return cuKernelGetFunction(&out, k);
  }
  CUresult attribute_defaults(CUfunction f, const std::vector<graphs::ParamSlot>& params,
                              graphs::AttributeDefaults& out) override {
    return probe(f, params, out);
  }
};

// The restore's driver, straight to the driver.
class Builder final : public GraphBuildDriver {
 public:
  CUresult current_context(CUcontext& out) override { return cuCtxGetCurrent(&out); }
  CUresult module_function(CUmodule m, const char* name, CUfunction& out) override {
    return cuModuleGetFunction(&out, m, name);
  }
  CUresult library_function(CUlibrary, const char*, CUfunction&) override {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUresult graph_create(CUgraph& out) override { return cuGraphCreate(&out, 0); }
  CUresult graph_destroy(CUgraph g) override { return cuGraphDestroy(g); }
  CUresult add_kernel_node(CUgraph g, const CUDA_KERNEL_NODE_PARAMS& p, CUgraphNode& out) override {
    return cuGraphAddKernelNode(&out, g, nullptr, 0, &p);
  }
  CUresult set_kernel_attribute(CUgraphNode n, CUkernelNodeAttrID id,
                                const CUkernelNodeAttrValue& v) override {
    return cuGraphKernelNodeSetAttribute(n, id, &v);
  }
  CUresult add_memset_node(CUgraph g, const CUDA_MEMSET_NODE_PARAMS& p, CUcontext ctx,
                           CUgraphNode& out) override {
    return cuGraphAddMemsetNode(&out, g, nullptr, 0, &p, ctx);
  }
  CUresult add_memcpy_node(CUgraph g, const CUDA_MEMCPY3D& p, CUcontext ctx,
                           CUgraphNode& out) override {
    return cuGraphAddMemcpyNode(&out, g, nullptr, 0, &p, ctx);
  }
  CUresult add_empty_node(CUgraph g, CUgraphNode& out) override {
    return cuGraphAddEmptyNode(&out, g, nullptr, 0);
  }
  CUresult add_dependency(CUgraph g, CUgraphNode from, CUgraphNode to) override {
    return cuGraphAddDependencies(g, &from, &to, nullptr, 1);
  }
  CUresult instantiate(CUgraph g, unsigned long long flags, CUgraphExec& out) override {
    return cuGraphInstantiateWithFlags(&out, g, flags);
  }
  CUresult attribute_defaults(CUfunction f, const std::vector<graphs::ParamSlot>& params,
                              graphs::AttributeDefaults& out) override {
    return probe(f, params, out);
  }
};

// The emulator's answers for "not set" (THAW_EMU_CARVEOUT_DEFAULT / _CLUSTER_DEFAULT; ctest runs
// this suite a second time with a carveout of 0 and a cluster of [1, 1, 1]).
graphs::AttributeDefaults emulated_defaults() {
  graphs::AttributeDefaults d;
  if (const char* v = std::getenv("THAW_EMU_CARVEOUT_DEFAULT"))
    d.carveout = static_cast<std::uint32_t>(std::atol(v));
  if (const char* v = std::getenv("THAW_EMU_CLUSTER_DEFAULT"); v != nullptr && v[0] == '1')
    d.cluster = {1, 1, 1};
  return d;
}

const std::string kDigest(64, 'c');

class GraphAttributeRoundTrip : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    ASSERT_CU(cuModuleLoadData(&chain_, thaw_cubin_chain().data));
    ASSERT_CU(cuModuleGetFunction(&axpb_, chain_, "axpb"));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuMemAlloc(&x_, kN * sizeof(float)));
  }
  void TearDown() override {
    if (x_ != 0) EXPECT_EQ(cuMemFree(x_), CUDA_SUCCESS);
    if (stream_ != nullptr) EXPECT_EQ(cuStreamDestroy(stream_), CUDA_SUCCESS);
    if (chain_ != nullptr) EXPECT_EQ(cuModuleUnload(chain_), CUDA_SUCCESS);
    if (ctx_ != nullptr) EXPECT_EQ(cuDevicePrimaryCtxRelease(dev_), CUDA_SUCCESS);
  }

  // x = 1, then the exec, then x's sum.
  double Run(CUgraphExec exec) {
    std::vector<float> x(kN, 1.0f);
    EXPECT_EQ(cuMemcpyHtoD(x_, x.data(), kN * sizeof(float)), CUDA_SUCCESS);
    EXPECT_EQ(cuGraphLaunch(exec, stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuMemcpyDtoH(x.data(), x_, kN * sizeof(float)), CUDA_SUCCESS);
    double sum = 0;
    for (float v : x) sum += v;
    return sum;
  }
  static nlohmann::json Describe(CUgraphExec exec) {
    char* text = nullptr;
    if (thawEmuDescribeGraphExec(exec, &text) != CUDA_SUCCESS) return nullptr;
    auto doc = nlohmann::json::parse(text);
    std::free(text);
    return doc;
  }

  static constexpr int kN = 1024;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule chain_ = nullptr;
  CUfunction axpb_ = nullptr;
  CUstream stream_ = nullptr;
  CUdeviceptr x_ = 0;
  float a_ = 2.0f, b_ = 1.0f;
  int n_ = kN;
};

TEST_F(GraphAttributeRoundTrip, AClusterLaunchIsRecordedAndRestoredWithItsAttributes) {
  // The live capture: axpb twice, the second with a cluster of 2 and priority -1.
  CUlaunchAttribute attrs[2]{};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attrs[0].value.clusterDim = {2, 1, 1};
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  attrs[1].value.priority = -1;
  CUlaunchConfig config{};
  config.gridDimX = kN / 128;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream_;
  void* params[] = {&x_, &a_, &b_, &n_};
  CUgraph live = nullptr;
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(cuLaunchKernelEx(&config, axpb_, params, nullptr));
  config.attrs = attrs;
  config.numAttrs = 2;
  ASSERT_CU(cuLaunchKernelEx(&config, axpb_, params, nullptr));
  ASSERT_CU(cuStreamEndCapture(stream_, &live));

  Queries queries;
  GraphRecorder recorder(queries);
  recorder.module_loaded(chain_, {kDigest, 1000, graphs::ImageKind::cubin});
  recorder.label_next_capture("cluster");
  recorder.capture_began(1, 0);
  recorder.capture_ended(1, live, true);
  graphs::GraphRecord record = recorder.record();
  ASSERT_EQ(record.graphs.size(), 1u) << testing::PrintToString(recorder.omissions());
  // The driver's defaults are the record's; the plain launch's node holds none of them (on a
  // driver that answers a carveout of 0 for "not set", a carveout of 0 is not a set one).
  EXPECT_EQ(record.attribute_defaults, emulated_defaults());
  for (const auto& n : record.graphs[0].nodes) {
    ASSERT_TRUE(n.kernel.has_value());
    EXPECT_EQ(n.kernel->carveout, graphs::kCarveoutDefault);
    if (n.kernel->cluster[0] != 2)
      EXPECT_EQ(n.kernel->cluster, (std::array<std::uint32_t, 3>{0, 0, 0}));
  }
  record.identity = {"engine", "model", "gpu", "13000"};
  CUgraphExec live_exec = nullptr;
  ASSERT_CU(cuGraphInstantiateWithFlags(&live_exec, live, 0));
  ASSERT_CU(cuGraphDestroy(live));
  const std::string text = graphs::graph_record_to_json(record);
  ASSERT_NE(text.find(R"("cluster":[2,1,1])"), std::string::npos) << text;

  auto restore_from = [&](const std::string& stored, CUgraphExec& out) {
    GraphRestoreEnvironment env;
    env.identity = [] { return graphs::GraphIdentity{"engine", "model", "gpu", "13000"}; };
    env.not_following = [] { return std::optional<std::string>(); };
    env.allocations = [] { return std::uint64_t{0}; };
    env.in_region = [](std::uint64_t) { return false; };  // no layout: no pointer to check
    env.live = [](std::uint64_t, std::uint64_t) { return true; };
    env.fetch = [stored](const graphs::GraphIdentity&) { return std::optional(stored); };
    GraphRestore restore(env);
    restore.module_loaded(chain_, kDigest);
    Builder builder;
    const GraphRestoreResult r = restore.restore(builder, "cluster", 0);
    out = r.exec;
    return r;
  };
  CUgraphExec restored = nullptr;
  const GraphRestoreResult r = restore_from(text, restored);
  ASSERT_EQ(r.status, GraphStatus::ok) << r.why;
  const nlohmann::json want = Describe(live_exec);
  ASSERT_TRUE(want.is_object());
  EXPECT_EQ(Describe(restored), want);
  bool clustered = false;
  for (const auto& node : want["nodes"]) {
    clustered = clustered || node["cluster"] == nlohmann::json::array({2, 1, 1});
  }
  EXPECT_TRUE(clustered) << want.dump();
  EXPECT_EQ(Run(restored), Run(live_exec));

  // The record's cluster is what the rebuilt node gets.
  graphs::GraphRecord four = record;
  for (auto& n : four.graphs[0].nodes) {
    if (n.kernel && n.kernel->cluster[0] == 2) n.kernel->cluster = {4, 1, 1};
  }
  CUgraphExec restored4 = nullptr;
  const GraphRestoreResult r4 = restore_from(graphs::graph_record_to_json(four), restored4);
  ASSERT_EQ(r4.status, GraphStatus::ok) << r4.why;
  EXPECT_NE(Describe(restored4), want);
  EXPECT_NE(Describe(restored4).dump().find(R"("cluster":[4,1,1])"), std::string::npos);

  // A cluster the driver refuses (the grid of 8 is no multiple of 3): no graph, saying which.
  for (auto& n : four.graphs[0].nodes) {
    if (n.kernel && n.kernel->cluster[0] == 4) n.kernel->cluster = {3, 1, 1};
  }
  CUgraphExec refused = nullptr;
  const GraphRestoreResult r3 = restore_from(graphs::graph_record_to_json(four), refused);
  EXPECT_EQ(r3.status, GraphStatus::mismatch);
  EXPECT_NE(r3.why.find("the driver refused its cluster dimension"), std::string::npos) << r3.why;

  // A record made where the driver answered other defaults: a mismatch that says so (this
  // driver would run the nodes the record left "not set" otherwise).
  graphs::GraphRecord elsewhere = record;
  elsewhere.attribute_defaults.carveout = record.attribute_defaults.carveout == 0 ? 4294967295u : 0;
  CUgraphExec other = nullptr;
  const GraphRestoreResult ro = restore_from(graphs::graph_record_to_json(elsewhere), other);
  EXPECT_EQ(ro.status, GraphStatus::mismatch);
  EXPECT_EQ(other, nullptr);
  EXPECT_NE(ro.why.find("other kernel attribute defaults"), std::string::npos) << ro.why;

  for (CUgraphExec e : {live_exec, restored, restored4}) EXPECT_EQ(cuGraphExecDestroy(e), 0);
}

// The emulator's knobs for other defaults refuse what no driver would answer, naming the variable
// (a typo must not silently leave the documented defaults in place).
TEST(EmulatedAttributeDefaults, AValueNoDriverWouldAnswerFailsCuInitNamingTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the driver not yet read
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_CARVEOUT_DEFAULT", "101", 1);
        std::_Exit(cuInit(0) == CUDA_SUCCESS ? 1 : 0);
      },
      testing::ExitedWithCode(0), "THAW_EMU_CARVEOUT_DEFAULT='101'");
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_CLUSTER_DEFAULT", "2", 1);
        std::_Exit(cuInit(0) == CUDA_SUCCESS ? 1 : 0);
      },
      testing::ExitedWithCode(0), "THAW_EMU_CLUSTER_DEFAULT='2'");
}

}  // namespace
