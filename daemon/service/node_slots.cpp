// NodeService: prewarm slots (prewarm, activate, deactivate, evict) and handing their pages
// to shim clients (attach, confirm_import, release_owner).
#include <fmt/format.h>
#include <sys/random.h>

#include <charconv>
#include <chrono>
#include <thread>

#include "common/safetensors/model.hpp"
#include "daemon/log/log.hpp"
#include "daemon/prewarm/cache_weight_source.hpp"
#include "daemon/prewarm/engine_layout.hpp"
#include "daemon/service/node_service.hpp"
#include "daemon/service/node_service_state.hpp"
#include "daemon/store/cache/cache_layout.hpp"

namespace thaw::daemon {

namespace {

std::uint64_t random_token() {
  std::uint64_t t = 0;
  while (t == 0) {
    if (::getrandom(&t, sizeof t, 0) != sizeof t) t = 0;
  }
  return t;
}

// The engine layout an engine recorded for this model when there is one that fits the cached
// copy, else the packed layout (said in the journal when a record was refused).
vmm::VmmResult<vmm::WeightLayout> choose_layout(const safetensors::Model& model,
                                                const std::string& key,
                                                const EngineLayoutLookup& lookup,
                                                layout::LayoutKind& kind,
                                                std::string& fingerprint) {
  if (lookup) {
    if (auto text = lookup(key)) {
      auto engine = engine_layout_from_record(*text, model);
      if (engine) {
        kind = layout::LayoutKind::engine;
        fingerprint = engine->fingerprint;
        return std::move(engine->layout);
      }
      log(LogLevel::warning,
          fmt::format("{}: {}; prewarming the packed layout", key, engine.error().message),
          {{"MODEL", key}});
    }
  }
  kind = layout::LayoutKind::packed;
  fingerprint.clear();
  return vmm::WeightLayout::packed(model);
}

}  // namespace

std::string NodeService::slot_id(std::uint32_t gpu, vmm::SlotId slot) {
  return fmt::format("g{}s{}", gpu, slot);
}

ServiceResult<std::pair<std::uint32_t, vmm::SlotId>> NodeService::parse_slot_locked(
    const std::string& id) const {
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return service_error(error_name::kUnknownSlot,
                         fmt::format("no slot \"{}\" (slot ids look like g0s1; list them with "
                                     "thawctl slots)",
                                     id));
  }
  return std::pair{it->second->gpu, it->second->slot};
}

void NodeService::set_engine_layouts(EngineLayoutLookup lookup) {
  std::lock_guard lock(mutex_);
  engine_layouts_ = std::move(lookup);
}

ServiceResult<std::string> NodeService::prewarm(const std::string& model,
                                                std::optional<std::uint32_t> gpu,
                                                std::optional<int> layers) {
  auto key = key_for(model);
  if (!key) return std::unexpected(key.error());
  if (layers && *layers < 0) {
    return service_error(
        error_name::kInvalidArgument,
        fmt::format("cannot prewarm {} layers; give 0 (embeddings only) or more", *layers));
  }
  bool cached_complete = false;
  for (const store::CachedModelInfo& m : cache_.models()) {
    if (m.key != *key || m.files.empty()) continue;
    cached_complete = std::ranges::all_of(
        m.files, [](const auto& f) { return f.state == store::FillState::complete; });
  }

  std::lock_guard lock(mutex_);
  if (shutting_down_) return service_error(error_name::kShuttingDown, "thawd is stopping");
  if (gpus_.empty()) {
    return service_error(error_name::kNoGpu,
                         "thawd has no GPU (no CUDA driver was found, or it reports no device); "
                         "prewarm needs one — see `journalctl -u thawd` for why");
  }
  std::uint32_t index = 0;
  if (gpu) {
    if (*gpu >= gpus_.size()) {
      return service_error(error_name::kUnknownGpu,
                           fmt::format("no GPU {}: this node has {} (0 to {})", *gpu, gpus_.size(),
                                       gpus_.size() - 1));
    }
    index = *gpu;
  } else {
    std::size_t best_free = 0;
    for (std::uint32_t i = 0; i < gpus_.size(); ++i) {
      const std::size_t free = gpus_[i]->pool().free;
      if (i == 0 || free > best_free) {
        best_free = free;
        index = i;
      }
    }
  }

  std::shared_ptr<FetchJob> job;
  if (auto it = fetches_.find(*key); it != fetches_.end() && !it->second->done()) {
    job = it->second;
  } else if (!cached_complete) {
    auto started = start_fetch_locked(model, *key);
    if (!started) return std::unexpected(started.error());
    job = *started;
  }

  auto slot = gpus_[index]->create_slot(*key);
  if (!slot) {
    return service_error(error_name::kGpu, fmt::format("GPU {}: {}", index, slot.error().message));
  }
  auto record = std::make_shared<SlotRecord>();
  record->id = slot_id(index, *slot);
  record->gpu = index;
  record->slot = *slot;
  record->key = *key;
  record->layers = layers;
  record->thread = std::thread([this, record, job] { run_prewarm(record, job); });
  slots_[record->id] = record;
  changed();
  return record->id;
}

