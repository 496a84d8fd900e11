// Kernel execution helpers shared by launches and graph kernel nodes.
#include "kernel_exec.hpp"

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "module.hpp"

namespace emu {
namespace {

constexpr unsigned kMaxBlockThreads = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535, 65535};
constexpr unsigned kSmCount = 132;
constexpr unsigned kMaxThreadsPerSm = 2048;
constexpr unsigned kMaxBlocksPerSm = 32;

thread_local sigjmp_buf* t_fault_jump = nullptr;
struct sigaction g_previous_segv {};
struct sigaction g_previous_bus {};

void on_fault(int sig, siginfo_t* info, void* uctx) {
  if (t_fault_jump != nullptr) siglongjmp(*t_fault_jump, 1);
  // Not inside a twin: behave as if we were never here.
  const struct sigaction& prev = sig == SIGSEGV ? g_previous_segv : g_previous_bus;
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, uctx);
  } else if (prev.sa_handler != SIG_IGN && prev.sa_handler != SIG_DFL) {
    prev.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // the faulting instruction re-executes and the process dies
  }
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

}  // namespace

CUresult run_twin(const ThawEmuTwin* twin, const ThawEmuLaunch& launch) {
  install_fault_handler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_fault_jump = nullptr;
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  t_fault_jump = &jump;
  twin->launcher(&launch);
  t_fault_jump = nullptr;
  return CUDA_SUCCESS;
}

CUresult check_geometry(const unsigned grid[3], const unsigned block[3], unsigned shared,
                        bool cooperative, const Function& f) {
  std::uint64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    if (grid[i] > kMaxGridDim[i] || block[i] > kMaxBlockDim[i]) return CUDA_ERROR_INVALID_VALUE;
    threads *= block[i];
  }
  unsigned limit = f.info().max_threads != 0 ? f.info().max_threads : kMaxBlockThreads;
  if (threads > kMaxBlockThreads) return CUDA_ERROR_INVALID_VALUE;
  if (threads > limit) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  if (shared > static_cast<unsigned>(f.max_dynamic_shared)) return CUDA_ERROR_INVALID_VALUE;
  if (cooperative) {
    // All blocks must be resident at once.
    std::uint64_t blocks = std::uint64_t{grid[0]} * grid[1] * grid[2];
    std::uint64_t per_sm = std::min<std::uint64_t>(kMaxBlocksPerSm, kMaxThreadsPerSm / threads);
    if (blocks > per_sm * kSmCount) return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  }
  return CUDA_SUCCESS;
}

// Copies the arguments into one buffer laid out as the kernel's parameter bank.
CUresult pack_params(const KernelInfo& k, void** kernelParams, void** extra,
                     std::vector<std::uint8_t>& buffer) {
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned bytes = k.param_bytes;
  for (const auto& p : k.params) bytes = std::max(bytes, p.offset + p.size);
  buffer.assign(bytes, 0);
  if (k.params.empty()) return CUDA_SUCCESS;
  if (kernelParams != nullptr) {
    for (std::size_t i = 0; i < k.params.size(); ++i) {
      if (kernelParams[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(buffer.data() + k.params[i].offset, kernelParams[i], k.params[i].size);
    }
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const void* data = nullptr;
  const std::size_t* size = nullptr;
  for (std::size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (i > 64) return CUDA_ERROR_INVALID_VALUE;  // unterminated
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      data = extra[i + 1];
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      size = static_cast<const std::size_t*>(extra[i + 1]);
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (data == nullptr || size == nullptr || *size < bytes) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(buffer.data(), data, bytes);
  return CUDA_SUCCESS;
}

void report_missing_twin(const char* name) {
  static std::mutex mu;
  static std::set<std::string> reported;
  std::lock_guard lock(mu);
  if (!reported.insert(name).second) return;
  std::fprintf(stderr,
               "thaw-emu: no host twin for kernel '%s' in %s; the launch fails with "
               "CUDA_ERROR_NOT_FOUND (see thaw/emu_twin.h)\n",
               name, twin_libraries().c_str());
}

}  // namespace emu
