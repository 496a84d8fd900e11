#include "engine_core_process.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>

namespace refengine {

std::optional<int> fork_engine_core_process() {
  // Anything still buffered would otherwise be written twice, once by each process.
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0)
    throw std::runtime_error(
        fmt::format("--engine-core-process: fork failed: {}", std::strerror(errno)));
  if (child == 0) {
    // An engine core must not outlive its front end: a serving engine whose parent was killed
    // would keep its port and its device memory.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) ::_exit(1);
    return std::nullopt;
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR)
      throw std::runtime_error(fmt::format("--engine-core-process: waitpid({}) failed: {}", child,
                                           std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  fmt::print(stderr,
             "refengine: error: the engine core process (pid {}) was killed by signal {} ({})\n",
             child, sig, ::strsignal(sig));
  return 128 + sig;
}

}  // namespace refengine
