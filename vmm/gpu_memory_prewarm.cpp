// GpuMemory: prewarm — a model's weights copied into a slot (all, or the first k layers,
// resumable) through the pinned staging buffers, the pages under each copy mapped while
// earlier copies transfer.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "vmm/gpu_memory.hpp"
#include "vmm/gpu_memory_internal.hpp"

namespace thaw::vmm {

using SteadyClock = std::chrono::steady_clock;
using detail::kCopyPages;
using detail::pages_for;

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

}  // namespace thaw::vmm
