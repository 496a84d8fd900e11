// Memset and memcpy nodes read and changed through the graph API: cuGraphMemsetNodeGetParams /
// SetParams, cuGraphMemcpyNodeGetParams / SetParams and their executable-graph forms
// cuGraphExecMemsetNodeSetParams / cuGraphExecMemcpyNodeSetParams. thaw's graph recorder reads a
// captured graph's memsets and copies through the getters, so a node made by stream capture must
// answer the parameters of the call it stands for.
//
// Part of the driver-conformance program (tests/emu/conformance): every check holds on NVIDIA's
// driver, by its documentation (CUDA 13 cuda.h, quoted where it decides). What the documentation
// leaves open (the memory types and pitch a captured operation is described with) is checked
// exactly on the emulator only (THAW_EMU_CHECK).
#include <cuda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu_test_support.hpp"

namespace {

CUDA_MEMCPY3D Copy1D(CUmemorytype dst_type, CUdeviceptr dst_dev, void* dst_host,
                     CUmemorytype src_type, CUdeviceptr src_dev, const void* src_host,
                     std::size_t bytes) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = src_type;
  c.srcDevice = src_dev;
  c.srcHost = src_host;
  c.dstMemoryType = dst_type;
  c.dstDevice = dst_dev;
  c.dstHost = dst_host;
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return c;
}

CUDA_MEMSET_NODE_PARAMS Memset(CUdeviceptr dst, unsigned value, unsigned element_size,
                               std::size_t width, std::size_t height = 1, std::size_t pitch = 0) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = element_size;
  p.width = width;
  p.height = height;
  p.pitch = pitch;
  return p;
}

// The address one side of a copy descriptor names: the host pointer for CU_MEMORYTYPE_HOST, the
// device (or unified) address otherwise.
std::uint64_t SrcAddress(const CUDA_MEMCPY3D& p) {
  return p.srcMemoryType == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(p.srcHost)
                                               : p.srcDevice;
}
std::uint64_t DstAddress(const CUDA_MEMCPY3D& p) {
  return p.dstMemoryType == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(p.dstHost)
                                               : p.dstDevice;
}

// The four bytes a memset of `value` with `element_size`-byte elements writes (little endian).
std::uint32_t Pattern(unsigned value, unsigned element_size) {
  switch (element_size) {
    case 1:
      return (value & 0xffu) * 0x01010101u;
    case 2:
      return (value & 0xffffu) * 0x00010001u;
    default:
      return value;
  }
}

class GraphMemoryNodes : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    if (stream_ != nullptr) EXPECT_CU(cuStreamSynchronize(stream_));
    for (CUgraphExec e : execs_) EXPECT_CU(cuGraphExecDestroy(e));
    for (CUgraph g : graphs_) EXPECT_CU(cuGraphDestroy(g));
    if (stream_ != nullptr) EXPECT_CU(cuStreamDestroy(stream_));
    for (CUdeviceptr d : buffers_) EXPECT_CU(cuMemFree(d));
    for (void* h : pinned_) EXPECT_CU(cuMemFreeHost(h));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  // Device memory of `bytes` bytes, all 0xEE.
  CUdeviceptr Buffer(std::size_t bytes) {
    CUdeviceptr d = 0;
    EXPECT_CU(cuMemAlloc(&d, bytes));
    if (d == 0) return 0;
    buffers_.push_back(d);
    EXPECT_CU(cuMemsetD8(d, 0xEE, bytes));
    EXPECT_CU(cuCtxSynchronize());
    return d;
  }
  std::uint8_t* Pinned(std::size_t bytes) {
    void* p = nullptr;
    EXPECT_CU(cuMemAllocHost(&p, bytes));
    if (p != nullptr) pinned_.push_back(p);
    return static_cast<std::uint8_t*>(p);
  }
  std::vector<std::uint8_t> Read(CUdeviceptr d, std::size_t bytes) {
    std::vector<std::uint8_t> out(bytes);
    EXPECT_CU(cuMemcpyDtoH(out.data(), d, bytes));
    return out;
  }
  CUgraph Graph() {
    CUgraph g = nullptr;
    EXPECT_CU(cuGraphCreate(&g, 0));
    if (g != nullptr) graphs_.push_back(g);
    return g;
  }
  CUgraphExec Instantiate(CUgraph g) {
    CUgraphExec e = nullptr;
    EXPECT_CU(cuGraphInstantiate(&e, g, 0));
    if (e != nullptr) execs_.push_back(e);
    return e;
  }
  void Launch(CUgraphExec e) {
    ASSERT_CU(cuGraphLaunch(e, stream_));
    ASSERT_CU(cuStreamSynchronize(stream_));
  }
  CUgraphNode AddMemset(CUgraph g, const CUDA_MEMSET_NODE_PARAMS& p) {
    CUgraphNode n = nullptr;
    EXPECT_CU(cuGraphAddMemsetNode(&n, g, nullptr, 0, &p, ctx_));
    return n;
  }
  CUgraphNode AddMemcpy(CUgraph g, const CUDA_MEMCPY3D& p) {
    CUgraphNode n = nullptr;
    EXPECT_CU(cuGraphAddMemcpyNode(&n, g, nullptr, 0, &p, ctx_));
    return n;
  }
  // The nodes of a graph, in the order the driver lists them.
  std::vector<CUgraphNode> Nodes(CUgraph g) {
    std::size_t n = 0;
    EXPECT_CU(cuGraphGetNodes(g, nullptr, &n));
    std::vector<CUgraphNode> out(n);
    if (n != 0) EXPECT_CU(cuGraphGetNodes(g, out.data(), &n));
    out.resize(n);
    return out;
  }
  CUgraph EndCapture() {
    CUgraph g = nullptr;
    EXPECT_CU(cuStreamEndCapture(stream_, &g));
    if (g != nullptr) graphs_.push_back(g);
    return g;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  std::vector<CUgraph> graphs_;
  std::vector<CUgraphExec> execs_;
  std::vector<CUdeviceptr> buffers_;
  std::vector<void*> pinned_;
};

