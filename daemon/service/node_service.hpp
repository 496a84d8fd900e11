// NodeService: what thawd does, behind every front end (D-Bus, the shim socket, metrics).
//
// It composes the host cache, a registry and each GPU's memory manager into operations on
// models and prewarm slots:
//
//   fetch(model)          a background ModelFetch into the cache (one per model; asking
//                         again while it runs joins it; a finished or failed one restarts
//                         and resumes from the cache's verified chunks)
//   prewarm(model, gpu)   a new slot on the GPU, filled from the cache as chunks arrive
//                         (starting the fetch when the model is not cached yet); the copy
//                         runs on a background thread, the call returns the slot id at once.
//                         The slot holds the model in the engine layout an engine recorded
//                         (when one did: set_engine_layouts), else packed; optionally only
//                         its first k layers (partial prewarm)
//   activate/deactivate/evict(slot)
//   open_file(model, path)  a cached file and its readiness map, for the shim
//   attach(model, owner)  descriptors of a prewarmed slot's pages, for the shim; while the
//                         engine runs the slot is its (free_pages gives back pages it copied
//                         out); release_owner ends that: a clean hand-back keeps the slot
//                         prewarmed for the next engine once its bytes are checked against
//                         the model ("verifying" until then), anything else (a crash, pages
//                         already given back, a byte that differs) evicts it
//
// Model keys are the cache's (registry name with '/' as "--"); slot ids are "g<gpu>s<n>".
//
// Threads: every member may be called from any thread. Fetches and prewarms run on their
// own threads; reap() (called by the event loop on a timer) joins finished ones and
// destroys slots whose eviction completed. change_counter() grows whenever something a
// front end shows may have changed, so they can emit change signals without diffing.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/layout/layout_kind.hpp"
#include "daemon/service/service_error.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/fetch/model_fetch.hpp"
#include "daemon/store/registry/registry.hpp"
#include "vmm/gpu_memory.hpp"

namespace thaw::network {
class FetchWindows;  // daemon/network/fetch_window.hpp
}

