// Stream capture: cuStreamBeginCapture .. cuStreamEndCapture record the operations of
// a stream (and of streams that join it through events) as a graph instead of
// running them.
#include <algorithm>
#include <atomic>
#include <functional>
#include <set>

#include "api_common.hpp"
#include "graph.hpp"

using namespace emu;

namespace emu {
CUstreamCaptureMode& thread_capture_mode();
}

namespace {

std::atomic<std::uint64_t> g_next_capture_id{1};

bool valid_mode(int mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

CUresult begin_capture(CUstream h, int mode, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h)).arg("mode", mode);
  EMU_REQUIRE_INIT();
  if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  // The legacy stream cannot be captured (it synchronises with everything).
  if ((*s)->kind() == StreamCore::Kind::kLegacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if ((*s)->capture) return CUDA_ERROR_ILLEGAL_STATE;
  auto& t = graph_tables();
  auto g = std::make_shared<Graph>();
  g->capturing = true;
  g->handle = t.graphs.add(g);
  auto cap = std::make_shared<CaptureSession>();
  cap->id = g_next_capture_id.fetch_add(1);
  cap->graph = g->handle;
  cap->origin = (*s)->id();
  cap->mode = static_cast<CUstreamCaptureMode>(mode);
  cap->thread = std::this_thread::get_id();
  cap->streams.push_back(*s);
  (*s)->capture = cap;
  (*s)->capture_deps.clear();
  t.captures.push_back(cap);
  c.out("capture_id", cap->id);
  return CUDA_SUCCESS;
}

void end_session_locked(const std::shared_ptr<CaptureSession>& cap) {
  for (auto& s : cap->streams) {
    s->capture.reset();
    s->capture_deps.clear();
  }
  std::erase(graph_tables().captures, cap);
}

// Every joined stream must have rejoined the origin: its last nodes are ancestors of
// (or among) the origin's current dependencies.
bool all_joined_locked(const CaptureSession& cap) {
  auto& nodes = graph_tables().nodes;
  std::set<std::uint64_t> reach;
  std::vector<std::uint64_t> stack = cap.streams.front()->capture_deps;
  while (!stack.empty()) {
    std::uint64_t n = stack.back();
    stack.pop_back();
    if (!reach.insert(n).second) continue;
    if (auto node = nodes.find(n)) stack.insert(stack.end(), node->deps.begin(), node->deps.end());
  }
  for (std::size_t i = 1; i < cap.streams.size(); ++i) {
    for (auto d : cap.streams[i]->capture_deps) {
      if (!reach.contains(d)) return false;
    }
  }
  return true;
}

void destroy_graph_locked(std::uint64_t handle) {
  auto& t = graph_tables();
  auto g = t.graphs.remove(handle);
  if (!g) return;
  for (auto n : g->nodes) t.nodes.remove(n);
}

CUresult end_capture(CUstream h, CUgraph* graph, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  auto cap = (*s)->capture;
  if (!cap) return CUDA_ERROR_ILLEGAL_STATE;
  if (cap->origin != (*s)->id()) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  // Only a relaxed capture may be ended from another thread.
  if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  bool joined = all_joined_locked(*cap);
  bool invalid = cap->invalidated;
  end_session_locked(cap);
  if (invalid || !joined) {
    destroy_graph_locked(cap->graph);
    *graph = nullptr;
    return invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  }
  auto g = graph_tables().graphs.find(cap->graph);
  g->capturing = false;
  *graph = to_handle<CUgraph>(g->handle);
  c.out_ptr("graph", g->handle).out("nodes", g->nodes.size());
  return CUDA_SUCCESS;
}

CUresult capture_status(CUstream h, bool ptds, CUstreamCaptureStatus* status,
                        std::shared_ptr<StreamCore>* stream_out) {
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  if ((*s)->kind() == StreamCore::Kind::kLegacy) {
    // Asking about the legacy stream while a blocking stream captures is itself the
    // implicit dependency capture forbids.
    auto ctx = driver().contexts.find((*s)->ctx());
    for (auto& other : context_streams_locked(*ctx)) {
      if (other != *s && other->blocking() && other->capture) {
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      }
    }
  }
  auto cap = (*s)->capture;
  *status = !cap               ? CU_STREAM_CAPTURE_STATUS_NONE
            : cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  *stream_out = *s;
  return CUDA_SUCCESS;
}

CUresult is_capturing(CUstream h, CUstreamCaptureStatus* status, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  std::shared_ptr<StreamCore> s;
  return capture_status(h, ptds, status, &s);
}

CUresult capture_info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* num_deps,
                      bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  std::shared_ptr<StreamCore> s;
  if (CUresult r = capture_status(h, ptds, status, &s); r != CUDA_SUCCESS) return r;
  if (*status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_SUCCESS;
  if (id != nullptr) *id = s->capture->id;
  if (graph != nullptr) *graph = to_handle<CUgraph>(s->capture->graph);
  // The dependency array stays valid until the next call on this stream (documented);
  // keep one per thread.
  static thread_local std::vector<CUgraphNode> dep_handles;
  static thread_local std::vector<CUgraphEdgeData> edge_data;  // parallel to dep_handles
  dep_handles.clear();
  for (auto d : s->capture_deps) dep_handles.push_back(to_handle<CUgraphNode>(d));
  edge_data.assign(dep_handles.size(), CUgraphEdgeData{});  // all edges are default edges
  if (deps != nullptr) *deps = dep_handles.empty() ? nullptr : dep_handles.data();
  if (edges != nullptr) *edges = edge_data.empty() ? nullptr : edge_data.data();
  if (num_deps != nullptr) *num_deps = dep_handles.size();
  return CUDA_SUCCESS;
}

}  // namespace

