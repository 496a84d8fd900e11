// A process under libthaw-preload.so (on the emulator) whose threads keep every lock of the
// shim busy while its main thread forks again and again; each child runs an engine's start
// under the shim — CUDA init, a context, deterministic allocations, a model file read,
// mapped and copied to the device, a memory query, CUDA IPC — and must exit 0 in time. A
// child that inherited a lock some other thread of the parent held would hang: the probe
// kills it after CHILD_TIMEOUT seconds and fails.
//
// The parent never initialises the driver (CUDA itself is not fork-safe once initialised,
// which is why engines fork their workers first): its threads reach the shim's locks through
// calls the driver refuses without init, and through the file hooks.
//
//   threads (two of each)      locks they take
//   managed file open/read/    managed-file table, file mappings, thawd client (no thawd:
//     mmap/close                 given up), recorder (model opened), notices
//   reads of a failed file     managed-file table, notices (every EIO is a notice)
//   mmap of a streamed file    userfaultfd registry (or a wait on readiness)
//   cuMemAlloc / cuMemFree /   engine memory, layout, notices
//     cuMemGetAddressRange
//   cuIpcOpenMemHandle of a    IPC tables, notices
//     thaw handle of no process
//
// usage: fork_safety_probe LIBCUDA WORKDIR [FORKS] [CHILD_TIMEOUT]   exit 0: every child ok
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/readiness/chunk_readiness.hpp"

#undef cuGetProcAddress

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kWeightBytes = 4 << 20;
constexpr std::size_t kChunk = 64 << 10;
constexpr CUdeviceptr kVaBase = 0x200000000000ull;  // the shim's default region

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "fork_safety_probe[%d]: %s\n", ::getpid(), why.c_str());
  std::exit(2);
}

// --- a thaw cache: <root>/.thaw-cache, <root>/model/<file>, <root>/model/.thaw/ready/<file>

enum class Fill { complete, failed, filling };

