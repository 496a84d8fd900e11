// Stream capture on the emulator: cuStreamBeginCapture .. cuStreamEndCapture record a stream's
// work (and the work of streams that join it through events) as a graph instead of running it.
// Every capture rule the emulator implements is checked here against CUDA 13's cuda.h: the
// capture modes and "potentially unsafe" calls, the legacy stream, fork/join through events,
// captured events, capture queries, and the error codes of each violation.
//
// Kernels: tests/emu/kernels/chain.cu (axpb, add_into), real sm_90 cubins run by their host
// twins (THAW_EMU_KERNELS).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_kernels_cubins.h"
#include "emu_test_support.hpp"

namespace {

const CUgraph kBogusGraph = reinterpret_cast<CUgraph>(std::uintptr_t{0xdead});

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void CpuAxpb(std::vector<float>& x, float a, float b) {
  for (float& v : x) v = std::fma(a, v, b);  // nvcc contracts a * x + b into an FFMA
}
void CpuAddInto(std::vector<float>& dst, const std::vector<float>& src) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

CUstreamCaptureStatus Status(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = cuStreamIsCapturing(s, &st);
  EXPECT_EQ(r, CUDA_SUCCESS) << "cuStreamIsCapturing: " << thaw::test::cu_error_name(r);
  return st;
}

void CountCall(void* user) {
  static_cast<std::atomic<int>*>(user)->fetch_add(1);
}
void NoOpCallback(CUstream, CUresult, void*) {}

// A context with chain.cu loaded and two non-blocking streams.
class Capture : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(thaw::test::open_primary_context(&dev_, &ctx_));
    ASSERT_CU(cuModuleLoadData(&chain_, thaw_cubin_chain().data));
    ASSERT_CU(cuModuleGetFunction(&axpb_, chain_, "axpb"));
    ASSERT_CU(cuModuleGetFunction(&add_into_, chain_, "add_into"));
    s1_ = Stream(CU_STREAM_NON_BLOCKING);
    s2_ = Stream(CU_STREAM_NON_BLOCKING);
  }
  void TearDown() override {
    // End any capture a failed test left open, so the rest of the teardown can run.
    for (CUstream s : streams_) {
      CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
      if (cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) {
        CUgraph g = nullptr;
        if (cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g != nullptr) cuGraphDestroy(g);
      }
    }
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    EXPECT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT_CU(cuCtxSynchronize());
    for (CUgraphExec e : execs_) EXPECT_CU(cuGraphExecDestroy(e));
    for (CUgraph g : graphs_) EXPECT_CU(cuGraphDestroy(g));
    for (CUevent e : events_) EXPECT_CU(cuEventDestroy(e));
    for (CUstream s : streams_) EXPECT_CU(cuStreamDestroy(s));
    for (CUdeviceptr d : buffers_) EXPECT_CU(cuMemFree(d));
    for (void* h : pinned_) EXPECT_CU(cuMemFreeHost(h));
    if (chain_ != nullptr) EXPECT_CU(cuModuleUnload(chain_));
    if (ctx_ != nullptr) EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }

  CUstream Stream(unsigned flags) {
    CUstream s = nullptr;
    EXPECT_CU(cuStreamCreate(&s, flags));
    if (s != nullptr) streams_.push_back(s);
    return s;
  }
  CUevent Event() {
    CUevent e = nullptr;
    EXPECT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
    if (e != nullptr) events_.push_back(e);
    return e;
  }
  CUdeviceptr Buffer(const std::vector<float>& init) {
    CUdeviceptr d = 0;
    EXPECT_CU(cuMemAlloc(&d, init.size() * sizeof(float)));
    if (d == 0) return 0;
    buffers_.push_back(d);
    EXPECT_CU(cuMemcpyHtoD(d, init.data(), init.size() * sizeof(float)));
    return d;
  }
  float* Pinned(std::size_t count) {
    void* p = nullptr;
    EXPECT_CU(cuMemAllocHost(&p, count * sizeof(float)));
    if (p != nullptr) pinned_.push_back(p);
    return static_cast<float*>(p);
  }
  std::vector<float> Read(CUdeviceptr d, std::size_t n) {
    std::vector<float> out(n);
    EXPECT_CU(cuMemcpyDtoH(out.data(), d, n * sizeof(float)));
    return out;
  }

  CUresult Axpb(CUstream s, CUdeviceptr x, float a, float b, int n) {
    void* params[] = {&x, &a, &b, &n};
    return cuLaunchKernel(axpb_, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, params, nullptr);
  }
  CUresult AddInto(CUstream s, CUdeviceptr dst, CUdeviceptr src, int n) {
    void* params[] = {&dst, &src, &n};
    return cuLaunchKernel(add_into_, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, params, nullptr);
  }

  // Ends the capture on s; a returned graph is kept (destroyed in TearDown) and stored in *out.
  CUresult End(CUstream s, CUgraph* out = nullptr) {
    CUgraph g = kBogusGraph;
    CUresult r = cuStreamEndCapture(s, &g);
    if (g != kBogusGraph && g != nullptr) graphs_.push_back(g);
    if (out != nullptr) *out = g;
    return r;
  }
  // An invalidated capture ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "If capture was
  // invalidated, due to a violation of the rules of stream capture, then a NULL graph will be
  // returned."
  void ExpectEndsInvalidated(CUstream s) {
    CUgraph g = kBogusGraph;
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, End(s, &g));
    EXPECT_EQ(g, nullptr);
    EXPECT_EQ(Status(s), CU_STREAM_CAPTURE_STATUS_NONE) << "the capture did not end";
  }
  CUgraphExec Instantiate(CUgraph g) {
    CUgraphExec e = nullptr;
    EXPECT_CU(cuGraphInstantiate(&e, g, 0));
    if (e != nullptr) execs_.push_back(e);
    return e;
  }
  std::vector<CUgraphNode> Nodes(CUgraph g) {
    size_t count = 0;
    EXPECT_CU(cuGraphGetNodes(g, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    EXPECT_CU(cuGraphGetNodes(g, nodes.data(), &count));
    nodes.resize(count);
    return nodes;
  }
  size_t EdgeCount(CUgraph g) {
    size_t count = 0;
    EXPECT_CU(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &count));
    return count;
  }
  size_t RootCount(CUgraph g) {
    size_t count = 0;
    EXPECT_CU(cuGraphGetRootNodes(g, nullptr, &count));
    return count;
  }
  // The node types along a captured chain, from its root.
  std::vector<CUgraphNodeType> ChainTypes(CUgraph g) {
    std::vector<CUgraphNode> nodes = Nodes(g);
    size_t count = EdgeCount(g);
    std::vector<CUgraphNode> from(count), to(count);
    EXPECT_CU(cuGraphGetEdges(g, from.data(), to.data(), nullptr, &count));
    std::set<CUgraphNode> has_pred(to.begin(), to.end());
    CUgraphNode cur = nullptr;
    for (CUgraphNode n : nodes) {
      if (!has_pred.contains(n)) cur = n;
    }
    std::vector<CUgraphNodeType> types;
    while (cur != nullptr && types.size() <= nodes.size()) {
      CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
      EXPECT_CU(cuGraphNodeGetType(cur, &t));
      types.push_back(t);
      CUgraphNode next = nullptr;
      for (size_t i = 0; i < count; ++i) {
        if (from[i] == cur) next = to[i];
      }
      cur = next;
    }
    return types;
  }
  // Runs fn on a new thread with this test's context current there, and waits for it.
  void OnOtherThread(const std::function<void()>& fn) {
    std::thread t([&] {
      EXPECT_CU(cuCtxSetCurrent(ctx_));
      fn();
    });
    t.join();
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule chain_ = nullptr;
  CUfunction axpb_ = nullptr;
  CUfunction add_into_ = nullptr;
  CUstream s1_ = nullptr;
  CUstream s2_ = nullptr;
  std::vector<CUstream> streams_;
  std::vector<CUevent> events_;
  std::vector<CUgraph> graphs_;
  std::vector<CUgraphExec> execs_;
  std::vector<CUdeviceptr> buffers_;
  std::vector<void*> pinned_;
};

// =============================================================================================
// Beginning and ending
// =============================================================================================

// "Capture may not be initiated if stream is CU_STREAM_LEGACY."
TEST_F(Capture, BeginOnTheLegacyStreamIsUnsupported) {
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(Status(nullptr), CU_STREAM_CAPTURE_STATUS_NONE);
  // The legacy stream still works.
  CUdeviceptr x = Buffer({1.0f});
  EXPECT_CU(Axpb(nullptr, x, 2.0f, 1.0f, 1));
  EXPECT_EQ(Read(x, 1)[0], 3.0f);
}

// "it may only be initiated if the stream is not already in capture mode."
TEST_F(Capture, BeginTwiceIsIllegalState) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_STATE, cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_STATE,
                cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  End(s1_);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
}