void NodeService::run_prewarm(std::shared_ptr<SlotRecord> record, std::shared_ptr<FetchJob> job) {
  std::string error;
  std::vector<vmm::LayoutPiece> pieces;
  std::uint64_t extent = 0;
  layout::LayoutKind kind = layout::LayoutKind::packed;
  std::string fingerprint;
  EngineLayoutLookup lookup;
  {
    std::lock_guard lock(mutex_);
    lookup = engine_layouts_;
  }
  if (job) error = job->wait_for_plan();
  if (error.empty()) {
    // Pinned while its bytes are copied: eviction from the cache must wait.
    auto pin = cache_.pin(record->key);
    auto model =
        safetensors::Model::open(store::cache_layout::model_dir(cache_.root(), record->key));
    if (!pin) {
      error = pin.error().message;
    } else if (!model) {
      error = model.error().message;
    } else if (auto layout = choose_layout(*model, record->key, lookup, kind, fingerprint);
               !layout) {
      error = layout.error().message;
    } else {
      wait_for_returned_pages(record->gpu, layout->extent());
      CacheWeightSource source(cache_, record->key);
      vmm::PrewarmOptions options;
      options.layers = record->layers;
      options.on_progress = [this](std::uint64_t, std::uint64_t) { changed(); };
      if (auto report = gpus_[record->gpu]->prewarm(record->slot, *layout, source, options);
          !report) {
        error = report.error().message;
      } else {
        pieces = layout->pieces();
        extent = layout->extent();
      }
    }
  } else {
    error = "fetching the model failed: " + error;
  }
  const std::string gpu = std::to_string(record->gpu);
  if (error.empty()) {
    log(LogLevel::info,
        fmt::format("slot {}: {} prewarmed in its {} layout ({} bytes{})", record->id, record->key,
                    layout::to_string(kind), extent,
                    record->layers ? fmt::format(", layers below {}", *record->layers) : ""),
        {{"MODEL", record->key}, {"SLOT", record->id}, {"GPU", std::to_string(record->gpu)}});
  } else {
    log(LogLevel::warning,
        fmt::format("slot {}: prewarming {} failed: {}", record->id, record->key, error),
        {{"MODEL", record->key}, {"SLOT", record->id}, {"GPU", gpu}});
  }
  std::lock_guard lock(mutex_);
  record->prewarming = false;
  record->thread_finished = true;
  record->error = std::move(error);
  record->layout = std::move(pieces);
  record->weight_bytes = extent;
  if (record->error.empty()) {
    record->layout_kind = kind;
    record->record_fingerprint = fingerprint;
  }
  changed();
}

