// cuInit's own dlsym lookups (emu/src/api_init.cpp). A real driver looks symbols up with dlsym
// while it initialises; an interposer that answers those lookups with its hooks makes the driver
// call into the interposer from inside itself (HAMi-core's pitfall). The emulator does such a
// lookup and refuses to initialise when the answer is not its own function, so that thaw's shim
// is tested against a driver that notices. init_probe runs under a test dlsym interposer
// (self_lookup/dlsym_interposer.cpp): recording, then answering with a decoy.
#include <cuda.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct ProbeResult {
  int exit_code = -1;
  std::string text;  // stdout and stderr
};

ProbeResult init_probe(const std::string& interposer_mode) {
  const std::string cmd =
      "env LD_PRELOAD=" EMU_DLSYM_INTERPOSER " EMU_DLSYM_INTERPOSER=" + interposer_mode +
      " " EMU_INIT_PROBE " 2>&1";
  ProbeResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) r.text.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool has(const ProbeResult& r, const std::string& s) {
  return r.text.find(s) != std::string::npos;
}

TEST(InitSelfLookup, CuInitLooksItsOwnHookableEntryPointsUpWithDlsym) {
  const ProbeResult r = init_probe("record");
  ASSERT_EQ(r.exit_code, 0) << r.text;
  EXPECT_TRUE(has(r, "interposer: driver looked up cuGetProcAddress_v2\n")) << r.text;
  EXPECT_TRUE(has(r, "interposer: driver looked up cuMemAlloc_v2\n")) << r.text;
  EXPECT_TRUE(has(r, "cuInit=0\ncuInit=0\ncuDeviceGetCount=0\n")) << r.text;
  EXPECT_FALSE(has(r, "thaw-emu:")) << r.text;
}

TEST(InitSelfLookup, AnInterposerAnsweringWithItsOwnFunctionIsRefused) {
  const ProbeResult r = init_probe("decoy");
  ASSERT_EQ(r.exit_code, 0) << r.text;
  const std::string refused = "cuInit=" + std::to_string(CUDA_ERROR_NOT_INITIALIZED) + "\n";
  EXPECT_TRUE(has(r, refused + refused)) << r.text;
  EXPECT_TRUE(has(r, "cuDeviceGetCount=" + std::to_string(CUDA_ERROR_NOT_INITIALIZED))) << r.text;
  // Said on stderr, naming the lookup and where the answer came from.
  EXPECT_TRUE(has(r, "thaw-emu: cuInit failed: its internal dlsym(")) << r.text;
  EXPECT_TRUE(has(r, "\"cuGetProcAddress_v2\")")) << r.text;
  EXPECT_TRUE(has(r, "libemu_dlsym_interposer.so")) << r.text;
}

}  // namespace