void ExpectMemsetParams(const CUDA_MEMSET_NODE_PARAMS& got, const CUDA_MEMSET_NODE_PARAMS& want) {
  EXPECT_EQ(got.dst, want.dst);
  EXPECT_EQ(got.value, want.value);
  EXPECT_EQ(got.elementSize, want.elementSize);
  EXPECT_EQ(got.width, want.width);
  EXPECT_EQ(got.height, want.height);
  // "Pitch of destination device pointer. Unused if height is 1".
  if (want.height > 1) {
    EXPECT_EQ(got.pitch, want.pitch);
  }
}

void ExpectCopy1D(const CUDA_MEMCPY3D& got, const CUDA_MEMCPY3D& want) {
  EXPECT_EQ(got.srcMemoryType, want.srcMemoryType);
  EXPECT_EQ(got.dstMemoryType, want.dstMemoryType);
  EXPECT_EQ(SrcAddress(got), SrcAddress(want));
  EXPECT_EQ(DstAddress(got), DstAddress(want));
  EXPECT_EQ(got.WidthInBytes, want.WidthInBytes);
  EXPECT_EQ(got.Height, want.Height);
  EXPECT_EQ(got.Depth, want.Depth);
  EXPECT_EQ(got.srcXInBytes, 0u);
  EXPECT_EQ(got.dstXInBytes, 0u);
  // The emulator hands back the descriptor exactly as it was given.
  THAW_EMU_CHECK(EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0));
}

// "Returns the parameters of memset node hNode": what cuGraphAddMemsetNode was given, 1-D and 2-D.
TEST_F(GraphMemoryNodes, MemsetNodeGetParamsAnswersWhatWasAdded) {
  CUdeviceptr a = Buffer(4096);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  const CUDA_MEMSET_NODE_PARAMS one = Memset(a, 0x5a, 1, 1000);
  const CUDA_MEMSET_NODE_PARAMS two = Memset(a + 1024, 0xBEEF, 2, 64, 4, 256);
  const CUDA_MEMSET_NODE_PARAMS four = Memset(a + 2048, 0x3f800000u, 4, 100);
  CUgraphNode n1 = AddMemset(g, one), n2 = AddMemset(g, two), n4 = AddMemset(g, four);
  ASSERT_NE(n4, nullptr);
  CUDA_MEMSET_NODE_PARAMS got{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(n1, &got));
  ExpectMemsetParams(got, one);
  ASSERT_CU(cuGraphMemsetNodeGetParams(n2, &got));
  ExpectMemsetParams(got, two);
  ASSERT_CU(cuGraphMemsetNodeGetParams(n4, &got));
  ExpectMemsetParams(got, four);
}

