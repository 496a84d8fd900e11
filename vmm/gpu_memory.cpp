#include "vmm/gpu_memory.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace thaw::vmm {

using SteadyClock = std::chrono::steady_clock;

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

struct GpuMemory::Slot {
  std::unique_ptr<PrewarmSlot> va;
  std::string model;
  SlotState state = SlotState::empty;
  std::uint64_t weight_bytes = 0;
  std::uint64_t loaded_bytes = 0;
  int layers_resident = -1;
  std::uint64_t prewarmed_at = 0;
  // Active slot: KV pages are mapped from kv_first_page() up to kv_next.
  std::uint64_t kv_target_bytes = 0;
  std::size_t kv_next = 0;
  bool kv_done = true;
  std::optional<VmmError> kv_error;
  // Pages lent to this slot by the active one and not mapped yet.
  std::vector<PageId> lent_unused;
  // A prewarm is copying into the slot (also while it is active): its pages must stay.
  bool prewarming = false;
};

namespace {

// Largest prewarm copy, in pages: big enough that a copy's launch cost is noise, small
// enough that mapping the next copy's pages overlaps this copy's transfer.
constexpr std::uint64_t kCopyPages = 8;
// Staging buffers of kCopyPages pages: enough that the host fills one while others are in
// flight.
constexpr std::size_t kStagingBuffers = 4;

std::size_t pages_for(std::uint64_t bytes, std::size_t page) {
  // Not (bytes + page - 1) / page: a size near 2^64 (Activate's kv_bytes) would wrap to 0.
  return static_cast<std::size_t>(bytes / page + (bytes % page != 0 ? 1 : 0));
}

}  // namespace

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

// --- prewarm -----------------------------------------------------------------------------

namespace {

struct CopyRun {
  std::uint64_t slot_offset;
  const std::string* file;
  std::uint64_t file_offset;
  std::uint64_t bytes;
};

// The layout's bytes in [begin, end) as copies: adjacent pieces of one file merged when
// they are contiguous in both the file and the slot (one launch instead of many), then cut
// at multiples of `max_bytes` of slot offset, so the pages of the next copy are mapped
// while this one transfers (a 1 GB copy would need all its pages mapped before it starts).
std::vector<CopyRun> copy_runs(const WeightLayout& layout, std::uint64_t begin, std::uint64_t end,
                               std::uint64_t max_bytes) {
  std::vector<CopyRun> runs;
  for (const LayoutPiece& p : layout.pieces()) {
    const std::uint64_t lo = std::max(p.slot_offset, begin);
    const std::uint64_t hi = std::min(p.slot_end(), end);
    if (lo >= hi) continue;
    const std::uint64_t file_offset = p.file_offset + (lo - p.slot_offset);
    if (!runs.empty()) {
      CopyRun& last = runs.back();
      if (*last.file == p.file && last.slot_offset + last.bytes == lo &&
          last.file_offset + last.bytes == file_offset) {
        last.bytes += hi - lo;
        continue;
      }
    }
    runs.push_back(CopyRun{lo, &p.file, file_offset, hi - lo});
  }
  std::vector<CopyRun> cut;
  for (const CopyRun& r : runs) {
    std::uint64_t at = r.slot_offset;
    while (at < r.slot_offset + r.bytes) {
      const std::uint64_t next =
          std::min(r.slot_offset + r.bytes, (at / max_bytes + 1) * max_bytes);
      cut.push_back(CopyRun{at, r.file, r.file_offset + (at - r.slot_offset), next - at});
      at = next;
    }
  }
  return cut;
}

}  // namespace

