// Copies and memsets. Every one is an operation on a stream (the legacy or per-thread
// default stream for the synchronous forms), so ordering, overlap and the timing model
// apply uniformly. Ranges are checked twice: their shape when the call is made
// (CUDA_ERROR_INVALID_VALUE), access when the operation runs (a GPU fault:
// CUDA_ERROR_ILLEGAL_ADDRESS, sticky for the context).
#include <cstring>
#include <type_traits>

#include "api_common.hpp"
#include "graph.hpp"
#include "host_mapping.hpp"

using namespace emu;

namespace {

enum class Side { kHost, kDevice };

struct Transfer {
  std::uint64_t dst;
  std::uint64_t src;
  std::uint64_t bytes;
  Side dst_side;
  Side src_side;
  bool unified = false;  // cuMemcpy / cuMemcpyAsync: unified addressing decided the sides
};

enum class HostWait {
  kNever,      // async w.r.t. the host (pinned memory, device-to-device, memset)
  kUntilDone,  // the call returns when the operation has completed
};

// Sends a node's operation to a stream (or into the capture the stream is in) and,
// for the synchronous forms, waits for it.
CUresult submit(NodeSpec spec, CUstream hstream, bool per_thread, HostWait wait, bool sync_api) {
  std::unique_lock lock(driver().mu);
  auto stream = resolve_stream_locked(hstream, per_thread);
  if (!stream) return stream.error();
  auto ctx = driver().contexts.find((*stream)->ctx());
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (sync_api) {
    // A synchronous call cannot be captured, and is "potentially unsafe" during capture.
    if (auto cap = (*stream)->capture) {
      cap->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (CUresult r = check_unsafe_during_capture_locked(); r != CUDA_SUCCESS) return r;
  }
  // The node's context, as a captured node reports and cuGraphExec*NodeSetParams checks.
  if (auto* m = std::get_if<MemsetNode>(&spec.data)) m->ctx = ctx->handle;
  if (auto* m = std::get_if<MemcpyNode>(&spec.data)) m->ctx = ctx->handle;
  std::uint64_t seq = 0;
  StreamOp op = op_for_node(spec);
  if (CUresult r = submit_locked(*ctx, *stream, std::move(op), std::move(spec), &seq);
      r != CUDA_SUCCESS) {
    return r;
  }
  StickyError sticky = (*stream)->sticky();
  lock.unlock();
  if (wait == HostWait::kUntilDone && seq != 0) {
    wait_point({*stream, seq});
    return static_cast<CUresult>(sticky->load());
  }
  return CUDA_SUCCESS;
}

// Tracing only: which mapping the host side of a copy lies in ("src_map"/"dst_map": file, private
// or shared, file offset), so a trace shows where an engine's weights are copied from.
void trace_host_mapping(const Transfer& t, Call& c) {
  if (t.src_side == Side::kHost) {
    if (auto m = find_host_mapping(t.src)) {
      c.arg("src_map", m->path.empty() ? "[anonymous]" : m->path.c_str());
      c.arg("src_map_shared", m->shared).arg("src_map_offset", m->offset);
    }
  }
  if (t.dst_side == Side::kHost) {
    if (auto m = find_host_mapping(t.dst)) {
      c.arg("dst_map", m->path.empty() ? "[anonymous]" : m->path.c_str());
      c.arg("dst_map_shared", m->shared).arg("dst_map_offset", m->offset);
    }
  }
}

// The CUDA_MEMCPY3D a copy call stands for, as cuGraphMemcpyNodeGetParams reports a captured one.
CUDA_MEMCPY3D descriptor_of(const Transfer& t) {
  CUDA_MEMCPY3D d{};
  auto side = [&](Side s, std::uint64_t p, CUmemorytype& type, CUdeviceptr& dev, auto& host) {
    if (t.unified) {
      type = CU_MEMORYTYPE_UNIFIED;
      dev = p;
    } else if (s == Side::kHost) {
      type = CU_MEMORYTYPE_HOST;
      host = reinterpret_cast<std::remove_reference_t<decltype(host)>>(p);
    } else {
      type = CU_MEMORYTYPE_DEVICE;
      dev = p;
    }
  };
  side(t.dst_side, t.dst, d.dstMemoryType, d.dstDevice, d.dstHost);
  side(t.src_side, t.src, d.srcMemoryType, d.srcDevice, d.srcHost);
  d.WidthInBytes = t.bytes;
  d.Height = 1;
  d.Depth = 1;
  return d;
}

CUresult copy(const char* name, Transfer t, CUstream hstream, bool per_thread, bool async,
              Call& c) {
  (void)name;
  c.ptr("dst", t.dst).ptr("src", t.src).arg("bytes", t.bytes).arg("async", async);
  if (per_thread) c.arg("ptds", true);
  if (trace().on()) trace_host_mapping(t, c);
  EMU_REQUIRE_INIT();
  if ((t.dst_side == Side::kHost && t.dst == 0) || (t.src_side == Side::kHost && t.src == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const CUDA_MEMCPY3D desc = descriptor_of(t);  // the sides as the call names them
  int device = 0;
  bool host_pinned = true;
  {
    std::shared_lock space(driver().space_mu);
    auto& as = driver().space;
    // Mapped pinned host memory is addressable by the device (zero-copy): its device
    // pointer is valid wherever device memory is.
    auto device_side = [&](Transfer& tr, std::uint64_t p, Side& side) {
      CUresult r = as.check_device_shape(p, tr.bytes, &device);
      if (r != CUDA_SUCCESS && as.host_range_pinned(p, tr.bytes)) {
        side = Side::kHost;
        return CUDA_SUCCESS;
      }
      return r;
    };
    if (t.dst_side == Side::kDevice) {
      if (CUresult r = device_side(t, t.dst, t.dst_side); r != CUDA_SUCCESS) return r;
    } else {
      host_pinned = as.host_range_pinned(t.dst, t.bytes);
    }
    if (t.src_side == Side::kDevice) {
      if (CUresult r = device_side(t, t.src, t.src_side); r != CUDA_SUCCESS) return r;
    } else {
      host_pinned = host_pinned && as.host_range_pinned(t.src, t.bytes);
    }
  }
  MemcpyNode node{t.dst,  t.src, t.bytes, t.dst_side == Side::kDevice, t.src_side == Side::kDevice,
                  device, 0,     desc};
  HostWait wait = HostWait::kUntilDone;
  bool involves_host = t.dst_side == Side::kHost || t.src_side == Side::kHost;
  if (!involves_host) {
    wait = HostWait::kNever;  // device to device never blocks the host
  } else if (async && host_pinned) {
    wait = HostWait::kNever;
  }
  // Async from/to pageable memory: the driver stages through pinned buffers and the
  // call returns once the user's buffer is no longer needed; we return when done.
  return submit({CU_GRAPH_NODE_TYPE_MEMCPY, node}, hstream, per_thread, wait, !async);
}

Side side_of(std::uint64_t p) {
  std::shared_lock space(driver().space_mu);
  return driver().space.classify(p) == MemoryClass::kDevice ? Side::kDevice : Side::kHost;
}

CUresult memset_n(std::uint64_t dst, std::uint32_t value, unsigned elem, std::uint64_t count,
                  CUstream hstream, bool per_thread, Call& c) {
  c.ptr("dst", dst).arg("value", value).arg("elem", elem).arg("count", count);
  if (per_thread) c.arg("ptds", true);
  EMU_REQUIRE_INIT();
  if (dst % elem != 0) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t bytes = count * elem;
  {
    std::shared_lock space(driver().space_mu);
    if (CUresult r = driver().space.check_device_shape(dst, bytes); r != CUDA_SUCCESS) return r;
  }
  MemsetNode node{dst, 0, value, elem, count, 1, 0};
  // Memsets of device memory are asynchronous with respect to the host, even the
  // "synchronous" forms (CUDA API synchronisation behaviour).
  return submit({CU_GRAPH_NODE_TYPE_MEMSET, node}, hstream, per_thread, HostWait::kNever, false);
}

}  // namespace

// Synchronous copies: on the legacy default stream (_ptds: the per-thread stream).
#define EMU_SYNC_COPY(sym, base, dst_side, src_side, ptds, DstT, SrcT)                         \
  EMU_EXPORT CUresult sym(DstT dst, SrcT src, size_t n) {                                      \
    return api(base, [&](Call& c) {                                                            \
      return copy(base,                                                                        \
                  Transfer{(std::uint64_t)(dst), (std::uint64_t)(src), n, dst_side, src_side}, \
                  nullptr, ptds, false, c);                                                    \
    });                                                                                        \
  }
#define EMU_ASYNC_COPY(sym, base, dst_side, src_side, ptds, DstT, SrcT)                           \
  EMU_EXPORT CUresult sym(DstT dst, SrcT src, size_t n, CUstream s) {                             \
    return api(base, [&](Call& c) {                                                               \
      return copy(base,                                                                           \
                  Transfer{(std::uint64_t)(dst), (std::uint64_t)(src), n, dst_side, src_side}, s, \
                  ptds, true, c);                                                                 \
    });                                                                                           \
  }

constexpr Side H = Side::kHost;
constexpr Side D = Side::kDevice;

EMU_SYNC_COPY(cuMemcpyHtoD_v2, "cuMemcpyHtoD", D, H, false, CUdeviceptr, const void*)
EMU_SYNC_COPY(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", D, H, true, CUdeviceptr, const void*)
EMU_SYNC_COPY(cuMemcpyDtoH_v2, "cuMemcpyDtoH", H, D, false, void*, CUdeviceptr)
EMU_SYNC_COPY(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", H, D, true, void*, CUdeviceptr)
EMU_SYNC_COPY(cuMemcpyDtoD_v2, "cuMemcpyDtoD", D, D, false, CUdeviceptr, CUdeviceptr)
EMU_SYNC_COPY(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", D, D, true, CUdeviceptr, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", D, H, false, CUdeviceptr, const void*)
EMU_ASYNC_COPY(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", D, H, true, CUdeviceptr, const void*)
EMU_ASYNC_COPY(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", H, D, false, void*, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", H, D, true, void*, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", D, D, false, CUdeviceptr, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", D, D, true, CUdeviceptr, CUdeviceptr)

// Generic copies: unified addressing tells which side each pointer is on.
static CUresult generic_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool ptds,
                             bool async, Call& c) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return copy(c.name(), Transfer{dst, src, n, side_of(dst), side_of(src), true}, s, ptds, async, c);
}

EMU_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpy",
             [&](Call& c) { return generic_copy(dst, src, n, nullptr, false, false, c); });
}
EMU_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpy",
             [&](Call& c) { return generic_copy(dst, src, n, nullptr, true, false, c); });
}
EMU_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return api("cuMemcpyAsync",
             [&](Call& c) { return generic_copy(dst, src, n, s, false, true, c); });
}
EMU_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return api("cuMemcpyAsync", [&](Call& c) { return generic_copy(dst, src, n, s, true, true, c); });
}