// "Sets the parameters of memset node hNode": a getter sees them, and a graph instantiated
// afterwards runs them.
TEST_F(GraphMemoryNodes, MemsetNodeSetParamsRoundTripsAndRuns) {
  constexpr std::size_t kBytes = 1024;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  CUgraphNode n = AddMemset(g, Memset(a, 0x11, 1, kBytes));
  ASSERT_NE(n, nullptr);
  const CUDA_MEMSET_NODE_PARAMS set = Memset(b + 16, 0xA1B2C3D4u, 4, 64);
  ASSERT_CU(cuGraphMemsetNodeSetParams(n, &set));
  CUDA_MEMSET_NODE_PARAMS got{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(n, &got));
  ExpectMemsetParams(got, set);

  // Refused parameters leave the node as it was: "The element size must be 1, 2, or 4 bytes."
  const CUDA_MEMSET_NODE_PARAMS bad = Memset(a, 0, 3, 16);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(n, &bad));
  ASSERT_CU(cuGraphMemsetNodeGetParams(n, &got));
  ExpectMemsetParams(got, set);

  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Launch(e));
  EXPECT_EQ(Read(a, kBytes), std::vector<std::uint8_t>(kBytes, 0xEE)) << "the old target";
  std::vector<std::uint8_t> want(kBytes, 0xEE);
  for (std::size_t i = 0; i < 64; ++i) {
    const std::uint32_t v = 0xA1B2C3D4u;
    std::memcpy(want.data() + 16 + 4 * i, &v, 4);
  }
  EXPECT_EQ(Read(b, kBytes), want);
}

// "Returns the parameters of memcpy node hNode": host-to-device, device-to-device,
// device-to-host and unified descriptors as they were added.
TEST_F(GraphMemoryNodes, MemcpyNodeGetParamsAnswersWhatWasAdded) {
  constexpr std::size_t kBytes = 512;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes);
  std::uint8_t* host = Pinned(kBytes);
  ASSERT_NE(host, nullptr);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  const CUDA_MEMCPY3D up =
      Copy1D(CU_MEMORYTYPE_DEVICE, a, nullptr, CU_MEMORYTYPE_HOST, 0, host, kBytes);
  const CUDA_MEMCPY3D across =
      Copy1D(CU_MEMORYTYPE_DEVICE, b, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, kBytes / 2);
  const CUDA_MEMCPY3D down =
      Copy1D(CU_MEMORYTYPE_HOST, 0, host, CU_MEMORYTYPE_DEVICE, b + 64, nullptr, 100);
  const CUDA_MEMCPY3D unified =
      Copy1D(CU_MEMORYTYPE_UNIFIED, a + 8, nullptr, CU_MEMORYTYPE_UNIFIED, b, nullptr, 24);
  for (const CUDA_MEMCPY3D& want : {up, across, down, unified}) {
    CUgraphNode n = AddMemcpy(g, want);
    ASSERT_NE(n, nullptr);
    CUDA_MEMCPY3D got{};
    ASSERT_CU(cuGraphMemcpyNodeGetParams(n, &got));
    ExpectCopy1D(got, want);
  }
}

TEST_F(GraphMemoryNodes, MemcpyNodeSetParamsRoundTripsAndRuns) {
  constexpr std::size_t kBytes = 256;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes), c = Buffer(kBytes);
  std::uint8_t* host = Pinned(kBytes);
  ASSERT_NE(host, nullptr);
  for (std::size_t i = 0; i < kBytes; ++i) host[i] = static_cast<std::uint8_t>(i);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  CUgraphNode n =
      AddMemcpy(g, Copy1D(CU_MEMORYTYPE_DEVICE, b, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, 64));
  ASSERT_NE(n, nullptr);
  const CUDA_MEMCPY3D set =
      Copy1D(CU_MEMORYTYPE_DEVICE, c + 32, nullptr, CU_MEMORYTYPE_HOST, 0, host, 128);
  ASSERT_CU(cuGraphMemcpyNodeSetParams(n, &set));
  CUDA_MEMCPY3D got{};
  ASSERT_CU(cuGraphMemcpyNodeGetParams(n, &got));
  ExpectCopy1D(got, set);

  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Launch(e));
  EXPECT_EQ(Read(b, kBytes), std::vector<std::uint8_t>(kBytes, 0xEE)) << "the old target";
  std::vector<std::uint8_t> want(kBytes, 0xEE);
  std::copy(host, host + 128, want.begin() + 32);
  EXPECT_EQ(Read(c, kBytes), want);
}