void NodeService::wait_for_returned_pages(std::uint32_t gpu_index, std::uint64_t bytes) {
  // An engine that just exited may still hold the pool's pages it was lent (the driver frees
  // a process's memory a moment after it is gone), and a slot just deactivated may still be
  // draining its KV cache: a prewarm started then waits for them rather than failing for
  // want of pages that are on their way back — a few seconds at
  // most, and never while another engine still needs the driver's room.
  vmm::GpuMemory& gpu = *gpus_[gpu_index];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (engine_needs_driver_room_locked(gpu_index)) return;
      (void)gpu.take_back_returned();
    }
    // A slot just deactivated gives its KV pages back on the GPU's worker, a moment later:
    // those are on their way back too.
    bool draining = false;
    for (const vmm::SlotInfo& s : gpu.slots()) draining |= s.state == vmm::SlotState::draining;
    const vmm::PoolInfo pool = gpu.pool();
    if ((pool.returned == 0 && !draining) || pool.free * pool.page_bytes >= bytes ||
        std::chrono::steady_clock::now() >= deadline) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServiceResult<void> NodeService::activate(const std::string& id, std::uint64_t kv_bytes) {
  std::lock_guard lock(mutex_);
  auto where = parse_slot_locked(id);
  if (!where) return std::unexpected(where.error());
  const SlotRecord& record = *slots_.at(id);
  if (record.prewarming) {
    return service_error(error_name::kSlotBusy,
                         fmt::format("slot {} is still prewarming {}; wait for it to be "
                                     "prewarmed (thawctl wait {})",
                                     id, record.key, record.key));
  }
  vmm::GpuMemory& gpu = *gpus_[where->first];
  vmm::ActivationOptions options;
  // 0: what is free now, so activating never evicts other prewarmed slots unasked.
  options.kv_bytes = kv_bytes != 0 ? kv_bytes : gpu.pool().free * gpu.pool().page_bytes;
  auto report = gpu.activate(where->second, options);
  if (!report) {
    return service_error(error_name::kGpu,
                         fmt::format("activating {}: {}", id, report.error().message));
  }
  counters_.activations.fetch_add(1);
  log(LogLevel::info,
      fmt::format(
          "slot {}: {} active in {} us (critical path)", id, record.key,
          std::chrono::duration_cast<std::chrono::microseconds>(report->critical_path).count()),
      {{"MODEL", record.key}, {"SLOT", id}, {"GPU", std::to_string(where->first)}});
  changed();
  return {};
}

ServiceResult<void> NodeService::deactivate(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto where = parse_slot_locked(id);
  if (!where) return std::unexpected(where.error());
  if (auto ok = gpus_[where->first]->deactivate(where->second); !ok) {
    return service_error(error_name::kGpu,
                         fmt::format("deactivating {}: {}", id, ok.error().message));
  }
  changed();
  return {};
}

ServiceResult<void> NodeService::evict(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto where = parse_slot_locked(id);
  if (!where) return std::unexpected(where.error());
  SlotRecord& record = *slots_.at(id);
  if (record.evicting) return {};  // already on its way out (reap() removes it)
  if (record.prewarming || record.verifying) {
    return service_error(error_name::kSlotBusy,
                         fmt::format("slot {} is still {}; evict it once it is prewarmed", id,
                                     record.prewarming ? "prewarming" : "being checked"));
  }
  if (!record.owner.empty()) {
    return service_error(error_name::kSlotBusy,
                         fmt::format("slot {} is held by an engine ({}); it is evictable once "
                                     "that engine releases it or exits",
                                     id, record.owner));
  }
  vmm::GpuMemory& gpu = *gpus_[where->first];
  auto info = gpu.slot(where->second);
  if (info && info->state == vmm::SlotState::empty) {
    (void)gpu.destroy_slot(where->second);  // a failed prewarm left nothing mapped
    slots_.erase(id);
    changed();
    return {};
  }
  if (info && info->state == vmm::SlotState::active) {
    return service_error(error_name::kSlotBusy,
                         fmt::format("slot {} is active; deactivate it first (thawctl "
                                     "deactivate {})",
                                     id, id));
  }
  if (auto ok = gpu.evict(where->second); !ok) {
    return service_error(error_name::kGpu, fmt::format("evicting {}: {}", id, ok.error().message));
  }
  record.evicting = true;
  log(LogLevel::info, fmt::format("slot {}: evicting {}", id, record.key),
      {{"MODEL", record.key}, {"SLOT", id}, {"GPU", std::to_string(where->first)}});
  changed();
  return {};
}

