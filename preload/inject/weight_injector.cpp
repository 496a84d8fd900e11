#include "preload/inject/weight_injector.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace thaw::preload {

bool InjectorDriver::complete() const {
  return mem_import && mem_address_reserve && mem_address_free && mem_map && mem_unmap &&
         mem_release && mem_set_access && memcpy_dtod_async && stream_synchronize && event_create &&
         event_record && event_query && event_synchronize && event_destroy && ctx_get_device;
}

WeightInjector::~WeightInjector() {
  if (importer_.joinable()) importer_.join();
}

WeightInjector::WeightInjector(InjectorDriver driver, InjectorEnvironment env, SlotGrant grant)
    : driver_(driver), env_(std::move(env)), grant_(std::move(grant)) {
  const std::uint64_t page = std::max<std::uint64_t>(grant_.page_bytes, 1);
  for (std::size_t i = 0; i < grant_.pieces.size(); ++i) {
    // Only what is resident counts: a piece the resident prefix ends inside is cut there.
    SlotPiece& p = grant_.pieces[i];
    if (p.slot_offset >= grant_.resident_bytes) p.bytes = 0;
    p.bytes =
        std::min(p.bytes, grant_.resident_bytes - std::min(p.slot_offset, grant_.resident_bytes));
    if (p.bytes == 0) continue;
    by_file_[p.file][p.file_offset] = i;
    for (std::uint64_t at = p.slot_offset; at < p.slot_end();) {
      const std::uint64_t page_start = at / page * page;
      const std::uint64_t end = std::min(p.slot_end(), page_start + page);
      page_left_[page_start] += end - at;
      at = end;
    }
  }
}

std::optional<std::vector<WeightInjector::Segment>> WeightInjector::cover_locked(
    const std::string& file, std::uint64_t file_offset, std::uint64_t bytes) const {
  auto in_file = by_file_.find(file);
  if (in_file == by_file_.end()) return std::nullopt;
  std::vector<Segment> out;
  std::uint64_t at = file_offset;
  const std::uint64_t end = file_offset + bytes;
  while (at < end) {
    auto it = in_file->second.upper_bound(at);
    if (it == in_file->second.begin()) return std::nullopt;
    const SlotPiece& p = grant_.pieces[std::prev(it)->second];
    if (at >= p.file_offset + p.bytes) return std::nullopt;  // a gap in what the slot holds
    const std::uint64_t n = std::min(end, p.file_offset + p.bytes) - at;
    const std::uint64_t slot_at = p.slot_offset + (at - p.file_offset);
    if (!out.empty() && out.back().slot_offset + out.back().bytes == slot_at) {
      out.back().bytes += n;
    } else {
      out.push_back({slot_at, n});
    }
    at += n;
  }
  return out;
}

void WeightInjector::start_import() {
  std::lock_guard lock(mutex_);
  start_import_locked();
}