TEST_F(Capture, BeginWithAnInvalidModeIsInvalidValue) {
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamBeginCapture(s1_, static_cast<CUstreamCaptureMode>(7)));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
}

TEST_F(Capture, EndCaptureErrors) {
  // "Capture must have been initiated on hStream via a call to cuStreamBeginCapture."
  CUgraph g = kBogusGraph;
  EXPECT_CU_ERR(CUDA_ERROR_ILLEGAL_STATE, cuStreamEndCapture(s1_, &g));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamEndCapture(s1_, nullptr));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(End(s1_, &g));
  EXPECT_NE(g, nullptr);
  EXPECT_NE(g, kBogusGraph);

  // "captureStatus_out - Location to return the capture status of the stream; required"
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuStreamIsCapturing(s1_, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuStreamGetCaptureInfo(s1_, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr));
}

// An empty capture is a graph with no nodes.
TEST_F(Capture, EmptyCaptureGivesAnEmptyGraph) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  ASSERT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Nodes(g).empty());
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
}

// =============================================================================================
// Calls that are not allowed on a capturing stream
// =============================================================================================

enum class Forbidden { kSynchronize, kQuery, kAddCallback };

class CaptureForbidden : public Capture, public testing::WithParamInterface<Forbidden> {};

// A synchronisation, a query or a stream callback on a capturing stream cannot be captured:
// the call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ("the operation is not permitted
// when the stream is capturing") and the capture is invalidated: "The stream was capturing but
// an error has invalidated the capture sequence. The capture sequence must be terminated with
// cuStreamEndCapture on the stream where it was initiated in order to continue using hStream."
TEST_P(CaptureForbidden, FailsAsUnsupportedAndInvalidatesTheCapture) {
  constexpr int n = 64;
  CUdeviceptr x = Buffer(std::vector<float>(n, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, n));
  CUresult r = CUDA_SUCCESS;
  switch (GetParam()) {
    case Forbidden::kSynchronize:
      r = cuStreamSynchronize(s1_);
      break;
    case Forbidden::kQuery:
      r = cuStreamQuery(s1_);
      break;
    case Forbidden::kAddCallback:
      r = cuStreamAddCallback(s1_, NoOpCallback, nullptr, 0);
      break;
  }
  EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) << thaw::test::cu_error_name(r);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  // Work pushed into an invalidated capture fails with the invalidation ("the current capture
  // sequence on the stream has been invalidated due to a previous error").
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, Axpb(s1_, x, 2.0f, 1.0f, n));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_CU(cuStreamGetCaptureInfo(s1_, &st, nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  ExpectEndsInvalidated(s1_);

  // The stream is usable again, and nothing captured ever ran.
  EXPECT_EQ(Read(x, 1)[0], 1.0f);
  EXPECT_CU(Axpb(s1_, x, 2.0f, 1.0f, n));
  EXPECT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(Read(x, 1)[0], 3.0f);
}

INSTANTIATE_TEST_SUITE_P(Calls, CaptureForbidden,
                         testing::Values(Forbidden::kSynchronize, Forbidden::kQuery,
                                         Forbidden::kAddCallback),
                         [](const testing::TestParamInfo<Forbidden>& info) {
                           switch (info.param) {
                             case Forbidden::kSynchronize:
                               return std::string("StreamSynchronize");
                             case Forbidden::kQuery:
                               return std::string("StreamQuery");
                             case Forbidden::kAddCallback:
                               return std::string("StreamAddCallback");
                           }
                           return std::string("Unknown");
                         });

// =============================================================================================
// Capture modes and "potentially unsafe" calls (cuThreadExchangeStreamCaptureMode)
// =============================================================================================

// "CU_STREAM_CAPTURE_MODE_GLOBAL: This is the default mode. If the local thread has an ongoing
// capture sequence that was not initiated with CU_STREAM_CAPTURE_MODE_RELAXED ..., this thread
// is prohibited from potentially unsafe API calls." A synchronisation of the whole context and
// cudaMalloc's driver counterpart are the standard examples.
TEST_F(Capture, CtxSynchronizeDuringAGlobalCaptureIsUnsupported) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuCtxSynchronize());
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  ExpectEndsInvalidated(s1_);
  EXPECT_CU(cuCtxSynchronize());
}

