// Streams, events, host functions and stream callbacks.
#include <algorithm>

#include "api_common.hpp"
#include "graph.hpp"

// The original (v1) entry points are exported under their plain names, which cuda.h
// maps to the newest variant: undo that here.
#undef cuEventElapsedTime

using namespace emu;

namespace {

using DriverLock = std::unique_lock<std::mutex>;

CUresult create_stream(CUstream* ph, unsigned flags, int priority, Call& c) {
  c.arg("flags", flags).arg("priority", priority);
  EMU_REQUIRE_INIT();
  if (ph == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(driver().mu);
  auto ctx = current_context_locked();
  if (!ctx) return ctx.error();
  // Out-of-range priorities are clamped, as the driver documents.
  priority = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
  auto s = std::make_shared<StreamCore>((*ctx)->handle, (*ctx)->device, StreamCore::Kind::kUser,
                                        flags, priority, (*ctx)->sticky, driver().timing());
  std::uint64_t h = driver().streams.add(s);
  (*ctx)->streams.push_back(h);
  *ph = to_handle<CUstream>(h);
  c.out_ptr("stream", h);
  return CUDA_SUCCESS;
}

CUresult stream_synchronize(CUstream h, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  DriverLock lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  if (auto cap = (*s)->capture) {  // not allowed while capturing
    cap->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (CUresult r = check_unsafe_during_capture_locked(); r != CUDA_SUCCESS) return r;
  StreamPoint tail = (*s)->tail();
  lock.unlock();
  wait_point(tail);
  return static_cast<CUresult>((*s)->sticky()->load());
}

CUresult stream_query(CUstream h, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  DriverLock lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  if (auto cap = (*s)->capture) {
    cap->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (int e = (*s)->sticky()->load(); e != CUDA_SUCCESS) return static_cast<CUresult>(e);
  return (*s)->idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

template <class F>
CUresult with_stream(CUstream h, bool ptds, Call& c, F&& f) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  return f(**s);
}

CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h)).ptr("event", handle_value(ev)).arg("flags", flags);
  EMU_REQUIRE_INIT();
  if (flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  auto e = driver().events.find(handle_value(ev));
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  if (e->capture) {
    // Fork/join inside a capture: the stream (joins and) depends on the event's position.
    auto& cap = e->capture;
    if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!(*s)->capture) {
      (*s)->capture = cap;
      (*s)->capture_deps = e->capture_deps;
      cap->streams.push_back(*s);
      return CUDA_SUCCESS;
    }
    if ((*s)->capture != cap) return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    for (auto d : e->capture_deps) {
      if (std::find((*s)->capture_deps.begin(), (*s)->capture_deps.end(), d) ==
          (*s)->capture_deps.end()) {
        (*s)->capture_deps.push_back(d);
      }
    }
    return CUDA_SUCCESS;
  }
  if (auto cap = (*s)->capture) {
    if (flags & CU_EVENT_WAIT_EXTERNAL) {
      // "Event is captured in the graph as an external event node".
      auto g = graph_tables().graphs.find(cap->graph);
      std::uint64_t node = add_node_locked(
          *g, {CU_GRAPH_NODE_TYPE_WAIT_EVENT, EventNode{handle_value(ev)}}, (*s)->capture_deps);
      (*s)->capture_deps = {node};
      return CUDA_SUCCESS;
    }
    cap->invalidated = true;  // a captured stream cannot wait on uncaptured work
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (!e->last) return CUDA_SUCCESS;  // never recorded: nothing to wait for
  auto ctx = driver().contexts.find((*s)->ctx());
  StreamOp op;
  op.waits.push_back(e->last->point);
  return submit_locked(*ctx, *s, std::move(op), {});
}

CUresult add_callback(CUstream h, CUstreamCallback cb, void* user, unsigned flags, bool ptds,
                      Call& c) {
  c.ptr("stream", handle_value(h)).arg("flags", flags);
  EMU_REQUIRE_INIT();
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  if (auto cap = (*s)->capture) {  // not capturable: use cuLaunchHostFunc
    cap->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  auto ctx = driver().contexts.find((*s)->ctx());
  StreamOp op;
  op.runs_user_code = true;
  op.runs_after_fault = true;  // a callback learns of the error through its status
  op.work = [h, cb, user, sticky = (*s)->sticky()] {
    cb(h, static_cast<CUresult>(sticky->load()), user);
    return CUDA_SUCCESS;
  };
  enqueue_locked(*ctx, *s, std::move(op));
  return CUDA_SUCCESS;
}

CUresult launch_host_func(CUstream h, CUhostFn fn, void* user, bool ptds, Call& c) {
  c.ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  auto ctx = driver().contexts.find((*s)->ctx());
  // Not called after a fault in the context.
  NodeSpec spec{CU_GRAPH_NODE_TYPE_HOST, HostNode{fn, user}};
  StreamOp op = op_for_node(spec);
  return submit_locked(*ctx, *s, std::move(op), std::move(spec));
}

CUresult event_record(CUevent ev, CUstream h, unsigned flags, bool ptds, Call& c) {
  c.ptr("event", handle_value(ev)).ptr("stream", handle_value(h));
  EMU_REQUIRE_INIT();
  if (flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto e = driver().events.find(handle_value(ev));
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  auto s = resolve_stream_locked(h, ptds);
  if (!s) return s.error();
  // "event and stream must be on the same context"
  if ((*s)->ctx() != e->ctx) return CUDA_ERROR_INVALID_HANDLE;
  if (auto cap = (*s)->capture) {
    if (cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (flags & CU_EVENT_RECORD_EXTERNAL) {
      // An external record becomes an event-record node of the graph.
      auto g = graph_tables().graphs.find(cap->graph);
      std::uint64_t node = add_node_locked(
          *g, {CU_GRAPH_NODE_TYPE_EVENT_RECORD, EventNode{handle_value(ev)}}, (*s)->capture_deps);
      (*s)->capture_deps = {node};
    }
    e->capture = cap;
    e->capture_deps = (*s)->capture_deps;
    return CUDA_SUCCESS;
  }
  // "This flag is invalid outside of stream capture."
  if (flags & CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  e->capture.reset();
  e->capture_deps.clear();
  auto ctx = driver().contexts.find((*s)->ctx());
  // Record through enqueue_locked so legacy-stream ordering applies to the record too.
  auto rec = std::make_shared<EventRecord>();
  StreamOp op;
  op.work = [rec] {
    rec->time = Clock::now();
    return CUDA_SUCCESS;
  };
  rec->point.stream = *s;
  if (CUresult r = submit_locked(*ctx, *s, std::move(op), {}, &rec->point.seq); r != CUDA_SUCCESS) {
    return r;
  }
  e->last = rec;
  return CUDA_SUCCESS;
}

}  // namespace

EMU_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return api("cuStreamCreate", [&](Call& c) { return create_stream(phStream, Flags, 0, c); });
}

EMU_EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags,
                                               int priority) {
  return api("cuStreamCreateWithPriority",
             [&](Call& c) { return create_stream(phStream, flags, priority, c); });
}

EMU_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return api("cuStreamDestroy", [&](Call& c) {
    c.ptr("stream", handle_value(hStream));
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto s = driver().streams.remove(handle_value(hStream));
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    if (auto ctx = driver().contexts.find(s->ctx())) {
      std::erase(ctx->streams, handle_value(hStream));
    }
    // Returns at once; queued work still completes, then the worker exits.
    s->shutdown();
    return CUDA_SUCCESS;
  });
}

#define EMU_STREAM_PAIR(sym, base, Params, Args, impl)                           \
  EMU_EXPORT CUresult sym Params {                                               \
    return api(base, [&](Call& c) { return impl(EMU_UNPAREN Args, false, c); }); \
  }                                                                              \
  EMU_EXPORT CUresult sym##_ptsz Params {                                        \
    return api(base, [&](Call& c) { return impl(EMU_UNPAREN Args, true, c); });  \
  }
#define EMU_UNPAREN(...) __VA_ARGS__

EMU_STREAM_PAIR(cuStreamSynchronize, "cuStreamSynchronize", (CUstream h), (h), stream_synchronize)
EMU_STREAM_PAIR(cuStreamQuery, "cuStreamQuery", (CUstream h), (h), stream_query)
EMU_STREAM_PAIR(cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream h, CUevent e, unsigned int f),
                (h, e, f), stream_wait_event)
