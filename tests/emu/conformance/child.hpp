// Running one program to completion with a deadline, its output captured: how the conformance
// runner runs each test in a fresh process.
#pragma once

#include <chrono>
#include <expected>
#include <string>
#include <vector>

namespace thaw::conformance {

struct ChildResult {
  bool timed_out = false;
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  std::string output;  // stdout and stderr, interleaved as written
  std::chrono::duration<double> elapsed{0};
};

// Runs `argv` (argv[0] a path) in its own process group with stdout and stderr on one pipe.
// Past `timeout` the whole group is killed. Helper processes the program leaves running once it
// has exited (they would hold the pipe open) are killed too. An error only when the program could
// not be started.
std::expected<ChildResult, std::string> run_child(const std::vector<std::string>& argv,
                                                  std::chrono::seconds timeout);

}  // namespace thaw::conformance