void make_model_file(const fs::path& root, const std::string& name, std::size_t bytes, Fill fill) {
  fs::create_directories(root / "model" / ".thaw" / "ready");
  {
    std::vector<unsigned char> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
    const int fd = ::open((root / "model" / name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::write(fd, data.data(), bytes) != static_cast<ssize_t>(bytes)) die("write");
    ::close(fd);
  }
  const fs::path map = root / "model" / ".thaw" / "ready" / name;
  thaw::UniqueFd fd(::open(map.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  auto r = thaw::store::ChunkReadiness::create(std::move(fd), name, bytes, kChunk);
  if (!r) die("readiness map: " + r.error().message);
  if (fill == Fill::complete) {
    for (std::uint64_t c = 0; c < r->chunk_count(); ++c) (void)r->mark_verified(c);
    if (!r->mark_complete()) die("mark_complete");
  } else if (fill == Fill::failed) {
    (void)r->mark_failed("never fetched (fork_safety_probe)");
  }
}

// --- the driver, reached as engines do: dlopen, then cuGetProcAddress

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
GetProcAddress g_gpa = nullptr;

template <typename Fn>
Fn get(const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (g_gpa(name, &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p)
    die(std::string("no ") + name);
  return reinterpret_cast<Fn>(p);
}

struct Driver {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain;
  decltype(&cuDevicePrimaryCtxRelease_v2) primary_release;
  decltype(&cuCtxSetCurrent) ctx_set_current;
  decltype(&cuMemAlloc_v2) mem_alloc;
  decltype(&cuMemFree_v2) mem_free;
  decltype(&cuMemGetAddressRange_v2) get_address_range;
  decltype(&cuMemcpyHtoD_v2) htod;
  decltype(&cuMemcpyDtoH_v2) dtoh;
  decltype(&cuMemGetInfo_v2) mem_get_info;
  decltype(&cuIpcGetMemHandle) ipc_get;
  decltype(&cuIpcOpenMemHandle_v2) ipc_open;
};

Driver load_driver(const char* libcuda) {
  void* h = ::dlopen(libcuda, RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) die(std::string("dlopen: ") + ::dlerror());
  g_gpa = reinterpret_cast<GetProcAddress>(::dlsym(h, "cuGetProcAddress_v2"));
  if (g_gpa == nullptr) die("no cuGetProcAddress_v2");
  Driver d{get<decltype(&cuInit)>("cuInit"),
           get<decltype(&cuDeviceGet)>("cuDeviceGet"),
           get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain"),
           get<decltype(&cuDevicePrimaryCtxRelease_v2)>("cuDevicePrimaryCtxRelease"),
           get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent"),
           get<decltype(&cuMemAlloc_v2)>("cuMemAlloc"),
           get<decltype(&cuMemFree_v2)>("cuMemFree"),
           get<decltype(&cuMemGetAddressRange_v2)>("cuMemGetAddressRange"),
           get<decltype(&cuMemcpyHtoD_v2)>("cuMemcpyHtoD"),
           get<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH"),
           get<decltype(&cuMemGetInfo_v2)>("cuMemGetInfo"),
           get<decltype(&cuIpcGetMemHandle)>("cuIpcGetMemHandle"),
           get<decltype(&cuIpcOpenMemHandle_v2)>("cuIpcOpenMemHandle")};
  // The probe proves nothing unless the hooks are the shim's.
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(d.mem_alloc), &info) == 0 ||
      std::strstr(info.dli_fname, "thaw-preload") == nullptr) {
    die("cuMemAlloc is not the shim's: run under LD_PRELOAD=libthaw-preload.so");
  }
  return d;
}

// A handle in the shim's IPC format (preload/hooks/ipc_hooks.cpp) whose exporter does not
// exist: opening it takes the shim's IPC lock and fails without asking the driver.
CUipcMemHandle orphan_ipc_handle() {
  CUipcMemHandle h{};
  const char magic[8] = {'T', 'H', 'A', 'W', 'I', 'P', 'C', '1'};
  std::memcpy(h.reserved, magic, sizeof magic);
  const std::uint64_t mapped = 2 << 20;
  const std::int32_t pid = 0x3ffffff0, fd = 3, carrier = 2;  // pidfd carrier
  std::memcpy(h.reserved + 24, &mapped, 8);
  std::memcpy(h.reserved + 32, &pid, 4);
  std::memcpy(h.reserved + 36, &fd, 4);
  std::memcpy(h.reserved + 40, &carrier, 4);
  return h;
}

// --- what each child does: an engine's start

int run_engine(const Driver& d, const fs::path& model) {
  auto fail = [](const char* what, long code) {
    std::fprintf(stderr, "fork_safety_probe child[%d]: %s (%ld)\n", ::getpid(), what, code);
    return 1;
  };
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) return fail("cuInit", r);
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (CUresult r = d.device_get(&dev, 0); r != CUDA_SUCCESS) return fail("cuDeviceGet", r);
  if (CUresult r = d.primary_retain(&ctx, dev); r != CUDA_SUCCESS) return fail("retain", r);
  if (CUresult r = d.ctx_set_current(ctx); r != CUDA_SUCCESS) return fail("set current", r);
  CUdeviceptr buffers[4] = {};
  for (CUdeviceptr& b : buffers) {
    if (CUresult r = d.mem_alloc(&b, 1 << 20); r != CUDA_SUCCESS) return fail("cuMemAlloc", r);
    if (b < kVaBase) return fail("allocation outside the deterministic layout", long(b));
  }
  const int fd = ::open((model / "weights.bin").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("open weights", errno);
  void* mapped = ::mmap(nullptr, kWeightBytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapped == MAP_FAILED) return fail("mmap weights", errno);
  if (CUresult r = d.htod(buffers[0], mapped, 1 << 20); r != CUDA_SUCCESS) return fail("H2D", r);
  std::vector<unsigned char> back(1 << 20), read_back(4096);
  if (CUresult r = d.dtoh(back.data(), buffers[0], back.size()); r != CUDA_SUCCESS)
    return fail("D2H", r);
  if (std::memcmp(back.data(), mapped, back.size()) != 0) return fail("copied bytes differ", 0);
  if (::pread(fd, read_back.data(), read_back.size(), 0) != 4096) return fail("pread", errno);
  if (std::memcmp(read_back.data(), mapped, read_back.size()) != 0) return fail("read", 0);
  const int failed = ::open((model / "failed.bin").c_str(), O_RDONLY | O_CLOEXEC);
  if (failed < 0) return fail("open failed.bin", errno);
  if (::pread(failed, read_back.data(), 16, 0) != -1 || errno != EIO)
    return fail("a failed file read without EIO", errno);
  ::close(failed);
  size_t free = 0, total = 0;
  if (CUresult r = d.mem_get_info(&free, &total); r != CUDA_SUCCESS) return fail("MemGetInfo", r);
  CUipcMemHandle handle{};
  if (CUresult r = d.ipc_get(&handle, buffers[1]); r != CUDA_SUCCESS) return fail("IPC get", r);
  for (CUdeviceptr b : buffers) {
    if (CUresult r = d.mem_free(b); r != CUDA_SUCCESS) return fail("cuMemFree", r);
  }
  ::munmap(mapped, kWeightBytes);
  ::close(fd);
  (void)d.primary_release(dev);
  return 0;
}

// --- the parent's threads

void hammer_files(const fs::path& model, const std::atomic<bool>& stop) {
  const std::string weights = (model / "weights.bin").string();
  char buf[4096];
  while (!stop.load(std::memory_order_relaxed)) {
    const int fd = ::open(weights.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)!::pread(fd, buf, sizeof buf, 8192);
    void* p = ::mmap(nullptr, kWeightBytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) ::munmap(p, kWeightBytes);
    ::close(fd);
  }
}

void hammer_failed_reads(const fs::path& model, const std::atomic<bool>& stop) {
  const int fd = ::open((model / "failed.bin").c_str(), O_RDONLY | O_CLOEXEC);
  char buf[64];
  while (!stop.load(std::memory_order_relaxed)) (void)!::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
}

void hammer_streamed_mappings(const fs::path& model, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    const int fd = ::open((model / "streamed.bin").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    void* p = ::mmap(nullptr, kChunk, PROT_READ, MAP_PRIVATE, fd, 0);  // never touched
    if (p != MAP_FAILED) ::munmap(p, kChunk);
    ::close(fd);
  }
}

void hammer_memory(const Driver& d, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    CUdeviceptr p = 0, base = 0;
    size_t size = 0;
    (void)d.mem_alloc(&p, 1 << 20);
    (void)d.mem_free(kVaBase + 4096);
    (void)d.get_address_range(&base, &size, kVaBase + 4096);
  }
}

void hammer_ipc(const Driver& d, const std::atomic<bool>& stop) {
  const CUipcMemHandle handle = orphan_ipc_handle();
  while (!stop.load(std::memory_order_relaxed)) {
    CUdeviceptr p = 0;
    (void)d.ipc_open(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  }
}

// 0: exited 0; 1: failed; 2: hung (killed).
int wait_for(pid_t child, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) die("usage: fork_safety_probe LIBCUDA WORKDIR [FORKS] [CHILD_TIMEOUT]");
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's ASan allocator takes its own locks without fork handlers: a child forked while
  // another thread is inside malloc or free deadlocks in ASan's allocator before the shim
  // runs a line (seen: the emulator's stream thread in the child waiting on
  // SizeClassAllocator64's mutex). glibc's malloc is fork-safe, so the default build runs
  // this test; under ASan it would only test the sanitizer.
  std::puts("fork_safety_probe: skipped under AddressSanitizer (its allocator is not fork-safe)");
  return 77;
#endif
  const int forks = argc > 3 ? std::atoi(argv[3]) : 100;
  const int child_timeout = argc > 4 ? std::atoi(argv[4]) : 30;
  const fs::path root = fs::path(argv[2]) / "cache";
  fs::remove_all(root);
  fs::create_directories(root);
  {
    std::FILE* marker = std::fopen((root / ".thaw-cache").c_str(), "w");
    std::fclose(marker);
  }
  make_model_file(root, "weights.bin", kWeightBytes, Fill::complete);
  make_model_file(root, "failed.bin", kChunk, Fill::failed);
  make_model_file(root, "streamed.bin", 4 * kChunk, Fill::filling);
  const fs::path model = root / "model";

  const Driver d = load_driver(argv[1]);
  {  // the emulator reads its configuration at the first call: before any thread exists
    CUdeviceptr p = 0;
    (void)d.mem_alloc(&p, 1 << 20);
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back(hammer_files, model, std::cref(stop));
    threads.emplace_back(hammer_failed_reads, model, std::cref(stop));
    threads.emplace_back(hammer_streamed_mappings, model, std::cref(stop));
    threads.emplace_back(hammer_memory, std::cref(d), std::cref(stop));
    threads.emplace_back(hammer_ipc, std::cref(d), std::cref(stop));
  }
  std::minstd_rand random(12345);
  int failed = 0, hung = 0;
  for (int i = 0; i < forks && hung == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
    const pid_t child = ::fork();
    if (child < 0) die("fork");
    if (child == 0) std::exit(run_engine(d, model));  // exit(): the shim's exit step runs too
    switch (wait_for(child, child_timeout)) {
      case 1:
        ++failed;
        break;
      case 2:
        ++hung;
        std::fprintf(stderr, "fork_safety_probe: child %d of fork %d hung (killed after %d s)\n",
                     child, i, child_timeout);
        break;
      default:
        break;
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("fork_safety_probe: %d forks, %d failed, %d hung\n", forks, failed, hung);
  return failed == 0 && hung == 0 ? 0 : 1;
}
