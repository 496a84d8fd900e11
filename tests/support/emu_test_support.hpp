// Support code shared by the suites that run against the emulated driver (tests/emu): CUresult
// assertions that print error names, the slow-build factor of the timing suites, and running a
// scenario in a freshly executed process with its own THAW_EMU_* configuration.
//
// Header-only; a suite includes it as "emu_test_support.hpp" (thaw_emu_test_main puts this
// folder on its include path).
#ifndef THAW_TESTS_SUPPORT_EMU_TEST_SUPPORT_HPP
#define THAW_TESTS_SUPPORT_EMU_TEST_SUPPORT_HPP

#include <cuda.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "on_emulator.hpp"

namespace thaw::test {

// The name of a CUresult ("CUDA_ERROR_INVALID_VALUE"), or "?" for a code the driver does not know.
inline const char* cu_error_name(CUresult r) {
  const char* s = nullptr;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "?";
}

}  // namespace thaw::test

// CUresult checks whose failure message names the call and the error codes.
#define ASSERT_CU(call)                                                                      \
  do {                                                                                       \
    CUresult r_ = (call);                                                                    \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #call << " returned " << ::thaw::test::cu_error_name(r_); \
  } while (0)
#define EXPECT_CU(call)                                                                      \
  do {                                                                                       \
    CUresult r_ = (call);                                                                    \
    EXPECT_EQ(r_, CUDA_SUCCESS) << #call << " returned " << ::thaw::test::cu_error_name(r_); \
  } while (0)
// A call that must fail with `want`.
#define EXPECT_CU_ERR(want, call)                                                                \
  do {                                                                                           \
    CUresult r_ = (call);                                                                        \
    EXPECT_EQ(r_, want) << #call << " returned " << ::thaw::test::cu_error_name(r_) << ", want " \
                        << #want;                                                                \
  } while (0)

