// GpuMemory: construction and teardown, the slot table (create, destroy, evict), the
// background workers, and inspection (slots, pool, invariants). The rest is split by concern:
// gpu_memory_prewarm.cpp (copying weights into a slot), gpu_memory_kv.cpp (activation and
// the active slot's KV region), gpu_memory_lending.cpp (KV pages lent between slots) and
// gpu_memory_engine.cpp (pages handed to an engine process).
#include "vmm/gpu_memory.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "vmm/gpu_memory_internal.hpp"

namespace thaw::vmm {

using detail::kCopyPages;
using detail::kStagingBuffers;
using detail::pages_for;

std::string_view to_string(SlotState state) {
  switch (state) {
    case SlotState::empty:
      return "empty";
    case SlotState::loading:
      return "loading";
    case SlotState::prewarmed:
      return "prewarmed";
    case SlotState::active:
      return "active";
    case SlotState::draining:
      return "draining";
    case SlotState::evicting:
      return "evicting";
  }
  return "unknown";
}

VmmResult<std::unique_ptr<GpuMemory>> GpuMemory::create(std::shared_ptr<const cuda::Driver> driver,
                                                        GpuMemoryConfig config) {
  if (auto ok = driver->init(); !ok) return std::unexpected(driver_error(ok.error(), "cuInit"));
  auto device = driver->device_get(config.ordinal);
  if (!device) {
    return std::unexpected(driver_error(device.error(), fmt::format("GPU {}", config.ordinal)));
  }
  auto context = driver->primary_ctx_retain(*device);
  if (!context) {
    return std::unexpected(
        driver_error(context.error(), fmt::format("GPU {}: primary context", config.ordinal)));
  }
  std::unique_ptr<GpuMemory> gpu(new GpuMemory(driver, *device, *context));
  gpu->max_slots_ = config.max_slots;
  if (auto ok = gpu->make_current(); !ok) return std::unexpected(ok.error());
  std::uint64_t pool_bytes = config.pool_bytes;
  if (pool_bytes == 0) {
    auto total = driver->device_total_mem(*device);
    if (!total) return std::unexpected(driver_error(total.error(), "device memory size"));
    pool_bytes = static_cast<std::uint64_t>(static_cast<double>(*total) * config.pool_share);
  }
  auto total = driver->device_total_mem(*device);
  if (!total) return std::unexpected(driver_error(total.error(), "device memory size"));
  if (auto uuid = driver->device_uuid(*device)) {
    for (char b : uuid->bytes) gpu->uuid_ += fmt::format("{:02x}", static_cast<unsigned char>(b));
  }
  auto pool = PagePool::create(driver, *device, pool_bytes);
  if (!pool) return std::unexpected(pool.error());
  gpu->pool_ = std::move(*pool);
  gpu->slot_pages_ = std::max(*total / gpu->pool_->page_bytes(), gpu->pool_->page_count());
  auto range = driver->stream_priority_range();
  if (!range) return std::unexpected(driver_error(range.error(), "stream priorities"));
  // Least priority: prewarm copies yield to the active engine's work on the same GPU.
  auto stream = driver->stream_create_with_priority(CU_STREAM_NON_BLOCKING, range->least);
  if (!stream) return std::unexpected(driver_error(stream.error(), "prewarm stream"));
  gpu->stream_ = *stream;
  gpu->staging_bytes_ = kCopyPages * gpu->pool_->page_bytes();
  for (std::size_t i = 0; i < kStagingBuffers; ++i) {
    auto buffer = driver->mem_host_alloc(gpu->staging_bytes_);
    if (!buffer) return std::unexpected(driver_error(buffer.error(), "prewarm staging buffer"));
    gpu->staging_.push_back(Staging{*buffer, nullptr, false});
    auto event = driver->event_create(CU_EVENT_DISABLE_TIMING);
    if (!event) return std::unexpected(driver_error(event.error(), "prewarm staging event"));
    gpu->staging_.back().done = *event;
  }
  for (int i = 0; i < 2; ++i) gpu->workers_.emplace_back([g = gpu.get()] { g->worker_loop(); });
  return gpu;
}

GpuMemory::GpuMemory(std::shared_ptr<const cuda::Driver> driver, CUdevice device, CUcontext context)
    : driver_(std::move(driver)), device_(device), context_(context) {}

GpuMemory::~GpuMemory() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : workers_) t.join();
  (void)make_current();
  {
    std::lock_guard lock(mutex_);
    // A failed unmap is tried again (twice) before the slot's own destructor, which
    // unmaps what is left, so one transient driver error does not leak a mapping.
    for (auto& [id, s] : slots_) {
      for (int attempt = 0; attempt < 3 && !unmap_all_locked(*s); ++attempt) {
      }
    }
    slots_.clear();
  }
  if (stream_ != nullptr) (void)driver_->stream_synchronize(stream_);
  for (Staging& st : staging_) {
    if (st.done != nullptr) (void)driver_->event_destroy(st.done);
    if (st.buffer != nullptr) (void)driver_->mem_free_host(st.buffer);
  }
  if (stream_ != nullptr) (void)driver_->stream_destroy(stream_);
  pool_.reset();
  (void)driver_->primary_ctx_release(device_);
}

