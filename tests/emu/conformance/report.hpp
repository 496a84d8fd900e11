// What each test's process ended with, and the runner's report: gtest-style lines on stdout and,
// on request, a JSON file a script can read the failed tests from.
#pragma once

#include <expected>
#include <string>
#include <vector>

#include "child.hpp"

namespace thaw::conformance {

enum class Outcome { kPassed, kSkipped, kFailed, kCrashed, kTimedOut, kNotRun };

const char* outcome_name(Outcome o);  // "passed", "skipped", "failed", "crashed", "timeout", ...
inline bool is_failure(Outcome o) {
  return o != Outcome::kPassed && o != Outcome::kSkipped;
}

struct TestRecord {
  std::string name;  // Suite.Test, as --gtest_filter takes it
  Outcome outcome = Outcome::kNotRun;
  double seconds = 0;
  std::string reason;  // why it was skipped, or the first lines of its failure
  std::string output;  // the process's whole output
};

// Reads the outcome of a one-test GoogleTest run from its exit status and output.
TestRecord classify(const std::string& name, const ChildResult& run);

struct DriverInfo {
  std::string libcuda;  // the file the suites loaded
  int version = 0;      // cuDriverGetVersion
  bool emulator = false;
};

// The JSON report:
//   {"program": "thaw-driver-conformance", "libcuda": PATH, "driver_version": N, "emulator": BOOL,
//    "counts": {"total", "passed", "skipped", "failed"}, "failed": [NAME...],
//    "tests": [{"name", "result", "seconds", "reason", "output" (failures only)}...]}
// "failed" counts and lists every test that did not pass or skip (crashed and timed-out ones too).
std::expected<void, std::string> write_json(const std::string& path, const DriverInfo& driver,
                                            const std::vector<TestRecord>& tests);

}  // namespace thaw::conformance
