// The emulator's timing model (THAW_EMU_TIMING=1): PCIe bandwidth for H2D/D2H, device bandwidth
// for D2D copies and memsets, latency per 2 MiB page created or mapped, a fixed launch latency
// per stream operation, one H2D and one D2H copy engine per device shared by all streams, and
// pageable-memory async copies that return only after completion.
//
// An async op takes max(modelled time, the host's real time to move the bytes). This machine's
// host memcpy is roughly 4-15 GB/s warm (depending on load) and first touch of fresh memory runs
// at ~1 GB/s, so every scenario pre-touches its buffers, and every "≈ model" assertion uses a
// configuration the host beats comfortably so the model, not the memcpy, decides the time
// (kSlowBuild scales the configuration for sanitizer builds). Tolerances are generous (the
// machine has 2 shared cores) but each bound fails if the model were off by 2× or turned off;
// the one exception, the default 25 GB/s floor, is explained where it is asserted.
//
// The emulator reads its configuration once, at a process's first cuInit. Each scenario therefore
// runs in a freshly executed copy of this binary (gtest's "threadsafe" death-test style re-executes
// it), so it gets its own configuration even when the whole suite runs as one process.
#include <cuda.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kPage = 2 * kMiB;  // the emulator's VMM granularity (minimum = recommended)

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Modelled transfer time in ms for `bytes` at `gbps` (GB = 1e9 bytes).
double TransferMs(size_t bytes, double gbps) {
  return double(bytes) / (gbps * 1e9) * 1e3;
}

using thaw::test::kSlowBuild;

// The timing configuration of one scenario, as the emulator will read it; an empty value leaves
// the emulator's default.
struct TimingEnv {
  std::optional<double> pcie_gbps;
  std::optional<double> d2d_gbps;
  std::optional<double> page_latency_us;
  std::optional<double> launch_latency_us;
};

// Runs one scenario in a fresh process configured by `env` (see the file comment).
void RunScenario(const TimingEnv& env, const std::function<void()>& body) {
  using thaw::test::env_number;
  thaw::test::run_in_fresh_process(
      {{"THAW_EMU_TIMING", "1"},
       {"THAW_EMU_PCIE_GBPS", env_number(env.pcie_gbps)},
       {"THAW_EMU_D2D_GBPS", env_number(env.d2d_gbps)},
       {"THAW_EMU_PAGE_LATENCY_US", env_number(env.page_latency_us)},
       {"THAW_EMU_LAUNCH_LATENCY_US", env_number(env.launch_latency_us)}},
      body);
}

// cuInit and the primary context of device 0, current on this thread.
class Driver {
 public:
  // The context's members (streams, memory, ...) are released by ~Driver before primary_ goes.
  ~Driver() {
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    for (CUstream s : streams_) EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
    for (CUevent e : events_) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
    for (CUdeviceptr d : device_) EXPECT_EQ(cuMemFree(d), CUDA_SUCCESS);
    for (void* h : pinned_) EXPECT_EQ(cuMemFreeHost(h), CUDA_SUCCESS);
    for (void* h : pageable_) std::free(h);
  }