TEST_F(Capture, MemAllocDuringAGlobalCaptureIsUnsupported) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr d = 0;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&d, 4096));
  EXPECT_EQ(d, 0u);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  ExpectEndsInvalidated(s1_);
  ASSERT_CU(cuMemAlloc(&d, 4096));
  EXPECT_CU(cuMemFree(d));
}

// "... or if any other thread has a concurrent capture sequence initiated with
// CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from potentially unsafe API calls."
// (A thread's mode is GLOBAL unless it exchanged it.)
TEST_F(Capture, UnsafeCallsOnAnotherThreadDuringAGlobalCaptureAreUnsupported) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OnOtherThread([] {
    CUdeviceptr d = 0;
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&d, 4096));
    EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuCtxSynchronize());
  });
  End(s1_);
}

// "CU_STREAM_CAPTURE_MODE_RELAXED: The local thread is not prohibited from potentially unsafe
// API calls."
TEST_F(Capture, RelaxedCaptureAllowsUnsafeCalls) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_RELAXED));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  CUdeviceptr d = 0;
  EXPECT_CU(cuMemAlloc(&d, 4096));
  EXPECT_CU(cuCtxSynchronize());
  if (d != 0) EXPECT_CU(cuMemFree(d));
  OnOtherThread([] {  // a RELAXED capture restricts no other thread either
    CUdeviceptr o = 0;
    EXPECT_CU(cuMemAlloc(&o, 4096));
    if (o != 0) EXPECT_CU(cuMemFree(o));
  });
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  EXPECT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Nodes(g).size(), 1u);
}