void NodeService::reap_slots_locked(std::vector<std::thread>& done) {
  for (auto it = slots_.begin(); it != slots_.end();) {
    SlotRecord& r = *it->second;
    if (r.thread_finished && r.thread.joinable()) done.push_back(std::move(r.thread));
    auto info = gpus_[r.gpu]->slot(r.slot);
    const bool empty = !info || info->state == vmm::SlotState::empty;
    // The GPU empties a prewarmed slot itself to make room (an activated model's KV cache
    // takes the pages of the least recently prewarmed one): such a slot holds nothing and
    // would count against gpu.max_slots for ever. A failed prewarm stays, to show why.
    const bool emptied_by_gpu =
        empty && !r.evicting && !r.prewarming && !r.verifying && r.owner.empty() && r.error.empty();
    if ((r.evicting || emptied_by_gpu) && empty) {
      if (emptied_by_gpu) {
        log(LogLevel::info,
            fmt::format("slot {}: {} was evicted by the GPU to make room; removed", r.id, r.key),
            {{"MODEL", r.key}, {"SLOT", r.id}, {"GPU", std::to_string(r.gpu)}});
      }
      (void)gpus_[r.gpu]->destroy_slot(r.slot);
      it = slots_.erase(it);
      changed();
      continue;
    }
    ++it;
  }
}

SlotStatus NodeService::slot_status_locked(const SlotRecord& r) const {
  SlotStatus s;
  s.id = r.id;
  s.gpu = r.gpu;
  s.model = r.key;
  s.owner = r.owner;
  s.error = r.error;
  s.layout = r.layout_kind;
  s.layers = r.layers.value_or(-1);
  if (auto info = gpus_[r.gpu]->slot(r.slot)) {
    s.state = std::string(vmm::to_string(info->state));
    s.resident_bytes = info->loaded_bytes;
    s.total_bytes = info->weight_bytes;
  }
  if (!r.prewarming && !r.error.empty() && s.state == "empty") s.state = "failed";
  // The GPU may call the slot prewarmed a moment before its prewarm thread has finished (and
  // before attach/activate accept it): until then it is still loading.
  if (r.prewarming && s.state == "prewarmed") s.state = "loading";
  if (r.verifying) s.state = "verifying";  // handed back; offered again once checked
  return s;
}

std::vector<SlotStatus> NodeService::slots() const {
  std::lock_guard lock(mutex_);
  std::vector<SlotStatus> out;
  for (const auto& [id, record] : slots_) out.push_back(slot_status_locked(*record));
  return out;
}

ServiceResult<SlotStatus> NodeService::slot(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return service_error(error_name::kUnknownSlot, fmt::format("no slot \"{}\"", id));
  }
  return slot_status_locked(*it->second);
}

std::vector<GpuStatus> NodeService::gpus() const {
  std::lock_guard lock(mutex_);
  std::vector<GpuStatus> out;
  for (std::uint32_t i = 0; i < gpus_.size(); ++i) {
    const vmm::PoolInfo pool = gpus_[i]->pool();
    GpuStatus g;
    g.index = i;
    // What the pool holds now: pages given back to the driver for an engine do not count.
    g.pool_bytes = static_cast<std::uint64_t>(pool.pages - pool.returned) * pool.page_bytes;
    g.free_bytes = static_cast<std::uint64_t>(pool.free) * pool.page_bytes;
    for (const vmm::SlotInfo& s : gpus_[i]->slots()) {
      ++g.slots;
      if (s.state == vmm::SlotState::active) g.active_slot = slot_id(i, s.id);
    }
    out.push_back(std::move(g));
  }
  return out;
}

