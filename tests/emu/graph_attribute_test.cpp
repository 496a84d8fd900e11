// Kernel node launch attributes in the emulator: cuLaunchKernelEx with a cluster (and priority,
// memory-sync domain, carveout) is accepted, runs, and a stream capture keeps the attributes on
// the kernel node (cuGraphKernelNodeGetAttribute answers them; thawEmuDescribeGraph lists
// them); cuGraphKernelNodeSetAttribute checks a cluster as the driver does (each dimension at
// least 1, at most 8 CTAs, the grid a whole number of clusters: CUDA_ERROR_INVALID_CLUSTER_SIZE)
// and leaves the node unchanged when it refuses.
// Kernels: tests/emu/kernels/chain.cu (axpb), run by its host twin (THAW_EMU_KERNELS).
#include <cuda.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "emu_kernels_cubins.h"
#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

class GraphAttributes : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuModuleLoadData(&chain_, thaw_cubin_chain().data));
    ASSERT_CU(cuModuleGetFunction(&axpb_, chain_, "axpb"));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuMemAlloc(&x_, kN * sizeof(float)));
    std::vector<float> ones(kN, 1.0f);
    ASSERT_CU(cuMemcpyHtoD(x_, ones.data(), kN * sizeof(float)));
  }
  void TearDown() override {
    if (graph_ != nullptr) EXPECT_CU(cuGraphDestroy(graph_));
    if (x_ != 0) EXPECT_CU(cuMemFree(x_));
    if (stream_ != nullptr) EXPECT_CU(cuStreamDestroy(stream_));
    if (chain_ != nullptr) EXPECT_CU(cuModuleUnload(chain_));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  // axpb(x, 2, 1, n) over 8 blocks of 32 with `attrs`.
  CUresult LaunchEx(std::vector<CUlaunchAttribute> attrs, unsigned grid = 8) {
    CUlaunchConfig config{};
    config.gridDimX = grid;
    config.gridDimY = 1;
    config.gridDimZ = 1;
    config.blockDimX = 32;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.hStream = stream_;
    config.attrs = attrs.data();
    config.numAttrs = static_cast<unsigned>(attrs.size());
    float a = 2.0f, b = 1.0f;
    int n = kN;
    void* params[] = {&x_, &a, &b, &n};
    return cuLaunchKernelEx(&config, axpb_, params, nullptr);
  }

  static CUlaunchAttribute Cluster(unsigned x, unsigned y, unsigned z) {
    CUlaunchAttribute a{};
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = x;
    a.value.clusterDim.y = y;
    a.value.clusterDim.z = z;
    return a;
  }

  // The only node of the graph captured from one LaunchEx.
  CUgraphNode CaptureOne(std::vector<CUlaunchAttribute> attrs) {
    EXPECT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_RELAXED));
    EXPECT_CU(LaunchEx(std::move(attrs)));
    EXPECT_CU(cuStreamEndCapture(stream_, &graph_));
    CUgraphNode node = nullptr;
    size_t count = 1;
    EXPECT_CU(cuGraphGetNodes(graph_, &node, &count));
    EXPECT_EQ(count, 1u);
    return node;
  }

  static constexpr int kN = 256;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule chain_ = nullptr;
  CUfunction axpb_ = nullptr;
  CUstream stream_ = nullptr;
  CUdeviceptr x_ = 0;
  CUgraph graph_ = nullptr;
};

TEST_F(GraphAttributes, LaunchWithAClusterRuns) {
  ASSERT_CU(LaunchEx({Cluster(2, 1, 1)}));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> x(kN);
  ASSERT_CU(cuMemcpyDtoH(x.data(), x_, kN * sizeof(float)));
  for (float v : x) ASSERT_EQ(v, 3.0f);
}

TEST_F(GraphAttributes, LaunchRefusesAClusterTheDriverRefuses) {
  EXPECT_EQ(LaunchEx({Cluster(3, 1, 1)}), CUDA_ERROR_INVALID_CLUSTER_SIZE);       // 8 % 3
  EXPECT_EQ(LaunchEx({Cluster(16, 1, 1)}, 16), CUDA_ERROR_INVALID_CLUSTER_SIZE);  // > 8 CTAs
  EXPECT_EQ(LaunchEx({Cluster(2, 0, 1)}), CUDA_ERROR_INVALID_CLUSTER_SIZE);
  EXPECT_CU(LaunchEx({Cluster(8, 1, 1)}));  // the portable maximum
  EXPECT_CU(cuStreamSynchronize(stream_));
}