// A thread whose own mode is RELAXED may make unsafe calls during its own GLOBAL capture.
TEST_F(Capture, RelaxedThreadModeAllowsUnsafeCallsDuringAGlobalCapture) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr d = 0;
  EXPECT_CU(cuMemAlloc(&d, 4096));
  if (d != 0) EXPECT_CU(cuMemFree(d));
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));  // restore GLOBAL
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(End(s1_));
}

// "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: If the local thread has an ongoing capture sequence not
// initiated with CU_STREAM_CAPTURE_MODE_RELAXED, it is prohibited from potentially unsafe API
// calls. Concurrent capture sequences in other threads are ignored." And a GLOBAL-mode thread is
// only held back by other threads' GLOBAL captures.
TEST_F(Capture, ThreadLocalCaptureLetsOtherThreadsAllocate) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  OnOtherThread([] {
    CUdeviceptr d = 0;
    EXPECT_CU(cuMemAlloc(&d, 4096));
    if (d != 0) EXPECT_CU(cuMemFree(d));
  });
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  // The capturing thread itself is still held back.
  CUdeviceptr d = 0;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&d, 4096));
  ExpectEndsInvalidated(s1_);
}

TEST_F(Capture, ThreadLocalThreadModeIgnoresAnotherThreadsGlobalCapture) {
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OnOtherThread([] {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    EXPECT_CU(cuThreadExchangeStreamCaptureMode(&mode));
    CUdeviceptr d = 0;
    EXPECT_CU(cuMemAlloc(&d, 4096));
    if (d != 0) EXPECT_CU(cuMemFree(d));
    EXPECT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  });
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(End(s1_));
}

// "Sets the calling thread's stream capture interaction mode to the value contained in *mode,
// and overwrites *mode with the previous mode for the thread."
TEST_F(Capture, ExchangeStreamCaptureModeSwapsPerThread) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL) << "the default mode is GLOBAL";
  mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  OnOtherThread([] {  // the mode is the thread's own
    CUstreamCaptureMode other = CU_STREAM_CAPTURE_MODE_GLOBAL;
    EXPECT_CU(cuThreadExchangeStreamCaptureMode(&other));
    EXPECT_EQ(other, CU_STREAM_CAPTURE_MODE_GLOBAL);
  });
  mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);

  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuThreadExchangeStreamCaptureMode(nullptr));
  CUstreamCaptureMode bad = static_cast<CUstreamCaptureMode>(42);
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE, cuThreadExchangeStreamCaptureMode(&bad));
  mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ASSERT_CU(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL) << "a rejected exchange changed the mode";
}

// "If the mode argument to cuStreamBeginCapture was not CU_STREAM_CAPTURE_MODE_RELAXED, this
// call must be from the same thread as cuStreamBeginCapture." CUDA_ERROR_STREAM_CAPTURE_WRONG_
// THREAD: "A stream capture sequence not initiated with the CU_STREAM_CAPTURE_MODE_RELAXED
// argument to cuStreamBeginCapture was passed to cuStreamEndCapture in a different thread."
class CaptureEndThread : public Capture, public testing::WithParamInterface<CUstreamCaptureMode> {};

TEST_P(CaptureEndThread, EndFromAnotherThreadIsWrongThreadUnlessRelaxed) {
  const CUstreamCaptureMode mode = GetParam();
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, mode));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  CUresult r = CUDA_ERROR_UNKNOWN;
  CUgraph g = kBogusGraph;
  OnOtherThread([&] { r = cuStreamEndCapture(s1_, &g); });
  if (g != kBogusGraph && g != nullptr) graphs_.push_back(g);
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
    EXPECT_EQ(r, CUDA_SUCCESS) << thaw::test::cu_error_name(r);
    EXPECT_NE(g, nullptr);
    EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
  } else {
    EXPECT_EQ(r, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) << thaw::test::cu_error_name(r);
    EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE) << "the capture ended anyway";
    CUgraph mine = nullptr;
    EXPECT_CU(End(s1_, &mine));  // the right thread still can
    EXPECT_NE(mine, nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CaptureEndThread,
                         testing::Values(CU_STREAM_CAPTURE_MODE_GLOBAL,
                                         CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                         CU_STREAM_CAPTURE_MODE_RELAXED),
                         [](const testing::TestParamInfo<CUstreamCaptureMode>& info) {
                           switch (info.param) {
                             case CU_STREAM_CAPTURE_MODE_GLOBAL:
                               return std::string("Global");
                             case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
                               return std::string("ThreadLocal");
                             case CU_STREAM_CAPTURE_MODE_RELAXED:
                               return std::string("Relaxed");
                           }
                           return std::string("Unknown");
                         });

