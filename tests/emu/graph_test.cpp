// CUDA graphs on the emulator: the acceptance test of emulator part 2 (a captured graph of more
// than 100 kernel launches, inspected node by node, rebuilt node by node from that description
// alone, and replayed bit-identically: the primitive thaw's graph restore stands on), and the
// graph API around it (nodes of every emulated type, edges, kernel node parameters and
// attributes, clone, exec update, DOT output, error codes).
//
// The kernels are real: tests/emu/kernels/chain.cu compiled by nvcc to an sm_90 cubin and
// embedded here; on the emulator they run as their host twins (THAW_EMU_KERNELS). Rules quoted
// from CUDA 13's cuda.h where they are subtle.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emu_kernels_cubins.h"
#include "emu_test_support.hpp"

namespace {

constexpr const char* kAxpb = "axpb";            // axpb(float* x, float a, float b, int n)
constexpr const char* kAddInto = "add_into";     // add_into(float* dst, const float* src, int n)
constexpr const char* kNoTwin = "no_twin_fill";  // samples.cu; deliberately has no host twin

// An entry point the CUDA 13 header no longer names (it maps the plain name to a newer
// version), as an application built against an older header calls it.
template <class Fn>
Fn Symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// CPU references of the chain kernels, rounding as the device does (nvcc contracts
// a * x + b into one FFMA).
void CpuAxpb(std::vector<float>& x, float a, float b) {
  for (float& v : x) v = std::fma(a, v, b);
}
void CpuAddInto(std::vector<float>& dst, const std::vector<float>& src) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

// A context (the primary one, as the runtime uses) with chain.cu and samples.cu loaded, and a
// non-blocking stream.
class Graphs : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuModuleLoadData(&chain_, thaw_cubin_chain().data));
    ASSERT_CU(cuModuleLoadData(&samples_, thaw_cubin_samples().data));
    ASSERT_CU(cuModuleGetFunction(&axpb_, chain_, kAxpb));
    ASSERT_CU(cuModuleGetFunction(&add_into_, chain_, kAddInto));
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    if (stream_ != nullptr) EXPECT_CU(cuStreamSynchronize(stream_));
    for (CUgraphExec e : execs_) EXPECT_CU(cuGraphExecDestroy(e));
    for (CUgraph g : graphs_) EXPECT_CU(cuGraphDestroy(g));
    for (CUevent e : events_) EXPECT_CU(cuEventDestroy(e));
    if (stream_ != nullptr) EXPECT_CU(cuStreamDestroy(stream_));
    for (CUdeviceptr d : buffers_) EXPECT_CU(cuMemFree(d));
    for (void* h : pinned_) EXPECT_CU(cuMemFreeHost(h));
    if (chain_ != nullptr) EXPECT_CU(cuModuleUnload(chain_));
    if (samples_ != nullptr) EXPECT_CU(cuModuleUnload(samples_));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  // Owned by the fixture: freed / destroyed in TearDown.
  CUdeviceptr Buffer(const std::vector<float>& init) {
    CUdeviceptr d = 0;
    EXPECT_CU(cuMemAlloc(&d, init.size() * sizeof(float)));
    if (d == 0) return 0;
    buffers_.push_back(d);
    EXPECT_CU(cuMemcpyHtoD(d, init.data(), init.size() * sizeof(float)));
    return d;
  }
  CUgraph Graph() {
    CUgraph g = nullptr;
    EXPECT_CU(cuGraphCreate(&g, 0));
    if (g != nullptr) graphs_.push_back(g);
    return g;
  }
  CUgraphExec Instantiate(CUgraph g, unsigned long long flags = 0) {
    CUgraphExec e = nullptr;
    EXPECT_CU(cuGraphInstantiate(&e, g, flags));
    if (e != nullptr) execs_.push_back(e);
    return e;
  }
  CUevent Event() {
    CUevent e = nullptr;
    EXPECT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
    if (e != nullptr) events_.push_back(e);
    return e;
  }
  template <class T = float>
  T* Pinned(std::size_t count) {
    void* p = nullptr;
    EXPECT_CU(cuMemAllocHost(&p, count * sizeof(T)));
    if (p != nullptr) pinned_.push_back(p);
    return static_cast<T*>(p);
  }
  std::vector<float> Read(CUdeviceptr d, std::size_t n) {
    std::vector<float> out(n);
    EXPECT_CU(cuMemcpyDtoH(out.data(), d, n * sizeof(float)));
    return out;
  }
  void Write(CUdeviceptr d, const std::vector<float>& v) {
    EXPECT_CU(cuMemcpyHtoD(d, v.data(), v.size() * sizeof(float)));
  }

  // Kernel node parameters for axpb / add_into over n elements. The pointed-to values live
  // in the returned object, which must outlive the call that copies them.
  struct AxpbArgs {
    CUdeviceptr x;
    float a, b;
    int n;
    void* ptrs[4] = {&x, &a, &b, &n};
  };
  struct AddArgs {
    CUdeviceptr dst, src;
    int n;
    void* ptrs[3] = {&dst, &src, &n};
  };
  CUDA_KERNEL_NODE_PARAMS KernelParams(CUfunction f, unsigned n, void** args) {
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = f;
    p.gridDimX = (n + 127) / 128;
    p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 128;
    p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = args;
    return p;
  }
  CUgraphNode AddAxpb(CUgraph g, std::vector<CUgraphNode> deps, CUdeviceptr x, float a, float b,
                      int n) {
    AxpbArgs args{x, a, b, n};
    CUDA_KERNEL_NODE_PARAMS p = KernelParams(axpb_, n, args.ptrs);
    CUgraphNode node = nullptr;
    EXPECT_CU(cuGraphAddKernelNode(&node, g, deps.data(), deps.size(), &p));
    return node;
  }
  CUgraphNode AddAddInto(CUgraph g, std::vector<CUgraphNode> deps, CUdeviceptr dst, CUdeviceptr src,
                         int n) {
    AddArgs args{dst, src, n};
    CUDA_KERNEL_NODE_PARAMS p = KernelParams(add_into_, n, args.ptrs);
    CUgraphNode node = nullptr;
    EXPECT_CU(cuGraphAddKernelNode(&node, g, deps.data(), deps.size(), &p));
    return node;
  }

  std::vector<CUgraphNode> Nodes(CUgraph g) {
    size_t count = 0;
    EXPECT_CU(cuGraphGetNodes(g, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    EXPECT_CU(cuGraphGetNodes(g, nodes.data(), &count));
    nodes.resize(count);
    return nodes;
  }
  std::vector<std::pair<CUgraphNode, CUgraphNode>> Edges(CUgraph g) {
    size_t count = 0;
    EXPECT_CU(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &count));
    std::vector<CUgraphNode> from(count), to(count);
    EXPECT_CU(cuGraphGetEdges(g, from.data(), to.data(), nullptr, &count));
    std::vector<std::pair<CUgraphNode, CUgraphNode>> edges;
    for (size_t i = 0; i < count; ++i) edges.emplace_back(from[i], to[i]);
    return edges;
  }
  CUgraphNodeType Type(CUgraphNode n) {
    CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
    EXPECT_CU(cuGraphNodeGetType(n, &t));
    return t;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule chain_ = nullptr;
  CUmodule samples_ = nullptr;
  CUfunction axpb_ = nullptr;
  CUfunction add_into_ = nullptr;
  CUstream stream_ = nullptr;
  std::vector<CUgraphExec> execs_;
  std::vector<CUgraph> graphs_;
  std::vector<CUevent> events_;
  std::vector<CUdeviceptr> buffers_;
  std::vector<void*> pinned_;
};

// =============================================================================================
// Acceptance: capture, inspect, rebuild node by node, replay bit-identically
// =============================================================================================

// What graph restore keeps of a kernel node: enough to rebuild it in another process.
struct KernelNodeDesc {
  std::string name;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  std::vector<std::size_t> offsets;
  std::vector<std::vector<unsigned char>> params;  // each parameter's bytes
};
struct GraphDesc {
  std::vector<KernelNodeDesc> nodes;
  std::vector<std::pair<std::size_t, std::size_t>> edges;  // (from, to) indices into nodes
};

// One launch of the captured sequence, as the test issued it.
struct Launch {
  bool axpb;
  bool x_is_acc;  // axpb on acc (else on x); add_into: into x from acc (else into acc from x)
  float a, b;
  unsigned block;
  bool via_extra;
};

// The sequence: axpb and add_into alternating over two buffers with varying a/b and block
// sizes, every 7th launch through the `extra` buffer form. a is kept in [0.25, 0.6] so the
// values stay bounded over 128 launches.
std::vector<Launch> LaunchSequence(int count) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> ad(0.25f, 0.6f), bd(-1.0f, 1.0f);
  std::vector<Launch> seq;
  for (int i = 0; i < count; ++i) {
    Launch l{};
    l.axpb = i % 2 == 0;
    l.x_is_acc = (i / 2) % 2 == 1;
    l.a = ad(gen);
    l.b = bd(gen);
    l.block = (i % 3 == 0) ? 256 : 128;
    l.via_extra = i % 7 == 3;
    seq.push_back(l);
  }
  return seq;
}

