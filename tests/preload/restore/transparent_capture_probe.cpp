// A small engine for the transparent-restore suite, linked against libcuda.so.1 (the emulator):
// it opens a file of a cached model (the layout record's identity), allocates three buffers,
// loads one module as a cubin (vec_add) and one as a fatbin library (axpb, add_into), fills the
// inputs, and captures one graph on a stream — a chain of three launches:
//   vec_add(a, b -> c), axpb(c, 2, 1), add_into(a += c)
// MODE (the environment's PROBE_MODE: argv is part of the engine's fingerprint, so every mode
// must be the same command line) changes what happens between the first and second launch:
//   plain   nothing;
//   unhooked  a cuMemcpyAsync c <- b (a node the driver captures, the shim does not elide);
//   ops     a cuMemcpyDtoDAsync b <- c and a cuMemsetD32Async of c to 1.0f (both elided too);
//   ops_value  the same with the memset's value 2.0f (differs from an "ops" record);
//   event   a cuEventRecord on the capturing stream (a call the elision does not model);
//   scale   axpb's scale is 3, not 2 (a kernel parameter that differs from the record);
//   invalidate  a cuMemAlloc during the (GLOBAL) capture, which invalidates it: prints the codes
//           every call answers after it ({"codes": [...]}) instead of a graph;
//   query   cuStreamGetCaptureInfo asking for the capture's graph (what the elision left out);
//   cluster   axpb is launched with cuLaunchKernelEx, a cluster of 2 and priority -1 (as cuBLAS
//           launches an sm_90 GEMM);
//   cluster4  the same with a cluster of 4 (differs from a "cluster" record);
//   cluster_unhooked  "cluster", then a cuMemcpyAsync c <- c after axpb (the kept launches are
//           replayed as nodes before the one the driver captured).
// At the end of the capture it prints the graph as the driver describes it (graph_parity.hpp),
// then instantiates it (destroying the graph right after, as PyTorch does), launches it and
// prints a checksum of a and c: {"graph": ..., "sum_a": x, "sum_c": y}.
//
// usage:
// PROBE_MODE=plain|unhooked|ops|ops_value|event|scale|query|invalidate|cluster|cluster4|cluster_unhooked
// transparent_capture_probe MODEL_FILE
#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu_kernels_cubins.h"
#include "graph_parity.hpp"

namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, r);
    std::exit(2);
  }
}