// =============================================================================================
// The legacy stream while a blocking stream captures
// =============================================================================================

// cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is in an
// unusable state until the blocking stream capture is terminated. The legacy stream is not
// supported for stream capture, but attempted use would have an implicit dependency on the
// capturing stream(s)." CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: "a disallowed implicit dependency on
// a current capture sequence from cudaStreamLegacy". A RELAXED capture keeps the synchronous
// copy from also being a "potentially unsafe" call, so only the implicit dependency is tested.
TEST_F(Capture, SyncCopyOnTheLegacyStreamWhileABlockingStreamCapturesIsImplicit) {
  CUstream blocking = Stream(CU_STREAM_DEFAULT);
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  const std::vector<float> host(64, 5.0f);
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                cuMemcpyHtoD(x, host.data(), host.size() * sizeof(float)));
  End(blocking);
  EXPECT_EQ(Read(x, 1)[0], 1.0f) << "the rejected copy ran";
}

// The same copy under the default (GLOBAL) mode is also a "potentially unsafe" call of the
// capturing thread; cuda.h does not say which of the two errors wins, so either is accepted.
TEST_F(Capture, SyncCopyOnTheLegacyStreamDuringAGlobalCaptureFails) {
  CUstream blocking = Stream(CU_STREAM_DEFAULT);
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  const std::vector<float> host(64, 5.0f);
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
  const CUresult r = cuMemcpyHtoD(x, host.data(), host.size() * sizeof(float));
  EXPECT_TRUE(r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
      << thaw::test::cu_error_name(r);
  End(blocking);
  EXPECT_EQ(Read(x, 1)[0], 1.0f) << "the rejected copy ran";
}

TEST_F(Capture, AsyncWorkOnTheLegacyStreamWhileABlockingStreamCapturesIsImplicit) {
  CUstream blocking = Stream(CU_STREAM_DEFAULT);
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuMemsetD32Async(x, 0, 64, nullptr));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, Axpb(nullptr, x, 2.0f, 1.0f, 64));
  End(blocking);
  EXPECT_EQ(Read(x, 1)[0], 1.0f) << "rejected legacy-stream work ran";
}

// "if this is called on CU_STREAM_LEGACY (the "null stream") while a blocking stream in the same
// context is capturing, it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ... The blocking
// stream capture is not invalidated."
TEST_F(Capture, IsCapturingOnTheLegacyStreamWhileABlockingStreamCapturesIsImplicit) {
  CUstream blocking = Stream(CU_STREAM_DEFAULT);
  ASSERT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus st;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cuStreamIsCapturing(nullptr, &st));
  // cuStreamGetCaptureInfo: "If called on CU_STREAM_LEGACY (the "null stream") while a stream
  // not created with CU_STREAM_NON_BLOCKING is capturing, returns
  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT."
  EXPECT_CU_ERR(
      CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
      cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(Status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph g = nullptr;
  EXPECT_CU(End(blocking, &g));
  EXPECT_NE(g, nullptr);
}

// A non-blocking stream has no implicit dependency on the legacy stream: the legacy stream stays
// usable while it captures.
TEST_F(Capture, LegacyStreamWorkIsFineWhileANonBlockingStreamCaptures) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU(Axpb(nullptr, x, 2.0f, 1.0f, 64));
  EXPECT_EQ(Status(nullptr), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_CU(End(s1_));
  EXPECT_EQ(Read(x, 1)[0], 3.0f);
}

// =============================================================================================
// Cross-stream capture through events
// =============================================================================================

// origin s1: A ─ record e1 ─────────── C ─ wait e2 ─ D
// joined s2:          wait e1 ─ B ─ record e2
TEST_F(Capture, ForkAndJoinThroughEventsCaptureTwoBranches) {
  constexpr int n = 999;
  const std::vector<float> x0 = thaw::test::random_floats(n, 1),
                           y0 = thaw::test::random_floats(n, 2),
                           z0 = thaw::test::random_floats(n, 3);
  CUdeviceptr x = Buffer(x0), y = Buffer(y0), z = Buffer(z0);
  CUevent fork = Event(), join = Event();

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, n));  // A
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_ACTIVE) << "s2 did not join the capture";
  ASSERT_CU(AddInto(s2_, y, x, n));        // B, after A
  ASSERT_CU(Axpb(s1_, z, 0.5f, 2.0f, n));  // C, after A
  ASSERT_CU(cuEventRecord(join, s2_));
  ASSERT_CU(cuStreamWaitEvent(s1_, join, 0));
  ASSERT_CU(AddInto(s1_, z, y, n));  // D, after B and C
  CUgraph g = nullptr;
  ASSERT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE) << "s2 still captures after the end";

  EXPECT_EQ(Nodes(g).size(), 4u);
  EXPECT_EQ(EdgeCount(g), 4u);  // A→B, A→C, B→D, C→D
  EXPECT_EQ(RootCount(g), 1u);
  // Nothing ran yet.
  EXPECT_TRUE(BitEqual(Read(x, n), x0));
  EXPECT_TRUE(BitEqual(Read(z, n), z0));

  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  std::vector<float> rx = x0, ry = y0, rz = z0;
  CpuAxpb(rx, 2.0f, 1.0f);
  CpuAddInto(ry, rx);
  CpuAxpb(rz, 0.5f, 2.0f);
  CpuAddInto(rz, ry);
  EXPECT_TRUE(BitEqual(Read(x, n), rx));
  EXPECT_TRUE(BitEqual(Read(y, n), ry));
  EXPECT_TRUE(BitEqual(Read(z, n), rz));
}