// "Kernel parameters can also be packaged by the application into a single buffer that is
// passed in via the extra parameter. This places the burden on the application of knowing
// each kernel parameter's size and alignment/padding within the buffer."
// axpb: pointer at 0, floats at 8 and 12, int at 16; add_into: pointers at 0 and 8, int at 16.
CUresult LaunchOne(CUfunction f, const Launch& l, CUdeviceptr x, CUdeviceptr acc, int n,
                   CUstream s) {
  const unsigned grid = (n + l.block - 1) / l.block;
  alignas(8) unsigned char buf[20] = {};
  std::size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  if (l.axpb) {
    CUdeviceptr target = l.x_is_acc ? acc : x;
    float a = l.a, b = l.b;
    int count = n;
    if (l.via_extra) {
      std::memcpy(buf + 0, &target, 8);
      std::memcpy(buf + 8, &a, 4);
      std::memcpy(buf + 12, &b, 4);
      std::memcpy(buf + 16, &count, 4);
      return cuLaunchKernel(f, grid, 1, 1, l.block, 1, 1, 0, s, nullptr, extra);
    }
    void* params[] = {&target, &a, &b, &count};
    return cuLaunchKernel(f, grid, 1, 1, l.block, 1, 1, 0, s, params, nullptr);
  }
  CUdeviceptr dst = l.x_is_acc ? x : acc, src = l.x_is_acc ? acc : x;
  int count = n;
  if (l.via_extra) {
    std::memcpy(buf + 0, &dst, 8);
    std::memcpy(buf + 8, &src, 8);
    std::memcpy(buf + 16, &count, 4);
    return cuLaunchKernel(f, grid, 1, 1, l.block, 1, 1, 0, s, nullptr, extra);
  }
  void* params[] = {&dst, &src, &count};
  return cuLaunchKernel(f, grid, 1, 1, l.block, 1, 1, 0, s, params, nullptr);
}

// Reads a kernel node into its description. The parameter count is found the way graph
// restore finds it: cuFuncGetParamInfo until "paramIndex must be less than the number of
// parameters that func takes" fails with CUDA_ERROR_INVALID_VALUE.
void DescribeKernelNode(CUgraphNode node, KernelNodeDesc& d) {
  CUDA_KERNEL_NODE_PARAMS p{};
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &p));
  ASSERT_NE(p.func, nullptr);
  const char* name = nullptr;
  ASSERT_CU(cuFuncGetName(&name, p.func));
  ASSERT_NE(name, nullptr);
  d.name = name;
  d.grid[0] = p.gridDimX, d.grid[1] = p.gridDimY, d.grid[2] = p.gridDimZ;
  d.block[0] = p.blockDimX, d.block[1] = p.blockDimY, d.block[2] = p.blockDimZ;
  d.shared = p.sharedMemBytes;
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    CUresult r = cuFuncGetParamInfo(p.func, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    ASSERT_EQ(r, CUDA_SUCCESS) << thaw::test::cu_error_name(r);
    ASSERT_LT(i, 64u) << "cuFuncGetParamInfo never reports the end of the parameters";
    d.offsets.push_back(offset);
    sizes.push_back(size);
  }
  // "The params will contain either kernelParams or extra, according to which of these was
  // most recently set on the node."
  const unsigned char* bank = nullptr;
  if (p.kernelParams == nullptr) {
    ASSERT_NE(p.extra, nullptr) << "a kernel node with neither kernelParams nor extra";
    for (std::size_t i = 0; p.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (p.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        bank = static_cast<const unsigned char*>(p.extra[i + 1]);
      }
    }
    ASSERT_NE(bank, nullptr);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto* src = bank != nullptr ? bank + d.offsets[i]
                                      : static_cast<const unsigned char*>(p.kernelParams[i]);
    ASSERT_NE(src, nullptr) << "kernelParams[" << i << "]";
    d.params.emplace_back(src, src + sizes[i]);
  }
}

