// The shim's interposition, seen from a program (preload_probe) that reaches the driver like
// the CUDA runtime: every lookup answers as without the shim — same result, same status,
// same ABI variant — except that exactly the hooked variants come from the shim; other
// libraries' names and cuGetExportTable are untouched; allocations land at the same
// deterministic addresses every run and answer range queries like cuMemAlloc memory; many
// threads at once and a forked child that uses CUDA work. And HAMi-core's pitfalls, each a
// test: host-NUMA cuMemCreate is not device memory; the driver's own dlsym lookups are not
// answered with hooks; no wrong ABI variant; cuGetExportTable untouched.
#include <cuda.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <set>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

struct ProbeRun {
  int exit_code = -1;
  std::vector<nlohmann::json> lines;
  std::string text;
};

ProbeRun probe(const std::string& args, bool preload, const std::string& env = "",
               const std::string& binary = PROBE_BIN) {
  std::string cmd = "env PROBE_LIBCUDA=" THAW_EMU_LIBCUDA " " + env + " ";
  if (preload) cmd += "LD_PRELOAD=" THAW_PRELOAD_LIB " ";
  cmd += binary + " " + args + " 2>&1";
  ProbeRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) r.text.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::size_t start = 0;
  while (start < r.text.size()) {
    const auto end = r.text.find('\n', start);
    auto j = nlohmann::json::parse(r.text.substr(start, end - start), nullptr, false);
    if (!j.is_discarded() && j.is_object()) r.lines.push_back(j);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return r;
}

// The shim's hooked set (preload/interpose/hook_table.cpp) and its cuGetProcAddress wrappers.
bool hooked(const std::string& variant) {
  static const std::set<std::string> kHooked = {"cuMemAlloc_v2",
                                                "cuMemFree_v2",
                                                "cuMemGetAddressRange_v2",
                                                "cuPointerGetAttribute",
                                                "cuPointerGetAttributes",
                                                "cuMemcpyHtoD_v2",
                                                "cuMemcpyHtoD_v2_ptds",
                                                "cuMemcpyHtoDAsync_v2",
                                                "cuMemcpyHtoDAsync_v2_ptsz",
                                                "cuMemGetInfo_v2",
                                                "cuIpcGetMemHandle",
                                                "cuIpcOpenMemHandle_v2",
                                                "cuIpcCloseMemHandle",
                                                "cuMemAddressReserve",
                                                "cuMemAddressFree",
                                                "cuMemCreate",
                                                "cuMemRelease",
                                                "cuMemMap",
                                                "cuMemUnmap",
                                                "cuMemSetAccess",
                                                "cuMemGetAccess",
                                                "cuMemRetainAllocationHandle",
                                                "cuCtxDestroy_v2",
                                                "cuDevicePrimaryCtxRelease",
                                                "cuDevicePrimaryCtxRelease_v2",
                                                "cuDevicePrimaryCtxReset",
                                                "cuDevicePrimaryCtxReset_v2",
                                                "cuStreamBeginCapture",
                                                "cuStreamBeginCapture_ptsz",
                                                "cuStreamBeginCapture_v2",
                                                "cuStreamBeginCapture_v2_ptsz",
                                                "cuStreamBeginCaptureToGraph",
                                                "cuStreamBeginCaptureToGraph_ptsz",
                                                "cuStreamEndCapture",
                                                "cuStreamEndCapture_ptsz",
                                                "cuGetProcAddress_v2",
                                                "cuGetProcAddress"};
  return kHooked.contains(variant);
}