#define EMU_MEMSET(sym, base, elem, ValT, ptds)                                             \
  EMU_EXPORT CUresult sym(CUdeviceptr dst, ValT v, size_t n) {                              \
    return api(base, [&](Call& c) { return memset_n(dst, v, elem, n, nullptr, ptds, c); }); \
  }
#define EMU_MEMSET_ASYNC(sym, base, elem, ValT, ptds)                                 \
  EMU_EXPORT CUresult sym(CUdeviceptr dst, ValT v, size_t n, CUstream s) {            \
    return api(base, [&](Call& c) { return memset_n(dst, v, elem, n, s, ptds, c); }); \
  }

EMU_MEMSET(cuMemsetD8_v2, "cuMemsetD8", 1, unsigned char, false)
EMU_MEMSET(cuMemsetD8_v2_ptds, "cuMemsetD8", 1, unsigned char, true)
EMU_MEMSET(cuMemsetD16_v2, "cuMemsetD16", 2, unsigned short, false)
EMU_MEMSET(cuMemsetD16_v2_ptds, "cuMemsetD16", 2, unsigned short, true)
EMU_MEMSET(cuMemsetD32_v2, "cuMemsetD32", 4, unsigned int, false)
EMU_MEMSET(cuMemsetD32_v2_ptds, "cuMemsetD32", 4, unsigned int, true)
EMU_MEMSET_ASYNC(cuMemsetD8Async, "cuMemsetD8Async", 1, unsigned char, false)
EMU_MEMSET_ASYNC(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 1, unsigned char, true)
EMU_MEMSET_ASYNC(cuMemsetD16Async, "cuMemsetD16Async", 2, unsigned short, false)
EMU_MEMSET_ASYNC(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 2, unsigned short, true)
EMU_MEMSET_ASYNC(cuMemsetD32Async, "cuMemsetD32Async", 4, unsigned int, false)
EMU_MEMSET_ASYNC(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 4, unsigned int, true)
