// GoogleTest main for suites that run against the emulated driver.
//
// Each test binary gets its own emulator state directory (the per-device memory
// ledger lives there), so suites that ctest runs in parallel never see each other's
// "GPU memory". Child processes spawned by a test inherit the variable and so share
// the device with their parent, as processes on one real GPU do. The timing model is
// off unless a suite turns it on: correctness tests should not sleep.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

int main(int argc, char** argv) {
  std::string made_dir;
  if (std::getenv("THAW_EMU_STATE_DIR") == nullptr) {
    std::string templ = (std::filesystem::temp_directory_path() / "thaw-emu-test-XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      perror("mkdtemp");
      return 2;
    }
    made_dir = templ;
    setenv("THAW_EMU_STATE_DIR", made_dir.c_str(), 1);
  }
  setenv("THAW_EMU_TIMING", "0", 0);  // do not overwrite a suite's explicit choice
  testing::InitGoogleTest(&argc, argv);
  // Death/exit tests re-execute the binary so each starts with an uninitialised driver.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int rc = RUN_ALL_TESTS();
  if (!made_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(made_dir, ec);
  }
  return rc;
}
