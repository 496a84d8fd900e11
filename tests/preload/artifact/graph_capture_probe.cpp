// A small engine for the graph-record suite, linked against libcuda.so.1 (the emulator): it
// opens a file of a cached model (the layout record's identity), allocates, loads one module
// as a cubin (cuModuleLoadData) and one as a fatbin library (cuLibraryLoadData, kernels through
// cuLibraryGetKernel + cuKernelGetFunction), and captures two graphs:
//   graph 0: vec_add on the capturing stream, then a fork to a second stream (axpb) and
//            add_into back on the first: three kernel nodes, two edges;
//   graph 1: a memset and a kernel (the memset node's parameters as cuGraphMemsetNodeGetParams
//            answers them).
// Before instantiating each graph (and destroying it right after, as PyTorch does) it prints
// what the live graph holds — node count, types, edge count — and each kernel launch's name
// and parameter bytes laid out as cuFuncGetParamInfo says, as one JSON line per graph.
//
// usage: graph_capture_probe MODEL_FILE
#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu_kernels_cubins.h"

namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, r);
    std::exit(2);
  }
}

struct Launch {
  std::string name;
  std::string param_hex;
};

// The bytes of `args` (pointers to each parameter's value) laid out as the driver says.
std::string param_hex(CUfunction f, void** args) {
  std::vector<unsigned char> bytes;
  for (std::size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    if (cuFuncGetParamInfo(f, i, &offset, &size) != CUDA_SUCCESS) break;
    if (bytes.size() < offset + size) bytes.resize(offset + size);
    std::memcpy(bytes.data() + offset, args[i], size);
  }
  std::string out;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    out += hex;
  }
  return out;
}

void launch(CUfunction f, const char* name, CUstream s, void** args, unsigned n,
            std::vector<Launch>& launches) {
  check(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, nullptr), name);
  launches.push_back({name, param_hex(f, args)});
}

void print_graph(CUgraph graph, const std::vector<Launch>& launches) {
  size_t count = 0;
  check(cuGraphGetNodes(graph, nullptr, &count), "cuGraphGetNodes");
  std::vector<CUgraphNode> nodes(count);
  check(cuGraphGetNodes(graph, nodes.data(), &count), "cuGraphGetNodes");
  size_t edges = 0;
  check(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges), "cuGraphGetEdges");
  std::string types;
  for (CUgraphNode n : nodes) {
    CUgraphNodeType t{};
    check(cuGraphNodeGetType(n, &t), "cuGraphNodeGetType");
    const char* name = t == CU_GRAPH_NODE_TYPE_KERNEL   ? "kernel"
                       : t == CU_GRAPH_NODE_TYPE_MEMSET ? "memset"
                       : t == CU_GRAPH_NODE_TYPE_MEMCPY ? "memcpy"
                                                        : "other";
    types += std::string(types.empty() ? "" : ",") + "\"" + name + "\"";
  }
  std::string kernels;
  for (const Launch& l : launches) {
    kernels += std::string(kernels.empty() ? "" : ",") + "{\"name\":\"" + l.name +
               "\",\"params\":\"" + l.param_hex + "\"}";
  }
  std::printf("{\"nodes\":%zu,\"types\":[%s],\"edges\":%zu,\"kernels\":[%s]}\n", count,
              types.c_str(), edges, kernels.c_str());
  std::fflush(stdout);
}

void instantiate_run_destroy(CUgraph graph, CUstream s) {
  CUgraphExec exec = nullptr;
  check(cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiate");
  check(cuGraphDestroy(graph), "cuGraphDestroy");
  check(cuGraphLaunch(exec, s), "cuGraphLaunch");
  check(cuStreamSynchronize(s), "cuStreamSynchronize");
  check(cuGraphExecDestroy(exec), "cuGraphExecDestroy");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: graph_capture_probe MODEL_FILE\n");
    return 2;
  }
  // The model this run is of (the shim's layout record names it).
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

  CUstream s1 = nullptr, s2 = nullptr;
  check(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUevent forked = nullptr, joined = nullptr;
  check(cuEventCreate(&forked, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  check(cuEventCreate(&joined, CU_EVENT_DISABLE_TIMING), "cuEventCreate");

  // Graph 0: vec_add; fork: axpb on s2 | add_into on s1; join.
  {
    std::vector<Launch> launches;
    float scale = 2.0f, shift = 1.0f;
    void* vec_args[] = {&a, &b, &c, &n};
    void* axpb_args[] = {&c, &scale, &shift, &n};
    void* add_args[] = {&a, &b, &n};
    CUgraph graph = nullptr;
    check(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    launch(vec_add, "vec_add", s1, vec_args, n, launches);
    check(cuEventRecord(forked, s1), "cuEventRecord");
    check(cuStreamWaitEvent(s2, forked, 0), "cuStreamWaitEvent");
    launch(axpb, "axpb", s2, axpb_args, n, launches);
    launch(add_into, "add_into", s1, add_args, n, launches);
    check(cuEventRecord(joined, s2), "cuEventRecord");
    check(cuStreamWaitEvent(s1, joined, 0), "cuStreamWaitEvent");
    check(cuStreamEndCapture(s1, &graph), "cuStreamEndCapture");
    print_graph(graph, launches);
    instantiate_run_destroy(graph, s1);
  }
  // Graph 1: a memset, then a kernel.
  {
    std::vector<Launch> launches;
    void* vec_args[] = {&a, &b, &c, &n};
    CUgraph graph = nullptr;
    check(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    check(cuMemsetD32Async(c, 0, n, s1), "cuMemsetD32Async");
    launch(vec_add, "vec_add", s1, vec_args, n, launches);
    check(cuStreamEndCapture(s1, &graph), "cuStreamEndCapture");
    print_graph(graph, launches);
    instantiate_run_destroy(graph, s1);
  }
  check(cuLibraryUnload(chain), "cuLibraryUnload");
  check(cuModuleUnload(samples), "cuModuleUnload");
  return 0;
}
