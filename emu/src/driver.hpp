// The emulated driver's process-wide state: configuration, devices, contexts,
// streams, events and the address space. One instance per process, as the real
// driver has.
#pragma once

#include <cuda.h>

#include <atomic>
#include <expected>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "address_space.hpp"
#include "config.hpp"
#include "handles.hpp"
#include "ledger.hpp"
#include "stream.hpp"
#include "timing.hpp"
#include "trace.hpp"

namespace emu {

constexpr std::uint64_t kGranularity = 2ull << 20;  // VMM minimum and recommended
constexpr int kDriverVersion = 13000;
constexpr int kGreatestStreamPriority = -5;  // Hopper: 6 levels, 0 (lowest) .. -5
constexpr int kLeastStreamPriority = 0;

struct Device {
  int ordinal = 0;
  std::string name;
  CUuuid uuid{};
  std::uint64_t capacity = 0;
  DeviceLedger ledger;
  CopyEngine h2d;
  CopyEngine d2h;
  // The primary context: one per device, retained by reference count.
  std::uint64_t primary = 0;  // context handle, made at cuInit
  int primary_refs = 0;
  unsigned primary_flags = 0;
};

struct Context {
  std::uint64_t handle = 0;
  int device = 0;
  unsigned flags = 0;
  bool primary = false;
  bool active = true;      // primary contexts: retained (refs > 0)
  bool destroyed = false;  // cuCtxDestroy'd (handle kept to say so)
  StickyError sticky = std::make_shared<std::atomic<int>>(CUDA_SUCCESS);
  std::shared_ptr<StreamCore> legacy;                                // the NULL stream
  std::unordered_map<long, std::shared_ptr<StreamCore>> per_thread;  // by tid
  std::vector<std::uint64_t> streams;                                // user stream handles
  std::vector<std::uint64_t> events;
};

class Driver {
 public:
  // Config is read on first use (so a trace covers calls made before cuInit).
  const std::expected<Config, std::string>& config();
  CUresult init(unsigned flags);
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  int device_count() const { return static_cast<int>(devices_.size()); }
  Device& device(int i) { return *devices_[static_cast<std::size_t>(i)]; }
  bool timing() { return config_->timing; }
  const Config& cfg() { return *config_; }

  // Guards contexts, streams, events and the thread->context bindings.
  std::mutex mu;
  // Guards the address space. Stream workers hold it shared while moving bytes, so
  // unmapping or freeing cannot pull memory out from under a copy.
  std::shared_mutex space_mu;
  AddressSpace space;

  // CUmemGenericAllocationHandle values (guarded by space_mu). A handle is a counted
  // reference to physical memory: cuMemCreate/import/retain add one, cuMemRelease
  // drops one; the memory itself lives while a handle reference or a mapping holds it.
  // A value stays tied to its memory while the memory lives (mapped), even at zero
  // references: cuMemRetainAllocationHandle must give back the value used to map it.
  struct VmmHandle {
    std::shared_ptr<PhysicalMemory> mem;  // held while refs > 0
    std::weak_ptr<PhysicalMemory> weak;
    int refs = 0;
  };
  std::unordered_map<std::uint64_t, VmmHandle> vmm_handles;
  std::unordered_map<const PhysicalMemory*, std::uint64_t> vmm_handle_of;
  std::uint64_t next_vmm_handle = 0x1000;
  // Physical memory this process knows, by ledger key, so importing the same
  // allocation twice yields the same object.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::weak_ptr<PhysicalMemory>> known_memory;

  HandleTable<Context> contexts{HandleTag::kContext};
  HandleTable<StreamCore> streams{HandleTag::kStream};
  HandleTable<Event> events{HandleTag::kEvent};

 private:
  std::once_flag config_once_;
  std::expected<Config, std::string> config_;
  std::mutex init_mu_;
  std::atomic<bool> initialized_{false};
  CUresult init_result_ = CUDA_SUCCESS;
  std::vector<std::unique_ptr<Device>> devices_;
};

Driver& driver();

std::optional<CUresult> faults_check(const char* name);
long current_tid();

// The api() wrapper every exported entry point goes through: records the call in the
// trace, applies fault injection, refuses calls from inside stream callbacks.
template <class Body>
CUresult api(const char* name, Body&& body) {
  driver().config();  // opens the trace and loads fault rules on first use: before `call`
  Call call(name);    // reads whether tracing is on
  CUresult r;
  if (in_user_callback()) {
    r = CUDA_ERROR_NOT_PERMITTED;
  } else if (auto injected = faults_check(name)) {
    call.arg("injected", true);
    r = *injected;
  } else {
    r = body(call);
  }
  call.finish(r);
  return r;
}

// --- helpers shared by the api_*.cpp files (caller holds driver().mu) ---

// The calling thread's current context, checked: CUDA_ERROR_INVALID_CONTEXT if none
// (or an inactive primary), CUDA_ERROR_CONTEXT_IS_DESTROYED, or its sticky error.
std::expected<Context*, CUresult> current_context_locked();
// The same, taking the lock itself. Contexts are never freed (a destroyed one stays as a
// tombstone), so the pointer stays valid after the lock is dropped.
std::expected<Context*, CUresult> current_context();
// A context handle given explicitly.
std::expected<Context*, CUresult> context_from_handle_locked(CUcontext h);

// Resolves a stream handle for the calling thread: NULL and CU_STREAM_LEGACY are the
// current context's legacy stream (or, when `per_thread` — the _ptsz/_ptds entry
// points — NULL means the per-thread stream), CU_STREAM_PER_THREAD the per-thread one.
std::expected<std::shared_ptr<StreamCore>, CUresult> resolve_stream_locked(CUstream h,
                                                                           bool per_thread);
// Enqueues `op` with the legacy-stream implicit synchronisation rules applied.
std::uint64_t enqueue_locked(Context& ctx, const std::shared_ptr<StreamCore>& s, StreamOp op);
// Every stream of a context, for cuCtxSynchronize and destruction.
std::vector<std::shared_ptr<StreamCore>> context_streams_locked(Context& ctx);
// Waits (without the lock) until everything enqueued so far on `streams` completed.
void drain(const std::vector<std::shared_ptr<StreamCore>>& streams);
// Frees everything a context owns: streams, events, cuMemAlloc memory, pinned memory.
void release_context_resources(Context& ctx, std::unique_lock<std::mutex>& lock);

// The calling thread's context stack (top = current), as context handles.
std::vector<std::uint64_t>& context_stack();

}  // namespace emu
