// The emulator's call trace (THAW_EMU_TRACE) and fault injection (THAW_EMU_FAULTS).
//
// Both are configured from the environment at cuInit, so every test runs its body in a
// fresh process (thaw::test::run_in_fresh_process) that sets the variables first: the suite passes
// under ctest (one process per test) and when run as one process.
//
// Trace format (emulator design): one JSON object per line,
//   {"t_ns":..., "pid":..., "tid":..., "call":"cuMemMap", "args":{...},
//    "result":"CUDA_SUCCESS", "out":{...}}
// with "call" the base name (no _v2/_ptsz/_ptds). Arguments use one small vocabulary
// across calls: "size" for byte sizes, "ptr"/"dptr" for addresses, "dst"/"src"/"bytes" for
// copies; pointers are written as "0x..." strings.
// Fault spec: "cuMemCreate:3=CUDA_ERROR_OUT_OF_MEMORY,cuMemMap:2+=999" fails only the 3rd
// cuMemCreate of the process, and every cuMemMap from the 2nd on.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_support.hpp"
#include "thaw/emu_inspect.h"

namespace {

using nlohmann::json;

constexpr size_t kMiB = size_t{1} << 20;

// A fresh, empty file for THAW_EMU_TRACE; removed when the test body ends.
class TraceFile {
 public:
  TraceFile() {
    path_ = testing::TempDir() + "thaw-emu-trace-XXXXXX";
    int fd = mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
    setenv("THAW_EMU_TRACE", path_.c_str(), 1);
  }
  ~TraceFile() { std::remove(path_.c_str()); }

  // Every line, parsed; a line that is not a JSON object fails the test.
  std::vector<json> Lines() const {
    std::vector<json> out;
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(j.is_object()) << "not a JSON object: " << line;
      out.push_back(std::move(j));
    }
    return out;
  }

 private:
  std::string path_;
};

std::vector<std::string> Calls(const std::vector<json>& lines) {
  std::vector<std::string> calls;
  for (const auto& l : lines) calls.push_back(l.value("call", std::string("<no call>")));
  return calls;
}

// Trace values of pointers and sizes: a number, or a string in decimal or 0x-hex.
uint64_t AsU64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return static_cast<uint64_t>(v.get<int64_t>());
  if (v.is_string()) return std::stoull(v.get<std::string>(), nullptr, 0);
  ADD_FAILURE() << "not a number: " << v.dump();
  return 0;
}

uint64_t Field(const json& line, const char* section, const char* key) {
  if (!line.contains(section) || !line[section].is_object() || !line[section].contains(key)) {
    ADD_FAILURE() << "no " << section << "." << key << " in " << line.dump();
    return 0;
  }
  return AsU64(line[section][key]);
}

// The lines of one call, in order.
std::vector<json> Of(const std::vector<json>& lines, const std::string& call) {
  std::vector<json> out;
  for (const auto& l : lines) {
    if (l.value("call", "") == call) out.push_back(l);
  }
  return out;
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

ThawEmuDeviceStats DeviceStats() {
  ThawEmuDeviceStats s{};
  EXPECT_EQ(thawEmuGetDeviceStats(0, &s), CUDA_SUCCESS);
  return s;
}

ThawEmuProcessStats ProcessStats() {
  ThawEmuProcessStats s{};
  EXPECT_EQ(thawEmuGetProcessStats(&s), CUDA_SUCCESS);
  return s;
}

CUmemAllocationProp DeviceMemory() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

void InitWithContext(CUcontext* ctx) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(ctx, nullptr, 0, 0), CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------------------
// THAW_EMU_TRACE
// ---------------------------------------------------------------------------------------

TEST(Trace, WritesOneParseableLinePerCall) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    unsetenv("THAW_EMU_FAULTS");
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    CUdevice dev = -1;
    CUcontext ctx = nullptr;
    CUdeviceptr p = 0, q = 0;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    ASSERT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc(&p, 1 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAlloc(&q, 0), CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);

    auto lines = trace.Lines();
    const auto written = ProcessStats().trace_lines;
    EXPECT_EQ(written, lines.size()) << "trace_lines disagrees with the file";
    // cuInit opens the trace; whether its own line makes it in is the emulator's choice.
    if (!lines.empty() && lines.front().value("call", "") == "cuInit") lines.erase(lines.begin());
    const std::vector<std::string> want = {
        "cuDeviceGetCount", "cuDeviceGet",     "cuDevicePrimaryCtxRetain",
        "cuCtxSetCurrent",  "cuMemAlloc",      "cuMemAlloc",
        "cuMemFree",        "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease"};
    ASSERT_EQ(Calls(lines), want);
    for (size_t i = 0; i < lines.size(); ++i) {
      const auto& l = lines[i];
      EXPECT_TRUE(l.contains("t_ns") && l["t_ns"].is_number_integer()) << l.dump();
      EXPECT_TRUE(l.contains("pid") && l["pid"].is_number_integer()) << l.dump();
      EXPECT_TRUE(l.contains("tid") && l["tid"].is_number_integer()) << l.dump();
      EXPECT_TRUE(l.contains("args") && l["args"].is_object()) << l.dump();
      EXPECT_TRUE(l.contains("out") && l["out"].is_object()) << l.dump();
      ASSERT_TRUE(l.contains("result") && l["result"].is_string()) << l.dump();
      EXPECT_EQ(l["pid"].get<int64_t>(), getpid());
      EXPECT_EQ(l["tid"].get<int64_t>(), gettid());
      EXPECT_EQ(l["result"].get<std::string>(),
                i == 5 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_SUCCESS")
          << l.dump();
    }
  });
}

