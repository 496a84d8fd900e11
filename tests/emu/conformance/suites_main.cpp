// main() of thaw-driver-conformance-suites: the emulator suites that pin documented driver
// behaviour, in one GoogleTest binary linked against libcuda.so.1 (the emulator's SONAME, so any
// libcuda.so.1 found first serves it). thaw-driver-conformance runs it one test per process; run
// directly it is a plain GoogleTest program.
//
// Before the tests it points the suites at the helpers that ship next to this binary (unless the
// environment already names them): emu_peer (THAW_EMU_PEER), the kernels' host twins for the
// emulator (THAW_EMU_KERNELS=libemu_kernels_twins.so) and the module images
// (THAW_MODULE_TESTDATA=module-images/). Like the emulator suites' own main, it gives the emulator
// a private state directory and turns its timing model off; a real driver ignores both.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <dlfcn.h>
#include <unistd.h>

#include "on_emulator.hpp"

namespace {

namespace fs = std::filesystem;

fs::path own_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

void default_env(const char* name, const fs::path& path) {
  setenv(name, path.c_str(), 0);
}

// "--thaw-describe-driver": which libcuda.so.1 this process loaded, its CUDA version, and whether
// it is the emulator (the runner checks THAW_LIBCUDA took effect and says which driver it tested).
int describe_driver() {
  void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  void* init = libcuda != nullptr ? dlsym(libcuda, "cuInit") : nullptr;
  Dl_info info{};
  if (init == nullptr || dladdr(init, &info) == 0 || info.dli_fname == nullptr) {
    std::fprintf(stderr, "no libcuda.so.1 is loaded\n");
    return 2;
  }
  std::error_code ec;
  fs::path path = fs::canonical(info.dli_fname, ec);
  int version = 0;
  cuDriverGetVersion(&version);  // needs no cuInit
  std::printf("libcuda %s\nversion %d\nemulator %s\n", ec ? info.dli_fname : path.c_str(), version,
              thaw::test::on_emulator() ? "yes" : "no");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--thaw-describe-driver") == 0) return describe_driver();
  const fs::path dir = own_dir();
  default_env("THAW_EMU_PEER", dir / "emu_peer");
  default_env("THAW_MODULE_TESTDATA", dir / "module-images");
  // Only the emulator runs twins, and a kit for a real GPU may leave them out.
  std::error_code ec;
  if (fs::exists(dir / "libemu_kernels_twins.so", ec)) {
    default_env("THAW_EMU_KERNELS", dir / "libemu_kernels_twins.so");
  }

  std::string made_dir;
  if (std::getenv("THAW_EMU_STATE_DIR") == nullptr) {
    std::string templ = (fs::temp_directory_path() / "thaw-conformance-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      perror("mkdtemp");
      return 2;
    }
    made_dir = templ;
    setenv("THAW_EMU_STATE_DIR", made_dir.c_str(), 1);
  }
  setenv("THAW_EMU_TIMING", "0", 0);
  testing::InitGoogleTest(&argc, argv);
  // Death/exit tests re-execute the binary so each starts with an uninitialised driver.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int rc = RUN_ALL_TESTS();
  if (!made_dir.empty()) {
    std::error_code ec;
    fs::remove_all(made_dir, ec);
  }
  return rc;
}