namespace thaw::daemon {

enum class ModelState { fetching, partial, complete, failed };
std::string_view to_string(ModelState state);

struct ModelStatus {
  std::string key;
  std::string name;  // as fetched from the registry ("" if cached before this thawd started)
  ModelState state = ModelState::partial;
  std::uint64_t fetched_bytes = 0;  // verified in the cache
  std::uint64_t total_bytes = 0;    // of the files known so far
  double rate_bytes_per_s = 0;      // while fetching
  std::uint32_t files = 0;
  std::string error;  // why the last fetch failed
  // Its files were taken with nothing to check them against (store.allow_unverified).
  bool unverified = false;
};

struct SlotStatus {
  std::string id;  // "g0s3"
  std::uint32_t gpu = 0;
  std::string model;  // cache key
  std::string state;  // vmm::SlotState, or "failed" when its prewarm failed
  std::uint64_t resident_bytes = 0;
  std::uint64_t total_bytes = 0;
  std::string owner;  // "pid 1234" of the shim client holding it, or ""
  std::string error;
  std::optional<layout::LayoutKind> layout;  // nullopt until its prewarm chose one
  int layers = -1;                           // a partial prewarm's layer count; -1: the whole model
};

struct GpuStatus {
  std::uint32_t index = 0;
  std::uint64_t pool_bytes = 0;
  std::uint64_t free_bytes = 0;
  std::uint32_t slots = 0;
  std::string active_slot;  // "" when none
};

struct NodeCounters {
  std::atomic<std::uint64_t> fetched_bytes_critical{0};
  std::atomic<std::uint64_t> fetched_bytes_background{0};
  std::atomic<std::uint64_t> prewarm_hits{0};        // shim attach found a prewarmed slot
  std::atomic<std::uint64_t> prewarm_misses{0};      // ... and did not
  std::atomic<std::uint64_t> engine_layout_hits{0};  // ... the hit was in an engine layout
  std::atomic<std::uint64_t> handbacks{0};           // an engine's exit left its slot prewarmed
  std::atomic<std::uint64_t> discards{0};            // an engine's slot was evicted when it went
  std::atomic<std::uint64_t> activations{0};
  std::atomic<std::uint64_t> fetches_started{0};
  std::atomic<std::uint64_t> fetches_failed{0};
};

// A cached file handed to a shim client: descriptors it can map and wait on.
struct OpenedFile {
  int data_fd = -1;       // O_RDONLY; the caller owns it
  int readiness_fd = -1;  // O_RDONLY; the caller owns it
  std::uint64_t size = 0;
  std::uint64_t chunk_size = 0;
  std::uint64_t chunk_count = 0;
  bool complete = false;
};

// A slot as NodeService::attach binds it to an engine: everything thawd needs to answer
// attach_slot (daemon/shim_socket turns it into proto::Slot and its page messages).
struct SlotAttachment {
  std::string slot;
  std::uint32_t gpu = 0;
  std::uint64_t weight_bytes = 0;
  std::uint64_t token = 0;  // for confirm_import by the same owner: random, not guessable
  // Device memory the engine may count as its own while attached (what its cuMemGetInfo
  // answers): this slot's pages plus the pool's free pages, whose memory thawd gave to the
  // driver for this engine's own allocations — not other slots' pages, which thawd keeps
  // prewarmed for other models, nor pages another engine was given.
  std::uint64_t budget_bytes = 0;
  std::uint64_t lent_bytes = 0;      // of the budget, what the pool gave the driver for it
  std::uint64_t resident_bytes = 0;  // prefix of the layout whose bytes are in the pages
  std::uint64_t page_bytes = 0;
  layout::LayoutKind layout_kind = layout::LayoutKind::packed;
  std::string record_fingerprint;  // engine layout: the record it was built from
  vmm::ExportedRange pages;        // the caller owns the fds
  std::vector<vmm::LayoutPiece> layout;
};

// The text of the newest layout record an engine left for a model (cache key), if any.
using EngineLayoutLookup = std::function<std::optional<std::string>(const std::string& key)>;

// Pool memory an engine process may allocate (from the driver) beyond any slot's pages:
// free pages of one GPU's pool whose memory thawd gave the driver for it. Held until the
// engine's connection closes.
struct EngineLease {
  std::uint32_t gpu = 0;
  std::size_t pages = 0;
  std::uint64_t bytes = 0;
};

struct NodeServiceConfig {
  std::string registry;  // address (store.registry); "" = none configured
  std::uint32_t connections = 8;
  std::uint64_t max_rate_bytes_per_s = 0;  // per fetch; 0 = no limit
  bool allow_unverified = false;           // fetch models published without digests
  // Traffic shaping runs: fetch sockets carry their class's SO_MARK (critical for a stage
  // or a cold start, background for consolidation) for the classifier. Off without it:
  // SO_MARK needs CAP_NET_ADMIN, and a fetch that cannot set it fails.
  bool mark_fetch_sockets = false;
  // With mark_fetch_sockets: the registry the fetch sockets' receive windows are kept at their
  // class's current share by (daemon/network/fetch_window.hpp); null leaves them to the kernel.
  std::shared_ptr<network::FetchWindows> fetch_windows;
  // With mark_fetch_sockets: told each model's id (the mark's model bits, 1..65535, one per
  // cache key for thawd's lifetime) before its first fetch socket carries it, so the
  // classifier can count the model's bytes by name.
  std::function<void(std::uint16_t id, const std::string& key)> on_model_id;
};

class NodeService {
 public:
  NodeService(store::HostCache& cache, std::vector<vmm::GpuMemory*> gpus, NodeServiceConfig config);
  ~NodeService();  // shutdown()
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  void set_config(NodeServiceConfig config);  // SIGHUP: used by fetches started from now on

  // `stage`: only pipeline stage k of n (HydraServe); `consolidate`: then the rest of the
  // model at background class. Asking while a fetch of the model runs joins that one.
  ServiceResult<std::string> fetch(const std::string& model,
                                   std::optional<store::StageSpec> stage = std::nullopt,
                                   bool consolidate = false);
  // Where prewarms find engine layouts (thawd: its artifact store). Unset: always packed.
  void set_engine_layouts(EngineLayoutLookup lookup);

  // `layers`: only embeddings and the first k layers (WarmServe's partial prewarm).
  ServiceResult<std::string> prewarm(const std::string& model, std::optional<std::uint32_t> gpu,
                                     std::optional<int> layers = std::nullopt);
  ServiceResult<void> activate(const std::string& slot, std::uint64_t kv_bytes);
  ServiceResult<void> deactivate(const std::string& slot);
  ServiceResult<void> evict(const std::string& slot);

  std::vector<ModelStatus> models() const;
  ServiceResult<ModelStatus> model(const std::string& key_or_name) const;
  std::vector<SlotStatus> slots() const;
  ServiceResult<SlotStatus> slot(const std::string& id) const;
  std::vector<GpuStatus> gpus() const;