// Arguments that matter for memory calls are recorded, outputs under "out": enough to
// replay or check an allocation sequence from the trace.
TEST(Trace, RecordsTheArgumentsOfMemoryCalls) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    CUcontext ctx = nullptr;
    InitWithContext(&ctx);
    CUdeviceptr p = 0;
    ASSERT_EQ(cuMemAlloc(&p, 3 * kMiB), CUDA_SUCCESS);
    const auto prop = DeviceMemory();
    CUmemGenericAllocationHandle handle = 0;
    ASSERT_EQ(cuMemCreate(&handle, 4 * kMiB, &prop, 0), CUDA_SUCCESS);
    CUdeviceptr va = 0;
    ASSERT_EQ(cuMemAddressReserve(&va, 8 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemMap(va + 2 * kMiB, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemUnmap(va + 2 * kMiB, 4 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAddressFree(va, 8 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
    std::vector<unsigned char> host(4096, 1);
    ASSERT_EQ(cuMemcpyHtoD(p, host.data(), host.size()), CUDA_SUCCESS);
    ASSERT_EQ(cuMemFree(p), CUDA_SUCCESS);

    const auto lines = trace.Lines();
    const auto alloc = Of(lines, "cuMemAlloc");
    ASSERT_EQ(alloc.size(), 1u);
    EXPECT_EQ(Field(alloc[0], "args", "size"), 3 * kMiB);
    EXPECT_EQ(Field(alloc[0], "out", "dptr"), p);
    const auto create = Of(lines, "cuMemCreate");
    ASSERT_EQ(create.size(), 1u);
    EXPECT_EQ(Field(create[0], "args", "size"), 4 * kMiB);
    const auto reserve = Of(lines, "cuMemAddressReserve");
    ASSERT_EQ(reserve.size(), 1u);
    EXPECT_EQ(Field(reserve[0], "args", "size"), 8 * kMiB);
    EXPECT_EQ(Field(reserve[0], "out", "ptr"), va);
    const auto map = Of(lines, "cuMemMap");
    ASSERT_EQ(map.size(), 1u);
    EXPECT_EQ(Field(map[0], "args", "ptr"), va + 2 * kMiB);
    EXPECT_EQ(Field(map[0], "args", "size"), 4 * kMiB);
    EXPECT_EQ(Field(map[0], "args", "offset"), 0u);
    const auto unmap = Of(lines, "cuMemUnmap");
    ASSERT_EQ(unmap.size(), 1u);
    EXPECT_EQ(Field(unmap[0], "args", "ptr"), va + 2 * kMiB);
    EXPECT_EQ(Field(unmap[0], "args", "size"), 4 * kMiB);
    const auto copy = Of(lines, "cuMemcpyHtoD");
    ASSERT_EQ(copy.size(), 1u) << "cuMemcpyHtoD_v2 is traced under its base name";
    EXPECT_EQ(Field(copy[0], "args", "dst"), p);
    EXPECT_EQ(Field(copy[0], "args", "src"), reinterpret_cast<uint64_t>(host.data()));
    EXPECT_EQ(Field(copy[0], "args", "bytes"), 4096u);
    const auto free_line = Of(lines, "cuMemFree");
    ASSERT_EQ(free_line.size(), 1u);
    EXPECT_EQ(Field(free_line[0], "args", "dptr"), p);
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// Per-thread-default-stream variants are the same call under the same base name.
TEST(Trace, PerThreadVariantsAreTracedUnderTheBaseName) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    CUcontext ctx = nullptr;
    InitWithContext(&ctx);
    void* fn = nullptr;
    ASSERT_EQ(cuGetProcAddress("cuStreamSynchronize", &fn, 13000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr),
              CUDA_SUCCESS);
    ASSERT_NE(fn, nullptr);
    ASSERT_EQ(reinterpret_cast<PFN_cuStreamSynchronize_v7000_ptsz>(fn)(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    const auto lines = trace.Lines();
    EXPECT_EQ(Of(lines, "cuStreamSynchronize").size(), 2u);
    for (const auto& l : lines) {
      const auto call = l.value("call", std::string());
      EXPECT_EQ(call.find("_ptsz"), std::string::npos) << call;
      EXPECT_EQ(call.find("_ptds"), std::string::npos) << call;
      EXPECT_EQ(call.find("_v2"), std::string::npos) << call;
    }
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// t_ns is CLOCK_MONOTONIC (steady) time, non-decreasing along one thread's calls.
TEST(Trace, TimesAreMonotonicClockNanoseconds) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    const uint64_t before = MonotonicNs();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    for (int i = 0; i < 50; ++i) {
      int count = 0;
      ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    }
    const uint64_t after = MonotonicNs();
    const auto lines = trace.Lines();
    ASSERT_GE(lines.size(), 50u);
    uint64_t last = 0;
    for (const auto& l : lines) {
      const uint64_t t = AsU64(l["t_ns"]);
      EXPECT_GE(t, before);
      EXPECT_LE(t, after);
      EXPECT_GE(t, last) << "time went backwards";
      last = t;
    }
  });
}

// Each line names the thread that made the call (its kernel tid), and lines written by
// concurrent threads never interleave.
TEST(Trace, LinesCarryTheCallingThreadAndNeverInterleave) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    constexpr int kThreads = 4, kCalls = 200;
    std::vector<pid_t> tids(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&tids, t] {
        tids[t] = gettid();
        for (int i = 0; i < kCalls; ++i) {
          int count = 0;
          cuDeviceGetCount(&count);
        }
      });
    }
    for (auto& th : threads) th.join();
    const auto lines = trace.Lines();  // every line parses: none was torn
    std::map<int64_t, int> per_tid;
    for (const auto& l : Of(lines, "cuDeviceGetCount")) {
      EXPECT_EQ(l["pid"].get<int64_t>(), getpid());
      ++per_tid[l["tid"].get<int64_t>()];
    }
    ASSERT_EQ(per_tid.size(), static_cast<size_t>(kThreads));
    for (pid_t tid : tids) EXPECT_EQ(per_tid[tid], kCalls) << "tid " << tid;
  });
}

