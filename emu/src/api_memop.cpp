// Stream memory operations (cuda.h, "Stream Memory Operations"): cuStreamWriteValue32/64 in the
// CUDA 11.7 ABI (_v2), the one cuGetProcAddress hands out from 11.7 on. PyTorch requires
// cuStreamWriteValue32 (c10/cuda/driver_api.h, looked up at version 12000) for the signal pads of
// its symmetric memory.
//
// Not provided: the CUDA 8.0 ABI of the same names, usable only where
// CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 is set (it reads 0 here), so a request for a
// version before 11.7 gets VERSION_NOT_SUFFICIENT; the waits (cuStreamWaitValue*) and
// cuStreamBatchMemOp.
#include <shared_mutex>

#include "api_common.hpp"
#include "graph.hpp"

using namespace emu;

namespace {

// "Write a value to memory": an operation on the stream like any other (captured as a batch
// memory-op node). The address must be device memory, or pinned host memory through its device
// pointer; the store itself is checked when it runs, where missing access is a device fault.
CUresult write_value(CUstream hstream, CUdeviceptr addr, std::uint64_t value, unsigned size,
                     unsigned flags, bool per_thread, Call& c) {
  c.ptr("stream", handle_value(hstream)).ptr("addr", addr).arg("value", value);
  c.arg("flags", flags);
  if (per_thread) c.arg("ptds", true);
  EMU_REQUIRE_INIT();
  if (addr % size != 0 || (flags & ~unsigned{CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  {
    std::shared_lock space(driver().space_mu);
    auto& as = driver().space;
    if (as.check_device_shape(addr, size) != CUDA_SUCCESS && !as.host_range_pinned(addr, size)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::lock_guard lock(driver().mu);
  auto stream = resolve_stream_locked(hstream, per_thread);
  if (!stream) return stream.error();
  auto ctx = driver().contexts.find((*stream)->ctx());
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  NodeSpec spec{CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, MemOpNode{addr, value, size, flags}};
  StreamOp op = op_for_node(spec);
  return submit_locked(*ctx, *stream, std::move(op), std::move(spec));
}

}  // namespace

#define EMU_WRITE_VALUE(sym, base, ValT, size, ptds)                                              \
  EMU_EXPORT CUresult sym(CUstream s, CUdeviceptr addr, ValT value, unsigned int flags) {         \
    return api(base, [&](Call& c) { return write_value(s, addr, value, size, flags, ptds, c); }); \
  }

EMU_WRITE_VALUE(cuStreamWriteValue32_v2, "cuStreamWriteValue32", cuuint32_t, 4, false)
EMU_WRITE_VALUE(cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", cuuint32_t, 4, true)
EMU_WRITE_VALUE(cuStreamWriteValue64_v2, "cuStreamWriteValue64", cuuint64_t, 8, false)
EMU_WRITE_VALUE(cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", cuuint64_t, 8, true)
