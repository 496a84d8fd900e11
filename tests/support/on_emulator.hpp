// Whether this process runs against thaw's emulated driver or a real one.
//
// The emulator suites (tests/emu) also build as the driver-conformance program, which runs them
// against any libcuda.so.1 (tests/emu/conformance). Checks of the emulator's own features (the
// inspection calls of thaw/emu_inspect.h, THAW_EMU_* settings, fault injection, the timing model,
// the trace, host access to device pointers) then run only on the emulator:
//
//   THAW_SKIP_UNLESS_EMULATOR("reads the emulator's leak counters");  // the rest of the test
//   THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u));                      // one emulator-only check
//
// No GoogleTest dependency in the function, so helper processes can use it too.
#ifndef THAW_TESTS_SUPPORT_ON_EMULATOR_HPP
#define THAW_TESTS_SUPPORT_ON_EMULATOR_HPP

#include <dlfcn.h>

#include <cstdlib>

namespace thaw::test {

// Asks the loaded libcuda.so.1 itself for the emulator's inspection entry point. Not
// dlsym(RTLD_DEFAULT): the conformance program defines forwarders of that name, which a global
// lookup would find on a real driver too.
//
// THAW_CONFORMANCE_DRIVER_ONLY=1 answers false on the emulator too: only documented driver
// behaviour is checked, as on a real driver. The conformance run under libthaw-preload.so
// uses it, because the emulator's own bookkeeping there also counts the shim's region.
inline bool on_emulator() {
  static const bool yes = [] {
    if (const char* only = std::getenv("THAW_CONFORMANCE_DRIVER_ONLY");
        only != nullptr && only[0] == '1') {
      return false;
    }
    void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (libcuda == nullptr) return false;
    bool found = dlsym(libcuda, "thawEmuGetDeviceStats") != nullptr;
    dlclose(libcuda);
    return found;
  }();
  return yes;
}

}  // namespace thaw::test

// Skips the rest of a test (its TearDown still runs) on a real driver.
#define THAW_SKIP_UNLESS_EMULATOR(why) \
  if (!::thaw::test::on_emulator()) GTEST_SKIP() << "emulator only: " << why

// A check of the emulator's own bookkeeping inside a test of documented behaviour: made on the
// emulator, left out on a real driver.  THAW_EMU_CHECK(EXPECT_EQ(BytesInUse(), 0u) << "leak");
#define THAW_EMU_CHECK(...)            \
  do {                                 \
    if (::thaw::test::on_emulator()) { \
      __VA_ARGS__;                     \
    }                                  \
  } while (0)

#endif  // THAW_TESTS_SUPPORT_ON_EMULATOR_HPP
