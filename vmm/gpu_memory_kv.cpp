// GpuMemory: activation and the active slot's KV region — activate (no driver call on the
// critical path), the background job that maps KV pages (evicting prewarmed slots when the
// pool runs dry), ensure_kv, and deactivate with its background drain.
#include <fmt/format.h>

#include <algorithm>

#include "vmm/gpu_memory.hpp"
#include "vmm/gpu_memory_internal.hpp"

namespace thaw::vmm {

using SteadyClock = std::chrono::steady_clock;
using detail::pages_for;

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

}  // namespace thaw::vmm
