// A small engine stand-in for the shim's suites, run with and without LD_PRELOAD: it reaches
// the driver the way the CUDA runtime does (dlopen + dlsym("cuGetProcAddress_v2")) and prints
// what it sees as JSON lines, so the suite can compare the two runs.
//
//   preload_probe lookups   every cuGetProcAddress case the shim must honour: versions,
//                           the per-thread flag, unknown symbols, cuGetExportTable, v1
//   preload_probe alloc N   N allocations of mixed sizes: addresses and range queries
//   preload_probe threads   8 threads allocating and freeing at once
//   preload_probe fork      resolve the driver, fork before initialising it (as engines
//                           that fork workers do: CUDA is not fork-safe once initialised);
//                           child and parent each initialise and allocate
//   preload_probe export-table   cuGetExportTable called, as the CUDA runtime does first
//                           thing, through both lookups: each call's result (SIGALRM after
//                           20 s: a hang fails instead of stalling the suite)
//   preload_probe numa      cuMemCreate of host-NUMA memory (as NCCL asks for it) next to a
//                           device-memory control: result and free-memory change of each,
//                           then one cuMemAlloc
//   preload_probe init      cuInit alone. Built as preload_probe_linked (PROBE_LINKED_DRIVER:
//                           linked against libcuda.so.1) it calls cuInit directly before any
//                           lookup, as a linked program does: nothing has told the shim where
//                           the driver is when the driver's own cuInit calls dlsym
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#undef cuGetProcAddress

namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

void* g_handle = nullptr;
GetProcAddress g_gpa = nullptr;

template <typename Fn>
Fn get(const char* name, int version = 12080) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (g_gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      p == nullptr) {
    std::fprintf(stderr, "no %s\n", name);
    std::exit(3);
  }
  return reinterpret_cast<Fn>(p);
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, r);
    std::exit(4);
  }
}

// The exported name and library file of a function pointer.
std::string where(void* p) {
  Dl_info info{};
  if (p == nullptr || ::dladdr(p, &info) == 0) return "\"\",\"\"";
  const char* file = std::strrchr(info.dli_fname, '/');
  return std::string("\"") + (info.dli_sname ? info.dli_sname : "") + "\",\"" +
         (file ? file + 1 : info.dli_fname) + "\"";
}