void launch(CUfunction f, const char* name, CUstream s, void** args, unsigned n) {
  check(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, nullptr), name);
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode_env = std::getenv("PROBE_MODE");
  if (argc != 2 || mode_env == nullptr) {
    std::fprintf(stderr,
                 "usage: PROBE_MODE=plain|unhooked|ops|ops_value|event|scale|query|invalidate|"
                 "cluster|cluster4|cluster_unhooked "
                 "transparent_capture_probe MODEL_FILE\n");
    return 2;
  }
  const std::string mode = mode_env;
  const int fd = ::open(argv[1], O_RDONLY);
  if (fd < 0) {
    std::perror(argv[1]);
    return 2;
  }
  ::close(fd);

  check(cuInit(0), "cuInit");
  CUdevice dev = 0;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

  int n = 4096;
  CUdeviceptr a = 0, b = 0, c = 0;
  check(cuMemAlloc(&a, n * sizeof(float)), "cuMemAlloc(a)");
  check(cuMemAlloc(&b, n * sizeof(float)), "cuMemAlloc(b)");
  check(cuMemAlloc(&c, n * sizeof(float)), "cuMemAlloc(c)");
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = float(i % 17);
  check(cuMemcpyHtoD(a, host.data(), n * sizeof(float)), "cuMemcpyHtoD(a)");
  for (int i = 0; i < n; ++i) host[i] = float(i % 5) * 0.5f;
  check(cuMemcpyHtoD(b, host.data(), n * sizeof(float)), "cuMemcpyHtoD(b)");

  CUmodule samples = nullptr;
  check(cuModuleLoadData(&samples, thaw_cubin_samples().data), "cuModuleLoadData");
  CUfunction vec_add = nullptr;
  check(cuModuleGetFunction(&vec_add, samples, "vec_add"), "cuModuleGetFunction");
  CUlibrary chain = nullptr;
  check(
      cuLibraryLoadData(&chain, thaw_fatbin_chain().data, nullptr, nullptr, 0, nullptr, nullptr, 0),
      "cuLibraryLoadData");
  CUfunction axpb = nullptr, add_into = nullptr;
  CUkernel k = nullptr;
  check(cuLibraryGetKernel(&k, chain, "axpb"), "cuLibraryGetKernel(axpb)");
  check(cuKernelGetFunction(&axpb, k), "cuKernelGetFunction(axpb)");
  check(cuLibraryGetKernel(&k, chain, "add_into"), "cuLibraryGetKernel(add_into)");
  check(cuKernelGetFunction(&add_into, k), "cuKernelGetFunction(add_into)");

  CUstream s = nullptr;
  check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUevent event = nullptr;
  check(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");

  float scale = mode == "scale" ? 3.0f : 2.0f, shift = 1.0f;
  void* vec_args[] = {&a, &b, &c, &n};
  void* axpb_args[] = {&c, &scale, &shift, &n};
  void* add_args[] = {&a, &c, &n};
  CUgraph graph = nullptr;
  check(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  launch(vec_add, "vec_add", s, vec_args, n);
  if (mode == "unhooked") check(cuMemcpyAsync(c, b, n * sizeof(float), s), "cuMemcpyAsync");
  if (mode == "ops" || mode == "ops_value") {
    check(cuMemcpyDtoDAsync(b, c, n * sizeof(float), s), "cuMemcpyDtoDAsync");
    check(cuMemsetD32Async(c, mode == "ops" ? 0x3f800000u : 0x40000000u, n, s), "cuMemsetD32Async");
  }
  if (mode == "event") check(cuEventRecord(event, s), "cuEventRecord");
  if (mode == "query") {
    CUstreamCaptureStatus status{};
    cuuint64_t id = 0;
    CUgraph capturing = nullptr;
    check(cuStreamGetCaptureInfo(s, &status, &id, &capturing, nullptr, nullptr, nullptr),
          "cuStreamGetCaptureInfo");
    size_t nodes = 0;
    check(cuGraphGetNodes(capturing, nullptr, &nodes), "cuGraphGetNodes");
    // What a live capture has at this point: the first launch.
    if (nodes != 1) {
      std::fprintf(stderr, "the capture's graph holds %zu nodes after one launch\n", nodes);
      return 3;
    }
  }
  if (mode == "invalidate") {
    // cuMemAlloc during a GLOBAL capture: refused, and the capture invalidated; what every call
    // after it answers, as codes.
    CUdeviceptr extra = 0;
    nlohmann::json codes = nlohmann::json::array();
    codes.push_back(static_cast<int>(cuMemAlloc(&extra, 4096)));
    codes.push_back(static_cast<int>(
        cuLaunchKernel(axpb, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, axpb_args, nullptr)));
    codes.push_back(static_cast<int>(
        cuLaunchKernel(add_into, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, add_args, nullptr)));
    codes.push_back(static_cast<int>(cuStreamEndCapture(s, &graph)));
    codes.push_back(graph == nullptr ? 0 : 1);
    std::printf("%s\n", nlohmann::json{{"codes", codes}}.dump().c_str());
    return 0;
  }
  if (mode == "cluster" || mode == "cluster4" || mode == "cluster_unhooked") {
    CUlaunchAttribute attrs[2]{};
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[0].value.clusterDim.x = mode == "cluster4" ? 4 : 2;
    attrs[0].value.clusterDim.y = 1;
    attrs[0].value.clusterDim.z = 1;
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attrs[1].value.priority = -1;
    CUlaunchConfig config{};
    config.gridDimX = (n + 127) / 128;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 128;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = s;
    config.attrs = attrs;
    config.numAttrs = 2;
    check(cuLaunchKernelEx(&config, axpb, axpb_args, nullptr), "cuLaunchKernelEx(axpb)");
    attrs[0].value.clusterDim.x = 99;  // the caller's array is its own again: nothing may see it
    if (mode == "cluster_unhooked")
      check(cuMemcpyAsync(c, c, n * sizeof(float), s), "cuMemcpyAsync");
  } else {
    launch(axpb, "axpb", s, axpb_args, n);
  }
  launch(add_into, "add_into", s, add_args, n);
  check(cuStreamEndCapture(s, &graph), "cuStreamEndCapture");
  nlohmann::json out;
  out["graph"] = thaw::testing::describe_graph(graph);

  CUgraphExec exec = nullptr;
  check(cuGraphInstantiateWithFlags(&exec, graph, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH),
        "cuGraphInstantiateWithFlags");
  check(cuGraphDestroy(graph), "cuGraphDestroy");
  check(cuGraphLaunch(exec, s), "cuGraphLaunch");
  check(cuStreamSynchronize(s), "cuStreamSynchronize");
  check(cuGraphExecDestroy(exec), "cuGraphExecDestroy");
  for (CUdeviceptr p : {a, c}) {
    check(cuMemcpyDtoH(host.data(), p, n * sizeof(float)), "cuMemcpyDtoH");
    double sum = 0;
    for (float v : host) sum += v;
    out[p == a ? "sum_a" : "sum_c"] = sum;
  }
  std::printf("%s\n", out.dump().c_str());
  check(cuLibraryUnload(chain), "cuLibraryUnload");
  check(cuModuleUnload(samples), "cuModuleUnload");
  return 0;
}