TEST_F(Graphs, CapturedGraphRebuiltNodeByNodeReplaysBitIdentically) {
  constexpr int kLaunches = 128;
  constexpr int n = 4099;  // not a multiple of any block size: tail threads idle
  const std::vector<float> x0 = thaw::test::random_floats(n, 1),
                           acc0 = thaw::test::random_floats(n, 2);
  CUdeviceptr x = Buffer(x0), acc = Buffer(acc0);
  ASSERT_NE(x, 0u);
  ASSERT_NE(acc, 0u);
  const std::vector<Launch> seq = LaunchSequence(kLaunches);

  // ---- capture -------------------------------------------------------------------------
  ASSERT_CU(cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (const Launch& l : seq) {
    ASSERT_CU(LaunchOne(l.axpb ? axpb_ : add_into_, l, x, acc, n, stream_));
  }
  CUgraph captured = nullptr;
  ASSERT_CU(cuStreamEndCapture(stream_, &captured));
  ASSERT_NE(captured, nullptr);

  // ---- inspect node by node into a host-side description ----------------------------------
  GraphDesc desc;
  std::map<CUgraphNode, std::size_t> index;
  {
    std::vector<CUgraphNode> nodes = Nodes(captured);
    ASSERT_EQ(nodes.size(), std::size_t{kLaunches});
    for (CUgraphNode node : nodes) {
      ASSERT_EQ(Type(node), CU_GRAPH_NODE_TYPE_KERNEL);
      index[node] = desc.nodes.size();
      desc.nodes.emplace_back();
      ASSERT_NO_FATAL_FAILURE(DescribeKernelNode(node, desc.nodes.back()));
    }
    for (auto [from, to] : Edges(captured)) {
      ASSERT_TRUE(index.contains(from) && index.contains(to)) << "an edge to a foreign node";
      desc.edges.emplace_back(index[from], index[to]);
    }
    size_t roots = 0;
    ASSERT_CU(cuGraphGetRootNodes(captured, nullptr, &roots));
    EXPECT_EQ(roots, 1u) << "one stream captures one chain";
  }
  // A single stream captures a chain: kLaunches - 1 edges.
  ASSERT_EQ(desc.edges.size(), std::size_t{kLaunches - 1});

  // The description is what was launched, in launch order along the chain.
  {
    std::map<std::size_t, std::size_t> next;
    std::set<std::size_t> has_pred;
    for (auto [from, to] : desc.edges) {
      ASSERT_FALSE(next.contains(from)) << "node " << from << " has two successors";
      next[from] = to;
      has_pred.insert(to);
    }
    std::size_t cur = 0;
    while (has_pred.contains(cur)) ++cur;  // the root
    for (int i = 0; i < kLaunches; ++i) {
      ASSERT_LT(cur, desc.nodes.size());
      const KernelNodeDesc& d = desc.nodes[cur];
      const Launch& l = seq[i];
      SCOPED_TRACE("launch " + std::to_string(i));
      EXPECT_EQ(d.name, l.axpb ? kAxpb : kAddInto);
      EXPECT_EQ(d.grid[0], (n + l.block - 1) / l.block);
      EXPECT_EQ(d.grid[1], 1u);
      EXPECT_EQ(d.grid[2], 1u);
      EXPECT_EQ(d.block[0], l.block);
      EXPECT_EQ(d.block[1], 1u);
      EXPECT_EQ(d.block[2], 1u);
      EXPECT_EQ(d.shared, 0u);
      if (l.axpb) {
        // axpb(float* x, float a, float b, int n)
        ASSERT_EQ(d.params.size(), 4u);
        EXPECT_EQ(d.offsets, (std::vector<std::size_t>{0, 8, 12, 16}));
        ASSERT_EQ(d.params[0].size(), 8u);
        ASSERT_EQ(d.params[1].size(), 4u);
        ASSERT_EQ(d.params[2].size(), 4u);
        ASSERT_EQ(d.params[3].size(), 4u);
        CUdeviceptr target = 0;
        float a = 0, b = 0;
        int count = 0;
        std::memcpy(&target, d.params[0].data(), 8);
        std::memcpy(&a, d.params[1].data(), 4);
        std::memcpy(&b, d.params[2].data(), 4);
        std::memcpy(&count, d.params[3].data(), 4);
        EXPECT_EQ(target, l.x_is_acc ? acc : x);
        EXPECT_EQ(a, l.a);
        EXPECT_EQ(b, l.b);
        EXPECT_EQ(count, n);
      } else {
        // add_into(float* dst, const float* src, int n)
        ASSERT_EQ(d.params.size(), 3u);
        EXPECT_EQ(d.offsets, (std::vector<std::size_t>{0, 8, 16}));
        ASSERT_EQ(d.params[0].size(), 8u);
        ASSERT_EQ(d.params[1].size(), 8u);
        ASSERT_EQ(d.params[2].size(), 4u);
        CUdeviceptr dst = 0, src = 0;
        int count = 0;
        std::memcpy(&dst, d.params[0].data(), 8);
        std::memcpy(&src, d.params[1].data(), 8);
        std::memcpy(&count, d.params[2].data(), 4);
        EXPECT_EQ(dst, l.x_is_acc ? x : acc);
        EXPECT_EQ(src, l.x_is_acc ? acc : x);
        EXPECT_EQ(count, n);
      }
      if (i + 1 < kLaunches) {
        ASSERT_TRUE(next.contains(cur)) << "the chain ends early";
        cur = next[cur];
      }
    }
  }

  // Nothing ran during capture.
  EXPECT_TRUE(BitEqual(Read(x, n), x0));
  EXPECT_TRUE(BitEqual(Read(acc, n), acc0));

  // ---- instantiate as PyTorch does, destroy the graph at once, replay ---------------------
  CUgraphExec original = nullptr;
  ASSERT_CU(cuGraphInstantiate(&original, captured,
                               CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                   CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  execs_.push_back(original);
  ASSERT_CU(cuGraphDestroy(captured));
  ASSERT_CU(cuGraphLaunch(original, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  const std::vector<float> out_x = Read(x, n), out_acc = Read(acc, n);

  // The CPU reference.
  std::vector<float> ref_x = x0, ref_acc = acc0;
  for (const Launch& l : seq) {
    if (l.axpb) {
      CpuAxpb(l.x_is_acc ? ref_acc : ref_x, l.a, l.b);
    } else if (l.x_is_acc) {
      CpuAddInto(ref_x, ref_acc);
    } else {
      CpuAddInto(ref_acc, ref_x);
    }
  }
  EXPECT_TRUE(BitEqual(out_x, ref_x)) << "x differs from the CPU reference";
  EXPECT_TRUE(BitEqual(out_acc, ref_acc)) << "acc differs from the CPU reference";
  for (float v : ref_x) ASSERT_TRUE(std::isfinite(v)) << "the sequence overflows";

  // ---- rebuild from the description alone --------------------------------------------------
  CUgraph rebuilt = Graph();
  ASSERT_NE(rebuilt, nullptr);
  std::vector<std::vector<std::size_t>> preds(desc.nodes.size());
  std::vector<std::size_t> indegree(desc.nodes.size(), 0);
  std::vector<std::vector<std::size_t>> succs(desc.nodes.size());
  for (auto [from, to] : desc.edges) {
    preds[to].push_back(from);
    succs[from].push_back(to);
    ++indegree[to];
  }
  std::vector<CUgraphNode> made(desc.nodes.size(), nullptr);
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < desc.nodes.size(); ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  std::size_t added = 0;
  while (!ready.empty()) {
    const std::size_t i = ready.back();
    ready.pop_back();
    const KernelNodeDesc& d = desc.nodes[i];
    CUfunction f = nullptr;
    ASSERT_CU(cuModuleGetFunction(&f, chain_, d.name.c_str()));
    std::vector<std::vector<unsigned char>> values = d.params;  // a copy the pointers name
    std::vector<void*> ptrs;
    for (auto& v : values) ptrs.push_back(v.data());
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = f;
    p.gridDimX = d.grid[0], p.gridDimY = d.grid[1], p.gridDimZ = d.grid[2];
    p.blockDimX = d.block[0], p.blockDimY = d.block[1], p.blockDimZ = d.block[2];
    p.sharedMemBytes = d.shared;
    p.kernelParams = ptrs.data();
    std::vector<CUgraphNode> deps;
    for (std::size_t pr : preds[i]) deps.push_back(made[pr]);
    ASSERT_CU(cuGraphAddKernelNode_v2(&made[i], rebuilt, deps.data(), deps.size(), &p));
    ++added;
    for (std::size_t s : succs[i]) {
      if (--indegree[s] == 0) ready.push_back(s);
    }
  }
  ASSERT_EQ(added, desc.nodes.size()) << "the captured edges have a cycle";
  EXPECT_EQ(Edges(rebuilt).size(), desc.edges.size());

  CUgraphExec replay = Instantiate(rebuilt);
  ASSERT_NE(replay, nullptr);
  Write(x, x0);
  Write(acc, acc0);
  ASSERT_CU(cuGraphLaunch(replay, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_TRUE(BitEqual(Read(x, n), out_x)) << "the rebuilt graph's x differs from the capture's";
  EXPECT_TRUE(BitEqual(Read(acc, n), out_acc))
      << "the rebuilt graph's acc differs from the capture's";
}

// =============================================================================================
// Building graphs: node types, dependencies, order
// =============================================================================================

struct HostProbe {
  const float* watched = nullptr;  // pinned memory a D2H node wrote before this node ran
  std::size_t count = 0;
  std::vector<float> seen;
  std::atomic<int> calls{0};
};

void CopyWatched(void* user) {
  auto* probe = static_cast<HostProbe*>(user);
  probe->seen.assign(probe->watched, probe->watched + probe->count);
  probe->calls.fetch_add(1);
}

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

// memcpy H2D ──────────────┐
// memset A=1 ─ axpb(A,2,1) ┴ add_into(A,C) ─ memcpy D2D A→B ─ memcpy D2H B→out ─ host ─ empty ─
// event record
TEST_F(Graphs, NodesOfEveryTypeRunInDependencyOrder) {
  constexpr int n = 1000;
  const std::vector<float> in = thaw::test::random_floats(n, 3);
  CUdeviceptr a = Buffer(std::vector<float>(n, -7.0f)), b = Buffer(std::vector<float>(n, -7.0f)),
              c = Buffer(std::vector<float>(n, -7.0f));
  float* host_in = Pinned(n);
  float* host_out = Pinned(n);
  ASSERT_NE(host_in, nullptr);
  ASSERT_NE(host_out, nullptr);
  std::memcpy(host_in, in.data(), n * sizeof(float));
  std::fill(host_out, host_out + n, -1.0f);
  CUevent done = Event();
  CUgraph g = Graph();
  ASSERT_NE(g, nullptr);

  CUgraphNode h2d = nullptr, set_a = nullptr, scale = nullptr, add = nullptr, d2d = nullptr,
              d2h = nullptr, host = nullptr, empty = nullptr, record = nullptr;
  CUDA_MEMCPY3D up =
      Copy1D(CU_MEMORYTYPE_DEVICE, c, nullptr, CU_MEMORYTYPE_HOST, 0, host_in, n * sizeof(float));
  ASSERT_CU(cuGraphAddMemcpyNode(&h2d, g, nullptr, 0, &up, ctx_));
  CUDA_MEMSET_NODE_PARAMS ms{};
  ms.dst = a;
  ms.value = 0x3f800000u;  // 1.0f
  ms.elementSize = 4;
  ms.width = n;
  ms.height = 1;
  ASSERT_CU(cuGraphAddMemsetNode(&set_a, g, nullptr, 0, &ms, ctx_));
  scale = AddAxpb(g, {set_a}, a, 2.0f, 1.0f, n);  // A = 3
  add = AddAddInto(g, {h2d, scale}, a, c, n);     // A = 3 + in
  CUDA_MEMCPY3D dd =
      Copy1D(CU_MEMORYTYPE_DEVICE, b, nullptr, CU_MEMORYTYPE_DEVICE, a, nullptr, n * sizeof(float));
  ASSERT_CU(cuGraphAddMemcpyNode(&d2d, g, &add, 1, &dd, ctx_));
  CUDA_MEMCPY3D down =
      Copy1D(CU_MEMORYTYPE_HOST, 0, host_out, CU_MEMORYTYPE_DEVICE, b, nullptr, n * sizeof(float));
  ASSERT_CU(cuGraphAddMemcpyNode(&d2h, g, &d2d, 1, &down, ctx_));
  HostProbe probe;
  probe.watched = host_out;
  probe.count = n;
  CUDA_HOST_NODE_PARAMS hp{CopyWatched, &probe};
  ASSERT_CU(cuGraphAddHostNode(&host, g, &d2h, 1, &hp));
  ASSERT_CU(cuGraphAddEmptyNode(&empty, g, &host, 1));
  ASSERT_CU(cuGraphAddEventRecordNode(&record, g, &empty, 1, done));

  EXPECT_EQ(Type(h2d), CU_GRAPH_NODE_TYPE_MEMCPY);
  EXPECT_EQ(Type(set_a), CU_GRAPH_NODE_TYPE_MEMSET);
  EXPECT_EQ(Type(scale), CU_GRAPH_NODE_TYPE_KERNEL);
  EXPECT_EQ(Type(d2d), CU_GRAPH_NODE_TYPE_MEMCPY);
  EXPECT_EQ(Type(host), CU_GRAPH_NODE_TYPE_HOST);
  EXPECT_EQ(Type(empty), CU_GRAPH_NODE_TYPE_EMPTY);
  EXPECT_EQ(Type(record), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  EXPECT_EQ(Nodes(g).size(), 9u);
  EXPECT_EQ(Edges(g).size(), 8u);

  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  // Nothing runs before the launch.
  EXPECT_EQ(probe.calls.load(), 0);
  EXPECT_EQ(host_out[0], -1.0f);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  // "Each launch of the graph will record event to capture execution of the node's
  // dependencies."
  ASSERT_CU(cuEventSynchronize(done));
  EXPECT_EQ(probe.calls.load(), 1);
  ASSERT_CU(cuStreamSynchronize(stream_));

  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[i] = std::fma(2.0f, 1.0f, 1.0f) + in[i];
  EXPECT_TRUE(BitEqual(std::vector<float>(host_out, host_out + n), want));
  EXPECT_TRUE(BitEqual(probe.seen, want)) << "the host node ran before the D2H copy finished";
  EXPECT_TRUE(BitEqual(Read(b, n), want));
}

struct Flag {
  std::atomic<int> value{0};
  std::atomic<int> seen{-1};
};
void SleepThenSet(void* user) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  static_cast<Flag*>(user)->value.store(1);
}
void ObserveFlag(void* user) {
  auto* f = static_cast<Flag*>(user);
  f->seen.store(f->value.load());
}

// "The graph node will wait for all work captured in event."
TEST_F(Graphs, EventWaitNodeWaitsForTheEventsWork) {
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent ev = Event();
  Flag flag;
  CUgraph g = Graph();
  CUgraphNode wait = nullptr, host = nullptr;
  ASSERT_CU(cuGraphAddEventWaitNode(&wait, g, nullptr, 0, ev));
  CUDA_HOST_NODE_PARAMS hp{ObserveFlag, &flag};
  ASSERT_CU(cuGraphAddHostNode(&host, g, &wait, 1, &hp));
  EXPECT_EQ(Type(wait), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);

  ASSERT_CU(cuLaunchHostFunc(other, SleepThenSet, &flag));
  ASSERT_CU(cuEventRecord(ev, other));
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(flag.seen.load(), 1) << "the host node ran before the awaited event's work";
  EXPECT_CU(cuStreamSynchronize(other));
  EXPECT_CU(cuStreamDestroy(other));
}

// A diamond: top ─┬─ left ─┬─ bottom; left and right are independent branches.
//                 └─ right ┘
TEST_F(Graphs, DiamondOfIndependentBranchesComputesTheRightResult) {
  constexpr int n = 777;
  const std::vector<float> x0 = thaw::test::random_floats(n, 4),
                           y0 = thaw::test::random_floats(n, 5),
                           z0 = thaw::test::random_floats(n, 6);
  CUdeviceptr x = Buffer(x0), y = Buffer(y0), z = Buffer(z0);
  CUgraph g = Graph();
  CUgraphNode top = AddAxpb(g, {}, x, 1.0f, 1.0f, n);  // x += 1
  CUgraphNode left = AddAddInto(g, {top}, y, x, n);    // y += x
  CUgraphNode right = AddAddInto(g, {top}, z, x, n);   // z += x
  AddAddInto(g, {left, right}, y, z, n);               // y += z

  size_t roots = 0;
  ASSERT_CU(cuGraphGetRootNodes(g, nullptr, &roots));
  EXPECT_EQ(roots, 1u);
  EXPECT_EQ(Edges(g).size(), 4u);

  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> rx = x0, ry = y0, rz = z0;
  CpuAxpb(rx, 1.0f, 1.0f);
  CpuAddInto(ry, rx);
  CpuAddInto(rz, rx);
  CpuAddInto(ry, rz);
  EXPECT_TRUE(BitEqual(Read(x, n), rx));
  EXPECT_TRUE(BitEqual(Read(y, n), ry));
  EXPECT_TRUE(BitEqual(Read(z, n), rz));
}

// "Each launch is ordered behind both any previous work in hStream and any previous launches
// of hGraphExec."
TEST_F(Graphs, RepeatedLaunchesOfOneExecAccumulate) {
  constexpr int n = 300;
  const std::vector<float> x0 = thaw::test::random_floats(n, 7);
  CUdeviceptr x = Buffer(x0), ones = Buffer(std::vector<float>(n, 1.0f));
  CUgraph g = Graph();
  CUgraphNode first = AddAxpb(g, {}, x, 0.5f, 1.0f, n);  // x = x/2 + 1: order-sensitive
  AddAddInto(g, {first}, x, ones, n);                    // x += 1
  CUgraphExec e = Instantiate(g);
  constexpr int kLaunches = 5;
  for (int i = 0; i < kLaunches; ++i) ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> ref = x0;
  for (int i = 0; i < kLaunches; ++i) {
    CpuAxpb(ref, 0.5f, 1.0f);
    CpuAddInto(ref, std::vector<float>(n, 1.0f));
  }
  EXPECT_TRUE(BitEqual(Read(x, n), ref));
}

struct OverlapProbe {
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> calls{0};
};
void DetectOverlap(void* user) {
  auto* p = static_cast<OverlapProbe*>(user);
  if (p->running.fetch_add(1) != 0) p->overlaps.fetch_add(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  p->running.fetch_sub(1);
  p->calls.fetch_add(1);
}

// "Only one instance of hGraphExec may be executing at a time. Each launch is ordered behind
// both any previous work in hStream and any previous launches of hGraphExec."
TEST_F(Graphs, LaunchesOfOneExecOnTwoStreamsDoNotOverlap) {
  CUstream other = nullptr;
  ASSERT_CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  OverlapProbe probe;
  CUgraph g = Graph();
  CUgraphNode host = nullptr;
  CUDA_HOST_NODE_PARAMS hp{DetectOverlap, &probe};
  ASSERT_CU(cuGraphAddHostNode(&host, g, nullptr, 0, &hp));
  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuGraphLaunch(e, other));
  ASSERT_CU(cuStreamSynchronize(other));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(probe.calls.load(), 2);
  EXPECT_EQ(probe.overlaps.load(), 0) << "two launches of one exec ran at the same time";
  EXPECT_CU(cuStreamDestroy(other));
}

// =============================================================================================
// Nodes, roots and edges
// =============================================================================================

// "If numNodes is higher than the actual number of nodes, the remaining entries in nodes will
// be set to NULL, and the number of nodes actually obtained will be returned in numNodes."
TEST_F(Graphs, GetNodesAndRootNodesFillAndNullTheRest) {
  CUgraph g = Graph();
  CUgraphNode a = nullptr, b = nullptr, c = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g, nullptr, 0));
  CUgraphNode ab[] = {a, b};
  ASSERT_CU(cuGraphAddEmptyNode(&c, g, ab, 2));

  size_t count = 0;
  ASSERT_CU(cuGraphGetNodes(g, nullptr, &count));
  EXPECT_EQ(count, 3u);
  CUgraphNode bogus = reinterpret_cast<CUgraphNode>(std::uintptr_t{0x1234});
  std::vector<CUgraphNode> nodes(5, bogus);
  count = nodes.size();
  ASSERT_CU(cuGraphGetNodes(g, nodes.data(), &count));
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(std::set<CUgraphNode>(nodes.begin(), nodes.begin() + 3),
            (std::set<CUgraphNode>{a, b, c}));
  EXPECT_EQ(nodes[3], nullptr);
  EXPECT_EQ(nodes[4], nullptr);
  // Fewer than there are: exactly that many.
  std::vector<CUgraphNode> two(3, bogus);
  count = 2;
  ASSERT_CU(cuGraphGetNodes(g, two.data(), &count));
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(two[2], bogus) << "wrote past numNodes";

  ASSERT_CU(cuGraphGetRootNodes(g, nullptr, &count));
  EXPECT_EQ(count, 2u);
  std::vector<CUgraphNode> roots(4, bogus);
  count = roots.size();
  ASSERT_CU(cuGraphGetRootNodes(g, roots.data(), &count));
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(std::set<CUgraphNode>(roots.begin(), roots.begin() + 2), (std::set<CUgraphNode>{a, b}));
  EXPECT_EQ(roots[2], nullptr);
  EXPECT_EQ(roots[3], nullptr);

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetNodes(g, nodes.data(), nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetRootNodes(g, roots.data(), nullptr));
}

TEST_F(Graphs, GetEdgesCountsAndPairs) {
  CUgraph g = Graph();
  CUgraphNode a = nullptr, b = nullptr, c = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g, nullptr, 0));
  CUgraphNode ab[] = {a, b};
  ASSERT_CU(cuGraphAddEmptyNode(&c, g, ab, 2));
  using Pair = std::pair<CUgraphNode, CUgraphNode>;
  const std::set<Pair> want{{a, c}, {b, c}};

  // v2 (the CUDA 13 name): "from and to may both be NULL, in which case this function only
  // returns the number of edges in numEdges."
  size_t count = 0;
  ASSERT_CU(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &count));
  EXPECT_EQ(count, 2u);
  // "If numEdges is higher than the actual number of edges, the remaining entries in from and
  // to will be set to NULL, and the number of edges actually returned will be written."
  CUgraphNode bogus = reinterpret_cast<CUgraphNode>(std::uintptr_t{0x1234});
  std::vector<CUgraphNode> from(4, bogus), to(4, bogus);
  std::vector<CUgraphEdgeData> data(4);
  std::memset(data.data(), 0xff, data.size() * sizeof(CUgraphEdgeData));
  count = 4;
  ASSERT_CU(cuGraphGetEdges(g, from.data(), to.data(), data.data(), &count));
  ASSERT_EQ(count, 2u);
  EXPECT_EQ((std::set<Pair>{{from[0], to[0]}, {from[1], to[1]}}), want);
  EXPECT_EQ(from[2], nullptr);
  EXPECT_EQ(to[3], nullptr);
  for (int i = 0; i < 2; ++i) {  // default edges: zeroed edge data
    EXPECT_EQ(data[i].type, CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
    EXPECT_EQ(data[i].from_port, 0);
    EXPECT_EQ(data[i].to_port, 0);
  }

  // v1, as older applications call it.
  auto get_edges_v1 = Symbol<PFN_cuGraphGetEdges_v10000>("cuGraphGetEdges");
  ASSERT_NE(get_edges_v1, nullptr);
  count = 0;
  ASSERT_CU(get_edges_v1(g, nullptr, nullptr, &count));
  EXPECT_EQ(count, 2u);
  std::vector<CUgraphNode> f1(2), t1(2);
  ASSERT_CU(get_edges_v1(g, f1.data(), t1.data(), &count));
  ASSERT_EQ(count, 2u);
  EXPECT_EQ((std::set<Pair>{{f1[0], t1[0]}, {f1[1], t1[1]}}), want);

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetEdges(g, nullptr, nullptr, nullptr, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphGetEdges(g, from.data(), nullptr, nullptr, &count));
}

// "If edgeData is non-NULL then from and to must be as well."
TEST_F(Graphs, GetEdgesWithEdgeDataButNoEndpointsIsInvalidValue) {
  CUgraph g = Graph();
  CUgraphNode a = nullptr, b = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g, &a, 1));
  CUgraphEdgeData data[2] = {};
  size_t count = 2;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetEdges(g, nullptr, nullptr, data, &count));
}