void lookups() {
  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
  };
  const Case cases[] = {
      {"cuMemAlloc", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuMemAlloc", 3010, CU_GET_PROC_ADDRESS_DEFAULT},  // the v1 ABI: not hooked
      {"cuMemFree", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuMemGetAddressRange", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuPointerGetAttribute", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuMemcpyHtoDAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"cuMemcpyHtoDAsync", 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM},
      {"cuStreamSynchronize", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
      {"cuInit", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuGetExportTable", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuGetProcAddress", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuNoSuchFunction", 12080, CU_GET_PROC_ADDRESS_DEFAULT},
      {"cuMemAlloc", 99000, CU_GET_PROC_ADDRESS_DEFAULT},  // newer than the driver
  };
  for (const Case& c : cases) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult r = g_gpa(c.name, &p, c.version, c.flags, &status);
    std::printf(
        "{\"lookup\":\"%s\",\"version\":%d,\"flags\":%llu,\"result\":%d,\"status\":%d,"
        "\"got\":[%s]}\n",
        c.name, c.version, static_cast<unsigned long long>(c.flags), r, status, where(p).c_str());
  }
  // The v1 entry point, and plain dlsym of driver and non-driver names.
  auto v1 = reinterpret_cast<GetProcAddressV1>(::dlsym(g_handle, "cuGetProcAddress"));
  void* p = nullptr;
  const CUresult r = v1 != nullptr ? v1("cuMemAlloc", &p, 12080, 0) : CUDA_ERROR_NOT_FOUND;
  std::printf("{\"lookup\":\"v1 cuMemAlloc\",\"result\":%d,\"got\":[%s]}\n", r, where(p).c_str());
  for (const char* name : {"cuMemAlloc_v2", "cuMemAlloc", "cuMemFree_v2", "cuDeviceGet",
                           "cudnnCreate", "cublasCreate_v2"}) {
    std::printf("{\"dlsym\":\"%s\",\"got\":[%s]}\n", name, where(::dlsym(g_handle, name)).c_str());
  }
}

struct Api {
  decltype(&cuInit) init = get<decltype(&cuInit)>("cuInit");
  decltype(&cuDevicePrimaryCtxRetain) retain =
      get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  decltype(&cuCtxSetCurrent) set_current = get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent");
  decltype(&cuMemAlloc_v2) alloc = get<decltype(&cuMemAlloc_v2)>("cuMemAlloc");
  decltype(&cuMemFree_v2) free = get<decltype(&cuMemFree_v2)>("cuMemFree");
  decltype(&cuMemGetAddressRange_v2) range =
      get<decltype(&cuMemGetAddressRange_v2)>("cuMemGetAddressRange");
  decltype(&cuPointerGetAttribute) attribute =
      get<decltype(&cuPointerGetAttribute)>("cuPointerGetAttribute");
  decltype(&cuMemcpyHtoD_v2) htod = get<decltype(&cuMemcpyHtoD_v2)>("cuMemcpyHtoD");
  decltype(&cuMemcpyDtoH_v2) dtoh = get<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH");

  void start() {
    check(init(0), "cuInit");
    CUcontext ctx = nullptr;
    check(retain(&ctx, 0), "cuDevicePrimaryCtxRetain");
    check(set_current(ctx), "cuCtxSetCurrent");
  }
  // An allocation, its range as the driver answers, and a copy round trip through it.
  void alloc_and_report(std::size_t size, bool print) {
    CUdeviceptr p = 0;
    check(alloc(&p, size), "cuMemAlloc");
    CUdeviceptr base = 0, start = 0;
    size_t bytes = 0, range_size = 0;
    check(range(&base, &bytes, p + size / 2), "cuMemGetAddressRange");
    check(attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + size - 1), "RANGE_START");
    check(attribute(&range_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p), "RANGE_SIZE");
    std::vector<unsigned char> out(4096, 0x5a), in(4096, 0);
    check(htod(p, out.data(), out.size()), "cuMemcpyHtoD");
    check(dtoh(in.data(), p, in.size()), "cuMemcpyDtoH");
    const bool ok = base == p && bytes == size && start == p && range_size == size && in == out;
    if (print) {
      std::printf("{\"alloc\":%zu,\"ptr\":%llu,\"range_ok\":%s}\n", size,
                  static_cast<unsigned long long>(p), ok ? "true" : "false");
    }
    if (!ok) {
      std::fprintf(stderr, "allocation %llu of %zu: range %llu+%zu, attribute %llu+%zu\n",
                   static_cast<unsigned long long>(p), size, static_cast<unsigned long long>(base),
                   bytes, static_cast<unsigned long long>(start), range_size);
      std::exit(5);
    }
  }
};

void allocs(int n) {
  Api api;
  api.start();
  for (int i = 0; i < n; ++i) {
    api.alloc_and_report(static_cast<std::size_t>((i % 3 + 1) * (1 << 20) + i * 4096 + 256), true);
  }
  // A freed allocation's address is not handed out again; a bad free is refused.
  CUdeviceptr p = 0;
  check(api.alloc(&p, 1 << 20), "cuMemAlloc");
  check(api.free(p), "cuMemFree");
  std::printf("{\"double_free\":%d,\"interior_free\":%d}\n", api.free(p), api.free(p + 256));
}