TEST(Interposition, LookupsAnswerAsTheDriverDoesWithOnlyTheHookedVariantsSwapped) {
  const ProbeRun plain = probe("lookups", false), shimmed = probe("lookups", true);
  ASSERT_EQ(plain.exit_code, 0) << plain.text;
  ASSERT_EQ(shimmed.exit_code, 0) << shimmed.text;
  ASSERT_EQ(plain.lines.size(), shimmed.lines.size()) << shimmed.text;
  int swapped = 0;
  for (std::size_t i = 0; i < plain.lines.size(); ++i) {
    const auto& a = plain.lines[i];
    const auto& b = shimmed.lines[i];
    SCOPED_TRACE(a.dump() + " / " + b.dump());
    EXPECT_EQ(a.value("result", 0), b.value("result", 0));
    EXPECT_EQ(a.value("status", 0), b.value("status", 0));
    // The same ABI variant (cudaVersion and the per-thread flag honoured) ...
    const std::string variant = a["got"][0];
    EXPECT_EQ(variant, b["got"][0].get<std::string>());
    // ... from the shim exactly when it is hooked.
    const bool from_shim = b["got"][1] == "libthaw-preload.so";
    EXPECT_EQ(from_shim, hooked(variant));
    EXPECT_NE(a["got"][1], "libthaw-preload.so");
    swapped += from_shim;
  }
  EXPECT_GE(swapped, 6);
  // Spot checks of what the driver decides, so the comparison above compares something.
  auto find = [&](const std::string& key, const std::string& value, int version = -1) {
    for (const auto& l : shimmed.lines) {
      if (l.value(key, "") == value && (version < 0 || l.value("version", -1) == version)) return l;
    }
    return nlohmann::json();
  };
  EXPECT_EQ(find("lookup", "cuMemAlloc", 12080)["got"][0], "cuMemAlloc_v2");
  EXPECT_NE(find("lookup", "cuMemAlloc", 3010)["got"][1], "libthaw-preload.so");
  EXPECT_EQ(find("lookup", "cuMemAlloc", 99000)["result"], CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(find("lookup", "cuNoSuchFunction")["status"], CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(find("lookup", "cuGetExportTable")["got"][1], "libcuda.so.1");
  EXPECT_EQ(find("lookup", "cuGetProcAddress")["got"][1], "libthaw-preload.so");
  EXPECT_EQ(find("dlsym", "cudnnCreate")["got"][0], "");
  EXPECT_EQ(find("dlsym", "cuMemAlloc_v2")["got"][1], "libthaw-preload.so");
  EXPECT_EQ(find("dlsym", "cuDeviceGet")["got"][1], "libcuda.so.1");
}

TEST(Interposition, AllocationsLandAtTheSameAddressesEveryRun) {
  const ProbeRun first = probe("alloc 12", true), second = probe("alloc 12", true);
  ASSERT_EQ(first.exit_code, 0) << first.text;
  ASSERT_EQ(second.exit_code, 0) << second.text;
  std::vector<std::uint64_t> a, b;
  for (const auto& l : first.lines) {
    if (l.contains("ptr")) a.push_back(l["ptr"]);
  }
  for (const auto& l : second.lines) {
    if (l.contains("ptr")) b.push_back(l["ptr"]);
  }
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front(), 0x200000000000ull);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  // Range queries answered for the allocation (checked inside the probe, exit 5 otherwise),
  // and a double or interior free refused as cuMemFree does.
  const auto& frees = first.lines.back();
  EXPECT_EQ(frees["double_free"], CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(frees["interior_free"], CUDA_ERROR_INVALID_VALUE);
  // The base moves with THAW_PRELOAD_VA_BASE, and the layout can be turned off.
  const ProbeRun moved = probe("alloc 2", true, "THAW_PRELOAD_VA_BASE=0x300000000000");
  ASSERT_EQ(moved.exit_code, 0) << moved.text;
  EXPECT_EQ(moved.lines[0]["ptr"], 0x300000000000ull);
  const ProbeRun off = probe("alloc 2", true, "THAW_PRELOAD_DETERMINISTIC=0");
  ASSERT_EQ(off.exit_code, 0) << off.text;
  EXPECT_NE(off.lines[0]["ptr"], 0x200000000000ull);
}

TEST(Interposition, AnOccupiedBaseFallsBackToTheDriversAddressesAndSaysSo) {
  // Half a terabyte into the emulator's own reservations is never free at this base...
  // instead take a base that is not aligned to the granularity: the reservation fails.
  const ProbeRun r = probe("alloc 3", true, "THAW_PRELOAD_VA_BASE=0x200000001000");
  ASSERT_EQ(r.exit_code, 0) << r.text;
  EXPECT_NE(r.text.find("deterministic layout off"), std::string::npos) << r.text;
  EXPECT_NE(r.lines[0]["ptr"], 0x200000001000ull);
}

TEST(Interposition, ManyThreadsAllocateAtOnce) {
  const ProbeRun r = probe("threads", true);
  ASSERT_EQ(r.exit_code, 0) << r.text;
  EXPECT_EQ(r.lines.back()["thread_failures"], 0);
}

TEST(Interposition, AForkedChildUsesCudaThroughTheShim) {
  const ProbeRun plain = probe("fork", false), shimmed = probe("fork", true, "THAW_PRELOAD_LOG=1");
  ASSERT_EQ(plain.exit_code, 0) << plain.text;
  ASSERT_EQ(shimmed.exit_code, 0) << shimmed.text;
  EXPECT_EQ(plain.lines.back()["child_exit"], 0) << plain.text;
  EXPECT_EQ(shimmed.lines.back()["child_exit"], 0) << shimmed.text;
  std::vector<std::uint64_t> ptrs;
  for (const auto& l : shimmed.lines) {
    if (l.contains("range_ok")) {
      EXPECT_TRUE(l["range_ok"].get<bool>()) << l.dump();
      ptrs.push_back(l["ptr"]);
    }
  }
  // Child (two allocations) and parent (one): each process's layout starts at the base.
  ASSERT_EQ(ptrs.size(), 3u) << shimmed.text;
  EXPECT_EQ(ptrs[0], 0x200000000000ull);
  EXPECT_EQ(ptrs[2], 0x200000000000ull);
}

// The lookup test above checks that cuGetExportTable is the driver's own function; this one
// calls it, by both lookups (intercepting it hung HAMi-core with driver 570): it returns, with
// the driver's answers.
TEST(Interposition, CuGetExportTableAnswersAsTheDriverDoes) {
  const ProbeRun plain = probe("export-table", false), shimmed = probe("export-table", true);
  ASSERT_EQ(plain.exit_code, 0) << plain.text;
  ASSERT_EQ(shimmed.exit_code, 0) << shimmed.text;
  ASSERT_EQ(plain.lines.size(), 4u) << plain.text;
  EXPECT_EQ(plain.lines, shimmed.lines) << shimmed.text;
  EXPECT_EQ(plain.lines[0]["result"], CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(plain.lines[0]["table_null"], true);
}

// NCCL asks cuMemCreate for host memory (location HOST_NUMA). A shim that took every
// cuMemCreate for device memory would count it against the device or give it a place in the
// layout; it must reach the driver untouched, whatever the driver answers.
TEST(Interposition, HostNumaCuMemCreateGoesToTheDriverUntouched) {
  const ProbeRun plain = probe("numa", false);
  const ProbeRun shimmed = probe("numa", true, "THAW_PRELOAD_LOG=1");
  ASSERT_EQ(plain.exit_code, 0) << plain.text;
  ASSERT_EQ(shimmed.exit_code, 0) << shimmed.text;
  auto creates = [](const ProbeRun& r) {
    std::vector<nlohmann::json> out;
    for (const auto& l : r.lines) {
      if (l.contains("create")) out.push_back(l);
    }
    return out;
  };
  const auto a = creates(plain), b = creates(shimmed);
  ASSERT_EQ(a.size(), 5u) << plain.text;
  EXPECT_EQ(a, b) << shimmed.text;  // same result codes, same effect on free device memory
  // What the emulator answers (emu/src/api_vmm.cpp), so the comparison compares something.
  auto find = [&](const std::string& name) {
    for (const auto& l : b) {
      if (l["create"] == name) return l;
    }
    return nlohmann::json();
  };
  EXPECT_EQ(find("host_numa")["result"], CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(find("host_numa_fd")["result"], CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(find("host_numa_current")["result"], CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(find("host_numa")["free_delta"], 0);
  EXPECT_EQ(find("device")["result"], CUDA_SUCCESS);
  EXPECT_GT(find("device")["free_delta"], 0);
  // The layout never saw them: the one cuMemAlloc after them is its first allocation.
  ASSERT_TRUE(shimmed.lines.back().contains("ptr")) << shimmed.text;
  EXPECT_EQ(shimmed.lines.back()["ptr"], 0x200000000000ull);
  EXPECT_NE(shimmed.text.find("(deterministic #0)"), std::string::npos) << shimmed.text;
  EXPECT_EQ(shimmed.text.find("(deterministic #1)"), std::string::npos) << shimmed.text;
}

// Real libcuda calls dlsym itself. The emulator does too in cuInit — of names the shim hooks,
// through a handle to itself — and refuses to initialise if the answer is not its own function
// (emu/src/api_init.cpp): under the shim, cuInit must still succeed, both when the program
// named the driver to the shim first (dlopen + dlsym, as the CUDA runtime does) and when it
// never did (a program linked against libcuda.so.1 whose first driver call is cuInit).
TEST(Interposition, TheDriversOwnLookupsAreNotAnsweredWithHooks) {
  for (const std::string binary : {PROBE_BIN, PROBE_LINKED_BIN}) {
    SCOPED_TRACE(binary);
    const ProbeRun plain = probe("init", false, "", binary);
    const ProbeRun shimmed = probe("init", true, "", binary);
    ASSERT_EQ(plain.exit_code, 0) << plain.text;
    ASSERT_EQ(shimmed.exit_code, 0) << shimmed.text;
    ASSERT_EQ(plain.lines.size(), 1u) << plain.text;
    ASSERT_EQ(shimmed.lines.size(), 1u) << shimmed.text;
    EXPECT_EQ(plain.lines[0]["cuInit"], CUDA_SUCCESS) << plain.text;
    EXPECT_EQ(shimmed.lines[0]["cuInit"], CUDA_SUCCESS) << shimmed.text;
    EXPECT_EQ(shimmed.text.find("thaw-emu:"), std::string::npos) << shimmed.text;
  }
}

TEST(Interposition, DisabledShimPassesEverythingThrough) {
  const ProbeRun r = probe("lookups", true, "THAW_PRELOAD_DISABLE=1");
  ASSERT_EQ(r.exit_code, 0) << r.text;
  for (const auto& l : r.lines) {
    if (l.contains("got")) {
      EXPECT_NE(l["got"][1], "libthaw-preload.so") << l.dump();
    }
  }
}

}  // namespace