// CUDA_ERROR_STREAM_CAPTURE_UNJOINED: "the capture sequence contains a fork that was not joined
// to the primary stream."
TEST_F(Capture, ForgettingToJoinIsUnjoined) {
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f)), y = Buffer(std::vector<float>(64, 1.0f));
  CUevent fork = Event();
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  ASSERT_CU(Axpb(s2_, y, 2.0f, 1.0f, 64));
  CUgraph g = kBogusGraph;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, End(s1_, &g));
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);
  // Both streams work again.
  EXPECT_CU(Axpb(s2_, y, 2.0f, 1.0f, 64));
  EXPECT_CU(cuStreamSynchronize(s2_));
  EXPECT_EQ(Read(y, 1)[0], 3.0f);
}

// "Capture must be ended on the same stream in which it was initiated."
// CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: "the capture was not initiated in this stream."
TEST_F(Capture, EndingOnAJoinedStreamIsUnmatched) {
  CUevent fork = Event(), join = Event();
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  CUgraph g = kBogusGraph;
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, End(s2_, &g));
  // Join and end where it began.
  ASSERT_CU(cuEventRecord(join, s2_));
  ASSERT_CU(cuStreamWaitEvent(s1_, join, 0));
  End(s1_);
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(Status(s2_), CU_STREAM_CAPTURE_STATUS_NONE);
}

// CUDA_ERROR_STREAM_CAPTURE_ISOLATION: "a dependency would have been created which crosses the
// capture sequence boundary. Only implicit in-stream ordering dependencies are allowed to cross
// the boundary."
TEST_F(Capture, WaitingOnAnEventRecordedOutsideTheCaptureIsIsolation) {
  CUevent outside = Event();
  ASSERT_CU(cuEventRecord(outside, s2_));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cuStreamWaitEvent(s1_, outside, 0));
  EXPECT_EQ(Status(s1_), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  ExpectEndsInvalidated(s1_);
}

// CUDA_ERROR_STREAM_CAPTURE_MERGE: "the operation would have resulted in a merge of two
// independent capture sequences."
TEST_F(Capture, JoiningTwoSeparateCapturesIsMerge) {
  CUevent ev = Event();
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuStreamBeginCapture(s2_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(ev, s2_));
  EXPECT_CU_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE, cuStreamWaitEvent(s1_, ev, 0));
  End(s2_);
  End(s1_);
}

// CUDA_ERROR_CAPTURED_EVENT: "the operation is not permitted on an event which was last
// recorded in a capturing stream."
TEST_F(Capture, EventRecordedDuringCaptureIsACapturedEvent) {
  CUevent ev = Event(), other = Event();
  ASSERT_CU(cuEventRecord(other, s2_));
  ASSERT_CU(cuEventSynchronize(other));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuEventRecord(ev, s1_));
  EXPECT_CU_ERR(CUDA_ERROR_CAPTURED_EVENT, cuEventQuery(ev));
  EXPECT_CU_ERR(CUDA_ERROR_CAPTURED_EVENT, cuEventSynchronize(ev));
  float ms = 0;
  EXPECT_CU_ERR(CUDA_ERROR_CAPTURED_EVENT, cuEventElapsedTime(&ms, other, ev));
  EXPECT_CU(End(s1_));
  // Recorded again outside capture, it is an ordinary event.
  ASSERT_CU(cuEventRecord(ev, s1_));
  EXPECT_CU(cuEventSynchronize(ev));
  EXPECT_CU(cuEventQuery(ev));
}