#undef cuStreamBeginCapture
#undef cuStreamGetCaptureInfo

EMU_EXPORT CUresult cuStreamBeginCapture(CUstream h) {
  return api("cuStreamBeginCapture",
             [&](Call& c) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, false, c); });
}
EMU_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream h) {
  return api("cuStreamBeginCapture",
             [&](Call& c) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, true, c); });
}
EMU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
  return api("cuStreamBeginCapture",
             [&](Call& c) { return begin_capture(h, raw(mode), false, c); });
}
EMU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode) {
  return api("cuStreamBeginCapture", [&](Call& c) { return begin_capture(h, raw(mode), true, c); });
}

EMU_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph* g) {
  return api("cuStreamEndCapture", [&](Call& c) { return end_capture(h, g, false, c); });
}
EMU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph* g) {
  return api("cuStreamEndCapture", [&](Call& c) { return end_capture(h, g, true, c); });
}

EMU_EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* st) {
  return api("cuStreamIsCapturing", [&](Call& c) { return is_capturing(h, st, false, c); });
}
EMU_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* st) {
  return api("cuStreamIsCapturing", [&](Call& c) { return is_capturing(h, st, true, c); });
}

EMU_EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id) {
  return api("cuStreamGetCaptureInfo", [&](Call& c) {
    return capture_info(h, st, id, nullptr, nullptr, nullptr, nullptr, false, c);
  });
}
EMU_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus* st,
                                                cuuint64_t* id) {
  return api("cuStreamGetCaptureInfo", [&](Call& c) {
    return capture_info(h, st, id, nullptr, nullptr, nullptr, nullptr, true, c);
  });
}
EMU_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id,
                                              CUgraph* g, const CUgraphNode** deps, size_t* n) {
  return api("cuStreamGetCaptureInfo",
             [&](Call& c) { return capture_info(h, st, id, g, deps, nullptr, n, false, c); });
}
EMU_EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus* st,
                                                   cuuint64_t* id, CUgraph* g,
                                                   const CUgraphNode** deps, size_t* n) {
  return api("cuStreamGetCaptureInfo",
             [&](Call& c) { return capture_info(h, st, id, g, deps, nullptr, n, true, c); });
}
EMU_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* st, cuuint64_t* id,
                                              CUgraph* g, const CUgraphNode** deps,
                                              const CUgraphEdgeData** edges, size_t* n) {
  return api("cuStreamGetCaptureInfo",
             [&](Call& c) { return capture_info(h, st, id, g, deps, edges, n, false, c); });
}
EMU_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus* st,
                                                   cuuint64_t* id, CUgraph* g,
                                                   const CUgraphNode** deps,
                                                   const CUgraphEdgeData** edges, size_t* n) {
  return api("cuStreamGetCaptureInfo",
             [&](Call& c) { return capture_info(h, st, id, g, deps, edges, n, true, c); });
}

EMU_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return api("cuThreadExchangeStreamCaptureMode", [&](Call&) {
    EMU_REQUIRE_INIT();
    if (mode == nullptr || !valid_mode(raw(*mode))) return CUDA_ERROR_INVALID_VALUE;
    std::swap(*mode, thread_capture_mode());
    return CUDA_SUCCESS;
  });
}