EMU_STREAM_PAIR(cuStreamAddCallback, "cuStreamAddCallback",
                (CUstream h, CUstreamCallback cb, void* u, unsigned int f), (h, cb, u, f),
                add_callback)
EMU_STREAM_PAIR(cuLaunchHostFunc, "cuLaunchHostFunc", (CUstream h, CUhostFn fn, void* u),
                (h, fn, u), launch_host_func)

static CUresult event_record_default(CUevent e, CUstream h, bool ptds, Call& c) {
  return event_record(e, h, 0, ptds, c);
}
EMU_STREAM_PAIR(cuEventRecord, "cuEventRecord", (CUevent e, CUstream h), (e, h),
                event_record_default)
EMU_STREAM_PAIR(cuEventRecordWithFlags, "cuEventRecordWithFlags",
                (CUevent e, CUstream h, unsigned int f), (e, h, f), event_record)

static CUresult get_priority(CUstream h, int* out, bool ptds, Call& c) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    *out = s.priority();
    return CUDA_SUCCESS;
  });
}
static CUresult get_flags(CUstream h, unsigned int* out, bool ptds, Call& c) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    *out = s.flags();
    return CUDA_SUCCESS;
  });
}
static CUresult get_ctx(CUstream h, CUcontext* out, bool ptds, Call& c) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    *out = to_handle<CUcontext>(s.ctx());
    return CUDA_SUCCESS;
  });
}
static CUresult get_id(CUstream h, unsigned long long* out, bool ptds, Call& c) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    *out = s.id();
    return CUDA_SUCCESS;
  });
}
EMU_STREAM_PAIR(cuStreamGetPriority, "cuStreamGetPriority", (CUstream h, int* p), (h, p),
                get_priority)