// "Specifying an existing dependency will return an error." "Each node in from and to must
// belong to hGraph." "If numDependencies is 0, elements in from and to will be ignored."
TEST_F(Graphs, AddDependenciesAddsEdgesAndRejectsBadOnes) {
  CUgraph g = Graph(), other = Graph();
  CUgraphNode a = nullptr, b = nullptr, c = nullptr, foreign = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&b, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&c, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&foreign, other, nullptr, 0));

  ASSERT_CU(cuGraphAddDependencies(g, &a, &b, nullptr, 1));  // v2, default edge data
  EXPECT_EQ(Edges(g).size(), 1u);
  size_t roots = 0;
  ASSERT_CU(cuGraphGetRootNodes(g, nullptr, &roots));
  EXPECT_EQ(roots, 2u);  // a and c

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, &a, &b, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, &foreign, &b, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, &a, &foreign, nullptr, 1));
  CUgraphNode null_node = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, &null_node, &b, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, nullptr, nullptr, nullptr, 1));
  EXPECT_CU(cuGraphAddDependencies(g, nullptr, nullptr, nullptr, 0));
  EXPECT_EQ(Edges(g).size(), 1u) << "a rejected call added an edge";

  // v1, as older applications call it; explicit default edge data through v2.
  auto add_v1 = Symbol<PFN_cuGraphAddDependencies_v10000>("cuGraphAddDependencies");
  ASSERT_NE(add_v1, nullptr);
  ASSERT_CU(add_v1(g, &b, &c, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, add_v1(g, &b, &c, 1));
  CUgraphEdgeData def{};
  ASSERT_CU(cuGraphAddDependencies(g, &a, &c, &def, 1));
  EXPECT_EQ(Edges(g).size(), 3u);
  ASSERT_CU(cuGraphGetRootNodes(g, nullptr, &roots));
  EXPECT_EQ(roots, 1u);
}

