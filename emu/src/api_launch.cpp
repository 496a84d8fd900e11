// Kernel launches: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel.
//
// The launch is checked as the driver checks it (geometry, shared memory, parameters),
// the parameter bytes are copied at launch time (kernel arguments are by value), and
// the kernel's host twin runs on the stream's worker. A twin that touches device
// memory without access faults like a GPU would: CUDA_ERROR_ILLEGAL_ADDRESS, sticky
// for the context, instead of a crash.
#include <optional>

#include "api_common.hpp"
#include "graph.hpp"
#include "kernel_exec.hpp"
#include "module.hpp"

using namespace emu;

namespace {

constexpr int kLastLaunchAttribute = 16;  // CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING

struct LaunchConfig {
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  CUstream stream;
  bool cooperative = false;
  KernelAttributes attrs;       // cuLaunchKernelEx's, kept on a captured node
  std::optional<int> priority;  // the launch's own, over its stream's
};

CUresult launch(CUfunction f, const LaunchConfig& config, void** kernelParams, void** extra,
                bool ptds, Call& c) {
  c.ptr("function", handle_value(f))
      .arg("grid_x", config.grid[0])
      .arg("grid_y", config.grid[1])
      .arg("grid_z", config.grid[2])
      .arg("block_x", config.block[0])
      .arg("block_y", config.block[1])
      .arg("block_z", config.block[2])
      .arg("shared", config.shared)
      .ptr("stream", handle_value(config.stream));
  EMU_REQUIRE_INIT();
  std::lock_guard lock(driver().mu);
  auto stream = resolve_stream_locked(config.stream, ptds);
  if (!stream) return stream.error();
  auto ctx = driver().contexts.find((*stream)->ctx());
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  auto fn = function_for_launch_locked(handle_value(f), *ctx, c);
  if (!fn) return fn.error();
  const KernelInfo& k = (*fn)->info();
  c.arg("kernel", k.name.c_str());
  if (CUresult r =
          check_geometry(config.grid, config.block, config.shared, config.cooperative, **fn);
      r != CUDA_SUCCESS) {
    return r;
  }
  KernelNode node;
  if (CUresult r = pack_params(k, kernelParams, extra, node.params); r != CUDA_SUCCESS) return r;
  if ((*fn)->twin == nullptr) {
    report_missing_twin(k.name.c_str());
    return CUDA_ERROR_NOT_FOUND;
  }
  node.function = (*fn)->handle;
  node.ctx = ctx->handle;
  std::copy(config.grid, config.grid + 3, node.grid);
  std::copy(config.block, config.block + 3, node.block);
  node.shared = config.shared;
  for (const auto& p : k.params) node.offsets.push_back(p.offset);
  node.twin = (*fn)->twin;
  node.name = k.name;
  node.from_extra = kernelParams == nullptr && extra != nullptr;
  // Captured kernels take their stream's priority (used with USE_NODE_PRIORITY).
  node.priority = config.priority.value_or((*stream)->priority());
  node.attrs = config.attrs;
  node.attrs.cooperative = config.cooperative ? 1 : 0;
  NodeSpec spec{CU_GRAPH_NODE_TYPE_KERNEL, std::move(node)};
  StreamOp op = op_for_node(spec);
  return submit_locked(*ctx, *stream, std::move(op), std::move(spec));
}

}  // namespace

EMU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shared, CUstream s, void** kernelParams,
                                   void** extra) {
  return api("cuLaunchKernel", [&](Call& c) {
    return launch(f, {{gx, gy, gz}, {bx, by, bz}, shared, s}, kernelParams, extra, false, c);
  });
}

EMU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int shared, CUstream s,
                                        void** kernelParams, void** extra) {
  return api("cuLaunchKernel", [&](Call& c) {
    return launch(f, {{gx, gy, gz}, {bx, by, bz}, shared, s}, kernelParams, extra, true, c);
  });
}

static CUresult launch_ex(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                          void** extra, bool ptds, Call& c) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  LaunchConfig l{{config->gridDimX, config->gridDimY, config->gridDimZ},
                 {config->blockDimX, config->blockDimY, config->blockDimZ},
                 config->sharedMemBytes,
                 config->hStream};
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    int id = raw(config->attrs[i].id);
    if (id < CU_LAUNCH_ATTRIBUTE_IGNORE || id > kLastLaunchAttribute)
      return CUDA_ERROR_INVALID_VALUE;
    if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      l.cooperative = config->attrs[i].value.cooperative != 0;
      continue;
    }
    // Cluster, priority, memory-sync and carveout attributes are checked and kept on the node
    // (a capture records them, cuGraphKernelNodeGetAttribute answers them); the others
    // (programmatic serialization, events, ...) change scheduling on a GPU, not results:
    // accepted and ignored.
    int priority = 0;
    const CUresult r = set_launch_attribute(id, config->attrs[i].value, l.grid, l.attrs, priority);
    if (r == CUDA_ERROR_NOT_SUPPORTED) continue;
    if (r != CUDA_SUCCESS) return r;
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) l.priority = priority;
  }
  return launch(f, l, kernelParams, extra, ptds, c);
}

EMU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                     void** kernelParams, void** extra) {
  return api("cuLaunchKernelEx",
             [&](Call& c) { return launch_ex(config, f, kernelParams, extra, false, c); });
}

EMU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                          void** kernelParams, void** extra) {
  return api("cuLaunchKernelEx",
             [&](Call& c) { return launch_ex(config, f, kernelParams, extra, true, c); });
}

EMU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                              unsigned int gz, unsigned int bx, unsigned int by,
                                              unsigned int bz, unsigned int shared, CUstream s,
                                              void** kernelParams) {
  return api("cuLaunchCooperativeKernel", [&](Call& c) {
    LaunchConfig l{{gx, gy, gz}, {bx, by, bz}, shared, s, true};
    return launch(f, l, kernelParams, nullptr, false, c);
  });
}

EMU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                   unsigned int gz, unsigned int bx,
                                                   unsigned int by, unsigned int bz,
                                                   unsigned int shared, CUstream s,
                                                   void** kernelParams) {
  return api("cuLaunchCooperativeKernel", [&](Call& c) {
    LaunchConfig l{{gx, gy, gz}, {bx, by, bz}, shared, s, true};
    return launch(f, l, kernelParams, nullptr, true, c);
  });
}
