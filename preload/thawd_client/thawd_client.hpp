// The shim's connection to thawd (common/proto over $THAW_SOCKET, default
// /run/thaw/thawd.sock), opened on first need and said hello to with the engine's identity.
//
// Everything here is optional: with no thawd, an old one, a dead one or a refused hello,
// calls return nullopt, the shim says so once and goes on without it (streamed files then
// use the cache's own readiness maps). A connection that fails mid-way is dropped and not
// retried for the rest of the process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/fd/unique_fd.hpp"
#include "common/proto/shim_messages.hpp"
#include "preload/inject/weight_injector.hpp"

namespace thaw::preload {

// The readiness map of a cached model file, from thawd (open_file). nullopt when thawd
// is not there or does not know the file, or when thawd's file is not `opened_path`, the file
// the engine opened (same device and inode), so that its map would describe other bytes.
std::optional<UniqueFd> daemon_readiness_fd(const std::string& model_key,
                                            const std::string& relative_path,
                                            const std::string& opened_path);

// What thawd says of a model file the engine looked for before the file was in the cache:
// `fetching` while a fetch of its model runs and has not created it yet (thawd lists the
// model, then creates each file at its final size), `present` (with that size) once it is
// there, `unknown` when thawd is not reachable or no fetch will create it.
struct PendingFileState {
  enum Kind { unknown, fetching, present } kind = unknown;
  std::uint64_t size = 0;  // when present
};
PendingFileState daemon_pending_file(const std::string& model_key,
                                     const std::string& relative_path);

// The artifact of `kind` recorded for `identity`, as text; nullopt when there is none (or no
// thawd).
std::optional<std::string> daemon_get_artifact(proto::ArtifactKind kind,
                                               const proto::ArtifactIdentity& identity);
// Stores an artifact (sent as a memfd: records can exceed a message). false: not stored.
bool daemon_report_artifact(proto::ArtifactKind kind, const proto::ArtifactIdentity& identity,
                            const std::string& document);
// Reports the shim's counters — only over a connection already open (never connects at
// exit just for this).
void daemon_report_counters(const proto::EngineCounters& counters);

// CUDA IPC through thawd: hands over a VMM handle's descriptor, gets the token a handle
// carries; and the other way round (`bytes`, when not 0: the size the handle names, which
// thawd's export must have). nullopt: no thawd, or it refused (logged). The caller keeps `fd`.
std::optional<std::uint64_t> daemon_export_ipc(int fd, std::uint64_t bytes);
std::optional<UniqueFd> daemon_import_ipc(std::uint64_t token, std::uint64_t bytes = 0);

// Attaches this engine to a prewarmed slot of `model` (attach_slot, its page messages, then
// `imported`): thawd then counts the slot's pages as the engine's until it releases them or
// exits. What comes back is what weight injection needs (preload/inject) and the budget
// cuMemGetInfo answers from (the slot's pages plus the pool's free pages). nullopt: no
// thawd, or no prewarmed slot of that model (thawd's message is logged).
struct AttachedSlot {
  std::string slot;
  std::uint64_t budget_bytes = 0;
  SlotGrant grant;
};
std::optional<AttachedSlot> daemon_attach_slot(const std::string& model);

// Asks thawd for memory of the pool of the GPU with UUID `gpu_uuid` (32 hex digits): the
// bytes this engine may allocate from the driver beyond what it holds now, until it exits.
// nullopt: no thawd, or it manages no such GPU.
std::optional<std::uint64_t> daemon_lease_memory(const std::string& gpu_uuid);

// In a forked child: the parent's connection is the parent's. The child closes its copy
// (without a word on it) and connects afresh when it needs thawd.
void daemon_after_fork_in_child();

// Weight injection's copy mode is done with these pages of `slot` (offsets from its base;
// sent in messages of at most proto::kMaxFreePagesPerMessage).
void daemon_free_pages(const std::string& slot, const std::vector<std::uint64_t>& offsets);
// Ends this engine's hold on `slot`; `handback`: it exits normally and the slot's pages
// still hold the model, so thawd may keep it prewarmed.
void daemon_release_slot(const std::string& slot, bool handback);

}  // namespace thaw::preload