VmmResult<PrewarmReport> GpuMemory::prewarm(SlotId id, const WeightLayout& layout,
                                            WeightSource& source, const PrewarmOptions& options) {
  const auto t0 = SteadyClock::now();
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  const std::size_t page = pool_->page_bytes();
  Slot* s = nullptr;
  SlotState before{};
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  {
    std::lock_guard lock(mutex_);
    auto found = require_locked(id);
    if (!found) return std::unexpected(found.error());
    s = *found;
    if (s->state != SlotState::empty && s->state != SlotState::prewarmed &&
        s->state != SlotState::active) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} ({}) is {}; prewarm needs it empty, prewarmed or "
                                     "active",
                                     id, s->model, to_string(s->state)));
    }
    if (layout.extent() == 0) {
      return vmm_failure(VmmErrc::invalid_argument,
                         fmt::format("slot {}: the layout holds no bytes", id));
    }
    if (s->weight_bytes != 0 && s->weight_bytes != layout.extent()) {
      return vmm_failure(
          VmmErrc::invalid_argument,
          fmt::format("slot {} holds a layout of {} bytes, this one has {}; evict the slot "
                      "before prewarming another layout into it",
                      id, s->weight_bytes, layout.extent()));
    }
    if (pages_for(layout.extent(), page) > std::min(s->va->page_count(), pool_->page_count())) {
      return vmm_failure(VmmErrc::invalid_argument,
                         fmt::format("slot {}: {} bytes of weights do not fit the GPU's pool of "
                                     "{} bytes",
                                     id, layout.extent(), s->va->page_count() * page));
    }
    end = options.layers ? layout.prefix_for_layers(*options.layers) : layout.extent();
    begin = s->loaded_bytes;
    if (end <= begin) return PrewarmReport{};
    before = s->state;
    if (s->prewarming) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} ({}) is being prewarmed already", id, s->model));
    }
    if (before != SlotState::active) s->state = SlotState::loading;
    s->prewarming = true;
    s->weight_bytes = layout.extent();
  }

  PrewarmReport report;
  std::vector<std::size_t> mapped_now;  // slot pages this call mapped (undone on failure)
  auto fail = [&](VmmError error) -> VmmResult<PrewarmReport> {
    (void)driver_->stream_synchronize(stream_);
    for (Staging& st : staging_) st.in_flight = false;
    std::lock_guard lock(mutex_);
    for (auto it = mapped_now.rbegin(); it != mapped_now.rend(); ++it) {
      auto p = s->va->unmap(*it);
      if (!p) continue;  // stays mapped and owned: still consistent
      if (pool_->owner(*p).use == PageUse::lent) {
        s->lent_unused.push_back(*p);
      } else {
        pool_->release(std::span(&*p, 1));
      }
    }
    s->state = before;
    s->prewarming = false;
    // A page whose unmap failed stays mapped in the weights region, so the region keeps
    // its size until nothing is mapped there.
    if (s->loaded_bytes == 0 && s->va->mapped_count() == 0) s->weight_bytes = 0;
    changed_.notify_all();
    return std::unexpected(std::move(error));
  };

  // Maps every slot page below `until` not mapped yet: lent pages first, then free ones.
  std::size_t next_page = static_cast<std::size_t>(begin / page);
  auto map_until = [&](std::uint64_t until) -> VmmResult<void> {
    for (; static_cast<std::uint64_t>(next_page) * page < until; ++next_page) {
      std::lock_guard lock(mutex_);
      if (s->va->page_at(next_page)) continue;
      PageId p = 0;
      bool lent = !s->lent_unused.empty();
      if (lent) {
        p = s->lent_unused.back();
        s->lent_unused.pop_back();
      } else {
        auto taken = pool_->take(1, PageOwner{PageUse::weights, id});
        if (!taken) return std::unexpected(taken.error());
        p = taken->front();
      }
      if (auto ok = s->va->map(next_page, p, pool_->handle(p)); !ok) {
        if (lent) {
          s->lent_unused.push_back(p);
        } else {
          pool_->release(std::span(&p, 1));
        }
        return std::unexpected(ok.error());
      }
      mapped_now.push_back(next_page);
      ++report.pages_mapped;
    }
    return {};
  };

  const std::vector<CopyRun> runs = copy_runs(layout, begin, end, kCopyPages * page);
  const std::uint64_t total = [&] {
    std::uint64_t t = 0;
    for (const auto& r : runs) t += r.bytes;
    return t;
  }();
  for (const CopyRun& run : runs) {
    // The pages under this run are mapped while the previous runs' copies are still in
    // flight on the stream: page-table work overlaps the transfer.
    if (auto ok = map_until(run.slot_offset + run.bytes); !ok) return fail(ok.error());
    auto src = source.wait_bytes(*run.file, run.file_offset, run.bytes);
    if (!src) return fail(src.error());
    // Runs are at most one staging buffer long (copy_runs cuts them at kCopyPages pages).
    Staging& st = staging_[report.copies % staging_.size()];
    if (st.in_flight) {
      if (auto ok = driver_->event_synchronize(st.done); !ok) {
        return fail(driver_error(ok.error(), fmt::format("slot {}: waiting for a copy", id)));
      }
      st.in_flight = false;
    }
    std::memcpy(st.buffer, *src, run.bytes);
    if (auto ok = driver_->memcpy_htod_async(s->va->base() + run.slot_offset, st.buffer, run.bytes,
                                             stream_);
        !ok) {
      return fail(driver_error(ok.error(), fmt::format("slot {}: copying {} bytes {}+{}", id,
                                                       *run.file, run.file_offset, run.bytes)));
    }
    if (auto ok = driver_->event_record(st.done, stream_); !ok) {
      return fail(driver_error(ok.error(), fmt::format("slot {}: recording a copy", id)));
    }
    st.in_flight = true;
    ++report.copies;
    report.bytes_copied += run.bytes;
    if (options.on_progress) options.on_progress(report.bytes_copied, total);
  }
  if (auto ok = map_until(end); !ok) return fail(ok.error());  // pages of padding only
  if (auto ok = driver_->stream_synchronize(stream_); !ok) {
    return fail(driver_error(ok.error(), fmt::format("slot {}: waiting for the copies", id)));
  }
  for (Staging& st : staging_) st.in_flight = false;
  {
    std::lock_guard lock(mutex_);
    s->loaded_bytes = end;
    s->layers_resident = end < layout.extent() && options.layers ? *options.layers : -1;
    if (before != SlotState::active) s->state = SlotState::prewarmed;
    s->prewarming = false;
    s->prewarmed_at = ++prewarm_clock_;
  }
  changed_.notify_all();
  report.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return report;
}