// A node of another type, or no parameter struct: CUDA_ERROR_INVALID_VALUE, nothing changed.
TEST_F(GraphMemoryNodes, WrongNodeTypeAndNullParamsAreInvalidValue) {
  constexpr std::size_t kBytes = 256;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  const CUDA_MEMSET_NODE_PARAMS ms = Memset(a, 7, 1, kBytes);
  const CUDA_MEMCPY3D mc =
      Copy1D(CU_MEMORYTYPE_DEVICE, b, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, kBytes);
  CUgraphNode memset = AddMemset(g, ms), memcpy = AddMemcpy(g, mc), empty = nullptr, host = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
  CUDA_HOST_NODE_PARAMS hp{[](void*) {}, nullptr};
  ASSERT_CU(cuGraphAddHostNode(&host, g, nullptr, 0, &hp));
  ASSERT_NE(memcpy, nullptr);

  CUDA_MEMSET_NODE_PARAMS ms_out{};
  CUDA_MEMCPY3D mc_out{};
  for (CUgraphNode other : {memcpy, empty, host}) {
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeGetParams(other, &ms_out));
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(other, &ms));
  }
  for (CUgraphNode other : {memset, empty, host}) {
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeGetParams(other, &mc_out));
    EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeSetParams(other, &mc));
  }
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeGetParams(memset, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeSetParams(memset, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeGetParams(memcpy, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeSetParams(memcpy, nullptr));

  // Both nodes still hold what they were made with.
  ASSERT_CU(cuGraphMemsetNodeGetParams(memset, &ms_out));
  ExpectMemsetParams(ms_out, ms);
  ASSERT_CU(cuGraphMemcpyNodeGetParams(memcpy, &mc_out));
  ExpectCopy1D(mc_out, mc);

  // The executable-graph forms: a node of the other type is refused too.
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, memcpy, &ms, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, empty, &ms, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemcpyNodeSetParams(e, memset, &mc, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemcpyNodeSetParams(e, host, &mc, ctx_));
}

// Stream capture records each cuMemsetD*Async as a memset node: the getter answers the
// destination, value and size that call was given, and the captured graph writes them.
TEST_F(GraphMemoryNodes, CapturedMemsetsAnswerTheirCallsParameters) {
  constexpr std::size_t kBytes = 4096;
  CUdeviceptr a = Buffer(kBytes);
  struct Call {
    CUdeviceptr dst;
    unsigned value;
    unsigned element_size;
    std::size_t count;
  };
  const Call calls[] = {
      {a, 0x5a, 1, 1000}, {a + 1024, 0xBEEF, 2, 200}, {a + 2048, 0xDEADBEEFu, 4, 300}};
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(calls[0].dst, 0x5a, calls[0].count, stream_));
  ASSERT_CU(cuMemsetD16Async(calls[1].dst, 0xBEEF, calls[1].count, stream_));
  ASSERT_CU(cuMemsetD32Async(calls[2].dst, 0xDEADBEEFu, calls[2].count, stream_));
  CUgraph g = EndCapture();
  ASSERT_NE(g, nullptr);
  const std::vector<CUgraphNode> nodes = Nodes(g);
  ASSERT_EQ(nodes.size(), 3u);

  std::vector<bool> seen(3, false);
  for (CUgraphNode n : nodes) {
    CUgraphNodeType type{};
    ASSERT_CU(cuGraphNodeGetType(n, &type));
    ASSERT_EQ(type, CU_GRAPH_NODE_TYPE_MEMSET);
    CUDA_MEMSET_NODE_PARAMS p{};
    ASSERT_CU(cuGraphMemsetNodeGetParams(n, &p));
    const auto* call = std::find_if(std::begin(calls), std::end(calls),
                                    [&](const Call& c) { return c.dst == p.dst; });
    ASSERT_NE(call, std::end(calls)) << "a memset node of an address no call named";
    seen[call - calls] = true;
    // The same bytes, whatever element size the driver describes them with.
    EXPECT_EQ(p.height, 1u);
    ASSERT_TRUE(p.elementSize == 1 || p.elementSize == 2 || p.elementSize == 4);
    EXPECT_EQ(p.width * p.elementSize, call->count * call->element_size);
    EXPECT_EQ(Pattern(p.value, p.elementSize), Pattern(call->value, call->element_size));
    // The emulator describes the call exactly as it was made.
    THAW_EMU_CHECK(EXPECT_EQ(p.elementSize, call->element_size));
    THAW_EMU_CHECK(EXPECT_EQ(p.width, call->count));
    THAW_EMU_CHECK(EXPECT_EQ(p.value, call->value));
  }
  EXPECT_EQ(seen, std::vector<bool>(3, true));

  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Launch(e));
  std::vector<std::uint8_t> want(kBytes, 0xEE);
  for (const Call& c : calls) {
    const std::uint32_t pattern = Pattern(c.value, c.element_size);
    for (std::size_t i = 0; i < c.count * c.element_size; ++i) {
      want[c.dst - a + i] = static_cast<std::uint8_t>(pattern >> (8 * (i % 4)));
    }
  }
  EXPECT_EQ(Read(a, kBytes), want);
}