void threads() {
  Api api;
  api.start();
  CUcontext ctx = nullptr;
  check(api.retain(&ctx, 0), "retain");
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      if (api.set_current(ctx) != CUDA_SUCCESS) ++failures;
      for (int i = 0; i < 20; ++i) {
        CUdeviceptr p = 0;
        const std::size_t size = static_cast<std::size_t>((t + 1) * 65536 + i);
        CUdeviceptr base = 0;
        size_t bytes = 0;
        if (api.alloc(&p, size) != CUDA_SUCCESS ||
            api.range(&base, &bytes, p + 1) != CUDA_SUCCESS || base != p || bytes != size ||
            api.free(p) != CUDA_SUCCESS) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  std::printf("{\"thread_failures\":%d}\n", failures.load());
}

void forked() {
  Api api;  // entry points resolved through the shim, nothing initialised
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    Api c;
    c.start();
    c.alloc_and_report(1 << 20, true);
    c.alloc_and_report(5 << 20, true);
    std::fflush(stdout);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  api.start();
  api.alloc_and_report(2 << 20, true);
  std::printf("{\"child_exit\":%d}\n",
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

void export_table() {
  ::alarm(20);
  using GetExportTable = CUresult (*)(const void**, const CUuuid*);
  const auto by_proc_address = get<GetExportTable>("cuGetExportTable");
  const auto by_dlsym = reinterpret_cast<GetExportTable>(::dlsym(g_handle, "cuGetExportTable"));
  if (by_dlsym == nullptr) std::exit(3);
  CUuuid some_table{};
  for (int i = 0; i < 16; ++i) some_table.bytes[i] = static_cast<char>(0x10 + i);
  const CUuuid zero{};
  struct Call {
    const char* name;
    GetExportTable fn;
    const CUuuid* id;
    bool out;
  };
  const Call calls[] = {{"proc_address", by_proc_address, &some_table, true},
                        {"dlsym", by_dlsym, &some_table, true},
                        {"dlsym_zero_uuid", by_dlsym, &zero, true},
                        {"dlsym_null_out", by_dlsym, &some_table, false}};
  for (const Call& c : calls) {
    const void* table = reinterpret_cast<const void*>(0x1);
    const CUresult r = c.fn(c.out ? &table : nullptr, c.id);
    std::printf("{\"export_table\":\"%s\",\"result\":%d,\"table_null\":%s}\n", c.name, r,
                table == nullptr ? "true" : "false");
  }
}

void numa() {
  Api api;
  api.start();
  auto create = get<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = get<decltype(&cuMemRelease)>("cuMemRelease");
  auto granularity = get<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  auto mem_info = get<decltype(&cuMemGetInfo_v2)>("cuMemGetInfo");
  struct Case {
    const char* name;
    CUmemLocationType type;
    unsigned long long handle_types;
  };
  const Case cases[] = {
      {"host_numa", CU_MEM_LOCATION_TYPE_HOST_NUMA, 0},
      {"host_numa_fd", CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
      {"host_numa_current", CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0},
      {"host", CU_MEM_LOCATION_TYPE_HOST, 0},
      {"device", CU_MEM_LOCATION_TYPE_DEVICE, 0},  // the control: this one is device memory
  };
  CUmemAllocationProp device_prop{};
  device_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  device_prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  size_t size = 0;
  check(granularity(&size, &device_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  for (const Case& c : cases) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {c.type, 0};  // NUMA node 0; ignored for HOST and HOST_NUMA_CURRENT
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(c.handle_types);
    size_t free_before = 0, free_after = 0, total = 0;
    check(mem_info(&free_before, &total), "cuMemGetInfo");
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = create(&h, size, &prop, 0);
    check(mem_info(&free_after, &total), "cuMemGetInfo");
    if (r == CUDA_SUCCESS) check(release(h), "cuMemRelease");
    std::printf("{\"create\":\"%s\",\"result\":%d,\"free_delta\":%lld}\n", c.name, r,
                static_cast<long long>(free_before) - static_cast<long long>(free_after));
  }
  api.alloc_and_report(1 << 20, true);
}

void init() {
  auto cu_init = get<decltype(&cuInit)>("cuInit");
  std::printf("{\"cuInit\":%d}\n", cu_init(0));
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = std::getenv("PROBE_LIBCUDA");
  if (path == nullptr) path = "libcuda.so.1";
  const std::string mode = argc > 1 ? argv[1] : "lookups";
#ifdef PROBE_LINKED_DRIVER
  if (mode == "init") {
    std::printf("{\"cuInit\":%d}\n", ::cuInit(0));
    return 0;
  }
#endif
  g_handle = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (g_handle == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", ::dlerror());
    return 2;
  }
  g_gpa = reinterpret_cast<GetProcAddress>(::dlsym(g_handle, "cuGetProcAddress_v2"));
  if (g_gpa == nullptr) return 2;
  if (mode == "lookups") {
    lookups();
  } else if (mode == "alloc") {
    allocs(argc > 2 ? std::atoi(argv[2]) : 8);
  } else if (mode == "threads") {
    threads();
  } else if (mode == "fork") {
    forked();
  } else if (mode == "export-table") {
    export_table();
  } else if (mode == "numa") {
    numa();
  } else if (mode == "init") {
    init();
  } else {
    return 2;
  }
  return 0;
}