// --- activation and KV -------------------------------------------------------------------

VmmResult<ActivationReport> GpuMemory::activate(SlotId id, const ActivationOptions& options) {
  const auto t0 = SteadyClock::now();
  ActivationReport report;
  {
    std::lock_guard lock(mutex_);
    auto found = require_locked(id);
    if (!found) return std::unexpected(found.error());
    Slot& s = **found;
    if (s.state != SlotState::prewarmed) {
      return vmm_failure(
          VmmErrc::bad_state,
          fmt::format("slot {} ({}) is {}; only a prewarmed slot can be activated{}", id, s.model,
                      to_string(s.state),
                      s.state == SlotState::loading ? " (wait for its prewarm)" : ""));
    }
    // A draining slot does not block: its KV pages go back to the pool on the background
    // thread before this slot's KV job runs (jobs run in order), so a switch costs no wait.
    for (const auto& [other_id, other] : slots_) {
      if (other->state == SlotState::active) {
        return vmm_failure(VmmErrc::bad_state,
                           fmt::format("slot {} ({}) is {} on this GPU; deactivate it first",
                                       other_id, other->model, to_string(other->state)));
      }
    }
    const std::size_t page = pool_->page_bytes();
    const std::size_t kv_pages_max = s.va->page_count() - kv_first_page(s);
    const std::size_t want = options.kv_bytes == 0
                                 ? kv_pages_max
                                 : std::min(kv_pages_max, pages_for(options.kv_bytes, page));
    s.state = SlotState::active;
    s.kv_target_bytes = static_cast<std::uint64_t>(want) * page;
    s.kv_next = kv_first_page(s);
    s.kv_done = false;
    s.kv_error.reset();
    report.base = s.va->base();
    report.weight_bytes = s.weight_bytes;
    report.kv_offset = static_cast<std::uint64_t>(kv_first_page(s)) * page;
    report.kv_target_bytes = s.kv_target_bytes;
  }
  // Everything below the weights is mapped already; the KV pages follow in the background.
  post([this, id] { map_kv_job(id); });
  report.critical_path = SteadyClock::now() - t0;
  return report;
}