// "dependencies may not have any duplicate entries."
TEST_F(Graphs, AddNodeWithBadDependenciesIsInvalidValue) {
  CUgraph g = Graph(), other = Graph();
  CUgraphNode a = nullptr, foreign = nullptr, n = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  ASSERT_CU(cuGraphAddEmptyNode(&foreign, other, nullptr, 0));
  CUgraphNode dup[] = {a, a};
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&n, g, dup, 2));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&n, g, &foreign, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&n, g, nullptr, 1));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(nullptr, g, nullptr, 0));
  EXPECT_EQ(Nodes(g).size(), 1u) << "a rejected call added a node";
}

// =============================================================================================
// Kernel node parameters and attributes
// =============================================================================================

TEST_F(Graphs, KernelNodeParamsRoundTripThroughV1AndV2) {
  constexpr int n = 500;
  const std::vector<float> x0 = thaw::test::random_floats(n, 8);
  CUdeviceptr x = Buffer(x0);
  CUgraph g = Graph();

  // Added through v1 (CUDA_KERNEL_NODE_PARAMS_v1, no kern/ctx fields).
  auto add_v1 = Symbol<PFN_cuGraphAddKernelNode_v10000>("cuGraphAddKernelNode");
  auto get_v1 = Symbol<PFN_cuGraphKernelNodeGetParams_v10000>("cuGraphKernelNodeGetParams");
  auto set_v1 = Symbol<PFN_cuGraphKernelNodeSetParams_v10000>("cuGraphKernelNodeSetParams");
  ASSERT_NE(add_v1, nullptr);
  ASSERT_NE(get_v1, nullptr);
  ASSERT_NE(set_v1, nullptr);
  AxpbArgs args{x, 2.0f, 3.0f, n};
  CUDA_KERNEL_NODE_PARAMS_v1 p1{};
  p1.func = axpb_;
  p1.gridDimX = 4, p1.gridDimY = 1, p1.gridDimZ = 1;
  p1.blockDimX = 128, p1.blockDimY = 1, p1.blockDimZ = 1;
  p1.kernelParams = args.ptrs;
  CUgraphNode node = nullptr;
  ASSERT_CU(add_v1(&node, g, nullptr, 0, &p1));
  args.a = -100.0f;  // "The kernelParams ... as well as the argument values it points to, are
                     // copied during this call."

  // Read through v2 and v1.
  CUDA_KERNEL_NODE_PARAMS got{};
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &got));
  EXPECT_EQ(got.func, axpb_);
  EXPECT_EQ(got.gridDimX, 4u);
  EXPECT_EQ(got.blockDimX, 128u);
  EXPECT_EQ(got.sharedMemBytes, 0u);
  ASSERT_NE(got.kernelParams, nullptr);
  EXPECT_EQ(*static_cast<CUdeviceptr*>(got.kernelParams[0]), x);
  EXPECT_EQ(*static_cast<float*>(got.kernelParams[1]), 2.0f);
  EXPECT_EQ(*static_cast<float*>(got.kernelParams[2]), 3.0f);
  EXPECT_EQ(*static_cast<int*>(got.kernelParams[3]), n);
  CUDA_KERNEL_NODE_PARAMS_v1 got1{};
  ASSERT_CU(get_v1(node, &got1));
  EXPECT_EQ(got1.func, axpb_);
  EXPECT_EQ(got1.gridDimX, 4u);
  ASSERT_NE(got1.kernelParams, nullptr);
  EXPECT_EQ(*static_cast<float*>(got1.kernelParams[2]), 3.0f);

  // Set through v2: new a/b and geometry.
  AxpbArgs args2{x, 0.5f, -1.0f, n};
  CUDA_KERNEL_NODE_PARAMS p2 = KernelParams(axpb_, n, args2.ptrs);
  p2.blockDimX = 64;
  p2.gridDimX = (n + 63) / 64;
  ASSERT_CU(cuGraphKernelNodeSetParams(node, &p2));
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &got));
  EXPECT_EQ(got.blockDimX, 64u);
  EXPECT_EQ(*static_cast<float*>(got.kernelParams[1]), 0.5f);
  EXPECT_EQ(*static_cast<float*>(got.kernelParams[2]), -1.0f);

  // Set through v1: only b changes; the launch uses these last parameters.
  AxpbArgs args3{x, 0.5f, 4.0f, n};
  CUDA_KERNEL_NODE_PARAMS_v1 p3{};
  p3.func = axpb_;
  p3.gridDimX = (n + 127) / 128, p3.gridDimY = 1, p3.gridDimZ = 1;
  p3.blockDimX = 128, p3.blockDimY = 1, p3.blockDimZ = 1;
  p3.kernelParams = args3.ptrs;
  ASSERT_CU(set_v1(node, &p3));
  ASSERT_CU(get_v1(node, &got1));
  EXPECT_EQ(*static_cast<float*>(got1.kernelParams[2]), 4.0f);

  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> ref = x0;
  CpuAxpb(ref, 0.5f, 4.0f);
  EXPECT_TRUE(BitEqual(Read(x, n), ref));

  // On a node that is no kernel node, and with no output.
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeGetParams(empty, &got));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeGetParams(node, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphKernelNodeSetParams(node, nullptr));
}

