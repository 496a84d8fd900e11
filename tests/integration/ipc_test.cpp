// CUDA IPC of the engine's memory under the shim. The deterministic layout serves
// allocations with VMM memory, which the driver's legacy IPC refuses; the shim translates
// cuIpcGetMemHandle / cuIpcOpenMemHandle into POSIX-fd VMM sharing — carried by thawd
// when it runs, by pidfd_getfd when it does not — and the importing process reads the
// exporter's bytes exactly as without the shim. The driver's rules stay: opening one's
// own handle is INVALID_CONTEXT, flags other than LAZY_ENABLE_PEER_ACCESS are refused,
// the same handle opened twice gives the same address.
#include <cuda.h>
#include <gtest/gtest.h>

#include <regex>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

struct ProbeResult {
  nlohmann::json exporter;
  nlohmann::json importer;
  std::string output;
};

ProbeResult run_probe(const std::string& env) {
  const std::string cmd =
      "env THAW_EMU_DEVICE_MEMORY=1G " + env + " " IPC_PROBE_BIN " " + THAW_EMU_LIBCUDA + " 2>&1";
  ProbeResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) r.output += buf;
  if (p != nullptr) ::pclose(p);
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    (j["side"] == "exporter" ? r.exporter : r.importer) = j;
  }
  return r;
}

void expect_shared(const ProbeResult& r) {
  ASSERT_TRUE(r.exporter.is_object() && r.importer.is_object()) << r.output;
  EXPECT_EQ(r.exporter["export"], CUDA_SUCCESS) << r.output;
  EXPECT_EQ(r.exporter["export_again"], CUDA_SUCCESS) << r.output;
  EXPECT_EQ(r.exporter["same_handle"], true) << r.output;
  EXPECT_EQ(r.exporter["self_open"], CUDA_ERROR_INVALID_CONTEXT) << r.output;
  EXPECT_EQ(r.exporter["child_exit"], 0) << r.output;
  EXPECT_EQ(r.importer["open"], CUDA_SUCCESS) << r.output;
  EXPECT_EQ(r.importer["open_again"], CUDA_SUCCESS) << r.output;
  EXPECT_EQ(r.importer["same_address"], true) << r.output;
  EXPECT_EQ(r.importer["bad_flags"], CUDA_ERROR_INVALID_VALUE) << r.output;
  EXPECT_EQ(r.importer["bytes_match"], true) << r.output;
  EXPECT_EQ(r.importer["close"], CUDA_SUCCESS) << r.output;
  EXPECT_EQ(r.importer["close_again"], CUDA_SUCCESS) << r.output;
}

class IpcUnderShim : public ThawdFixture {};

TEST_F(IpcUnderShim, WithoutTheShimTheDriversOwnIpcWorks) {
  const ProbeResult r = run_probe("");
  expect_shared(r);
  EXPECT_NE(r.exporter["address"].get<std::string>().rfind("0x2000", 0), 0u) << r.output;
}

TEST_F(IpcUnderShim, LayoutMemoryIsSharedThroughThawd) {
  start_thawd(BusPolicy::open);
  const ProbeResult r =
      run_probe("LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
                " THAW_PRELOAD_LOG=1");
  expect_shared(r);
  EXPECT_EQ(r.exporter["address"], "0x200000200000") << "the layout's second allocation";
  const std::string m = thaw::testing::run({"/usr/bin/curl", "-sf", metrics_url()}).output;
  EXPECT_NE(m.find("thaw_ipc_exports_total 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("thaw_ipc_imports_total 1\n"), std::string::npos) << m;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(IpcUnderShim, LayoutMemoryIsSharedWithoutThawdToo) {
  const ProbeResult r =
      run_probe("LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=/nonexistent/thawd.sock");
  expect_shared(r);
  EXPECT_EQ(r.exporter["address"], "0x200000200000") << r.output;
  EXPECT_NE(r.output.find("pidfd"), std::string::npos) << "says how it carried the handle\n"
                                                       << r.output;
}

}  // namespace