void GpuMemory::map_kv_job(SlotId id) {
  (void)make_current();
  for (;;) {
    std::unique_lock lock(mutex_);
    Slot* s = find_locked(id);
    if (s == nullptr || s->state != SlotState::active || stopping_) break;
    const std::size_t target_end =
        kv_first_page(*s) + pages_for(s->kv_target_bytes, pool_->page_bytes());
    if (s->kv_next >= target_end || s->kv_next >= s->va->page_count()) {
      s->kv_done = true;
      break;
    }
    if (s->va->page_at(s->kv_next)) {  // reclaimed or left from before
      ++s->kv_next;
      continue;
    }
    if (pool_->count(PageUse::free) == 0) {
      // A draining slot is giving its KV pages back (on the other worker): take them as
      // they come rather than evicting a prewarmed model.
      const bool draining = std::any_of(slots_.begin(), slots_.end(), [](const auto& e) {
        return e.second->state == SlotState::draining;
      });
      if (draining) {
        changed_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      // Free a prewarmed slot, least recently prewarmed first, unless exports pin it.
      Slot* victim = nullptr;
      for (auto& [other_id, other] : slots_) {
        if (other_id == id || other->state != SlotState::prewarmed || pinned_locked(*other))
          continue;
        if (other->va->mapped_count() == 0 && other->lent_unused.empty()) continue;
        if (victim == nullptr || other->prewarmed_at < victim->prewarmed_at) victim = other.get();
      }
      if (victim == nullptr || !unmap_all_locked(*victim)) {
        // The budget cannot be met: settle for what is mapped.
        s->kv_target_bytes =
            static_cast<std::uint64_t>(s->kv_next - kv_first_page(*s)) * pool_->page_bytes();
        s->kv_done = true;
        break;
      }
      victim->state = SlotState::empty;
      victim->weight_bytes = victim->loaded_bytes = 0;
      continue;
    }
    auto taken = pool_->take(1, PageOwner{PageUse::kv, id});
    if (!taken) {
      s->kv_error = taken.error();
      s->kv_done = true;
      break;
    }
    if (auto ok = s->va->map(s->kv_next, taken->front(), pool_->handle(taken->front())); !ok) {
      pool_->release(*taken);
      s->kv_error = ok.error();
      s->kv_done = true;
      break;
    }
    ++s->kv_next;
    lock.unlock();
    changed_.notify_all();
  }
  changed_.notify_all();
}

VmmResult<std::uint64_t> GpuMemory::ensure_kv(SlotId id, std::uint64_t bytes,
                                              std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  auto found = require_locked(id);
  if (!found) return std::unexpected(found.error());
  Slot* s = *found;
  if (s->state != SlotState::active) {
    return vmm_failure(VmmErrc::bad_state,
                       fmt::format("slot {} is {}; KV is mapped only for the active slot", id,
                                   to_string(s->state)));
  }
  const std::size_t page = pool_->page_bytes();
  auto mapped = [&] { return static_cast<std::uint64_t>(s->kv_next - kv_first_page(*s)) * page; };
  changed_.wait_for(lock, timeout, [&] {
    return mapped() >= bytes || s->kv_done || s->state != SlotState::active;
  });
  if (mapped() >= bytes) return mapped();
  if (s->kv_error) return std::unexpected(*s->kv_error);
  return vmm_failure(
      VmmErrc::pool_exhausted,
      fmt::format("slot {}: {} bytes of KV asked for, {} mapped{}", id, bytes, mapped(),
                  s->kv_done ? " (the pool has no more pages to give)" : " so far"));
}

VmmResult<void> GpuMemory::deactivate(SlotId id) {
  {
    std::lock_guard lock(mutex_);
    auto found = require_locked(id);
    if (!found) return std::unexpected(found.error());
    if ((*found)->state != SlotState::active) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} is {}, not active", id, to_string((*found)->state)));
    }
    if ((*found)->prewarming) {
      return vmm_failure(VmmErrc::bad_state,
                         fmt::format("slot {} is still being prewarmed; deactivate it when its "
                                     "prewarm returns",
                                     id));
    }
    (*found)->state = SlotState::draining;
  }
  post([this, id] { drain_job(id); });
  return {};
}