// CU_EVENT_RECORD_EXTERNAL: "Event is captured in the graph as an external event node when
// performing stream capture. This flag is invalid outside of stream capture."
TEST_F(Capture, ExternalEventRecordBecomesAnEventRecordNode) {
  CUevent ev = Event();
  EXPECT_CU_ERR(CUDA_ERROR_INVALID_VALUE,
                cuEventRecordWithFlags(ev, s1_, CU_EVENT_RECORD_EXTERNAL));
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  ASSERT_CU(cuEventRecordWithFlags(ev, s1_, CU_EVENT_RECORD_EXTERNAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  CUgraph g = nullptr;
  ASSERT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(ChainTypes(g), (std::vector<CUgraphNodeType>{CU_GRAPH_NODE_TYPE_KERNEL,
                                                         CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                                                         CU_GRAPH_NODE_TYPE_KERNEL}));
  // Launching the graph records the event.
  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, s1_));
  EXPECT_CU(cuEventSynchronize(ev));
  EXPECT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(Read(x, 1)[0], 7.0f);
}

// CU_EVENT_WAIT_EXTERNAL: "Event is captured in the graph as an external event node when
// performing stream capture." The event may be one recorded outside the capture.
TEST_F(Capture, ExternalEventWaitBecomesAnEventWaitNode) {
  CUevent outside = Event();
  ASSERT_CU(cuEventRecord(outside, s2_));
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  ASSERT_CU(cuStreamWaitEvent(s1_, outside, CU_EVENT_WAIT_EXTERNAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  CUgraph g = nullptr;
  EXPECT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(ChainTypes(g),
            (std::vector<CUgraphNodeType>{CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_WAIT_EVENT,
                                          CU_GRAPH_NODE_TYPE_KERNEL}));
}

// =============================================================================================
// Capture queries
// =============================================================================================

// cuStreamGetCaptureInfo in its three versions: "id_out - Optional location to return an id for
// the capture sequence, which is unique over the lifetime of the process"; "graph_out - ... the
// graph being captured into"; "dependencies_out - ... The next node to be captured in the stream
// will depend on this set of nodes".
TEST_F(Capture, GetCaptureInfoReportsTheIdGraphAndCurrentDependencies) {
  auto info_v1 = reinterpret_cast<PFN_cuStreamGetCaptureInfo_v10010>(
      dlsym(RTLD_DEFAULT, "cuStreamGetCaptureInfo"));
  auto info_v2 = reinterpret_cast<PFN_cuStreamGetCaptureInfo_v11030>(
      dlsym(RTLD_DEFAULT, "cuStreamGetCaptureInfo_v2"));
  ASSERT_NE(info_v1, nullptr);
  ASSERT_NE(info_v2, nullptr);
  CUdeviceptr x = Buffer(std::vector<float>(64, 1.0f));

  // Not capturing: status NONE, and a successful call.
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, nullptr, nullptr, nullptr, nullptr, nullptr));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  // Before any work: no dependencies.
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* edges = nullptr;
  size_t num = 99;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id, &graph, &deps, &edges, &num));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(id, 0u);
  EXPECT_NE(graph, nullptr);
  EXPECT_EQ(num, 0u);

  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, 64));
  ASSERT_CU(Axpb(s1_, x, 3.0f, 1.0f, 64));
  // v3 (the CUDA 13 name).
  cuuint64_t id3 = 0;
  CUgraph graph3 = nullptr;
  ASSERT_CU(cuStreamGetCaptureInfo(s1_, &st, &id3, &graph3, &deps, &edges, &num));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(id3, id);
  EXPECT_EQ(graph3, graph);
  ASSERT_EQ(num, 1u);
  ASSERT_NE(deps, nullptr);
  const CUgraphNode last = deps[0];
  // "edgeData_out - ... This array parallels dependencies_out": one zeroed (default) entry.
  EXPECT_NE(edges, nullptr) << "no edge data array parallel to the dependencies";
  if (edges != nullptr) {
    EXPECT_EQ(edges[0].type, CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
    EXPECT_EQ(edges[0].from_port, 0);
    EXPECT_EQ(edges[0].to_port, 0);
  }
  // The last captured node: the second launch, a = 3.
  CUDA_KERNEL_NODE_PARAMS p{};
  ASSERT_CU(cuGraphKernelNodeGetParams(last, &p));
  EXPECT_EQ(*static_cast<float*>(p.kernelParams[1]), 3.0f);
  // "All operations other than destroy and node removal are permitted on the graph while the
  // capture sequence is in progress."
  EXPECT_EQ(Nodes(graph).size(), 2u);

  // v2 and v1.
  cuuint64_t id2 = 0;
  CUgraph graph2 = nullptr;
  const CUgraphNode* deps2 = nullptr;
  size_t num2 = 0;
  ASSERT_CU(info_v2(s1_, &st, &id2, &graph2, &deps2, &num2));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(id2, id);
  EXPECT_EQ(graph2, graph);
  ASSERT_EQ(num2, 1u);
  EXPECT_EQ(deps2[0], last);
  cuuint64_t id1 = 0;
  ASSERT_CU(info_v1(s1_, &st, &id1));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(id1, id);

  // A stream that joins through an event depends on the origin's last node.
  CUevent fork = Event(), join = Event();
  ASSERT_CU(cuEventRecord(fork, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, fork, 0));
  ASSERT_CU(info_v2(s2_, &st, &id2, &graph2, &deps2, &num2));
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(id2, id) << "a joined stream is in the same capture sequence";
  ASSERT_EQ(num2, 1u);
  EXPECT_EQ(deps2[0], last);
  ASSERT_CU(cuEventRecord(join, s2_));
  ASSERT_CU(cuStreamWaitEvent(s1_, join, 0));

  CUgraph ended = nullptr;
  ASSERT_CU(End(s1_, &ended));
  EXPECT_EQ(ended, graph) << "the graph returned is not the one captured into";

  // The next capture has another id.
  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  cuuint64_t next = 0;
  ASSERT_CU(info_v1(s1_, &st, &next));
  EXPECT_NE(next, id);
  EXPECT_CU(End(s1_));
}

