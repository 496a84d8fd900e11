// CUDA IPC the way engines use it (vLLM's custom all-reduce: cudaIpcGetMemHandle in one
// process, the 64 bytes sent to another, cudaIpcOpenMemHandle there), run with and without
// the shim. The process forks before either side initialises the driver; the parent
// allocates, fills and exports; the child opens the handle (twice: same address), reads
// the bytes back, closes twice. One JSON line each side on stdout.
//
//   ipc_probe <path of libcuda.so.1>
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void* g_driver = nullptr;

template <typename Fn>
Fn sym(const char* name) {
  void* p = ::dlsym(g_driver, name);  // through the shim's dlsym when it is preloaded
  if (p == nullptr) {
    std::fprintf(stderr, "no %s\n", name);
    std::exit(3);
  }
  return reinterpret_cast<Fn>(p);
}

void init_context() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (sym<CUresult (*)(unsigned)>("cuInit")(0) != CUDA_SUCCESS ||
      sym<CUresult (*)(CUdevice*, int)>("cuDeviceGet")(&dev, 0) != CUDA_SUCCESS ||
      sym<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain")(&ctx, dev) !=
          CUDA_SUCCESS ||
      sym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "driver initialisation failed\n");
    std::exit(4);
  }
}

constexpr std::size_t kBytes = (1 << 20) + 4096;

std::uint32_t pattern(std::size_t i) {
  return static_cast<std::uint32_t>(i * 2654435761u);
}

int child(int from_parent) {
  CUipcMemHandle handle{};
  std::size_t got = 0;
  while (got < sizeof handle) {
    const ssize_t n =
        ::read(from_parent, reinterpret_cast<char*>(&handle) + got, sizeof handle - got);
    if (n <= 0) return 5;
    got += static_cast<std::size_t>(n);
  }
  init_context();
  auto open = sym<CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned)>("cuIpcOpenMemHandle_v2");
  auto close = sym<CUresult (*)(CUdeviceptr)>("cuIpcCloseMemHandle");
  auto d2h = sym<CUresult (*)(void*, CUdeviceptr, size_t)>("cuMemcpyDtoH_v2");
  CUdeviceptr a = 0, b = 0;
  const CUresult open_a = open(&a, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  const CUresult open_b = open(&b, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  const CUresult bad_flags = open(&b, handle, 0);
  std::vector<std::uint32_t> host(kBytes / 4);
  const CUresult copy = open_a == CUDA_SUCCESS ? d2h(host.data(), a, kBytes) : open_a;
  bool match = copy == CUDA_SUCCESS;
  for (std::size_t i = 0; match && i < host.size(); ++i) match = host[i] == pattern(i);
  const CUresult close_a = close(a), close_b = close(b);
  std::printf(
      "{\"side\":\"importer\",\"open\":%d,\"open_again\":%d,\"same_address\":%s,"
      "\"bad_flags\":%d,\"copy\":%d,\"bytes_match\":%s,\"close\":%d,\"close_again\":%d}\n",
      open_a, open_b, a == b ? "true" : "false", bad_flags, copy, match ? "true" : "false", close_a,
      close_b);
  std::fflush(stdout);  // the caller leaves with _exit
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ipc_probe <libcuda.so.1>\n");
    return 2;
  }
  g_driver = ::dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (g_driver == nullptr) {
    std::fprintf(stderr, "%s\n", ::dlerror());
    return 2;
  }
  int fds[2];
  if (::pipe(fds) != 0) return 2;
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[1]);
    std::fflush(stdout);
    ::_exit(child(fds[0]));  // _exit: the parent's stdio buffers are not the child's
  }
  ::close(fds[0]);
  init_context();
  auto alloc = sym<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc_v2");
  auto h2d = sym<CUresult (*)(CUdeviceptr, const void*, size_t)>("cuMemcpyHtoD_v2");
  auto get = sym<CUresult (*)(CUipcMemHandle*, CUdeviceptr)>("cuIpcGetMemHandle");
  auto open = sym<CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned)>("cuIpcOpenMemHandle_v2");
  CUdeviceptr first = 0, ptr = 0;
  // A first allocation, so that the shared one does not start the layout's region.
  if (alloc(&first, 4096) != CUDA_SUCCESS || alloc(&ptr, kBytes) != CUDA_SUCCESS) return 6;
  std::vector<std::uint32_t> host(kBytes / 4);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = pattern(i);
  if (h2d(ptr, host.data(), kBytes) != CUDA_SUCCESS) return 7;
  CUipcMemHandle handle{}, again{};
  const CUresult exported = get(&handle, ptr);
  const CUresult exported_again = get(&again, ptr + 4096);  // an interior pointer: same handle
  CUdeviceptr self = 0;
  const CUresult self_open = open(&self, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (exported == CUDA_SUCCESS) {
    (void)::write(fds[1], &handle, sizeof handle);
  }
  ::close(fds[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::printf(
      "{\"side\":\"exporter\",\"address\":\"0x%llx\",\"export\":%d,\"export_again\":%d,"
      "\"same_handle\":%s,\"self_open\":%d,\"child_exit\":%d}\n",
      static_cast<unsigned long long>(ptr), exported, exported_again,
      std::equal(std::begin(handle.reserved), std::end(handle.reserved), std::begin(again.reserved))
          ? "true"
          : "false",
      self_open, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return 0;
}