ServiceResult<SlotAttachment> NodeService::attach(const std::string& model,
                                                  const std::string& owner) {
  auto key = key_for(model);
  if (!key) return std::unexpected(key.error());
  std::lock_guard lock(mutex_);
  // A free slot of the model, fully prewarmed if there is one, else the one with the most
  // resident (a partial prewarm: the rest streams through the engine's own copies).
  SlotRecord* found = nullptr;
  std::uint64_t found_resident = 0;
  for (auto& [id, record] : slots_) {
    // (No layout kind: its prewarm failed, so there is no layout to hand out.)
    if (record->key != *key || record->prewarming || record->evicting || record->verifying ||
        !record->owner.empty() || !record->layout_kind) {
      continue;
    }
    auto info = gpus_[record->gpu]->slot(record->slot);
    if (!info || info->loaded_bytes == 0 ||
        (info->state != vmm::SlotState::prewarmed && info->state != vmm::SlotState::active)) {
      continue;
    }
    const std::uint64_t resident = std::min(info->loaded_bytes, info->weight_bytes);
    if (found == nullptr || resident > found_resident) {
      found = record.get();
      found_resident = resident;
    }
  }
  if (found == nullptr) {
    counters_.prewarm_misses.fetch_add(1);
    return service_error(error_name::kNotPrewarmed,
                         fmt::format("no free, prewarmed slot holds {} (prewarm one: "
                                     "thawctl prewarm {})",
                                     *key, model));
  }
  vmm::GpuMemory& gpu = *gpus_[found->gpu];
  auto range = gpu.export_range(found->slot, 0, found_resident);
  if (!range) {
    return service_error(error_name::kGpu,
                         fmt::format("exporting slot {}: {}", found->id, range.error().message));
  }
  counters_.prewarm_hits.fetch_add(1);
  if (found->layout_kind == layout::LayoutKind::engine) counters_.engine_layout_hits.fetch_add(1);
  // The GPU's export tokens count up from 1; what the engine is given is random, so no
  // other client can name this export (and confirm_import checks the owner besides).
  std::uint64_t token = random_token();
  while (found->exports.contains(token)) token = random_token();
  found->owner = owner;
  found->exports[token] = range->token;
  SlotAttachment out;
  out.slot = found->id;
  out.gpu = found->gpu;
  out.weight_bytes = found->weight_bytes;
  out.resident_bytes = found_resident;
  out.token = token;
  // The engine's budget beyond its weights: every free page of the pool, its memory given
  // to the driver (the engine allocates with whatever driver calls it makes — the shim's
  // layout, expandable segments, a library's own cuMemCreate — and none of them could use a
  // page thawd kept). Pages other slots hold stay prewarmed, and a page given here is no
  // prewarm's until this engine is gone: nothing is promised twice.
  const vmm::PoolInfo pool = gpu.pool();
  out.page_bytes = pool.page_bytes;
  std::uint64_t slot_bytes = 0;
  for (const auto& page : range->pages) slot_bytes += page.bytes;
  // (An engine that leased memory before it opened its model keeps that lease: it is part
  // of the same budget.)
  const EngineLease& lease = lend_locked(owner, found->gpu, found->slot);
  out.lent_bytes = lease.gpu == found->gpu ? lease.bytes : 0;
  out.budget_bytes = slot_bytes + out.lent_bytes;
  out.pages = std::move(*range);
  out.layout = found->layout;
  out.layout_kind = *found->layout_kind;
  out.record_fingerprint = found->record_fingerprint;
  log(LogLevel::info,
      fmt::format("slot {}: {} attached to {} ({} layout, {} of {} bytes resident; budget {} "
                  "bytes, {} of them given to the driver from the pool)",
                  found->id, found->key, owner, layout::to_string(out.layout_kind), found_resident,
                  found->weight_bytes, out.budget_bytes, out.lent_bytes),
      {{"MODEL", found->key}, {"SLOT", found->id}, {"GPU", std::to_string(found->gpu)}});
  changed();
  return out;
}