  ServiceResult<OpenedFile> open_file(const std::string& model, const std::string& path);
  ServiceResult<SlotAttachment> attach(const std::string& model, const std::string& owner);
  // Memory for an engine not attached to a slot (or not yet): the free pages of the pool of
  // the GPU whose UUID is `gpu_uuid` ("" on a one-GPU node), their memory given to the
  // driver for `owner` until release_owner(owner). With pool_share 0.9 a process that got
  // nothing would have a tenth of the GPU. Returns the lease (all it holds, if it had one).
  ServiceResult<EngineLease> lease_memory(const std::string& owner, const std::string& gpu_uuid);
  // `owner` mapped the pages attach gave it (the token that attach answered it): they are
  // unpinned. Only the slot's owner may confirm, so another engine cannot unpin pages it was
  // never given, nor spend the owner's confirmation.
  ServiceResult<void> confirm_import(const std::string& owner, const std::string& slot,
                                     std::uint64_t token);
  // The owner copied these pages' bytes out (offsets from the slot's base): they are freed.
  ServiceResult<std::size_t> free_pages(const std::string& owner, const std::string& slot,
                                        const std::vector<std::uint64_t>& offsets);
  // Gives back what `owner` holds (of one slot, or of all when `slot` is empty): exports
  // not yet confirmed are unpinned, the slots released. With `handback` (the engine exited
  // normally and vouches that it did not write its weights) a slot whose pages are all still
  // there stays prewarmed for the next engine; otherwise it is evicted. Returns the slots
  // released.
  std::size_t release_owner(const std::string& owner, const std::string& slot = "",
                            bool handback = false);

  // Joins finished fetch and prewarm threads, destroys slots whose eviction finished.
  void reap();
  // Cancels fetches and waits for every thread (prewarms finish their current copy).
  void shutdown();

  std::uint64_t change_counter() const { return changes_.load(); }
  const NodeCounters& counters() const { return counters_; }

  // The key a registry name is cached under ("org/name" → "org--name"), or the key itself.
  static ServiceResult<std::string> key_for(const std::string& key_or_name);
  static std::string slot_id(std::uint32_t gpu, vmm::SlotId slot);

 private:
  struct FetchJob;
  struct SlotRecord;

  ServiceResult<std::shared_ptr<FetchJob>> start_fetch_locked(
      const std::string& name, const std::string& key,
      std::optional<store::StageSpec> stage = std::nullopt, bool consolidate = false);
  ModelStatus status_of_locked(const std::string& key, const store::CachedModelInfo* cached) const;
  // The model id `key`'s fetch sockets are marked with; 0 once all 65535 are taken.
  std::uint16_t model_id_locked(const std::string& key);
  ServiceResult<std::pair<std::uint32_t, vmm::SlotId>> parse_slot_locked(
      const std::string& id) const;
  void run_prewarm(std::shared_ptr<SlotRecord> record, std::shared_ptr<FetchJob> job);
  // Moves finished prewarm threads to `done`; destroys slots whose eviction finished.
  void reap_slots_locked(std::vector<std::thread>& done);
  // Whether an engine on `gpu` holds pool pages given to the driver for it.
  bool engine_needs_driver_room_locked(std::uint32_t gpu) const;
  // Before a prewarm of `bytes`: takes back pages a departed engine was lent, waiting a
  // little for the driver to have their room again.
  void wait_for_returned_pages(std::uint32_t gpu, std::uint64_t bytes);
  // Gives the GPU's free pages to the driver for `owner` (added to its lease); locked.
  EngineLease& lend_locked(const std::string& owner, std::uint32_t gpu, vmm::SlotId slot);
  SlotStatus slot_status_locked(const SlotRecord& record) const;
  void changed() { changes_.fetch_add(1); }
  // Evicts an engine's slot when it is released without a clean hand-back.
  void discard_locked(SlotRecord& record, std::string_view why);
  // A handed-back slot is offered again only once its bytes are checked against the model
  // (the engine may have written its weights); on its own thread.
  void verify_handback(std::shared_ptr<SlotRecord> record, std::string owner);

  store::HostCache& cache_;
  std::vector<vmm::GpuMemory*> gpus_;

  mutable std::mutex mutex_;
  NodeServiceConfig config_;
  EngineLayoutLookup engine_layouts_;
  std::map<std::string, std::shared_ptr<FetchJob>> fetches_;  // by key, latest run
  std::map<std::string, std::uint16_t> model_ids_;            // by key: socket marks' model id
  std::map<std::string, std::shared_ptr<SlotRecord>> slots_;  // by slot id
  std::map<std::string, EngineLease> leases_;                 // by owner
  std::vector<std::thread> finished_threads_;
  bool shutting_down_ = false;

  std::atomic<std::uint64_t> changes_{1};
  NodeCounters counters_;
};

}  // namespace thaw::daemon