// "The params will contain either kernelParams or extra, according to which of these was most
// recently set on the node."
TEST_F(Graphs, KernelNodeGetParamsReturnsTheExtraFormWhenExtraWasSet) {
  constexpr int n = 64;
  CUdeviceptr x = Buffer(std::vector<float>(n, 1.0f));
  CUgraph g = Graph();
  alignas(8) unsigned char buf[20] = {};
  const float a = 3.0f, b = 0.5f;
  const int count = n;
  std::memcpy(buf + 0, &x, 8);
  std::memcpy(buf + 8, &a, 4);
  std::memcpy(buf + 12, &b, 4);
  std::memcpy(buf + 16, &count, 4);
  std::size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUDA_KERNEL_NODE_PARAMS p = KernelParams(axpb_, n, nullptr);
  p.extra = extra;
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphAddKernelNode(&node, g, nullptr, 0, &p));
  CUDA_KERNEL_NODE_PARAMS got{};
  ASSERT_CU(cuGraphKernelNodeGetParams(node, &got));
  EXPECT_EQ(got.kernelParams, nullptr);
  ASSERT_NE(got.extra, nullptr);
  const unsigned char* bank = nullptr;
  for (std::size_t i = 0; got.extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (got.extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      bank = static_cast<const unsigned char*>(got.extra[i + 1]);
    }
  }
  ASSERT_NE(bank, nullptr);
  EXPECT_EQ(std::memcmp(bank, buf, sizeof buf), 0);
}