// --- helpers every gpu_memory*.cpp uses ------------------------------------------------

VmmResult<void> GpuMemory::make_current() const {
  if (auto ok = driver_->ctx_set_current(context_); !ok) {
    return std::unexpected(driver_error(ok.error(), "making the GPU's context current"));
  }
  return {};
}

GpuMemory::Slot* GpuMemory::find_locked(SlotId id) const {
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : it->second.get();
}

VmmResult<GpuMemory::Slot*> GpuMemory::require_locked(SlotId id) const {
  if (Slot* s = find_locked(id)) return s;
  return vmm_failure(VmmErrc::unknown_slot,
                     fmt::format("no prewarm slot {} on this GPU; list them with slots()", id));
}

std::size_t GpuMemory::kv_first_page(const Slot& s) const {
  return pages_for(s.weight_bytes, pool_->page_bytes());
}

bool GpuMemory::pinned_locked(const Slot& s) const {
  SlotId id = s.va->id();
  for (const auto& [token, pages] : exports_) {
    for (const auto& [slot, page] : pages) {
      if (slot == id) return true;
    }
  }
  return false;
}

// --- slots -----------------------------------------------------------------------------

VmmResult<SlotId> GpuMemory::create_slot(std::string model) {
  std::lock_guard lock(mutex_);
  if (slots_.size() >= max_slots_) {
    return vmm_failure(VmmErrc::invalid_argument,
                       fmt::format("GPU already has {} prewarm slots (the maximum); destroy an "
                                   "empty one first",
                                   slots_.size()));
  }
  const SlotId id = next_slot_++;
  // VA for the whole device, as an engine sees it: an engine layout's offsets may lie
  // anywhere an engine could have allocated, even where the pool does not reach.
  auto va = PrewarmSlot::create(driver_, device_, id, slot_pages_, pool_->page_bytes());
  if (!va) return std::unexpected(va.error());
  auto s = std::make_unique<Slot>();
  s->va = std::move(*va);
  s->model = std::move(model);
  slots_.emplace(id, std::move(s));
  return id;
}

VmmResult<void> GpuMemory::destroy_slot(SlotId id) {
  std::lock_guard lock(mutex_);
  auto s = require_locked(id);
  if (!s) return std::unexpected(s.error());
  if ((*s)->state != SlotState::empty || pinned_locked(**s)) {
    return vmm_failure(
        VmmErrc::bad_state,
        fmt::format("slot {} is {}; evict it before destroying it", id, to_string((*s)->state)));
  }
  // An empty slot may still hold pages whose unmap failed earlier (or lent ones not yet
  // used): give them back now, or refuse.
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  if (auto ok = unmap_all_locked(**s); !ok) return std::unexpected(ok.error());
  slots_.erase(id);
  return {};
}
VmmResult<void> GpuMemory::evict(SlotId id) {
  {
    std::lock_guard lock(mutex_);
    auto found = require_locked(id);
    if (!found) return std::unexpected(found.error());
    Slot& s = **found;
    if (s.state == SlotState::empty && s.va->mapped_count() == 0 && s.lent_unused.empty()) {
      return {};
    }
    if (s.state != SlotState::prewarmed && s.state != SlotState::empty) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} ({}) is {}; only a prewarmed slot can be evicted{}",
                                     id, s.model, to_string(s.state),
                                     s.state == SlotState::active ? " (deactivate it first)" : ""));
    }
    if (pinned_locked(s)) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} has pages exported to an engine that has not "
                                     "confirmed the import; confirm_import() first",
                                     id));
    }
    s.state = SlotState::evicting;
  }
  post([this, id] { evict_job(id); });
  return {};
}

void GpuMemory::evict_job(SlotId id) {
  (void)make_current();
  {
    std::lock_guard lock(mutex_);
    Slot* s = find_locked(id);
    if (s == nullptr) return;
    if (unmap_all_locked(*s)) {
      s->weight_bytes = s->loaded_bytes = 0;
      s->layers_resident = -1;
      s->state = SlotState::empty;
    } else {
      s->state = SlotState::prewarmed;  // some pages stayed mapped: still (partly) there
      s->loaded_bytes = 0;
    }
  }
  changed_.notify_all();
}