TEST(Trace, IsOffWithoutTheVariable) {
  thaw::test::run_in_fresh_process({}, [] {
    unsetenv("THAW_EMU_TRACE");
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_EQ(ProcessStats().trace_lines, 0u);
  });
}

// ---------------------------------------------------------------------------------------
// THAW_EMU_FAULTS
// ---------------------------------------------------------------------------------------

// ":N" fails only the Nth call, and an injected failure changes nothing: no physical
// allocation, handle or byte appears.
TEST(Faults, NthCallFailsOnlyThatCallAndLeavesNoState) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemCreate:3=CUDA_ERROR_OUT_OF_MEMORY", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);  // VMM calls need no context
    const auto prop = DeviceMemory();
    std::vector<CUmemGenericAllocationHandle> handles;
    std::vector<CUresult> results;
    for (int i = 1; i <= 5; ++i) {
      const auto before = DeviceStats();
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = cuMemCreate(&h, 2 * kMiB, &prop, 0);
      results.push_back(r);
      const auto after = DeviceStats();
      if (r == CUDA_SUCCESS) {
        handles.push_back(h);
        EXPECT_EQ(after.physical_allocations, before.physical_allocations + 1);
      } else {
        EXPECT_EQ(after.physical_allocations, before.physical_allocations) << "call " << i;
        EXPECT_EQ(after.vmm_handle_refs, before.vmm_handle_refs) << "call " << i;
        EXPECT_EQ(after.process_bytes_in_use, before.process_bytes_in_use) << "call " << i;
        EXPECT_EQ(after.device_bytes_in_use, before.device_bytes_in_use) << "call " << i;
      }
    }
    const std::vector<CUresult> want = {CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY,
                                        CUDA_SUCCESS, CUDA_SUCCESS};
    EXPECT_EQ(results, want);
    for (auto h : handles) EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(DeviceStats().physical_allocations, 0u);
  });
}

