// GpuMemory: pages handed to an engine process — export_range / confirm_import (page
// descriptors for the shim, pinned until imported), free_weight_pages (weights an engine
// copied into its own memory), and lend_to_engine / take_back_returned (free pages given
// back to the driver for the engine's own allocations, and re-created once it is gone),
// and find_difference (whether a slot an engine gave back still holds its layout's bytes).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "vmm/gpu_memory.hpp"
#include "vmm/gpu_memory_internal.hpp"

namespace thaw::vmm {

using detail::pages_for;

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

}  // namespace thaw::vmm
