// Interposition overhead (issue 8, benchmark 2), measured inside one engine-like process that
// reaches the driver as the CUDA runtime does (dlopen + cuGetProcAddress_v2). bench/preload/
// run.sh runs it without and with LD_PRELOAD=libthaw-preload.so and prints the ratios.
//
//   unhooked: N calls of cuCtxGetCurrent (not in the hooked set: the engine holds the
//             driver's own pointer, so the shim should cost nothing)
//   hooked query: N calls of cuPointerGetAttribute(RANGE_START_ADDR) on an allocation
//   allocation: M × (cuMemAlloc of 2 MiB + cuMemFree): the layout's VMM path vs the driver's
//   h2d copy: N/1000 × cuMemcpyHtoD of 64 bytes (an engine's per-step token upload): hooked
//             since the layout record notes copies from model files
#include <cuda.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;
using Gpa = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
Gpa g_gpa = nullptr;

template <typename Fn>
Fn get(const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (g_gpa(name, &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p) {
    std::fprintf(stderr, "no %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<Fn>(p);
}

double ns_per_call(Clock::time_point start, long n) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
         static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 10'000'000;
  const long allocs = argc > 2 ? std::atol(argv[2]) : 2'000;
  void* h = ::dlopen(std::getenv("BENCH_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 2;
  g_gpa = reinterpret_cast<Gpa>(::dlsym(h, "cuGetProcAddress_v2"));
  auto init = get<decltype(&cuInit)>("cuInit");
  auto retain = get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  auto set_current = get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent");
  auto get_current = get<decltype(&cuCtxGetCurrent)>("cuCtxGetCurrent");
  auto alloc = get<decltype(&cuMemAlloc_v2)>("cuMemAlloc");
  auto mfree = get<decltype(&cuMemFree_v2)>("cuMemFree");
  auto attribute = get<decltype(&cuPointerGetAttribute)>("cuPointerGetAttribute");
  CUcontext ctx = nullptr;
  if (init(0) != CUDA_SUCCESS || retain(&ctx, 0) != CUDA_SUCCESS ||
      set_current(ctx) != CUDA_SUCCESS)
    return 3;

  CUcontext c = nullptr;
  for (long i = 0; i < calls / 10; ++i) get_current(&c);  // warm
  auto t = Clock::now();
  for (long i = 0; i < calls; ++i) get_current(&c);
  const double unhooked = ns_per_call(t, calls);

  CUdeviceptr p = 0;
  if (alloc(&p, 2 << 20) != CUDA_SUCCESS) return 4;
  CUdeviceptr start = 0;
  const long queries = calls / 10;
  t = Clock::now();
  for (long i = 0; i < queries; ++i) attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
  const double query = ns_per_call(t, queries);
  auto h2d = get<CUresult (*)(CUdeviceptr, const void*, size_t)>("cuMemcpyHtoD");
  char tokens[64] = {};
  // The emulator's synchronous copy costs tens of microseconds: fewer of them.
  const long copies = calls / 1000;
  t = Clock::now();
  for (long i = 0; i < copies; ++i) h2d(p, tokens, sizeof tokens);
  const double copy = ns_per_call(t, copies);
  mfree(p);

  t = Clock::now();
  for (long i = 0; i < allocs; ++i) {
    if (alloc(&p, 2 << 20) != CUDA_SUCCESS || mfree(p) != CUDA_SUCCESS) return 5;
  }
  const double allocation = ns_per_call(t, allocs);
  std::printf(
      "{\"unhooked_ns\":%.3f,\"hooked_query_ns\":%.3f,\"h2d_copy_ns\":%.3f,"
      "\"alloc_free_ns\":%.1f,\"calls\":%ld,\"allocs\":%ld}\n",
      unhooked, query, copy, allocation, calls, allocs);
  return 0;
}