void GpuMemory::drain_job(SlotId id) {
  (void)make_current();
  {
    std::unique_lock lock(mutex_);
    Slot* s = find_locked(id);
    if (s == nullptr) return;
    // One page at a time, the lock dropped and waiters told as each is free, so a slot
    // activated meanwhile maps it at once (nothing else touches a draining slot's pages).
    // The driver call runs unlocked: a KV job of a newly active slot waits on this lock
    // for each page it maps, and would otherwise wait for the whole drain.
    for (std::size_t i = s->va->page_count(); i-- > kv_first_page(*s);) {
      if (!s->va->page_at(i)) continue;
      lock.unlock();
      const bool unmapped = s->va->unmap_only(i).has_value();
      lock.lock();
      if (!unmapped) continue;  // stays mapped and owned
      const PageId p = s->va->forget(i);
      pool_->release(std::span(&p, 1));
      lock.unlock();
      changed_.notify_all();
      lock.lock();
    }
    // Pages lent to other slots stay with them (WarmServe: the worker turns universal
    // holding both the old model and the proactively prewarmed ones).
    for (auto& [other_id, other] : slots_) {
      for (PageId p : pool_->pages_of(PageOwner{PageUse::lent, other_id})) {
        pool_->reassign(p, PageOwner{PageUse::weights, other_id});
      }
      pool_->release(other->lent_unused);
      other->lent_unused.clear();
    }
    s->kv_next = kv_first_page(*s);
    s->kv_target_bytes = 0;
    s->kv_done = true;
    s->state = SlotState::prewarmed;
  }
  changed_.notify_all();
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

// --- proactive prewarm -------------------------------------------------------------------

VmmResult<std::size_t> GpuMemory::lend_kv(SlotId active, SlotId borrower,
                                          std::uint64_t keep_bytes) {
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  std::lock_guard lock(mutex_);
  auto a = require_locked(active);
  if (!a) return std::unexpected(a.error());
  auto b = require_locked(borrower);
  if (!b) return std::unexpected(b.error());
  Slot& A = **a;
  Slot& B = **b;
  if (A.state != SlotState::active) {
    return vmm_failure(VmmErrc::bad_state,
                       fmt::format("slot {} is {}; only the active slot lends KV pages", active,
                                   to_string(A.state)));
  }
  if (active == borrower || (B.state != SlotState::empty && B.state != SlotState::prewarmed)) {
    return vmm_failure(VmmErrc::bad_state,
                       fmt::format("slot {} is {}; pages are lent to an empty or prewarmed slot",
                                   borrower, to_string(B.state)));
  }
  const std::size_t page = pool_->page_bytes();
  const std::size_t keep_end = kv_first_page(A) + pages_for(keep_bytes, page);
  // The worker must not map the lent range again.
  A.kv_target_bytes = std::min<std::uint64_t>(
      A.kv_target_bytes, static_cast<std::uint64_t>(keep_end - kv_first_page(A)) * page);
  std::size_t lent = 0;
  while (A.kv_next > keep_end) {
    const std::size_t index = A.kv_next - 1;
    if (A.va->page_at(index)) {
      auto p = A.va->unmap(index);
      if (!p) return std::unexpected(p.error());
      pool_->reassign(*p, PageOwner{PageUse::lent, borrower});
      B.lent_unused.push_back(*p);
      ++lent;
    }
    --A.kv_next;
  }
  return lent;
}

VmmResult<std::size_t> GpuMemory::reclaim_kv(SlotId active, std::uint64_t bytes) {
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  std::unique_lock lock(mutex_);
  auto a = require_locked(active);
  if (!a) return std::unexpected(a.error());
  Slot& A = **a;
  if (A.state != SlotState::active) {
    return vmm_failure(
        VmmErrc::bad_state,
        fmt::format("slot {} is {}; only the active slot reclaims KV", active, to_string(A.state)));
  }
  const std::size_t page = pool_->page_bytes();
  const std::size_t want = pages_for(bytes, page);
  std::size_t got = 0;
  auto give_to_active = [&](PageId p) -> VmmResult<void> {
    pool_->reassign(p, PageOwner{PageUse::kv, active});
    if (auto ok = A.va->map(A.kv_next, p, pool_->handle(p)); !ok) {
      pool_->release(std::span(&p, 1));
      return std::unexpected(ok.error());
    }
    ++A.kv_next;
    A.kv_target_bytes += page;
    ++got;
    return {};
  };
  for (auto& [id, B] : slots_) {  // unused lent pages first: nothing is lost
    while (got < want && !B->lent_unused.empty() && A.kv_next < A.va->page_count()) {
      const PageId p = B->lent_unused.back();
      B->lent_unused.pop_back();
      if (auto ok = give_to_active(p); !ok) return std::unexpected(ok.error());
    }
  }
  for (auto& [id, B] : slots_) {  // then pages holding a borrower's weights, highest first
    for (std::size_t i = B->va->page_count(); i-- > 0 && got < want;) {
      auto p = B->va->page_at(i);
      if (!p || pool_->owner(*p).use != PageUse::lent || A.kv_next >= A.va->page_count()) continue;
      auto unmapped = B->va->unmap(i);
      if (!unmapped) return std::unexpected(unmapped.error());
      B->loaded_bytes =
          std::min<std::uint64_t>(B->loaded_bytes, static_cast<std::uint64_t>(i) * page);
      B->layers_resident = B->loaded_bytes == 0 ? -1 : 0;
      if (B->loaded_bytes == 0 && B->va->mapped_count() == 0) {
        B->state = SlotState::empty;
        B->weight_bytes = 0;
      }
      if (auto ok = give_to_active(*unmapped); !ok) return std::unexpected(ok.error());
    }
  }
  lock.unlock();
  changed_.notify_all();
  return got;
}

// --- export ------------------------------------------------------------------------------

VmmResult<ExportedRange> GpuMemory::export_range(SlotId id, std::uint64_t offset,
                                                 std::uint64_t length) {
  std::lock_guard lock(mutex_);
  auto found = require_locked(id);
  if (!found) return std::unexpected(found.error());
  Slot& s = **found;
  if (s.state != SlotState::prewarmed && s.state != SlotState::active) {
    return vmm_failure(VmmErrc::bad_state, fmt::format("slot {} is {}; export needs it prewarmed "
                                                       "or active",
                                                       id, to_string(s.state)));
  }
  const std::size_t page = pool_->page_bytes();
  if (length == 0 || offset + length > s.va->page_count() * page) {
    return vmm_failure(
        VmmErrc::invalid_argument,
        fmt::format("slot {}: bytes {}+{} are outside the slot", id, offset, length));
  }
  ExportedRange out;
  std::vector<std::pair<SlotId, PageId>> pinned;
  auto close_all = [&] {
    for (auto& e : out.pages) ::close(e.fd);
  };
  for (std::size_t i = offset / page; i * page < offset + length; ++i) {
    auto p = s.va->page_at(i);
    if (!p) {
      close_all();
      return vmm_failure(VmmErrc::invalid_argument,
                         fmt::format("slot {}: page at offset {} is not mapped; prewarm (or "
                                     "ensure_kv) before exporting it",
                                     id, i * page));
    }
    auto fd = pool_->export_fd(*p);
    if (!fd) {
      close_all();
      return std::unexpected(fd.error());
    }
    out.pages.push_back(ExportedPage{*fd, static_cast<std::uint64_t>(i) * page, page});
    pinned.emplace_back(id, *p);
  }
  out.token = next_token_++;
  exports_.emplace(out.token, std::move(pinned));
  return out;
}

VmmResult<void> GpuMemory::confirm_import(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  if (exports_.erase(token) == 0) {
    return vmm_failure(VmmErrc::unknown_export,
                       fmt::format("no pending export {} (already confirmed?)", token));
  }
  return {};
}

VmmResult<std::size_t> GpuMemory::free_weight_pages(SlotId id,
                                                    std::span<const std::uint64_t> offsets) {
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  std::lock_guard lock(mutex_);
  auto found = require_locked(id);
  if (!found) return std::unexpected(found.error());
  Slot& s = **found;
  if (s.state != SlotState::prewarmed && s.state != SlotState::active) {
    return vmm_failure(VmmErrc::bad_state, fmt::format("slot {} is {}; only a prewarmed or active "
                                                       "slot's weight pages can be freed",
                                                       id, to_string(s.state)));
  }
  const std::size_t page = pool_->page_bytes();
  const std::size_t weight_pages = pages_for(s.weight_bytes, page);
  std::size_t freed = 0;
  for (std::uint64_t offset : offsets) {
    const std::size_t index = static_cast<std::size_t>(offset / page);
    if (offset % page != 0 || index >= weight_pages) {
      return vmm_failure(VmmErrc::invalid_argument,
                         fmt::format("slot {}: {} is not the offset of a page of its weights "
                                     "region ({} pages of {} bytes)",
                                     id, offset, weight_pages, page));
    }
    if (!s.va->page_at(index)) continue;  // freed already
    auto p = s.va->unmap(index);
    if (!p) return std::unexpected(p.error());
    pool_->release(std::span(&*p, 1));
    // The engine needs the room for its own memory: the driver gets the page back until
    // the engine is gone (take_back_returned).
    (void)pool_->give_back(std::span(&*p, 1), id);
    s.loaded_bytes = std::min<std::uint64_t>(s.loaded_bytes, offset);
    ++freed;
  }
  bool any_weights = false;
  for (std::size_t i = 0; i < weight_pages && !any_weights; ++i)
    any_weights = s.va->page_at(i).has_value();
  if (!any_weights && s.state == SlotState::prewarmed && s.va->mapped_count() == 0) {
    s.state = SlotState::empty;
    s.weight_bytes = s.loaded_bytes = 0;
    s.layers_resident = -1;
  }
  changed_.notify_all();
  return freed;
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

VmmResult<std::optional<std::uint64_t>> GpuMemory::find_difference(SlotId id,
                                                                   const WeightLayout& layout,
                                                                   WeightSource& source) {
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  CUdeviceptr base = 0;
  std::uint64_t loaded = 0;
  {
    std::lock_guard lock(mutex_);
    auto found = require_locked(id);
    if (!found) return std::unexpected(found.error());
    base = (*found)->va->base();
    loaded = (*found)->loaded_bytes;
  }
  // Read back through a bounded buffer: a slot holds gigabytes.
  constexpr std::uint64_t kChunk = 8ull << 20;
  std::vector<std::byte> buffer(kChunk);
  for (const LayoutPiece& p : layout.pieces()) {
    if (p.slot_end() > loaded) break;  // only the resident prefix is promised
    for (std::uint64_t done = 0; done < p.bytes;) {
      const std::uint64_t n = std::min(kChunk, p.bytes - done);
      auto expected = source.wait_bytes(p.file, p.file_offset + done, n);
      if (!expected) return std::unexpected(expected.error());
      if (auto ok = driver_->memcpy_dtoh(buffer.data(), base + p.slot_offset + done, n); !ok) {
        return std::unexpected(driver_error(ok.error(), fmt::format("reading slot {} back", id)));
      }
      if (std::memcmp(buffer.data(), *expected, n) != 0) return p.slot_offset;
      done += n;
    }
  }
  return std::nullopt;
}

VmmResult<std::size_t> GpuMemory::lend_to_engine(SlotId id, std::size_t max_pages) {
  if (auto ok = make_current(); !ok) return std::unexpected(ok.error());
  std::lock_guard lock(mutex_);
  if (id != kNoSlot) {
    if (auto found = require_locked(id); !found) return std::unexpected(found.error());
  }
  std::vector<PageId> free = pool_->pages_of(PageOwner{});
  if (free.size() > max_pages) free.resize(max_pages);
  const std::size_t given = pool_->give_back(free, id);
  if (given != 0) changed_.notify_all();
  return given;
}

std::size_t GpuMemory::take_back_returned() {
  if (pool_->count(PageUse::returned) == 0) return 0;
  if (!make_current()) return 0;
  const std::size_t n = pool_->take_back();
  if (n != 0) changed_.notify_all();
  return n;
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
