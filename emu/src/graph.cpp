#include "graph.hpp"

#include <atomic>
#include <cstring>
#include <shared_mutex>

#include "api_common.hpp"
#include "kernel_exec.hpp"

namespace emu {

GraphTables& graph_tables() {
  static auto* t = new GraphTables();
  return *t;
}

CUstreamCaptureMode& thread_capture_mode() {
  static thread_local CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  return mode;
}

std::shared_ptr<CaptureSession> capture_of_locked(const StreamCore& s) {
  return s.capture;
}

std::uint64_t add_node_locked(Graph& g, NodeSpec spec, const std::vector<std::uint64_t>& deps) {
  auto n = std::make_shared<GraphNode>();
  n->graph = g.handle;
  n->type = spec.type;
  n->data = std::move(spec.data);
  n->deps = deps;
  n->handle = graph_tables().nodes.add(n);
  g.nodes.push_back(n->handle);
  return n->handle;
}

CUresult check_unsafe_during_capture_locked() {
  CUstreamCaptureMode mine = thread_capture_mode();
  if (mine == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  for (auto& cap : graph_tables().captures) {
    if (cap->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    bool own = cap->thread == std::this_thread::get_id();
    bool global =
        cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && mine == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (own || global) {
      cap->invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

CUresult submit_locked(Context& ctx, const std::shared_ptr<StreamCore>& s, StreamOp op,
                       NodeSpec spec, std::uint64_t* seq) {
  if (auto cap = s->capture) {
    if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    auto g = graph_tables().graphs.find(cap->graph);
    if (!g) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    auto t0 = Clock::now();
    std::uint64_t node = add_node_locked(*g, std::move(spec), s->capture_deps);
    s->capture_deps = {node};
    if (driver().timing()) wait_until(t0 + driver().cfg().capture_node_cost);
    return CUDA_SUCCESS;
  }
  if (s->kind() == StreamCore::Kind::kLegacy) {
    // The legacy stream would wait on a capturing blocking stream: not capturable.
    for (auto& other : context_streams_locked(ctx)) {
      if (other != s && other->blocking() && other->capture) {
        other->capture->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      }
    }
  }
  std::uint64_t n = enqueue_locked(ctx, s, std::move(op));
  if (seq != nullptr) *seq = n;
  return CUDA_SUCCESS;
}

namespace {

CUresult run_kernel(const KernelNode& k) {
  std::vector<void*> pointers;
  for (unsigned off : k.offsets) {
    pointers.push_back(const_cast<std::uint8_t*>(k.params.data()) + off);
  }
  ThawEmuLaunch launch{{k.grid[0], k.grid[1], k.grid[2]},
                       {k.block[0], k.block[1], k.block[2]},
                       k.shared,
                       static_cast<unsigned>(pointers.size()),
                       pointers.data()};
  return run_twin(k.twin, launch);
}

CUresult run_memset(const MemsetNode& m) {
  auto& as = driver().space;
  std::uint64_t row = m.width * m.element_size;
  for (std::size_t y = 0; y < m.height; ++y) {
    std::uint64_t dst = m.dst + y * (m.height > 1 ? m.pitch : 0);
    if (as.check_device(dst, row, true) != CUDA_SUCCESS) return CUDA_ERROR_ILLEGAL_ADDRESS;
    auto* p = reinterpret_cast<unsigned char*>(dst);
    if (m.element_size == 1) {
      std::memset(p, static_cast<int>(m.value), m.width);
    } else if (m.element_size == 2) {
      auto v = static_cast<std::uint16_t>(m.value);
      for (std::size_t i = 0; i < m.width; ++i) std::memcpy(p + i * 2, &v, 2);
    } else {
      for (std::size_t i = 0; i < m.width; ++i) std::memcpy(p + i * 4, &m.value, 4);
    }
  }
  return CUDA_SUCCESS;
}

CUresult run_memcpy(const MemcpyNode& m) {
  auto& as = driver().space;
  if (m.dst_device && as.check_device(m.dst, m.bytes, true) != CUDA_SUCCESS) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  if (m.src_device && as.check_device(m.src, m.bytes, false) != CUDA_SUCCESS) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  std::memmove(reinterpret_cast<void*>(m.dst), reinterpret_cast<const void*>(m.src), m.bytes);
  return CUDA_SUCCESS;
}

// The store is atomic and, unless the caller waived it (NO_MEMORY_BARRIER), ordered after every
// earlier write of the stream: another agent polling the word sees the value only with the data
// it guards.
CUresult run_mem_op(const MemOpNode& m) {
  auto& as = driver().space;
  bool reachable = as.check_device(m.address, m.size, true) == CUDA_SUCCESS ||
                   as.host_range_pinned(m.address, m.size);
  if (!reachable) return CUDA_ERROR_ILLEGAL_ADDRESS;
  const auto order = (m.flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) != 0
                         ? std::memory_order_relaxed
                         : std::memory_order_release;
  if (m.size == 4) {
    std::atomic_ref(*reinterpret_cast<std::uint32_t*>(m.address))
        .store(static_cast<std::uint32_t>(m.value), order);
  } else {
    std::atomic_ref(*reinterpret_cast<std::uint64_t*>(m.address)).store(m.value, order);
  }
  return CUDA_SUCCESS;
}

}  // namespace

StreamOp op_for_node(const NodeSpec& spec) {
  auto& cfg = driver().cfg();
  StreamOp op;
  switch (spec.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const auto& k = std::get<KernelNode>(spec.data);
      if (k.twin != nullptr && k.twin->model_ns != nullptr) {
        ThawEmuLaunch l{{k.grid[0], k.grid[1], k.grid[2]},
                        {k.block[0], k.block[1], k.block[2]},
                        k.shared,
                        0,
                        nullptr};
        op.model = nanoseconds(static_cast<std::int64_t>(k.twin->model_ns(&l)));
      }
      op.work = [k] {
        std::shared_lock space(driver().space_mu);  // nothing unmapped under a kernel
        return run_kernel(k);
      };
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const auto& m = std::get<MemsetNode>(spec.data);
      op.model = transfer_time(m.width * m.element_size * m.height, cfg.d2d_bytes_per_s);
      op.work = [m] {
        std::shared_lock space(driver().space_mu);
        return run_memset(m);
      };
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      const auto& m = std::get<MemcpyNode>(spec.data);
      if (m.dst_device && m.src_device) {
        op.model = transfer_time(m.bytes, cfg.d2d_bytes_per_s);
      } else if (m.dst_device || m.src_device) {
        op.model = transfer_time(m.bytes, cfg.pcie_bytes_per_s);
        op.engine = m.dst_device ? &driver().device(m.device).h2d : &driver().device(m.device).d2h;
      }
      op.work = [m] {
        std::shared_lock space(driver().space_mu);
        return run_memcpy(m);
      };
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      const auto& h = std::get<HostNode>(spec.data);
      op.runs_user_code = true;
      op.work = [h] {
        h.fn(h.user);
        return CUDA_SUCCESS;
      };
      break;
    }
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: {
      const auto& m = std::get<MemOpNode>(spec.data);
      op.work = [m] {
        std::shared_lock space(driver().space_mu);
        return run_mem_op(m);
      };
      break;
    }
    default:
      break;  // empty and event nodes do their work through stream ordering
  }
  return op;
}

}  // namespace emu
