// Consolidation by KV migration (HydraServe §6.2), the caller's side of docs/KV-TRANSFER.md:
// what the coordinator runs when a pipeline's full-memory worker takes over. It pauses stage 0,
// and for each of its requests gathers the KV blocks of every stage into the full worker and
// resumes the request there from its last token. The retry policy: a request whose blocks
// cannot all be gathered (a stage crashed, an export or import failed) restarts from its prompt
// on the full worker — greedy decoding makes that the same answer — and a request the full
// worker cannot take at all (no room) stays on the pipeline, which is unpaused to finish it.
// No CUDA; the engine is reached over HTTP only.
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <string>
#include <vector>

namespace thaw::kv_migration {

struct MigrationPlan {
  std::vector<std::string> stages;  // the pipeline's stages in rank order: "http://host:port"
  std::string target;               // the full worker taking over
  int timeout_ms = 60000;           // each HTTP call
  // Called before stage `rank` exports request `id` (tests inject a crash here).
  std::function<void(int rank, std::uint64_t id)> before_export;
  // Called after the full worker resumed request `id`, before stage 0 releases it (tests stop
  // a coordinator there).
  std::function<void(std::uint64_t id)> after_resume;
  // Stage 0 answers each moved request's caller with the whole answer, fetched from the full
  // worker (POST /kv/release with "to"), instead of finish_reason "migrated" and the tokens so
  // far: the move is invisible to the client, but stage 0 lives on (SIGTERM waits) until those
  // answers are in.
  bool forward_answers = false;
};

struct MovedRequest {
  std::uint64_t request_id = 0;  // stage 0's id; the full worker's /kv/result knows it by it
  // "kv": resumed over the migrated KV; "prompt": restarted from its prompt (why says why);
  // "stayed": still on the pipeline (unpaused), why says why; "earlier": an earlier, interrupted
  // migrate() had resumed it on the full worker already (only the release was left).
  std::string how;
  std::string why;
  std::vector<std::int32_t> prompt, generated_before;  // as stage 0 listed it
  bool released = false;  // stage 0 answered its caller with finish_reason "migrated"
  // Filled by wait_results: the whole answer (every generated token) from the full worker.
  std::vector<std::int32_t> tokens;
  std::string finish_reason, error;
};

// Moves every request of the pipeline to plan.target. An error only when nothing could be
// moved: stage 0 unreachable or not pausable, or the target not a compatible full worker.
std::expected<std::vector<MovedRequest>, std::string> migrate(const MigrationPlan& plan);

// Waits for the answers of the moved requests ("kv" and "prompt") on the full worker.
std::expected<void, std::string> wait_results(const std::string& target,
                                              std::vector<MovedRequest>& moved, int timeout_ms);

// Drain mode, for engines without a KV-transfer interface: stage 0 refuses new requests and
// returns once every accepted one has finished on the pipeline; then the stages may be stopped.
std::expected<void, std::string> drain(const std::string& stage0, int timeout_ms);

}  // namespace thaw::kv_migration