// =============================================================================================
// What capture records
// =============================================================================================

// "When a stream is in capture mode, all operations pushed into the stream will not be executed,
// but will instead be captured into a graph."
TEST_F(Capture, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  constexpr int n = 256;
  const std::vector<float> x0 = thaw::test::random_floats(n, 4);
  CUdeviceptr x = Buffer(x0), y = Buffer(std::vector<float>(n, 9.0f));
  float* host = Pinned(n);
  ASSERT_NE(host, nullptr);
  std::fill(host, host + n, -3.0f);
  std::atomic<int> calls{0};

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(Axpb(s1_, x, 2.0f, 1.0f, n));
  ASSERT_CU(cuMemsetD32Async(y, 0x40000000u, n, s1_));  // 2.0f
  ASSERT_CU(AddInto(s1_, y, x, n));
  ASSERT_CU(cuMemcpyDtoHAsync(host, y, n * sizeof(float), s1_));
  ASSERT_CU(cuLaunchHostFunc(s1_, CountCall, &calls));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CUgraph g = nullptr;
  ASSERT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);

  EXPECT_TRUE(BitEqual(Read(x, n), x0)) << "a captured kernel ran";
  EXPECT_EQ(Read(y, 1)[0], 9.0f) << "a captured memset ran";
  EXPECT_EQ(host[0], -3.0f) << "a captured copy ran";
  EXPECT_EQ(calls.load(), 0) << "a captured host function ran";

  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(calls.load(), 1);
  std::vector<float> want = x0;
  CpuAxpb(want, 2.0f, 1.0f);
  for (float& v : want) v = 2.0f + v;
  EXPECT_TRUE(BitEqual(std::vector<float>(host, host + n), want));
  ASSERT_CU(cuGraphLaunch(e, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(Capture, CapturedOperationsBecomeNodesOfTheirTypes) {
  constexpr int n = 128;
  CUdeviceptr x = Buffer(std::vector<float>(n, 1.0f)), y = Buffer(std::vector<float>(n, 0.0f));
  float* host = Pinned(n);
  ASSERT_NE(host, nullptr);
  std::fill(host, host + n, 4.0f);
  std::atomic<int> calls{0};

  ASSERT_CU(cuStreamBeginCapture(s1_, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ASSERT_CU(cuMemsetD32Async(x, 0x3f800000u, n, s1_));            // memset
  ASSERT_CU(cuMemcpyHtoDAsync(y, host, n * sizeof(float), s1_));  // memcpy H2D
  ASSERT_CU(AddInto(s1_, x, y, n));                               // kernel
  ASSERT_CU(cuMemcpyDtoDAsync(y, x, n * sizeof(float), s1_));     // memcpy D2D
  ASSERT_CU(cuMemcpyDtoHAsync(host, y, n * sizeof(float), s1_));  // memcpy D2H
  ASSERT_CU(cuLaunchHostFunc(s1_, CountCall, &calls));            // host
  CUgraph g = nullptr;
  ASSERT_CU(End(s1_, &g));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(ChainTypes(g),
            (std::vector<CUgraphNodeType>{CU_GRAPH_NODE_TYPE_MEMSET, CU_GRAPH_NODE_TYPE_MEMCPY,
                                          CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEMCPY,
                                          CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_HOST}));
  EXPECT_EQ(RootCount(g), 1u);
  EXPECT_EQ(EdgeCount(g), 5u);

  CUgraphExec e = Instantiate(g);
  ASSERT_CU(cuGraphLaunch(e, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(calls.load(), 1);
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 5.0f) << "at " << i;  // 1 + 4
}

}  // namespace