// Stream capture records each cuMemcpy*Async as a memcpy node whose descriptor names the call's
// source, destination and size.
TEST_F(GraphMemoryNodes, CapturedCopiesAnswerTheirCallsParameters) {
  constexpr std::size_t kBytes = 1024;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes);
  std::uint8_t* in = Pinned(kBytes);
  std::uint8_t* out = Pinned(kBytes);
  ASSERT_NE(in, nullptr);
  ASSERT_NE(out, nullptr);
  for (std::size_t i = 0; i < kBytes; ++i) in[i] = static_cast<std::uint8_t>(i * 7);
  std::fill(out, out + kBytes, 0);
  const auto host = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  struct Call {
    std::uint64_t dst, src;
    std::size_t bytes;
    CUmemorytype dst_type, src_type;  // what the emulator reports
  };
  const Call calls[] = {
      {a, host(in), 512, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST},           // HtoD
      {b + 100, a, 256, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE},          // DtoD
      {host(out), b + 100, 256, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE},    // DtoH
      {b + 512, a + 256, 128, CU_MEMORYTYPE_UNIFIED, CU_MEMORYTYPE_UNIFIED},  // cuMemcpyAsync
  };
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemcpyHtoDAsync(a, in, 512, stream_));
  ASSERT_CU(cuMemcpyDtoDAsync(b + 100, a, 256, stream_));
  ASSERT_CU(cuMemcpyDtoHAsync(out, b + 100, 256, stream_));
  ASSERT_CU(cuMemcpyAsync(b + 512, a + 256, 128, stream_));
  CUgraph g = EndCapture();
  ASSERT_NE(g, nullptr);
  const std::vector<CUgraphNode> nodes = Nodes(g);
  ASSERT_EQ(nodes.size(), 4u);

  std::vector<bool> seen(4, false);
  for (CUgraphNode n : nodes) {
    CUgraphNodeType type{};
    ASSERT_CU(cuGraphNodeGetType(n, &type));
    ASSERT_EQ(type, CU_GRAPH_NODE_TYPE_MEMCPY);
    CUDA_MEMCPY3D p{};
    ASSERT_CU(cuGraphMemcpyNodeGetParams(n, &p));
    const auto* call = std::find_if(std::begin(calls), std::end(calls), [&](const Call& c) {
      return c.dst == DstAddress(p) && c.src == SrcAddress(p);
    });
    ASSERT_NE(call, std::end(calls)) << "a memcpy node of addresses no call named";
    seen[call - calls] = true;
    EXPECT_EQ(p.WidthInBytes, call->bytes);
    EXPECT_EQ(p.Height, 1u);
    EXPECT_EQ(p.Depth, 1u);
    EXPECT_NE(p.srcMemoryType, CU_MEMORYTYPE_ARRAY);
    EXPECT_NE(p.dstMemoryType, CU_MEMORYTYPE_ARRAY);
    THAW_EMU_CHECK(EXPECT_EQ(p.dstMemoryType, call->dst_type));
    THAW_EMU_CHECK(EXPECT_EQ(p.srcMemoryType, call->src_type));
  }
  EXPECT_EQ(seen, std::vector<bool>(4, true));

  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Launch(e));
  EXPECT_TRUE(std::equal(out, out + 256, in)) << "in[0..256) went up, across and down";
  std::vector<std::uint8_t> got = Read(b, kBytes);
  EXPECT_TRUE(std::equal(got.begin() + 512, got.begin() + 640, in + 256));
}