void WeightInjector::start_import_locked() {
  if (import_started_) return;
  import_started_ = true;
  // Imports run beside the engine, in slot order (the order its allocations ask for pages),
  // so that a page is usually in by the time the layout maps it.
  importer_ = std::thread([this, pages = std::move(grant_.pages)]() mutable {
    for (auto& [offset, fd] : pages) {
      CUmemGenericAllocationHandle h = 0;
      const CUresult r =
          driver_.mem_import(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      fd.reset();  // the handle holds the memory
      std::lock_guard lock(mutex_);
      if (r != CUDA_SUCCESS) {
        if (env_.notice) {
          env_.notice(
              fmt::format("slot {}: importing its page at {:#x} failed (CUDA error {}); "
                          "weights load from the files instead",
                          grant_.slot, offset, static_cast<int>(r)));
        }
        import_failed_ = true;
        imported_cv_.notify_all();
        return;
      }
      handles_[offset] = h;
      imported_cv_.notify_all();
    }
    std::lock_guard lock(mutex_);
    imported_ = true;
    imported_cv_.notify_all();
  });
}

bool WeightInjector::import_locked(std::unique_lock<std::mutex>& lock) {
  start_import_locked();
  imported_cv_.wait(lock, [&] { return imported_ || import_failed_; });
  return imported_;
}

std::optional<CUmemGenericAllocationHandle> WeightInjector::handle_locked(
    std::unique_lock<std::mutex>& lock, std::uint64_t offset) {
  start_import_locked();
  imported_cv_.wait(lock, [&] { return handles_.contains(offset) || imported_ || import_failed_; });
  if (import_failed_) return std::nullopt;
  auto h = handles_.find(offset);
  if (h == handles_.end()) return std::nullopt;
  return h->second;
}

CUresult WeightInjector::map_for_copy_locked(std::unique_lock<std::mutex>& lock) {
  if (view_ != 0) return CUDA_SUCCESS;
  if (view_failed_ || !import_locked(lock) || handles_.empty()) return CUDA_ERROR_NOT_SUPPORTED;
  CUdevice device = 0;
  CUresult r = driver_.ctx_get_device(&device);
  const std::uint64_t page = grant_.page_bytes;
  const std::uint64_t bytes = std::prev(handles_.end())->first + page;
  CUdeviceptr va = 0;
  if (r == CUDA_SUCCESS) r = driver_.mem_address_reserve(&va, bytes, 0, 0, 0);
  std::vector<std::uint64_t> mapped;
  for (auto& [offset, h] : handles_) {
    if (r != CUDA_SUCCESS) break;
    r = driver_.mem_map(va + offset, page, 0, h, 0);
    if (r != CUDA_SUCCESS) break;
    mapped.push_back(offset);
    // Read-only: the engine's copies read the slot, nothing here may write it.
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    r = driver_.mem_set_access(va + offset, page, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    for (std::uint64_t offset : mapped) (void)driver_.mem_unmap(va + offset, page);
    if (va != 0) (void)driver_.mem_address_free(va, bytes);
    view_failed_ = true;
    if (env_.notice) {
      env_.notice(
          fmt::format("slot {}: mapping its pages failed (CUDA error {}); weights load "
                      "from the files instead",
                      grant_.slot, static_cast<int>(r)));
    }
    return r;
  }
  view_ = va;
  view_bytes_ = bytes;
  return CUDA_SUCCESS;
}

bool WeightInjector::zero_copy_locked(std::uint64_t granularity) {
  if (zero_copy_) return *zero_copy_;
  bool on = grant_.layout_kind == layout::LayoutKind::engine && !grant_.record_fingerprint.empty();
  std::string why;
  if (on) {
    const auto mine = env_.record_fingerprint ? env_.record_fingerprint() : std::nullopt;
    if (!mine || *mine != grant_.record_fingerprint) {
      on = false;
      why = "the slot was prewarmed from another layout record than this run follows";
    }
  }
  if (on) {
    if (granularity != grant_.page_bytes) {
      on = false;
      why = "the slot's pages are not the layout's granularity";
    }
  }
  if (!on && !why.empty() && env_.notice) {
    env_.notice(fmt::format("slot {}: no zero-copy ({}); its weights are copied on the GPU",
                            grant_.slot, why));
  }
  zero_copy_ = on;
  stats_.zero_copy = on;
  return on;
}

std::optional<CUmemGenericAllocationHandle> WeightInjector::page_at(std::uint64_t region_offset,
                                                                    std::uint64_t granularity) {
  std::unique_lock lock(mutex_);
  // Only pages holding resident weight bytes: the rest of an allocation is fresh memory.
  if (!page_left_.contains(region_offset) || engine_pages_.contains(region_offset)) {
    return std::nullopt;
  }
  if (!zero_copy_locked(granularity)) return std::nullopt;
  auto h = handle_locked(lock, region_offset);
  if (!h) return std::nullopt;
  engine_pages_.insert(region_offset);
  ++stats_.pages_mapped;
  return h;
}

std::optional<CUresult> WeightInjector::copy(CUdeviceptr dst,
                                             std::optional<std::uint64_t> region_offset,
                                             bool backed, const std::string& model,
                                             const std::string& file, std::uint64_t file_offset,
                                             std::uint64_t bytes, CUstream stream,
                                             bool synchronous) {
  std::unique_lock lock(mutex_);
  reap_locked(false);
  auto segments = model == grant_.model ? cover_locked(file, file_offset, bytes) : std::nullopt;
  if (!segments) {
    stats_.bytes_copied += bytes;
    return std::nullopt;
  }
  // Zero-copy: the destination is the slot's own bytes, at the very pages the layout put
  // the slot's pages — and nothing has written them since.
  if (backed && region_offset && zero_copy_.value_or(false) && !stats_.dirty &&
      segments->size() == 1 && segments->front().slot_offset == *region_offset) {
    const std::uint64_t page = grant_.page_bytes;
    bool all_slot = true;
    for (std::uint64_t p = *region_offset / page * page; p < *region_offset + bytes; p += page) {
      all_slot = all_slot && engine_pages_.contains(p);
    }
    if (all_slot) {
      stats_.bytes_skipped += bytes;
      return CUDA_SUCCESS;
    }
  }
  if (map_for_copy_locked(lock) != CUDA_SUCCESS) {
    stats_.bytes_copied += bytes;
    return std::nullopt;
  }
  if (backed) stats_.dirty = true;  // a real write into memory that may be the slot's
  std::uint64_t done = 0;
  for (const Segment& s : *segments) {
    const CUresult r =
        driver_.memcpy_dtod_async(dst + done, view_ + s.slot_offset, s.bytes, stream);
    if (r != CUDA_SUCCESS) return r;
    done += s.bytes;
  }
  stats_.bytes_injected += bytes;
  account_locked(*segments, stream);
  if (synchronous) return driver_.stream_synchronize(stream);
  return CUDA_SUCCESS;
}

void WeightInjector::note_write(std::uint64_t region_offset, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const std::uint64_t page = std::max<std::uint64_t>(grant_.page_bytes, 1);
  for (std::uint64_t p = region_offset / page * page; p < region_offset + bytes; p += page) {
    if (engine_pages_.contains(p)) stats_.dirty = true;
  }
}

void WeightInjector::account_locked(const std::vector<Segment>& segments, CUstream stream) {
  const std::uint64_t page = grant_.page_bytes;
  std::vector<std::uint64_t> finished;
  for (const Segment& s : segments) {
    for (std::uint64_t at = s.slot_offset; at < s.slot_offset + s.bytes;) {
      const std::uint64_t page_start = at / page * page;
      const std::uint64_t end = std::min(s.slot_offset + s.bytes, page_start + page);
      auto left = page_left_.find(page_start);
      if (left != page_left_.end() && left->second > 0) {
        left->second -= std::min(left->second, end - at);
        if (left->second == 0 && !engine_pages_.contains(page_start)) {
          finished.push_back(page_start);
        }
      }
      at = end;
    }
  }
  if (finished.empty()) return;
  CUevent done = nullptr;
  if (driver_.event_create(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
  if (driver_.event_record(done, stream) != CUDA_SUCCESS) {
    (void)driver_.event_destroy(done);
    return;
  }
  pending_.push_back({done, std::move(finished)});
}

void WeightInjector::reap_locked(bool wait) {
  std::vector<std::uint64_t> freed;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const CUresult r = wait ? driver_.event_synchronize(it->done) : driver_.event_query(it->done);
    if (r == CUDA_ERROR_NOT_READY) {
      ++it;
      continue;
    }
    (void)driver_.event_destroy(it->done);
    if (r == CUDA_SUCCESS) {
      for (std::uint64_t page : it->pages) {
        auto h = handles_.find(page);
        if (h == handles_.end()) continue;
        (void)driver_.mem_unmap(view_ + page, grant_.page_bytes);
        (void)driver_.mem_release(h->second);
        handles_.erase(h);
        freed.push_back(page);
      }
    }
    it = pending_.erase(it);
  }
  stats_.pages_freed += freed.size();
  unsent_.insert(unsent_.end(), freed.begin(), freed.end());
  // One message per batch: a round trip to thawd per tensor would slow the load down.
  if (unsent_.size() >= kFreeBatch) send_freed_locked();
}

void WeightInjector::send_freed_locked() {
  if (unsent_.empty()) return;
  if (env_.free_pages) env_.free_pages(unsent_);
  unsent_.clear();
}

void WeightInjector::poll() {
  std::lock_guard lock(mutex_);
  reap_locked(false);
  send_freed_locked();
}

bool WeightInjector::finish() {
  std::unique_lock lock(mutex_);
  if (import_started_) imported_cv_.wait(lock, [&] { return imported_ || import_failed_; });
  reap_locked(true);
  send_freed_locked();
  return stats_.pages_freed == 0 && !stats_.dirty && !import_failed_;
}

InjectorStats WeightInjector::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace thaw::preload