TEST_F(Graphs, KernelNodeParamsBothFormsOrNoneIsInvalidValue) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  CUgraph g = Graph();
  AxpbArgs args{x, 1.0f, 1.0f, 64};
  alignas(8) unsigned char buf[20] = {};
  std::size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  // "The error CUDA_ERROR_INVALID_VALUE will be returned if kernel parameters are specified
  // with both kernelParams and extra."
  CUDA_KERNEL_NODE_PARAMS p = KernelParams(axpb_, 64, args.ptrs);
  p.extra = extra;
  CUgraphNode node = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddKernelNode(&node, g, nullptr, 0, &p));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddKernelNode(&node, g, nullptr, 0, nullptr));
  EXPECT_EQ(Nodes(g).size(), 0u);
}

TEST_F(Graphs, KernelNodePriorityAttributeGetAndSet) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  CUgraph g = Graph();
  CUgraphNode node = AddAxpb(g, {}, x, 1.0f, 1.0f, 64);
  int least = 0, greatest = 0;
  ASSERT_CU(cuCtxGetStreamPriorityRange(&least, &greatest));
  ASSERT_LT(greatest, least) << "the device has one stream priority only";

  CUkernelNodeAttrValue v{};
  v.priority = 12345;
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  EXPECT_EQ(v.priority, 0) << "a node added by hand has the default priority";
  v.priority = greatest;
  ASSERT_CU(cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  v.priority = 12345;
  ASSERT_CU(cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  EXPECT_EQ(v.priority, greatest);

  // The node still runs, under an exec that uses node priorities.
  CUgraphExec e = Instantiate(g, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(Read(x, 1)[0], 2.0f);

  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphKernelNodeGetAttribute(empty, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphKernelNodeGetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, nullptr));
}

// cuGraphInstantiate, on CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: "Note that priorities
// are only available on kernel nodes, and are copied from stream priority during stream
// capture."
TEST_F(Graphs, CapturedKernelNodeTakesTheStreamsPriority) {
  int least = 0, greatest = 0;
  ASSERT_CU(cuCtxGetStreamPriorityRange(&least, &greatest));
  ASSERT_LT(greatest, least) << "the device has one stream priority only";
  CUstream high = nullptr;
  ASSERT_CU(cuStreamCreateWithPriority(&high, CU_STREAM_NON_BLOCKING, greatest));
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(high, CU_STREAM_CAPTURE_MODE_GLOBAL));
  AxpbArgs args{x, 1.0f, 1.0f, 64};
  ASSERT_CU(cuLaunchKernel(axpb_, 1, 1, 1, 64, 1, 1, 0, high, args.ptrs, nullptr));
  CUgraph g = nullptr;
  ASSERT_CU(cuStreamEndCapture(high, &g));
  ASSERT_NE(g, nullptr);
  graphs_.push_back(g);
  std::vector<CUgraphNode> nodes = Nodes(g);
  ASSERT_EQ(nodes.size(), 1u);
  CUkernelNodeAttrValue v{};
  ASSERT_CU(cuGraphKernelNodeGetAttribute(nodes[0], CU_KERNEL_NODE_ATTRIBUTE_PRIORITY, &v));
  EXPECT_EQ(v.priority, greatest);
  EXPECT_CU(cuStreamDestroy(high));
}

// =============================================================================================
// Clone, exec update, exec kernel node parameters
// =============================================================================================

// "All parameters are copied into the cloned graph. The original graph may be modified after
// this call without affecting the clone."
TEST_F(Graphs, CloneLaunchesLikeTheOriginalAndIsIndependentOfIt) {
  constexpr int n = 321;
  const std::vector<float> x0 = thaw::test::random_floats(n, 9),
                           y0 = thaw::test::random_floats(n, 10);
  CUdeviceptr x = Buffer(x0), y = Buffer(y0);
  CUgraph g = nullptr;
  ASSERT_CU(cuGraphCreate(&g, 0));
  CUgraphNode first = AddAxpb(g, {}, x, 1.5f, -0.25f, n);
  AddAddInto(g, {first}, y, x, n);
  CUgraph clone = nullptr;
  ASSERT_CU(cuGraphClone(&clone, g));
  ASSERT_NE(clone, nullptr);
  graphs_.push_back(clone);
  EXPECT_EQ(Nodes(clone).size(), 2u);
  EXPECT_EQ(Edges(clone).size(), 1u);

  // Change the original, then destroy it: the clone keeps the parameters it was cloned with.
  AxpbArgs changed{x, 100.0f, 100.0f, n};
  CUDA_KERNEL_NODE_PARAMS p = KernelParams(axpb_, n, changed.ptrs);
  ASSERT_CU(cuGraphKernelNodeSetParams(first, &p));
  ASSERT_CU(cuGraphDestroy(g));

  CUgraphExec e = Instantiate(clone);
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> rx = x0, ry = y0;
  CpuAxpb(rx, 1.5f, -0.25f);
  CpuAddInto(ry, rx);
  EXPECT_TRUE(BitEqual(Read(x, n), rx));
  EXPECT_TRUE(BitEqual(Read(y, n), ry));

  CUgraph none = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphClone(nullptr, clone));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphClone(&none, g));  // destroyed
}

TEST_F(Graphs, ExecUpdateWithTheSameTopologyTakesTheNewParameters) {
  constexpr int n = 256;
  const std::vector<float> x0 = thaw::test::random_floats(n, 11);
  CUdeviceptr x = Buffer(x0);
  CUgraph g1 = Graph();
  CUgraphNode a1 = AddAxpb(g1, {}, x, 2.0f, 1.0f, n);
  AddAxpb(g1, {a1}, x, 3.0f, 0.0f, n);
  CUgraphExec e = Instantiate(g1);
  ASSERT_NE(e, nullptr);

  CUgraph g2 = Graph();
  CUgraphNode a2 = AddAxpb(g2, {}, x, 1.0f, 5.0f, n);
  AddAxpb(g2, {a2}, x, 2.0f, 0.0f, n);
  CUgraphExecUpdateResultInfo info{};
  info.result = CU_GRAPH_EXEC_UPDATE_ERROR;
  ASSERT_CU(cuGraphExecUpdate(e, g2, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_SUCCESS);

  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> ref = x0;
  CpuAxpb(ref, 1.0f, 5.0f);
  CpuAxpb(ref, 2.0f, 0.0f);
  EXPECT_TRUE(BitEqual(Read(x, n), ref)) << "the exec still runs the old parameters";
}

// "cuGraphExecUpdate sets the result member of resultInfo to
// CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED under the following conditions: - The count of
// nodes directly in hGraphExec and hGraph differ, in which case resultInfo->errorNode is set to
// NULL." It "returns CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE if the graph update was not
// performed".
TEST_F(Graphs, ExecUpdateWithADifferentNodeCountFailsAsTopologyChanged) {
  constexpr int n = 256;
  const std::vector<float> x0 = thaw::test::random_floats(n, 12);
  CUdeviceptr x = Buffer(x0);
  CUgraph g1 = Graph();
  CUgraphNode a1 = AddAxpb(g1, {}, x, 2.0f, 1.0f, n);
  AddAxpb(g1, {a1}, x, 3.0f, 0.0f, n);
  CUgraphExec e = Instantiate(g1);

  CUgraph g3 = Graph();
  CUgraphNode b1 = AddAxpb(g3, {}, x, 1.0f, 1.0f, n);
  CUgraphNode b2 = AddAxpb(g3, {b1}, x, 1.0f, 1.0f, n);
  AddAxpb(g3, {b2}, x, 1.0f, 1.0f, n);
  CUgraphExecUpdateResultInfo info{};
  info.errorNode = b1;
  EXPECT_CU_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(e, g3, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  EXPECT_EQ(info.errorNode, nullptr);

  // "CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED if the type of a node changed, in which case
  // hErrorNode_out is set to the node from hGraph."
  CUgraph g4 = Graph();
  CUgraphNode c1 = AddAxpb(g4, {}, x, 1.0f, 1.0f, n);
  CUgraphNode c2 = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&c2, g4, &c1, 1));
  info = {};
  EXPECT_CU_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, cuGraphExecUpdate(e, g4, &info));
  EXPECT_EQ(info.result, CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED);
  EXPECT_EQ(info.errorNode, c2);

  // The failed updates changed nothing.
  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> ref = x0;
  CpuAxpb(ref, 2.0f, 1.0f);
  CpuAxpb(ref, 3.0f, 0.0f);
  EXPECT_TRUE(BitEqual(Read(x, n), ref));
}