// ":N+" fails the Nth call and every later one.
TEST(Faults, NthAndLaterCallsFail) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemAlloc:2+=CUDA_ERROR_UNKNOWN", 1);
    CUcontext ctx = nullptr;
    InitWithContext(&ctx);
    size_t free0 = 0, total = 0;
    CUdeviceptr first = 0;
    ASSERT_EQ(cuMemAlloc(&first, 2 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
    for (int i = 2; i <= 6; ++i) {
      CUdeviceptr p = 0;
      EXPECT_EQ(cuMemAlloc(&p, 2 * kMiB), CUDA_ERROR_UNKNOWN) << "call " << i;
    }
    size_t free1 = 0;
    ASSERT_EQ(cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free1, free0);
    EXPECT_EQ(DeviceStats().legacy_allocations, 1u);
    EXPECT_EQ(cuMemFree(first), CUDA_SUCCESS) << "other calls are unaffected";
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// The error is a CUresult name or its decimal value; several rules are comma-separated.
TEST(Faults, NumericCodesAndSeveralRules) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemAlloc:1=2,cuMemCreate:2=999,cuMemAllocHost:1=201", 1);
    CUcontext ctx = nullptr;
    InitWithContext(&ctx);
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    const auto prop = DeviceMemory();
    CUmemGenericAllocationHandle a = 0, b = 0;
    ASSERT_EQ(cuMemCreate(&a, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuMemCreate(&b, 2 * kMiB, &prop, 0), CUDA_ERROR_UNKNOWN);
    void* host = nullptr;
    EXPECT_EQ(cuMemAllocHost(&host, 4096), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(ProcessStats().pinned_host_ranges, 0u);
    EXPECT_EQ(cuMemRelease(a), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// Calls are counted per base name, whatever entry point reached them (the macro's _v2,
// a pointer from cuGetProcAddress, a per-thread variant); other functions do not count.
TEST(Faults, CallsAreCountedPerBaseNameAcrossEntryPoints) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS",
           "cuMemAlloc:2=CUDA_ERROR_OUT_OF_MEMORY,cuStreamSynchronize:2=CUDA_ERROR_LAUNCH_FAILED",
           1);
    CUcontext ctx = nullptr;
    InitWithContext(&ctx);
    CUdeviceptr a = 0, b = 0, c = 0;
    ASSERT_EQ(cuMemAlloc(&a, 4096), CUDA_SUCCESS);  // cuMemAlloc_v2 via cuda.h's macro
    void* host = nullptr;
    ASSERT_EQ(cuMemAllocHost(&host, 4096), CUDA_SUCCESS);  // another function
    ASSERT_EQ(cuMemFreeHost(host), CUDA_SUCCESS);
    void* fn = nullptr;
    ASSERT_EQ(cuGetProcAddress("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr),
              CUDA_SUCCESS);
    auto alloc = reinterpret_cast<PFN_cuMemAlloc_v3020>(fn);
    EXPECT_EQ(alloc(&b, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(alloc(&c, 4096), CUDA_SUCCESS);

    ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    ASSERT_EQ(cuGetProcAddress("cuStreamSynchronize", &fn, 13000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr),
              CUDA_SUCCESS);
    EXPECT_EQ(reinterpret_cast<PFN_cuStreamSynchronize_v7000_ptsz>(fn)(nullptr),
              CUDA_ERROR_LAUNCH_FAILED);
    EXPECT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
    EXPECT_EQ(cuMemFree(c), CUDA_SUCCESS);
    EXPECT_EQ(cuCtxDestroy(ctx), CUDA_SUCCESS);
  });
}

// A failed cuMemMap maps nothing: the same range can be mapped by the next call (a real
// mapping would make it CUDA_ERROR_INVALID_VALUE / already mapped) and no mapping counts.
TEST(Faults, InjectedMapFailureMapsNothing) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemMap:1=CUDA_ERROR_OUT_OF_MEMORY", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    const auto prop = DeviceMemory();
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(cuMemCreate(&h, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
    CUdeviceptr va = 0;
    ASSERT_EQ(cuMemAddressReserve(&va, 2 * kMiB, 0, 0, 0), CUDA_SUCCESS);
    const auto before = DeviceStats();
    EXPECT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_ERROR_OUT_OF_MEMORY);
    const auto after = DeviceStats();
    EXPECT_EQ(after.vmm_mappings, before.vmm_mappings);
    EXPECT_EQ(after.vmm_handle_refs, before.vmm_handle_refs);
    ASSERT_EQ(cuMemMap(va, 2 * kMiB, 0, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(DeviceStats().vmm_mappings, before.vmm_mappings + 1);
    EXPECT_EQ(cuMemUnmap(va, 2 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAddressFree(va, 2 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(DeviceStats().physical_allocations, 0u);
  });
}

// A failed cuMemAddressReserve reserves nothing.
TEST(Faults, InjectedReserveFailureReservesNothing) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemAddressReserve:1=CUDA_ERROR_OUT_OF_MEMORY", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    const auto before = ProcessStats();
    CUdeviceptr va = 0;
    EXPECT_EQ(cuMemAddressReserve(&va, 64 * kMiB, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
    const auto after = ProcessStats();
    EXPECT_EQ(after.reservations, before.reservations);
    EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  });
}

// The trace shows what the caller saw, injected failures included.
TEST(Faults, InjectedFailuresAppearInTheTrace) {
  thaw::test::run_in_fresh_process({}, [] {
    TraceFile trace;
    setenv("THAW_EMU_FAULTS", "cuMemCreate:2=CUDA_ERROR_OUT_OF_MEMORY", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    const auto prop = DeviceMemory();
    CUmemGenericAllocationHandle a = 0, b = 0;
    ASSERT_EQ(cuMemCreate(&a, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuMemCreate(&b, 2 * kMiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_EQ(cuMemRelease(a), CUDA_SUCCESS);
    const auto creates = Of(trace.Lines(), "cuMemCreate");
    ASSERT_EQ(creates.size(), 2u);
    EXPECT_EQ(creates[0].value("result", ""), "CUDA_SUCCESS");
    EXPECT_EQ(creates[1].value("result", ""), "CUDA_ERROR_OUT_OF_MEMORY");
  });
}

// A spec the emulator cannot parse must not be ignored (a test would believe it exercised
// an error path): cuInit fails with CUDA_ERROR_INVALID_VALUE, says why on stderr naming the
// variable, and the driver stays uninitialised.
void ExpectRejectedSpec(const char* spec) {
  EXPECT_EXIT(
      {
        setenv("THAW_EMU_FAULTS", spec, 1);
        const CUresult init = cuInit(0);
        int count = 0;
        const CUresult after = cuDeviceGetCount(&count);
        std::fflush(nullptr);
        std::_Exit(init == CUDA_ERROR_INVALID_VALUE && after == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
      },
      testing::ExitedWithCode(0), "THAW_EMU_FAULTS")
      << "spec '" << spec << "'";
}

TEST(Faults, MalformedSpecsFailCuInitNamingTheVariable) {
  for (const char* spec : {
           "cuMemCreate",                              // no :N=ERROR
           "cuMemCreate:3",                            // no =ERROR
           "cuMemCreate=2",                            // no :N
           "cuMemCreate:0=CUDA_ERROR_OUT_OF_MEMORY",   // calls count from 1
           "cuMemCreate:-1=CUDA_ERROR_OUT_OF_MEMORY",  // not a call number
           "cuMemCreate:x=2",                          //
           "cuMemCreate:3=",                           // no error
           "cuMemCreate:3=CUDA_ERROR_NOT_A_THING",     // not a CUresult name
           "cuMemCreate:3=12345",                      // not a CUresult value
           ":3=2",                                     // no function
           "cuMemCreate:3=2,garbage",                  // one bad rule spoils the spec
       }) {
    ExpectRejectedSpec(spec);
  }
}

// A rule naming no driver function would silently inject nothing.
TEST(Faults, SpecNamingNoDriverFunctionIsRejected) {
  ExpectRejectedSpec("cuMemCreat:1=CUDA_ERROR_OUT_OF_MEMORY");
  ExpectRejectedSpec("cuNotAFunction:1=2");
}

TEST(Faults, AWellFormedSpecInitialisesNormally) {
  thaw::test::run_in_fresh_process({}, [] {
    setenv("THAW_EMU_FAULTS", "cuMemCreate:3=CUDA_ERROR_OUT_OF_MEMORY,cuMemMap:2+=999", 1);
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    int count = 0;
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  });
}

}  // namespace
