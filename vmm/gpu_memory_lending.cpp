// GpuMemory: proactive prewarm (WarmServe §4.1) — lend_kv unmaps the active slot's KV
// pages above a kept amount and lends them to another slot's prewarm; reclaim_kv takes them
// back, unused ones first, then ones already holding the borrower's weights.
#include <fmt/format.h>

#include <algorithm>

#include "vmm/gpu_memory.hpp"
#include "vmm/gpu_memory_internal.hpp"

namespace thaw::vmm {

using detail::pages_for;

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
}  // namespace thaw::vmm