  CUstream Stream() {
    CUstream s = nullptr;
    EXPECT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    streams_.push_back(s);
    return s;
  }
  CUevent Event() {
    CUevent e = nullptr;
    EXPECT_EQ(cuEventCreate(&e, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    events_.push_back(e);
    return e;
  }
  // Device memory, written once so its first-touch cost is paid before anything is timed. A
  // memset of device memory is asynchronous to the host even in its "synchronous" form (as on
  // NVIDIA's driver), hence the synchronize.
  CUdeviceptr Device(size_t bytes) {
    CUdeviceptr d = 0;
    EXPECT_EQ(cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    device_.push_back(d);
    EXPECT_EQ(cuMemsetD8(d, 0, bytes), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    return d;
  }
  // Pinned host memory, pre-touched.
  unsigned char* Pinned(size_t bytes, int fill) {
    void* p = nullptr;
    EXPECT_EQ(cuMemAllocHost(&p, bytes), CUDA_SUCCESS);
    pinned_.push_back(p);
    if (p != nullptr) std::memset(p, fill, bytes);
    return static_cast<unsigned char*>(p);
  }
  // Ordinary (pageable) host memory, pre-touched.
  unsigned char* Pageable(size_t bytes, int fill) {
    void* p = std::aligned_alloc(4096, bytes);
    pageable_.push_back(p);
    std::memset(p, fill, bytes);
    return static_cast<unsigned char*>(p);
  }

  float ElapsedMs(CUevent start, CUevent end) {
    float ms = -1;
    EXPECT_EQ(cuEventElapsedTime_v2(&ms, start, end), CUDA_SUCCESS);
    return ms;
  }

 private:
  thaw::test::PrimaryContext primary_;  // first member: constructed first, destroyed last
  std::vector<CUstream> streams_;
  std::vector<CUevent> events_;
  std::vector<CUdeviceptr> device_;
  std::vector<void*> pinned_;
  std::vector<void*> pageable_;
};

// One timed async H2D copy: wall time of call + completion, time until the call returned, and
// the events' elapsed time around it.
struct CopyTiming {
  double wall_ms = 0;
  double call_ms = 0;
  double event_ms = 0;
};

CopyTiming TimeAsyncHtoD(Driver& d, CUstream s, CUdeviceptr dst, const void* src, size_t bytes) {
  CUevent start = d.Event();
  CUevent end = d.Event();
  CopyTiming t;
  EXPECT_EQ(cuEventRecord(start, s), CUDA_SUCCESS);
  auto t0 = Clock::now();
  EXPECT_EQ(cuMemcpyHtoDAsync(dst, src, bytes, s), CUDA_SUCCESS);
  t.call_ms = MsSince(t0);
  EXPECT_EQ(cuEventRecord(end, s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  t.wall_ms = MsSince(t0);
  t.event_ms = d.ElapsedMs(start, end);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Acceptance: an async 1 GiB H2D copy from pinned memory
// ---------------------------------------------------------------------------------------------

// 2 GB/s rather than a faster setting: the model (537 ms) must stay well above what the host
// needs for 1 GiB even when the 2 cores are busy with other work (up to ~270 ms seen).
TEST(TimingAcceptance, OneGiBPinnedHtoDTakesBytesOverTheConfiguredBandwidth) {
  const double gbps = 2 / kSlowBuild;
  RunScenario({.pcie_gbps = gbps}, [gbps] {
    Driver d;
    unsigned char* host = d.Pinned(kGiB, 0x5a);
    CUdeviceptr dev = d.Device(kGiB);
    ASSERT_NE(host, nullptr);
    CUstream s = d.Stream();

    const double model_ms = TransferMs(kGiB, gbps);
    CopyTiming t = TimeAsyncHtoD(d, s, dev, host, kGiB);
    std::printf(
        "1 GiB pinned H2D at %.3g GB/s: model %.1f ms, wall %.1f ms, events %.1f ms, "
        "call returned after %.3f ms\n",
        gbps, model_ms, t.wall_ms, t.event_ms, t.call_ms);
    // Within 15 % of the model: below it is wrong at any load, above it may be the load.
    EXPECT_GE(t.wall_ms, 0.85 * model_ms);
    EXPECT_GE(t.event_ms, 0.85 * model_ms);
    EXPECT_LE(t.wall_ms, 1.15 * model_ms) << thaw::test::kWallTimeAboveBound;
    EXPECT_LE(t.event_ms, 1.15 * model_ms) << thaw::test::kWallTimeAboveBound;
    EXPECT_LT(t.call_ms, 0.25 * model_ms)
        << "an async copy from pinned memory must not block" << thaw::test::kWallTimeAboveBound;

    unsigned char back[4] = {};
    ASSERT_EQ(cuMemcpyDtoH(back, dev + kGiB - sizeof(back), sizeof(back)), CUDA_SUCCESS);
    EXPECT_EQ(back[3], 0x5a);
  });
}

// At the default 25 GB/s the model gives 1 GiB 42.9 ms, but this host's memcpy of 1 GiB is
// slower than that (~70-270 ms warm, depending on load), and the emulator cannot move bytes
// faster than the host: the op takes max(model, host). So here the model can only be checked as
// a floor (a wrong or disabled model would be hidden by the slower host), and the upper bound
// only checks that nothing but those two costs is added. The "≈ model" check is the 2 GB/s
// scenario above.
TEST(TimingAcceptance, OneGiBPinnedHtoDAtDefaultBandwidthTakesAtLeastTheModel) {
  RunScenario({}, [] {
    Driver d;
    unsigned char* host = d.Pinned(kGiB, 0x3c);
    CUdeviceptr dev = d.Device(kGiB);
    ASSERT_NE(host, nullptr);
    CUstream s = d.Stream();

    // The host's own speed: a plain memcpy of a quarter of the bytes into a pre-touched buffer,
    // and the emulator's synchronous copy of all of them (which takes max(model, host) as well).
    unsigned char* scratch = d.Pageable(kGiB / 4, 0);
    auto h0 = Clock::now();
    std::memcpy(scratch, host, kGiB / 4);
    const double host_ms = 4 * MsSince(h0);
    h0 = Clock::now();
    ASSERT_EQ(cuMemcpyHtoD(dev, host, kGiB), CUDA_SUCCESS);
    const double sync_ms = MsSince(h0);

    const double model_ms = TransferMs(kGiB, 25);
    CopyTiming t = TimeAsyncHtoD(d, s, dev, host, kGiB);
    std::printf(
        "1 GiB pinned H2D at default 25 GB/s: model %.1f ms, host memcpy %.1f ms, "
        "synchronous copy %.1f ms, async wall %.1f ms, events %.1f ms\n",
        model_ms, host_ms, sync_ms, t.wall_ms, t.event_ms);
    EXPECT_GE(t.wall_ms, 0.95 * model_ms);
    EXPECT_GE(t.event_ms, 0.95 * model_ms);
    EXPECT_LE(t.wall_ms, 2.5 * std::max({model_ms, host_ms, sync_ms}) + 30)
        << "more than max(model, host copy) was charged: is the default bandwidth 25 GB/s?"
        << thaw::test::kWallTimeAboveBound;
  });
}

// ---------------------------------------------------------------------------------------------
// Copy engines: one H2D and one D2H link per device, shared by all streams
// ---------------------------------------------------------------------------------------------

TEST(TimingCopyEngines, HtoDAndDtoHOnTwoStreamsOverlap) {
  const double gbps = 1 / kSlowBuild;
  RunScenario({.pcie_gbps = gbps}, [gbps] {
    constexpr size_t kBytes = 64 * kMiB;
    Driver d;
    unsigned char* up_src = d.Pinned(kBytes, 1);
    unsigned char* down_dst = d.Pinned(kBytes, 0);
    CUdeviceptr up_dst = d.Device(kBytes);
    CUdeviceptr down_src = d.Device(kBytes);
    CUstream a = d.Stream();
    CUstream b = d.Stream();

    const double one_ms = TransferMs(kBytes, gbps);  // 67 ms; the host needs ~5-30 ms
    auto t0 = Clock::now();
    ASSERT_EQ(cuMemcpyHtoDAsync(up_dst, up_src, kBytes, a), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoHAsync(down_dst, down_src, kBytes, b), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(a), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(b), CUDA_SUCCESS);
    const double wall_ms = MsSince(t0);
    std::printf("H2D on A + D2H on B, 64 MiB each at %.3g GB/s: one copy %.1f ms, wall %.1f ms\n",
                gbps, one_ms, wall_ms);
    EXPECT_GE(wall_ms, 0.85 * one_ms);
    EXPECT_LE(wall_ms, 1.45 * one_ms) << "H2D and D2H did not overlap (serialized ≈ 2× one copy)"
                                      << thaw::test::kWallTimeAboveBound;
  });
}

TEST(TimingCopyEngines, TwoHtoDCopiesOnTwoStreamsShareOneEngine) {
  const double gbps = 1 / kSlowBuild;
  RunScenario({.pcie_gbps = gbps}, [gbps] {
    constexpr size_t kBytes = 64 * kMiB;
    Driver d;
    unsigned char* src_a = d.Pinned(kBytes, 1);
    unsigned char* src_b = d.Pinned(kBytes, 2);
    CUdeviceptr dst_a = d.Device(kBytes);
    CUdeviceptr dst_b = d.Device(kBytes);
    CUstream a = d.Stream();
    CUstream b = d.Stream();

    const double one_ms = TransferMs(kBytes, gbps);  // 67 ms; the host needs ~5-30 ms
    auto t0 = Clock::now();
    ASSERT_EQ(cuMemcpyHtoDAsync(dst_a, src_a, kBytes, a), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyHtoDAsync(dst_b, src_b, kBytes, b), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(a), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(b), CUDA_SUCCESS);
    const double wall_ms = MsSince(t0);
    std::printf("two H2D on A and B, 64 MiB each at %.3g GB/s: sum %.1f ms, wall %.1f ms\n", gbps,
                2 * one_ms, wall_ms);
    EXPECT_GE(wall_ms, 0.85 * 2 * one_ms) << "two H2D copies overlapped on one H2D engine";
    EXPECT_LE(wall_ms, 1.45 * 2 * one_ms) << thaw::test::kWallTimeAboveBound;

    unsigned char a_back = 0;
    unsigned char b_back = 0;
    ASSERT_EQ(cuMemcpyDtoH(&a_back, dst_a, 1), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoH(&b_back, dst_b + kBytes - 1, 1), CUDA_SUCCESS);
    EXPECT_EQ(a_back, 1);
    EXPECT_EQ(b_back, 2);
  });
}

// ---------------------------------------------------------------------------------------------
// VMM page latency
// ---------------------------------------------------------------------------------------------

// Per 2 MiB page created by cuMemCreate or mapped by cuMemMap. A large latency (5 ms) keeps the
// model far above whatever the host spends creating and mapping a 16 MiB memfd.
TEST(TimingVmm, CreateAndMapCostPageLatencyPerPage) {
  const double latency_us = 5000 * kSlowBuild;
  RunScenario({.page_latency_us = latency_us}, [latency_us] {
    constexpr size_t kPages = 8;
    const double model_ms = kPages * latency_us / 1000;  // 40 ms
    Driver d;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t granularity = 0;
    ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    ASSERT_EQ(granularity, kPage);

    // One cuMemCreate of N pages.
    CUmemGenericAllocationHandle big = 0;
    auto t0 = Clock::now();
    ASSERT_EQ(cuMemCreate(&big, kPages * kPage, &prop, 0), CUDA_SUCCESS);
    const double create_ms = MsSince(t0);

    // N cuMemCreate calls of one page each.
    std::vector<CUmemGenericAllocationHandle> small(kPages);
    t0 = Clock::now();
    for (auto& h : small) ASSERT_EQ(cuMemCreate(&h, kPage, &prop, 0), CUDA_SUCCESS);
    const double create_single_ms = MsSince(t0);

    // One cuMemMap of N pages.
    CUdeviceptr va = 0;
    ASSERT_EQ(cuMemAddressReserve(&va, kPages * kPage, 0, 0, 0), CUDA_SUCCESS);
    t0 = Clock::now();
    ASSERT_EQ(cuMemMap(va, kPages * kPage, 0, big, 0), CUDA_SUCCESS);
    const double map_ms = MsSince(t0);

    std::printf(
        "page latency %.0f us × %zu pages: model %.1f ms; cuMemCreate %.1f ms, "
        "%zu single-page cuMemCreate %.1f ms, cuMemMap %.1f ms\n",
        latency_us, kPages, model_ms, create_ms, kPages, create_single_ms, map_ms);
    for (double ms : {create_ms, create_single_ms, map_ms}) {
      EXPECT_GE(ms, 0.85 * model_ms);
      EXPECT_LE(ms, 1.5 * model_ms + 5) << thaw::test::kWallTimeAboveBound;
    }

    EXPECT_EQ(cuMemUnmap(va, kPages * kPage), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAddressFree(va, kPages * kPage), CUDA_SUCCESS);
    EXPECT_EQ(cuMemRelease(big), CUDA_SUCCESS);
    for (auto h : small) EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
  });
}

// ---------------------------------------------------------------------------------------------
// Launch latency
// ---------------------------------------------------------------------------------------------

TEST(TimingLaunch, ChainOfTinyOpsPaysTheLaunchLatencyPerOp) {
  const double latency_us = 1000 * kSlowBuild;
  RunScenario({.launch_latency_us = latency_us}, [latency_us] {
    constexpr int kOps = 100;
    const double model_ms = kOps * latency_us / 1000;  // 100 ms; a 1-byte memset moves nothing
    Driver d;
    CUdeviceptr dev = d.Device(kOps);
    CUstream s = d.Stream();
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);

    auto t0 = Clock::now();
    for (int i = 0; i < kOps; ++i) {
      ASSERT_EQ(cuMemsetD8Async(dev + i, static_cast<unsigned char>(i), 1, s), CUDA_SUCCESS);
    }
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    const double wall_ms = MsSince(t0);
    std::printf("%d one-byte memsets at %.0f us launch latency: model %.1f ms, wall %.1f ms\n",
                kOps, latency_us, model_ms, wall_ms);
    EXPECT_GE(wall_ms, 0.9 * model_ms);
    EXPECT_LE(wall_ms, 1.6 * model_ms) << thaw::test::kWallTimeAboveBound;

    std::vector<unsigned char> back(kOps);
    ASSERT_EQ(cuMemcpyDtoH(back.data(), dev, kOps), CUDA_SUCCESS);
    for (int i = 0; i < kOps; ++i) EXPECT_EQ(back[i], static_cast<unsigned char>(i));
  });
}

// ---------------------------------------------------------------------------------------------
// Device bandwidth: D2D copies and memsets
// ---------------------------------------------------------------------------------------------

TEST(TimingDevice, DtoDCopyAndMemsetUseTheDeviceBandwidth) {
  const double gbps = 1 / kSlowBuild;
  RunScenario({.d2d_gbps = gbps}, [gbps] {
    constexpr size_t kBytes = 64 * kMiB;
    const double model_ms = TransferMs(kBytes, gbps);  // 67 ms; the host needs ~5-30 ms
    Driver d;
    CUdeviceptr src = d.Device(kBytes);  // touched by a (modelled) memset
    CUdeviceptr dst = d.Device(kBytes);
    CUstream s = d.Stream();
    CUevent start = d.Event();
    CUevent end = d.Event();
    ASSERT_EQ(cuMemsetD8(src, 0x77, kBytes), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);  // the memset is asynchronous to the host

    ASSERT_EQ(cuEventRecord(start, s), CUDA_SUCCESS);
    auto t0 = Clock::now();
    ASSERT_EQ(cuMemcpyDtoDAsync(dst, src, kBytes, s), CUDA_SUCCESS);
    ASSERT_EQ(cuEventRecord(end, s), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    const double copy_wall_ms = MsSince(t0);
    const double copy_event_ms = d.ElapsedMs(start, end);

    ASSERT_EQ(cuEventRecord(start, s), CUDA_SUCCESS);
    t0 = Clock::now();
    ASSERT_EQ(cuMemsetD8Async(dst, 0x11, kBytes, s), CUDA_SUCCESS);
    ASSERT_EQ(cuEventRecord(end, s), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    const double memset_wall_ms = MsSince(t0);
    const double memset_event_ms = d.ElapsedMs(start, end);

    std::printf(
        "64 MiB at %.3g GB/s device bandwidth: model %.1f ms; D2D wall %.1f / events "
        "%.1f ms; memset wall %.1f / events %.1f ms\n",
        gbps, model_ms, copy_wall_ms, copy_event_ms, memset_wall_ms, memset_event_ms);
    for (double ms : {copy_wall_ms, copy_event_ms, memset_wall_ms, memset_event_ms}) {
      EXPECT_GE(ms, 0.85 * model_ms);
      EXPECT_LE(ms, 1.45 * model_ms) << thaw::test::kWallTimeAboveBound;
    }
    unsigned char back = 0;
    ASSERT_EQ(cuMemcpyDtoH(&back, dst + kBytes - 1, 1), CUDA_SUCCESS);
    EXPECT_EQ(back, 0x11);
  });
}

// The device bandwidth is not the PCIe bandwidth: a slow device does not slow an H2D copy.
TEST(TimingDevice, HtoDCopyIgnoresTheDeviceBandwidth) {
  const double pcie_gbps = 2 / kSlowBuild;
  const double d2d_gbps = 0.25 / kSlowBuild;
  RunScenario({.pcie_gbps = pcie_gbps, .d2d_gbps = d2d_gbps}, [pcie_gbps, d2d_gbps] {
    constexpr size_t kBytes = 64 * kMiB;
    Driver d;
    unsigned char* host = d.Pinned(kBytes, 9);
    CUdeviceptr dev = 0;  // not Device(): its warm-up memset would run at the slow device speed
    ASSERT_EQ(cuMemAlloc(&dev, kBytes), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyHtoD(dev, host, kBytes), CUDA_SUCCESS);  // warm-up: first touch
    CUstream s = d.Stream();
    const double pcie_ms = TransferMs(kBytes, pcie_gbps);   // 34 ms
    const double device_ms = TransferMs(kBytes, d2d_gbps);  // 268 ms
    CopyTiming t = TimeAsyncHtoD(d, s, dev, host, kBytes);
    std::printf(
        "64 MiB H2D at %.3g GB/s PCIe, %.3g GB/s device: PCIe model %.1f ms, wall %.1f "
        "ms\n",
        pcie_gbps, d2d_gbps, pcie_ms, t.wall_ms);
    EXPECT_GE(t.wall_ms, 0.85 * pcie_ms);
    EXPECT_LE(t.wall_ms, 1.45 * pcie_ms + 5) << thaw::test::kWallTimeAboveBound;
    EXPECT_LT(t.wall_ms, 0.5 * device_ms)
        << "the H2D copy was charged at the device bandwidth" << thaw::test::kWallTimeAboveBound;
    EXPECT_EQ(cuMemFree(dev), CUDA_SUCCESS);
  });
}

// ---------------------------------------------------------------------------------------------
// Pageable versus pinned host memory
// ---------------------------------------------------------------------------------------------

// The driver stages pageable memory, so an "async" copy from or to it returns only once the copy
// is done; from pinned (or registered) memory it returns at once and the stream carries the time.
TEST(TimingHostMemory, PageableAsyncCopyReturnsOnlyAfterCompletionPinnedReturnsAtOnce) {
  const double gbps = 1 / kSlowBuild;
  RunScenario({.pcie_gbps = gbps}, [gbps] {
    constexpr size_t kBytes = 64 * kMiB;
    const double model_ms = TransferMs(kBytes, gbps);  // 67 ms
    Driver d;
    unsigned char* pageable = d.Pageable(kBytes, 0x21);
    unsigned char* pinned = d.Pinned(kBytes, 0x42);
    CUdeviceptr dev = d.Device(kBytes);
    CUstream s = d.Stream();

    CopyTiming from_pageable = TimeAsyncHtoD(d, s, dev, pageable, kBytes);
    CopyTiming from_pinned = TimeAsyncHtoD(d, s, dev, pinned, kBytes);

    auto t0 = Clock::now();
    ASSERT_EQ(cuMemcpyDtoHAsync(pageable, dev, kBytes, s), CUDA_SUCCESS);
    const double to_pageable_call_ms = MsSince(t0);
    ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(pageable[kBytes - 1], 0x42);

    // Registered memory counts as pinned.
    ASSERT_EQ(cuMemHostRegister(pageable, kBytes, 0), CUDA_SUCCESS);
    CopyTiming from_registered = TimeAsyncHtoD(d, s, dev, pageable, kBytes);
    ASSERT_EQ(cuMemHostUnregister(pageable), CUDA_SUCCESS);

    std::printf(
        "64 MiB at %.3g GB/s (model %.1f ms): pageable H2D call %.1f / wall %.1f ms; "
        "pinned H2D call %.3f / wall %.1f ms; pageable D2H call %.1f ms; registered "
        "H2D call %.3f / wall %.1f ms\n",
        gbps, model_ms, from_pageable.call_ms, from_pageable.wall_ms, from_pinned.call_ms,
        from_pinned.wall_ms, to_pageable_call_ms, from_registered.call_ms, from_registered.wall_ms);
    EXPECT_GE(from_pageable.call_ms, 0.85 * model_ms) << "pageable async H2D returned early";
    EXPECT_LE(from_pageable.wall_ms, 1.45 * model_ms) << thaw::test::kWallTimeAboveBound;
    EXPECT_GE(to_pageable_call_ms, 0.85 * model_ms) << "pageable async D2H returned early";
    EXPECT_LE(to_pageable_call_ms, 1.45 * model_ms) << thaw::test::kWallTimeAboveBound;
    for (const CopyTiming& t : {from_pinned, from_registered}) {
      EXPECT_LT(t.call_ms, 0.25 * model_ms)
          << "an async copy from pinned memory blocked" << thaw::test::kWallTimeAboveBound;
      EXPECT_GE(t.wall_ms, 0.85 * model_ms);
      EXPECT_LE(t.wall_ms, 1.45 * model_ms) << thaw::test::kWallTimeAboveBound;
    }
  });
}

}  // namespace