TEST_F(GraphAttributes, CaptureKeepsTheLaunchAttributesOnTheNode) {
  CUlaunchAttribute priority{};
  priority.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  priority.value.priority = -1;
  CUlaunchAttribute domain{};
  domain.id = CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
  domain.value.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  CUlaunchAttribute policy{};
  policy.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
  policy.value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  const CUgraphNode node = CaptureOne({Cluster(4, 1, 1), priority, domain, policy});
  ASSERT_NE(node, nullptr);
  CUkernelNodeAttrValue v{};
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v));
  EXPECT_EQ(v.clusterDim.x, 4u);
  EXPECT_EQ(v.clusterDim.y, 1u);
  EXPECT_EQ(v.clusterDim.z, 1u);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  EXPECT_EQ(v.priority, -1);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_MEM_SYNC_DOMAIN, &v));
  EXPECT_EQ(v.memSyncDomain, CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(
      node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &v));
  EXPECT_EQ(v.clusterSchedulingPolicyPreference, CU_CLUSTER_SCHEDULING_POLICY_SPREAD);
  ASSERT_CU(cuGraphKernelNodeGetAttribute(
      node, CU_KERNEL_NODE_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, &v));
  EXPECT_EQ(v.sharedMemCarveout, 0xffffffffu);  // not set: the default

  char* text = nullptr;
  ASSERT_EQ(thawEmuDescribeGraph(graph_, &text), CUDA_SUCCESS);
  const auto doc = nlohmann::json::parse(text);
  std::free(text);
  EXPECT_EQ(doc["nodes"][0]["cluster"], nlohmann::json::array({4, 1, 1}));
  EXPECT_EQ(doc["nodes"][0]["mem_sync_domain"], 1);
  EXPECT_EQ(doc["nodes"][0]["cluster_policy"], 1);
}

TEST_F(GraphAttributes, AnUnsetClusterReadsAsZeros) {
  const CUgraphNode node = CaptureOne({});
  ASSERT_NE(node, nullptr);
  CUkernelNodeAttrValue v{};
  v.clusterDim.x = 7;
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v));
  EXPECT_EQ(v.clusterDim.x, 0u);
  EXPECT_EQ(v.clusterDim.y, 0u);
  EXPECT_EQ(v.clusterDim.z, 0u);
}

TEST_F(GraphAttributes, SetAttributeChecksTheClusterAgainstTheGrid) {
  const CUgraphNode node = CaptureOne({});
  ASSERT_NE(node, nullptr);
  CUkernelNodeAttrValue v{};
  v.clusterDim = {3, 1, 1};  // the grid is 8 blocks
  EXPECT_EQ(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v),
            CUDA_ERROR_INVALID_CLUSTER_SIZE);
  v.clusterDim = {1, 1, 16};
  EXPECT_EQ(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v),
            CUDA_ERROR_INVALID_CLUSTER_SIZE);
  CUkernelNodeAttrValue got{};
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &got));
  EXPECT_EQ(got.clusterDim.x, 0u);  // a refused value changes nothing
  v.clusterDim = {2, 1, 1};
  ASSERT_CU(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v));
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &got));
  EXPECT_EQ(got.clusterDim.x, 2u);
  v = {};
  v.memSyncDomain = static_cast<CUlaunchMemSyncDomain>(5);
  EXPECT_EQ(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_MEM_SYNC_DOMAIN, &v),
            CUDA_ERROR_INVALID_VALUE);
  v = {};
  v.accessPolicyWindow.num_bytes = 4096;
  EXPECT_EQ(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v),
            CUDA_ERROR_NOT_SUPPORTED);

  // The graph runs with its cluster.
  CUgraphExec exec = nullptr;
  ASSERT_CU(cuGraphInstantiate(&exec, graph_, 0));
  ASSERT_CU(cuGraphLaunch(exec, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_CU(cuGraphExecDestroy(exec));
  std::vector<float> x(kN);
  ASSERT_CU(cuMemcpyDtoH(x.data(), x_, kN * sizeof(float)));
  EXPECT_EQ(x[0], 3.0f);
}

}  // namespace