ServiceResult<void> NodeService::confirm_import(const std::string& owner, const std::string& id,
                                                std::uint64_t token) {
  std::lock_guard lock(mutex_);
  // One answer whether the slot, the owner or the token is wrong: a client learns nothing
  // about other engines' slots from it.
  auto refused = [&] {
    return service_error(error_name::kInvalidArgument,
                         fmt::format("this connection has no unconfirmed export of slot {} with "
                                     "that token",
                                     id));
  };
  auto it = slots_.find(id);
  if (it == slots_.end() || it->second->owner != owner) return refused();
  SlotRecord& record = *it->second;
  auto pending = record.exports.find(token);
  if (pending == record.exports.end()) return refused();
  if (auto ok = gpus_[record.gpu]->confirm_import(pending->second); !ok) {
    return service_error(error_name::kGpu, ok.error().message);
  }
  record.exports.erase(pending);
  return {};
}

ServiceResult<std::size_t> NodeService::free_pages(const std::string& owner, const std::string& id,
                                                   const std::vector<std::uint64_t>& offsets) {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end() || it->second->owner != owner) {
    return service_error(error_name::kUnknownSlot,
                         fmt::format("this engine holds no slot \"{}\"", id));
  }
  SlotRecord& record = *it->second;
  record.pages_freed = true;
  auto freed = gpus_[record.gpu]->free_weight_pages(record.slot, offsets);
  if (!freed) {
    return service_error(error_name::kGpu,
                         fmt::format("freeing pages of slot {}: {}", id, freed.error().message));
  }
  log(LogLevel::debug,
      fmt::format("slot {}: {} copied {} pages out; their memory is the driver's until it exits",
                  id, owner, *freed),
      {{"MODEL", record.key}, {"SLOT", id}, {"GPU", std::to_string(record.gpu)}});
  changed();
  return *freed;
}

void NodeService::verify_handback(std::shared_ptr<SlotRecord> record, std::string owner) {
  std::string problem;
  auto layout = vmm::WeightLayout::engine(record->layout);
  auto pin = cache_.pin(record->key);
  if (!layout) {
    problem = layout.error().message;
  } else if (!pin) {
    problem = pin.error().message;
  } else {
    CacheWeightSource source(cache_, record->key);
    auto diff = gpus_[record->gpu]->find_difference(record->slot, *layout, source);
    if (!diff) {
      problem = diff.error().message;
    } else if (*diff) {
      problem = fmt::format("its bytes at slot offset {} are not the model's", **diff);
    }
  }
  std::lock_guard lock(mutex_);
  record->verifying = false;
  record->thread_finished = true;
  if (problem.empty()) {
    counters_.handbacks.fetch_add(1);
    log(LogLevel::info,
        fmt::format("slot {}: {} handed back by {}: checked, prewarmed for the next engine",
                    record->id, record->key, owner),
        {{"MODEL", record->key}, {"SLOT", record->id}, {"GPU", std::to_string(record->gpu)}});
  } else {
    discard_locked(*record, fmt::format("after {} handed it back: {}", owner, problem));
  }
  changed();
}

void NodeService::discard_locked(SlotRecord& record, std::string_view why) {
  vmm::GpuMemory& gpu = *gpus_[record.gpu];
  auto info = gpu.slot(record.slot);
  if (!info) return;
  if (info->state == vmm::SlotState::active) (void)gpu.deactivate(record.slot);
  if (info->state == vmm::SlotState::empty || gpu.evict(record.slot)) {
    record.evicting = true;  // reap() destroys it once empty
  }
  counters_.discards.fetch_add(1);
  log(LogLevel::info, fmt::format("slot {}: {} evicted {}", record.id, record.key, why),
      {{"MODEL", record.key}, {"SLOT", record.id}, {"GPU", std::to_string(record.gpu)}});
}