// A captured memset can be changed before instantiation, as any memset node.
TEST_F(GraphMemoryNodes, CapturedMemsetCanBeSet) {
  constexpr std::size_t kBytes = 256;
  CUdeviceptr a = Buffer(kBytes);
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD8Async(a, 0x01, kBytes, stream_));
  CUgraph g = EndCapture();
  ASSERT_NE(g, nullptr);
  const std::vector<CUgraphNode> nodes = Nodes(g);
  ASSERT_EQ(nodes.size(), 1u);
  const CUDA_MEMSET_NODE_PARAMS set = Memset(a, 0x7f, 1, kBytes / 2);
  ASSERT_CU(cuGraphMemsetNodeSetParams(nodes[0], &set));
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  ASSERT_NO_FATAL_FAILURE(Launch(e));
  std::vector<std::uint8_t> want(kBytes, 0xEE);
  std::fill(want.begin(), want.begin() + kBytes / 2, 0x7f);
  EXPECT_EQ(Read(a, kBytes), want);
}

// cuGraphExecMemsetNodeSetParams: "Both the value and pointer address may be updated"; the graph's
// node is not modified; "changes in height are explicitly rejected", "for 2d memsets, all
// dimension changes are rejected", and "Zero sized operations are not supported".
TEST_F(GraphMemoryNodes, ExecMemsetNodeSetParamsUpdatesValueAndAddressOnly) {
  constexpr std::size_t kBytes = 4096;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  const CUDA_MEMSET_NODE_PARAMS orig = Memset(a, 0x11, 1, 512);
  const CUDA_MEMSET_NODE_PARAMS orig2d = Memset(a + 1024, 0x22, 1, 64, 4, 128);
  CUgraphNode n = AddMemset(g, orig), n2d = AddMemset(g, orig2d);
  ASSERT_NE(n2d, nullptr);
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);

  const CUDA_MEMSET_NODE_PARAMS moved = Memset(b + 64, 0x33, 1, 512);
  ASSERT_CU(cuGraphExecMemsetNodeSetParams(e, n, &moved, ctx_));
  CUDA_MEMSET_NODE_PARAMS got{};
  ASSERT_CU(cuGraphMemsetNodeGetParams(n, &got));
  ExpectMemsetParams(got, orig);  // "hNode is also not modified by this call"

  CUDA_MEMSET_NODE_PARAMS taller = orig;
  taller.height = 2;
  taller.pitch = 512;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, n, &taller, ctx_));
  CUDA_MEMSET_NODE_PARAMS wider2d = orig2d;
  wider2d.width = 32;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, n2d, &wider2d, ctx_));
  CUDA_MEMSET_NODE_PARAMS empty = moved;
  empty.width = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, n, &empty, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemsetNodeSetParams(e, n, nullptr, ctx_));

  ASSERT_NO_FATAL_FAILURE(Launch(e));
  std::vector<std::uint8_t> want_a(kBytes, 0xEE);
  for (std::size_t row = 0; row < 4; ++row) {
    std::fill_n(want_a.begin() + 1024 + row * 128, 64, 0x22);
  }
  EXPECT_EQ(Read(a, kBytes), want_a) << "only the 2-D memset still writes a";
  std::vector<std::uint8_t> want_b(kBytes, 0xEE);
  std::fill_n(want_b.begin() + 64, 512, 0x33);
  EXPECT_EQ(Read(b, kBytes), want_b);
}

