// Copies and memsets. Every one is an operation on a stream (the legacy or per-thread
// default stream for the synchronous forms), so ordering, overlap and the timing model
// apply uniformly. Ranges are checked twice: their shape when the call is made
// (CUDA_ERROR_INVALID_VALUE), access when the operation runs (a GPU fault:
// CUDA_ERROR_ILLEGAL_ADDRESS, sticky for the context).
#include <cstring>

#include "api_common.hpp"

using namespace emu;

namespace {

enum class Side { kHost, kDevice };

struct Transfer {
  std::uint64_t dst;
  std::uint64_t src;
  std::uint64_t bytes;
  Side dst_side;
  Side src_side;
};

enum class HostWait {
  kNever,         // async w.r.t. the host (pinned memory, device-to-device, memset)
  kUntilDone,     // the call returns when the operation has completed
};

CUresult submit(StreamOp op, CUstream hstream, bool per_thread, HostWait wait) {
  std::unique_lock lock(driver().mu);
  auto stream = resolve_stream_locked(hstream, per_thread);
  if (!stream) return stream.error();
  auto ctx = driver().contexts.find((*stream)->ctx());
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  std::uint64_t seq = enqueue_locked(*ctx, *stream, std::move(op));
  StickyError sticky = (*stream)->sticky();
  lock.unlock();
  if (wait == HostWait::kUntilDone) {
    wait_point({*stream, seq});
    return static_cast<CUresult>(sticky->load());
  }
  return CUDA_SUCCESS;
}

CUresult copy(const char* name, Transfer t, CUstream hstream, bool per_thread, bool async,
              Call& c) {
  (void)name;
  c.ptr("dst", t.dst).ptr("src", t.src).arg("bytes", t.bytes).arg("async", async);
  if (per_thread) c.arg("ptds", true);
  EMU_REQUIRE_INIT();
  if ((t.dst_side == Side::kHost && t.dst == 0) || (t.src_side == Side::kHost && t.src == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
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
  auto& cfg = driver().cfg();
  StreamOp op;
  if (t.dst_side == Side::kDevice && t.src_side == Side::kDevice) {
    op.model = transfer_time(t.bytes, cfg.d2d_bytes_per_s);
  } else if (t.dst_side == Side::kDevice) {
    op.model = transfer_time(t.bytes, cfg.pcie_bytes_per_s);
    op.engine = &driver().device(device).h2d;
  } else if (t.src_side == Side::kDevice) {
    op.model = transfer_time(t.bytes, cfg.pcie_bytes_per_s);
    op.engine = &driver().device(device).d2h;
  }
  op.work = [t] {
    std::shared_lock space(driver().space_mu);
    auto& as = driver().space;
    if (t.dst_side == Side::kDevice) {
      if (CUresult r = as.check_device(t.dst, t.bytes, true); r != CUDA_SUCCESS) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    }
    if (t.src_side == Side::kDevice) {
      if (CUresult r = as.check_device(t.src, t.bytes, false); r != CUDA_SUCCESS) {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    }
    std::memmove(reinterpret_cast<void*>(t.dst), reinterpret_cast<const void*>(t.src), t.bytes);
    return CUDA_SUCCESS;
  };
  HostWait wait = HostWait::kUntilDone;
  bool involves_host = t.dst_side == Side::kHost || t.src_side == Side::kHost;
  if (!involves_host) {
    wait = HostWait::kNever;  // device to device never blocks the host
  } else if (async && host_pinned) {
    wait = HostWait::kNever;
  }
  // Async from/to pageable memory: the driver stages through pinned buffers and the
  // call returns once the user's buffer is no longer needed; we return when done.
  return submit(std::move(op), hstream, per_thread, wait);
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
  StreamOp op;
  op.model = transfer_time(bytes, driver().cfg().d2d_bytes_per_s);
  op.work = [dst, value, elem, count, bytes] {
    std::shared_lock space(driver().space_mu);
    if (driver().space.check_device(dst, bytes, true) != CUDA_SUCCESS) {
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    auto* p = reinterpret_cast<unsigned char*>(dst);
    if (elem == 1) {
      std::memset(p, static_cast<int>(value), count);
    } else if (elem == 2) {
      auto v = static_cast<std::uint16_t>(value);
      for (std::uint64_t i = 0; i < count; ++i) std::memcpy(p + i * 2, &v, 2);
    } else {
      for (std::uint64_t i = 0; i < count; ++i) std::memcpy(p + i * 4, &value, 4);
    }
    return CUDA_SUCCESS;
  };
  // Memsets of device memory are asynchronous with respect to the host, even the
  // "synchronous" forms (CUDA API synchronisation behaviour).
  return submit(std::move(op), hstream, per_thread, HostWait::kNever);
}

}  // namespace

// Synchronous copies: on the legacy default stream (_ptds: the per-thread stream).
#define EMU_SYNC_COPY(sym, base, dst_side, src_side, ptds, DstT, SrcT)                       \
  EMU_EXPORT CUresult sym(DstT dst, SrcT src, size_t n) {                                    \
    return api(base, [&](Call& c) {                                                         \
      return copy(base,                                                                      \
                  Transfer{(std::uint64_t)(dst), (std::uint64_t)(src), n, dst_side, src_side}, \
                  nullptr, ptds, false, c);                                                  \
    });                                                                                      \
  }
#define EMU_ASYNC_COPY(sym, base, dst_side, src_side, ptds, DstT, SrcT)                      \
  EMU_EXPORT CUresult sym(DstT dst, SrcT src, size_t n, CUstream s) {                        \
    return api(base, [&](Call& c) {                                                         \
      return copy(base,                                                                      \
                  Transfer{(std::uint64_t)(dst), (std::uint64_t)(src), n, dst_side, src_side}, \
                  s, ptds, true, c);                                                         \
    });                                                                                      \
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
EMU_ASYNC_COPY(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", D, H, true, CUdeviceptr,
               const void*)
EMU_ASYNC_COPY(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", H, D, false, void*, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", H, D, true, void*, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", D, D, false, CUdeviceptr, CUdeviceptr)
EMU_ASYNC_COPY(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", D, D, true, CUdeviceptr,
               CUdeviceptr)

// Generic copies: unified addressing tells which side each pointer is on.
static CUresult generic_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool ptds,
                             bool async, Call& c) {
  if (!driver().initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return copy(c.name(), Transfer{dst, src, n, side_of(dst), side_of(src)}, s, ptds, async, c);
}

EMU_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpy", [&](Call& c) { return generic_copy(dst, src, n, nullptr, false, false, c); });
}
EMU_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpy", [&](Call& c) { return generic_copy(dst, src, n, nullptr, true, false, c); });
}
EMU_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return api("cuMemcpyAsync", [&](Call& c) { return generic_copy(dst, src, n, s, false, true, c); });
}
EMU_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return api("cuMemcpyAsync", [&](Call& c) { return generic_copy(dst, src, n, s, true, true, c); });
}

#define EMU_MEMSET(sym, base, elem, ValT, ptds)                                             \
  EMU_EXPORT CUresult sym(CUdeviceptr dst, ValT v, size_t n) {                            \
    return api(base, [&](Call& c) { return memset_n(dst, v, elem, n, nullptr, ptds, c); }); \
  }
#define EMU_MEMSET_ASYNC(sym, base, elem, ValT, ptds)                                     \
  EMU_EXPORT CUresult sym(CUdeviceptr dst, ValT v, size_t n, CUstream s) {              \
    return api(base, [&](Call& c) { return memset_n(dst, v, elem, n, s, ptds, c); });    \
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