std::size_t NodeService::release_owner(const std::string& owner, const std::string& slot,
                                       bool handback) {
  std::lock_guard lock(mutex_);
  std::size_t released = 0;
  // The engine is gone (its connection closed): its lease ends; reap() takes the pages back
  // once no engine on that GPU needs the driver's room.
  if (slot.empty() && leases_.erase(owner) != 0) changed();
  for (auto& [id, record] : slots_) {
    if (record->owner != owner || (!slot.empty() && id != slot)) continue;
    ++released;
    for (const auto& [token, gpu_token] : record->exports) {
      (void)gpus_[record->gpu]->confirm_import(gpu_token);  // unpin what was never mapped
    }
    record->exports.clear();
    record->owner.clear();
    if (handback && !record->pages_freed && !shutting_down_) {
      record->verifying = true;
      retire(record->thread);  // the prewarm's, finished before any attach
      record->thread_finished = false;
      record->thread = std::thread([this, record, owner] { verify_handback(record, owner); });
    } else {
      discard_locked(*record, "as its engine went without handing it back");
    }
    changed();
  }
  return released;
}

EngineLease& NodeService::lend_locked(const std::string& owner, std::uint32_t gpu_index,
                                      vmm::SlotId slot) {
  auto [it, added] = leases_.try_emplace(owner, EngineLease{gpu_index, 0, 0});
  EngineLease& lease = it->second;
  if (lease.gpu != gpu_index) return lease;  // one GPU's pool per engine
  vmm::GpuMemory& gpu = *gpus_[gpu_index];
  // Pages a departed engine left with the driver, when no other engine here still allocates
  // from the driver, are this engine's as they are: re-creating them only to give them back
  // would put two driver calls per page on the engine's critical path.
  std::size_t adopted = 0;
  if (!engine_needs_driver_room_locked(gpu_index)) adopted = gpu.pool().returned;
  const vmm::PoolInfo pool = gpu.pool();
  auto lent = gpu.lend_to_engine(slot, pool.free);
  if (adopted != 0) {
    lease.pages += adopted;
    lease.bytes += static_cast<std::uint64_t>(adopted) * pool.page_bytes;
    changed();
  }
  if (!lent) {
    log(LogLevel::warning,
        fmt::format("GPU {}: giving the pool's free pages to {}: {}", gpu_index, owner,
                    lent.error().message),
        {{"GPU", std::to_string(gpu_index)}});
  } else if (*lent != 0) {
    lease.pages += *lent;
    lease.bytes += static_cast<std::uint64_t>(*lent) * pool.page_bytes;
    changed();
  }
  return lease;
}

ServiceResult<EngineLease> NodeService::lease_memory(const std::string& owner,
                                                     const std::string& gpu_uuid) {
  std::lock_guard lock(mutex_);
  if (shutting_down_) return service_error(error_name::kShuttingDown, "thawd is stopping");
  std::optional<std::uint32_t> index;
  for (std::uint32_t i = 0; i < gpus_.size(); ++i) {
    if (gpus_[i]->uuid() == gpu_uuid || (gpu_uuid.empty() && gpus_.size() == 1)) index = i;
  }
  if (!index) {
    return service_error(error_name::kUnknownGpu,
                         fmt::format("thawd manages no GPU with UUID \"{}\" ({} managed); the "
                                     "engine allocates from the driver alone",
                                     gpu_uuid, gpus_.size()));
  }
  const EngineLease lease = lend_locked(owner, *index, vmm::kNoSlot);
  log(LogLevel::info,
      fmt::format("GPU {}: {} may allocate {} bytes of the pool (given to the driver for it)",
                  *index, owner, lease.bytes),
      {{"GPU", std::to_string(*index)}});
  return lease;
}

}  // namespace thaw::daemon