EMU_STREAM_PAIR(cuStreamGetFlags, "cuStreamGetFlags", (CUstream h, unsigned int* f), (h, f),
                get_flags)
EMU_STREAM_PAIR(cuStreamGetCtx, "cuStreamGetCtx", (CUstream h, CUcontext* p), (h, p), get_ctx)
EMU_STREAM_PAIR(cuStreamGetId, "cuStreamGetId", (CUstream h, unsigned long long* p), (h, p), get_id)

// --- events ---

EMU_EXPORT CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return api("cuEventCreate", [&](Call& c) {
    c.arg("flags", Flags);
    EMU_REQUIRE_INIT();
    constexpr unsigned kValid =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == nullptr || (Flags & ~kValid)) return CUDA_ERROR_INVALID_VALUE;
    // Interprocess events must not record timing.
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::lock_guard lock(driver().mu);
    auto ctx = current_context_locked();
    if (!ctx) return ctx.error();
    auto e = std::make_shared<Event>();
    e->ctx = (*ctx)->handle;
    e->flags = Flags;
    std::uint64_t h = driver().events.add(e);
    (*ctx)->events.push_back(h);
    *phEvent = to_handle<CUevent>(h);
    c.out_ptr("event", h);
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  return api("cuEventDestroy", [&](Call& c) {
    c.ptr("event", handle_value(hEvent));
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto e = driver().events.remove(handle_value(hEvent));
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (auto ctx = driver().contexts.find(e->ctx)) std::erase(ctx->events, handle_value(hEvent));
    return CUDA_SUCCESS;
  });
}

EMU_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  return api("cuEventQuery", [&](Call& c) {
    c.ptr("event", handle_value(hEvent));
    EMU_REQUIRE_INIT();
    std::lock_guard lock(driver().mu);
    auto e = driver().events.find(handle_value(hEvent));
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (e->capture) return CUDA_ERROR_CAPTURED_EVENT;
    if (!e->last) return CUDA_SUCCESS;
    return point_done(e->last->point) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

EMU_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  return api("cuEventSynchronize", [&](Call& c) {
    c.ptr("event", handle_value(hEvent));
    EMU_REQUIRE_INIT();
    std::shared_ptr<EventRecord> rec;
    {
      std::lock_guard lock(driver().mu);
      auto e = driver().events.find(handle_value(hEvent));
      if (!e) return CUDA_ERROR_INVALID_HANDLE;
      if (e->capture) return CUDA_ERROR_CAPTURED_EVENT;
      rec = e->last;
    }
    if (!rec) return CUDA_SUCCESS;
    wait_point(rec->point);
    return static_cast<CUresult>(rec->point.stream->sticky()->load());
  });
}

static CUresult elapsed(float* ms, CUevent start, CUevent end, Call& c) {
  c.ptr("start", handle_value(start)).ptr("end", handle_value(end));
  EMU_REQUIRE_INIT();
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(driver().mu);
  auto a = driver().events.find(handle_value(start));
  auto b = driver().events.find(handle_value(end));
  if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
  if (a->capture || b->capture) return CUDA_ERROR_CAPTURED_EVENT;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->last || !b->last) return CUDA_ERROR_INVALID_HANDLE;
  if (!point_done(a->last->point) || !point_done(b->last->point)) return CUDA_ERROR_NOT_READY;
  auto dt = record_time(*b->last) - record_time(*a->last);
  *ms = static_cast<float>(std::chrono::duration<double, std::milli>(dt).count());
  c.out("ms", *ms);
  return CUDA_SUCCESS;
}

EMU_EXPORT CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return api("cuEventElapsedTime",
             [&](Call& c) { return elapsed(pMilliseconds, hStart, hEnd, c); });
}
EMU_EXPORT CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return api("cuEventElapsedTime",
             [&](Call& c) { return elapsed(pMilliseconds, hStart, hEnd, c); });
}

static CUresult get_ctx_v2(CUstream h, CUcontext* out, CUgreenCtx* green, bool ptds, Call& c) {
  if (out == nullptr && green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    if (out != nullptr) *out = to_handle<CUcontext>(s.ctx());
    if (green != nullptr) *green = nullptr;  // green contexts are not emulated
    return CUDA_SUCCESS;
  });
}
EMU_STREAM_PAIR(cuStreamGetCtx_v2, "cuStreamGetCtx", (CUstream h, CUcontext* p, CUgreenCtx* g),
                (h, p, g), get_ctx_v2)

static CUresult get_device(CUstream h, CUdevice* out, bool ptds, Call& c) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_stream(h, ptds, c, [&](StreamCore& s) {
    *out = s.device();
    return CUDA_SUCCESS;
  });
}
EMU_STREAM_PAIR(cuStreamGetDevice, "cuStreamGetDevice", (CUstream h, CUdevice* d), (h, d),
                get_device)