// cuGraphExecMemcpyNodeSetParams: new 1-D operands of the same kinds take effect in later
// launches, the graph's node is not modified; "Both the instantiation-time memory operands and
// the memory operands in copyParams must be 1-dimensional. Zero-length operations are not
// supported."
TEST_F(GraphMemoryNodes, ExecMemcpyNodeSetParamsUpdatesOneDimensionalCopies) {
  constexpr std::size_t kBytes = 1024;
  CUdeviceptr a = Buffer(kBytes), b = Buffer(kBytes), c = Buffer(kBytes);
  ASSERT_CU(cuMemsetD8(a, 0x44, kBytes));
  ASSERT_CU(cuCtxSynchronize());
  std::uint8_t* host = Pinned(kBytes);
  ASSERT_NE(host, nullptr);
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);
  const CUDA_MEMCPY3D orig =
      Copy1D(CU_MEMORYTYPE_DEVICE, b, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, 256);
  CUgraphNode n = AddMemcpy(g, orig);
  ASSERT_NE(n, nullptr);
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);

  const CUDA_MEMCPY3D moved =
      Copy1D(CU_MEMORYTYPE_DEVICE, c + 128, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, 512);
  ASSERT_CU(cuGraphExecMemcpyNodeSetParams(e, n, &moved, ctx_));
  CUDA_MEMCPY3D got{};
  ASSERT_CU(cuGraphMemcpyNodeGetParams(n, &got));
  ExpectCopy1D(got, orig);  // "hNode is also not modified by this call"

  CUDA_MEMCPY3D two_d = moved;
  two_d.WidthInBytes = 64;
  two_d.Height = 2;
  two_d.srcPitch = 64;
  two_d.dstPitch = 64;
  two_d.srcHeight = 2;
  two_d.dstHeight = 2;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemcpyNodeSetParams(e, n, &two_d, ctx_));
  CUDA_MEMCPY3D zero = moved;
  zero.WidthInBytes = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemcpyNodeSetParams(e, n, &zero, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecMemcpyNodeSetParams(e, n, nullptr, ctx_));
  // The emulator also refuses a side that changes between host and device memory ("the memory
  // operands' mappings changed"); a driver may take it.
  const CUDA_MEMCPY3D to_host =
      Copy1D(CU_MEMORYTYPE_HOST, 0, host, CU_MEMORYTYPE_DEVICE, a, nullptr, 256);
  THAW_EMU_CHECK(EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                               cuGraphExecMemcpyNodeSetParams(e, n, &to_host, ctx_)));

  ASSERT_NO_FATAL_FAILURE(Launch(e));
  EXPECT_EQ(Read(b, kBytes), std::vector<std::uint8_t>(kBytes, 0xEE)) << "the old target";
  std::vector<std::uint8_t> want(kBytes, 0xEE);
  std::fill_n(want.begin() + 128, 512, 0x44);
  EXPECT_EQ(Read(c, kBytes), want);
}

// Every entry point is reachable as the CUDA runtime reaches it: cuGetProcAddress with the
// version that introduced it (cudaTypedefs.h: PFN_..._v10000 / _v10020).
TEST_F(GraphMemoryNodes, EntryPointsResolveThroughGetProcAddress) {
  struct Want {
    const char* name;
    int version;
  };
  for (const Want& w :
       {Want{"cuGraphMemsetNodeGetParams", 10000}, Want{"cuGraphMemsetNodeSetParams", 10000},
        Want{"cuGraphMemcpyNodeGetParams", 10000}, Want{"cuGraphMemcpyNodeSetParams", 10000},
        Want{"cuGraphExecMemsetNodeSetParams", 10020},
        Want{"cuGraphExecMemcpyNodeSetParams", 10020}}) {
    for (int version : {w.version, 12000}) {
      void* fn = nullptr;
      CUdriverProcAddressQueryResult status{};
      ASSERT_CU(cuGetProcAddress(w.name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status));
      EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << w.name << " at " << version;
      EXPECT_NE(fn, nullptr) << w.name << " at " << version;
    }
  }
}

// Before cuInit every one of them is CUDA_ERROR_NOT_INITIALIZED (a fresh process).
TEST(GraphMemoryNodesBeforeInit, CallsAreNotInitialized) {
  EXPECT_EXIT(
      {
        CUDA_MEMSET_NODE_PARAMS ms{};
        CUDA_MEMCPY3D mc{};
        bool ok = cuGraphMemsetNodeGetParams(nullptr, &ms) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphMemsetNodeSetParams(nullptr, &ms) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphMemcpyNodeGetParams(nullptr, &mc) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphMemcpyNodeSetParams(nullptr, &mc) == CUDA_ERROR_NOT_INITIALIZED;
        std::_Exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// Nodes of a destroyed graph are stale handles: only the emulator promises to answer them.
TEST_F(GraphMemoryNodes, NodesOfADestroyedGraphAreInvalidValue) {
  THAW_SKIP_UNLESS_EMULATOR("stale handles");
  CUdeviceptr a = Buffer(256);
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode n = AddMemset(g, Memset(a, 1, 1, 256));
  ASSERT_NE(n, nullptr);
  ASSERT_CU(cuGraphDestroy(g));
  CUDA_MEMSET_NODE_PARAMS ms{};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemsetNodeGetParams(n, &ms));
  CUDA_MEMCPY3D mc{};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphMemcpyNodeGetParams(n, &mc));
}

}  // namespace
