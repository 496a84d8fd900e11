#include "driver.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "faults.hpp"
#include "module.hpp"

namespace emu {

Driver& driver() {
  // Leaked on purpose: stream workers and atexit handlers of the program may still call
  // in while static destructors run.
  static auto* d = new Driver();
  return *d;
}

long current_tid() {
  static thread_local long tid = syscall(SYS_gettid);
  return tid;
}

std::vector<std::uint64_t>& context_stack() {
  static thread_local std::vector<std::uint64_t> stack;
  return stack;
}

std::optional<CUresult> faults_check(const char* name) {
  return faults().check(name);
}

const std::expected<Config, std::string>& Driver::config() {
  std::call_once(config_once_, [this] {
    config_ = config_from_env();
    if (!config_) return;
    trace().open(config_->trace_path);
    if (auto f = faults().configure(config_->faults_spec); !f) {
      config_ = std::unexpected(f.error());
    }
  });
  return config_;
}

namespace {

void raise_fd_limit() {
  // Every physical allocation is a memfd; engines make thousands of them.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

CUuuid make_uuid(int ordinal) {
  CUuuid u{};
  const char tag[] = "thaw-emu-gpu";
  std::memcpy(u.bytes, tag, sizeof(tag) - 1);
  u.bytes[15] = static_cast<char>(ordinal);
  u.bytes[14] = static_cast<char>(ordinal >> 8);
  return u;
}

}  // namespace

CUresult Driver::init(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(init_mu_);
  if (initialized()) return CUDA_SUCCESS;
  const auto& cfg = config();
  if (!cfg) {
    std::fprintf(stderr, "thaw-emu: cuInit failed: %s\n", cfg.error().c_str());
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (cfg->device_count == 0) return CUDA_ERROR_NO_DEVICE;
  raise_fd_limit();
  std::vector<std::unique_ptr<Device>> devices;
  for (int i = 0; i < cfg->device_count; ++i) {
    auto d = std::make_unique<Device>();
    d->ordinal = i;
    d->name = cfg->device_name;
    d->uuid = make_uuid(i);
    d->capacity = cfg->device_memory[static_cast<std::size_t>(i)];
    if (auto r = d->ledger.open(cfg->state_dir, i, d->capacity); !r) {
      std::fprintf(stderr,
                   "thaw-emu: cuInit failed: %s (set THAW_EMU_STATE_DIR to a writable "
                   "directory)\n",
                   r.error().c_str());
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    devices.push_back(std::move(d));
  }
  devices_ = std::move(devices);
  {
    std::lock_guard state(mu);
    for (auto& d : devices_) {
      auto ctx = std::make_shared<Context>();
      ctx->device = d->ordinal;
      ctx->primary = true;
      ctx->active = false;
      ctx->handle = contexts.add(ctx);
      d->primary = ctx->handle;
    }
  }
  initialized_.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

std::expected<Context*, CUresult> context_from_handle_locked(CUcontext h) {
  auto ctx = driver().contexts.find(handle_value(h));
  if (!ctx || ctx->destroyed) return std::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  return ctx.get();
}

std::expected<Context*, CUresult> current_context() {
  std::lock_guard lock(driver().mu);
  return current_context_locked();
}

std::expected<Context*, CUresult> current_context_locked() {
  auto& stack = context_stack();
  if (stack.empty()) return std::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  auto ctx = driver().contexts.find(stack.back());
  if (!ctx) return std::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  if (ctx->destroyed) return std::unexpected(CUDA_ERROR_CONTEXT_IS_DESTROYED);
  if (ctx->primary && !ctx->active) return std::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  if (int e = ctx->sticky->load(); e != CUDA_SUCCESS) {
    return std::unexpected(static_cast<CUresult>(e));
  }
  return ctx.get();
}

namespace {
std::shared_ptr<StreamCore> make_stream(Context& ctx, StreamCore::Kind kind, unsigned flags,
                                        int priority) {
  return std::make_shared<StreamCore>(ctx.handle, ctx.device, kind, flags, priority, ctx.sticky,
                                      driver().timing());
}
}  // namespace

std::expected<std::shared_ptr<StreamCore>, CUresult> resolve_stream_locked(CUstream h,
                                                                           bool per_thread) {
  auto ctx = current_context_locked();
  if (!ctx) return std::unexpected(ctx.error());
  Context& c = **ctx;
  std::uint64_t v = handle_value(h);
  bool want_per_thread = v == handle_value(CU_STREAM_PER_THREAD) || (v == 0 && per_thread);
  if (want_per_thread) {
    auto& s = c.per_thread[current_tid()];
    if (!s) s = make_stream(c, StreamCore::Kind::kPerThread, CU_STREAM_DEFAULT, 0);
    return s;
  }
  if (v == 0 || v == handle_value(CU_STREAM_LEGACY)) {
    if (!c.legacy) c.legacy = make_stream(c, StreamCore::Kind::kLegacy, CU_STREAM_DEFAULT, 0);
    return c.legacy;
  }
  auto s = driver().streams.find(v);
  if (!s) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
  // A stream belongs to its context; using it needs that context usable.
  auto owner = driver().contexts.find(s->ctx());
  if (!owner || owner->destroyed) return std::unexpected(CUDA_ERROR_INVALID_HANDLE);
  if (int e = owner->sticky->load(); e != CUDA_SUCCESS) {
    return std::unexpected(static_cast<CUresult>(e));
  }
  return s;
}

std::vector<std::shared_ptr<StreamCore>> context_streams_locked(Context& ctx) {
  std::vector<std::shared_ptr<StreamCore>> out;
  if (ctx.legacy) out.push_back(ctx.legacy);
  for (auto& [tid, s] : ctx.per_thread) out.push_back(s);
  for (auto h : ctx.streams) {
    if (auto s = driver().streams.find(h)) out.push_back(s);
  }
  return out;
}

std::uint64_t enqueue_locked(Context& ctx, const std::shared_ptr<StreamCore>& s, StreamOp op) {
  op.model += driver().cfg().launch_latency;
  if (s->kind() == StreamCore::Kind::kLegacy) {
    // Work on the legacy stream waits for all prior work on blocking streams.
    for (auto& other : context_streams_locked(ctx)) {
      if (other != s && other->blocking()) op.waits.push_back(other->tail());
    }
  } else if (s->blocking()) {
    // Work on a blocking stream waits for prior work on the legacy stream.
    if (!ctx.legacy) {
      ctx.legacy = make_stream(ctx, StreamCore::Kind::kLegacy, CU_STREAM_DEFAULT, 0);
    }
    op.waits.push_back(ctx.legacy->tail());
  }
  return s->enqueue(std::move(op));
}

void drain(const std::vector<std::shared_ptr<StreamCore>>& streams) {
  std::vector<StreamPoint> points;
  for (auto& s : streams) points.push_back(s->tail());
  for (auto& p : points) wait_point(p);
}

void release_context_resources(Context& ctx, std::unique_lock<std::mutex>& lock) {
  auto streams = context_streams_locked(ctx);
  lock.unlock();
  drain(streams);
  lock.lock();
  unload_context_modules_locked(ctx);
  for (auto& s : context_streams_locked(ctx)) s->shutdown();
  auto& d = driver();
  for (auto h : ctx.streams) d.streams.remove(h);
  for (auto h : ctx.events) d.events.remove(h);
  ctx.streams.clear();
  ctx.events.clear();
  ctx.legacy.reset();
  ctx.per_thread.clear();
  std::unique_lock space(d.space_mu);
  std::erase_if(d.space.legacy, [&](const auto& kv) { return kv.second.ctx == ctx.handle; });
  std::erase_if(d.space.ipc, [&](const auto& kv) { return kv.second.ctx == ctx.handle; });
  std::erase_if(d.space.pinned, [&](const auto& kv) { return kv.second.ctx == ctx.handle; });
}

}  // namespace emu