namespace thaw::test {

// Sanitizer and unoptimised builds move bytes and run the emulator's own work several times
// slower (ASan checks every copied range; the emulator is built -O0). The timing suites divide
// every configured bandwidth, and multiply every configured cost, by this factor there, so the
// model still dominates the host's own time and the same relative tolerances hold.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
inline constexpr double kSlowBuild = 4;
#else
inline constexpr double kSlowBuild = 1;
#endif

// A number as an environment value (17 significant digits); "" for an empty optional, which
// run_in_fresh_process turns into "unset" (the emulator's default).
inline std::string env_number(std::optional<double> value) {
  if (!value) return "";
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", *value);
  return text;
}

// Wall-clock upper bounds. A bound such as "took at most 1.5x the model" can fail because the
// machine was busy (2 shared cores, a parallel ctest), not because the model is wrong; a lower
// bound cannot (load only adds time). Tag an upper bound on measured time with this marker,
//   EXPECT_LE(wall_ms, 1.5 * model_ms) << thaw::test::kWallTimeAboveBound;
// and run the scenario with run_in_fresh_process: a run whose only failures are tagged ones is
// repeated, in a fresh process, up to kWallTimeAttempts times, and passes if one run meets every
// bound. A model that really is too slow misses the bound in every run, so it still fails; any
// untagged failure (a lower bound, wrong data) fails at once, never retried.
inline constexpr const char* kWallTimeAboveBound = "[wall time above its upper bound]";
inline constexpr int kWallTimeAttempts = 3;
inline constexpr int kExitOnlyWallTimeFailures = 3;

// Sets (or, for an empty value, unsets) each variable, runs `body` with gtest's failures
// intercepted, prints them on stderr (gtest shows a death-test child's stderr in the parent) and
// ends the process: exit status 0 if nothing failed, kExitOnlyWallTimeFailures if every failure
// was a tagged wall-time upper bound, 1 otherwise.
[[noreturn]] inline void run_and_exit(const std::vector<std::pair<std::string, std::string>>& env,
                                      const std::function<void()>& body) {
  for (const auto& [name, value] : env) {
    if (value.empty()) {
      unsetenv(name.c_str());
    } else {
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter reporter(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    body();
  }
  int failures = 0;
  int wall_time_failures = 0;
  for (int i = 0; i < results.size(); ++i) {
    const testing::TestPartResult& r = results.GetTestPartResult(i);
    if (!r.failed()) continue;
    ++failures;
    if (std::string(r.message()).find(kWallTimeAboveBound) != std::string::npos) {
      ++wall_time_failures;
    }
    std::fprintf(stderr, "%s:%d: Failure\n%s\n", r.file_name() != nullptr ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  std::fflush(nullptr);
  if (failures == 0) std::_Exit(0);
  std::_Exit(failures == wall_time_failures ? kExitOnlyWallTimeFailures : 1);
}

// Runs `body` in a fresh process with `env` applied before it (see run_and_exit): with the
// "threadsafe" death-test style gtest re-executes this binary and runs only this statement there,
// so the driver is uninitialised and reads its configuration at the body's first cuInit, even
// when the whole suite runs as one process. Expects the body to pass; a run that failed only
// tagged wall-time upper bounds (kWallTimeAboveBound) is run again, kWallTimeAttempts in all.
inline void run_in_fresh_process(std::vector<std::pair<std::string, std::string>> env,
                                 const std::function<void()>& body) {
  for (int attempt = 1;; ++attempt) {
    int status = -1;
    const auto passed_or_only_slow = [&status](int exit_status) {
      status = exit_status;
      return WIFEXITED(exit_status) && (WEXITSTATUS(exit_status) == 0 ||
                                        WEXITSTATUS(exit_status) == kExitOnlyWallTimeFailures);
    };
    EXPECT_EXIT(run_and_exit(env, body), passed_or_only_slow, "");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != kExitOnlyWallTimeFailures) return;
    if (attempt == kWallTimeAttempts) {
      ADD_FAILURE() << "the scenario took longer than its upper bound in " << attempt << " runs of "
                    << attempt << " (each run's output is above): the modelled time is too "
                    << "long, or this machine is far too busy for timing checks";
      return;
    }
    std::fprintf(stderr, "run %d of %d took longer than an upper bound; running it again\n",
                 attempt, kWallTimeAttempts);
  }
}

// cuInit, device 0 and its primary context made current on this thread (the runtime's shape), for
// a fixture's SetUp: ASSERT_NO_FATAL_FAILURE(open_primary_context(&dev_, &ctx_)). `*ctx` is set
// only once the context is retained; the fixture releases it (cuDevicePrimaryCtxRelease).
inline void open_primary_context(CUdevice* dev, CUcontext* ctx) {
  ASSERT_CU(cuInit(0));
  ASSERT_CU(cuDeviceGet(dev, 0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(ctx, *dev));
  ASSERT_CU(cuCtxSetCurrent(*ctx));
}

// RAII form for helper objects that live inside one scenario: the constructor does what
// open_primary_context does (non-fatally), the destructor unsets the current context and
// releases the primary context. Declare it before the members that need the context.
class PrimaryContext {
 public:
  PrimaryContext() {
    EXPECT_CU(cuInit(0));
    EXPECT_CU(cuDeviceGet(&dev_, 0));
    EXPECT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    EXPECT_CU(cuCtxSetCurrent(ctx_));
  }
  ~PrimaryContext() {
    EXPECT_CU(cuCtxSetCurrent(nullptr));
    EXPECT_CU(cuDevicePrimaryCtxRelease(dev_));
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUdevice dev() const { return dev_; }
  CUcontext ctx() const { return ctx_; }

 private:
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

// `n` floats drawn uniformly from [lo, hi) by a std::mt19937 seeded with `seed` (reproducible).
inline std::vector<float> random_floats(std::size_t n, unsigned seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Leaves the calling thread with an empty context stack (and no current context).
inline void clear_context_stack() {
  CUcontext c = nullptr;
  for (int i = 0; i < 64 && cuCtxPopCurrent(&c) == CUDA_SUCCESS; ++i) {
  }
  cuCtxSetCurrent(nullptr);
}

}  // namespace thaw::test

#endif  // THAW_TESTS_SUPPORT_EMU_TEST_SUPPORT_HPP