VmmResult<void> GpuMemory::unmap_all_locked(Slot& s) {
  for (std::size_t i = 0; i < s.va->page_count(); ++i) {
    if (!s.va->page_at(i)) continue;
    auto p = s.va->unmap(i);
    if (!p) return std::unexpected(p.error());
    pool_->release(std::span(&*p, 1));
  }
  pool_->release(s.lent_unused);
  s.lent_unused.clear();
  return {};
}

// --- background --------------------------------------------------------------------------

void GpuMemory::post(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void GpuMemory::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    ++busy_;
    lock.unlock();
    job();
    lock.lock();
    --busy_;
    changed_.notify_all();
  }
}

void GpuMemory::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    if (stopping_ || (busy_ == 0 && jobs_.empty())) return true;
    return false;
  });
}

// --- inspection --------------------------------------------------------------------------

std::vector<SlotInfo> GpuMemory::slots() const {
  std::lock_guard lock(mutex_);
  std::vector<SlotInfo> out;
  for (const auto& [id, s] : slots_) {
    SlotInfo info;
    info.id = id;
    info.model = s->model;
    info.state = s->state;
    info.base = s->va->base();
    info.weight_bytes = s->weight_bytes;
    info.loaded_bytes = s->loaded_bytes;
    info.layers_resident = s->layers_resident;
    const std::size_t kv_first = kv_first_page(*s);
    for (std::size_t i = 0; i < s->va->page_count(); ++i) {
      if (s->va->page_at(i)) ++(i < kv_first ? info.weight_pages : info.kv_pages);
    }
    info.kv_target_bytes = s->kv_target_bytes;
    out.push_back(std::move(info));
  }
  return out;
}

VmmResult<SlotInfo> GpuMemory::slot(SlotId id) const {
  for (auto& info : slots()) {
    if (info.id == id) return info;
  }
  return vmm_failure(VmmErrc::unknown_slot, fmt::format("no prewarm slot {} on this GPU", id));
}
PoolInfo GpuMemory::pool() const {
  PoolInfo info;
  info.page_bytes = pool_->page_bytes();
  info.pages = pool_->page_count();
  info.free = pool_->count(PageUse::free);
  info.weights = pool_->count(PageUse::weights);
  info.kv = pool_->count(PageUse::kv);
  info.lent = pool_->count(PageUse::lent);
  info.returned = pool_->count(PageUse::returned);
  return info;
}

std::expected<void, std::string> GpuMemory::check_invariants() const {
  std::lock_guard lock(mutex_);
  const std::size_t pages = pool_->page_count();
  std::vector<int> mapped_in(pages, -1);  // slot id a page is mapped in, or -1
  std::vector<bool> lent_unused(pages, false);
  for (const auto& [id, s] : slots_) {
    const std::size_t kv_first = kv_first_page(*s);
    for (std::size_t i = 0; i < s->va->page_count(); ++i) {
      auto p = s->va->page_at(i);
      if (!p) continue;
      if (mapped_in[*p] != -1) {
        return std::unexpected(
            fmt::format("page {} is mapped in slots {} and {}", *p, mapped_in[*p], id));
      }
      mapped_in[*p] = static_cast<int>(id);
      const PageOwner o = pool_->owner(*p);
      if (o.slot != id || o.use == PageUse::free) {
        return std::unexpected(
            fmt::format("page {} mapped in slot {} at {} is owned by {} of "
                        "slot {}",
                        *p, id, i, to_string(o.use), o.slot));
      }
      const bool in_kv = i >= kv_first;
      if (in_kv != (o.use == PageUse::kv)) {
        return std::unexpected(fmt::format("page {} at slot {} page {} ({} region) is owned as {}",
                                           *p, id, i, in_kv ? "KV" : "weights", to_string(o.use)));
      }
    }
    for (PageId p : s->lent_unused) {
      const PageOwner o = pool_->owner(p);
      if (o != PageOwner{PageUse::lent, id} || mapped_in[p] != -1 || lent_unused[p]) {
        return std::unexpected(
            fmt::format("page {} is listed as lent to slot {} but is {} of "
                        "slot {}{}",
                        p, id, to_string(o.use), o.slot, mapped_in[p] != -1 ? ", mapped" : ""));
      }
      lent_unused[p] = true;
    }
  }
  for (PageId p = 0; p < pages; ++p) {
    const PageOwner o = pool_->owner(p);
    const bool held = mapped_in[p] != -1 || lent_unused[p];
    const bool unowned = o.use == PageUse::free || o.use == PageUse::returned;
    if (unowned == held) {
      return std::unexpected(fmt::format("page {} is {} of slot {} but {}", p, to_string(o.use),
                                         o.slot, held ? "held by a slot" : "held by no slot"));
    }
  }
  return {};
}

}  // namespace thaw::vmm