// "Sets the parameters of a kernel node in an executable graph hGraphExec. The node is
// identified by the corresponding node hNode in the non-executable graph ... hNode is also not
// modified by this call."
TEST_F(Graphs, ExecKernelNodeSetParamsChangesOneLaunchOnly) {
  constexpr int n = 200;
  const std::vector<float> x0 = thaw::test::random_floats(n, 13);
  CUdeviceptr x = Buffer(x0);
  CUgraph g = Graph();
  CUgraphNode k1 = AddAxpb(g, {}, x, 2.0f, 1.0f, n);
  CUgraphNode k2 = AddAxpb(g, {k1}, x, 0.5f, 0.5f, n);
  AddAxpb(g, {k2}, x, 3.0f, -2.0f, n);
  CUgraphExec e = Instantiate(g);

  AxpbArgs args{x, -1.0f, 4.0f, n};
  CUDA_KERNEL_NODE_PARAMS p = KernelParams(axpb_, n, args.ptrs);
  ASSERT_CU(cuGraphExecKernelNodeSetParams(e, k2, &p));
  CUDA_KERNEL_NODE_PARAMS got{};
  ASSERT_CU(cuGraphKernelNodeGetParams(k2, &got));
  EXPECT_EQ(*static_cast<float*>(got.kernelParams[1]), 0.5f) << "the graph's node changed";

  ASSERT_CU(cuGraphLaunch(e, stream_));
  ASSERT_CU(cuStreamSynchronize(stream_));
  std::vector<float> ref = x0;
  CpuAxpb(ref, 2.0f, 1.0f);
  CpuAxpb(ref, -1.0f, 4.0f);
  CpuAxpb(ref, 3.0f, -2.0f);
  EXPECT_TRUE(BitEqual(Read(x, n), ref));

  // A node of another graph, a non-kernel node, no parameters.
  CUgraph other = Graph();
  CUgraphNode foreign = AddAxpb(other, {}, x, 1.0f, 1.0f, n);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecKernelNodeSetParams(e, foreign, &p));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecKernelNodeSetParams(e, k2, nullptr));
}

// =============================================================================================
// DOT output, kernels without twins, bad input
// =============================================================================================

// "By default this includes the graph topology, node types, node id, kernel names and memcpy
// direction."
TEST_F(Graphs, DebugDotPrintWritesTheKernelNames) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f)), y = Buffer(std::vector<float>(64, 1.0f));
  CUgraph g = Graph();
  CUgraphNode k = AddAxpb(g, {}, x, 1.0f, 1.0f, 64);
  AddAddInto(g, {k}, y, x, 64);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("thaw_graph_test_" + std::to_string(getpid()) + ".dot"))
                               .string();
  ASSERT_CU(cuGraphDebugDotPrint(g, path.c_str(), 0));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const std::string dot = text.str();
  EXPECT_NE(dot.find("digraph"), std::string::npos) << dot;
  EXPECT_NE(dot.find(kAxpb), std::string::npos) << dot;
  EXPECT_NE(dot.find(kAddInto), std::string::npos) << dot;
  EXPECT_NE(dot.find("->"), std::string::npos) << "no edge in:\n" << dot;

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDebugDotPrint(g, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_OPERATING_SYSTEM,
                cuGraphDebugDotPrint(g, "/nonexistent-dir/thaw/graph.dot", 0));
}

// The issue: "A launch of a kernel with no twin fails with a clear error naming the kernel."
// In a graph the node is accepted (the kernel exists in the cubin) and the graph launch fails.
TEST_F(Graphs, GraphWithAKernelWithoutTwinFailsToLaunchWithNotFound) {
  if (!thaw::test::on_emulator()) GTEST_SKIP() << "a real driver runs no_twin_fill's SASS";
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, samples_, kNoTwin));
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  CUgraph g = Graph();
  int value = 7, count = 64;
  void* params[] = {&x, &value, &count};
  CUDA_KERNEL_NODE_PARAMS p = KernelParams(f, 64, params);
  CUgraphNode node = nullptr;
  ASSERT_CU(cuGraphAddKernelNode(&node, g, nullptr, 0, &p));
  CUgraphExec e = Instantiate(g);
  ASSERT_NE(e, nullptr);
  testing::internal::CaptureStderr();
  const CUresult r = cuGraphLaunch(e, stream_);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r, CUDA_ERROR_NOT_FOUND) << thaw::test::cu_error_name(r);
  EXPECT_NE(err.find(kNoTwin), std::string::npos) << "stderr does not name the kernel: " << err;
  // Nothing ran, and the stream is still usable.
  EXPECT_CU(cuStreamSynchronize(stream_));
  EXPECT_EQ(Read(x, 1)[0], 1.0f);
}

TEST_F(Graphs, BadHandlesAndNullsGiveTheDocumentedCodes) {
  // cuGraphCreate: "flags - Graph creation flags, must be 0".
  CUgraph g = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphCreate(nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphCreate(&g, 1));

  // A destroyed graph (the emulator's handles are ids, so a stale one is safe to pass).
  CUgraph dead = nullptr;
  ASSERT_CU(cuGraphCreate(&dead, 0));
  ASSERT_CU(cuGraphDestroy(dead));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphDestroy(dead));
  CUgraphNode node = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEmptyNode(&node, dead, nullptr, 0));
  size_t count = 0;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphGetNodes(dead, nullptr, &count));
  CUgraphExec exec = nullptr;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiate(&exec, dead, 0));

  g = Graph();
  CUgraphNode empty = nullptr;
  ASSERT_CU(cuGraphAddEmptyNode(&empty, g, nullptr, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphNodeGetType(empty, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiate(nullptr, g, 0));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiate(&exec, g, 0x1000));

  // "The element size must be 1, 2, or 4 bytes."
  CUdeviceptr x = Buffer(std::vector<float>(64, 0.0f));
  CUDA_MEMSET_NODE_PARAMS ms{};
  ms.dst = x;
  ms.elementSize = 3;
  ms.width = 16;
  ms.height = 1;
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddMemsetNode(&node, g, nullptr, 0, &ms, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemsetNode(&node, g, nullptr, 0, nullptr, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuGraphAddMemcpyNode(&node, g, nullptr, 0, nullptr, ctx_));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddHostNode(&node, g, nullptr, 0, nullptr));
  CUevent ev = nullptr;
  ASSERT_CU(cuEventCreate(&ev, 0));
  ASSERT_CU(cuEventDestroy(ev));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEventRecordNode(&node, g, nullptr, 0, ev));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphAddEventWaitNode(&node, g, nullptr, 0, ev));

  // A destroyed exec.
  CUgraphExec e = nullptr;
  ASSERT_CU(cuGraphInstantiate(&e, g, 0));
  ASSERT_CU(cuGraphExecDestroy(e));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphExecDestroy(e));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(e, stream_));
}

// Every driver call before cuInit is CUDA_ERROR_NOT_INITIALIZED (checked in a fresh process).
TEST(GraphsBeforeInit, GraphCallsAreNotInitialized) {
  EXPECT_EXIT(
      {
        CUgraph g = nullptr;
        CUgraphExec e = nullptr;
        size_t n = 0;
        bool ok = cuGraphCreate(&g, 0) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphGetNodes(g, nullptr, &n) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphInstantiate(&e, g, 0) == CUDA_ERROR_NOT_INITIALIZED &&
                  cuGraphLaunch(e, nullptr) == CUDA_ERROR_NOT_INITIALIZED;
        std::_Exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
