// HandoverRunner: carries out ClusterState's hand-over orders (MigrationOrder) off the
// server's thread — a KV migration (HydraServe §6.2) or an engine drain takes as long as the
// requests it moves or waits for, and the server must keep answering heartbeats meanwhile.
//
// The default executor speaks the reference engine's KV-transfer interface (docs/KV-TRANSFER.md,
// coordinator/kv_migration/kv_migrate.hpp, the caller of the engine side in tools/refengine: the
// stand-in for vLLM's KV connector): migrate() gathers every request's blocks from all stages into
// the standalone worker; drain() makes stage 0 refuse new requests and returns once its accepted
// ones have finished. An engine without either answers with an error, and ClusterState falls back
// to draining on gateways' counts.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/cluster/cluster_state.hpp"

namespace thaw::coordinator {

struct HandoverResult {
  std::string plan_id;
  bool ok = false;
  std::string error;   // why not, for the plan's phase_error
  std::string detail;  // what moved how, for the log ("2 request(s): 2 with their KV cache")
};

// The reference engine's migration or drain for one order (blocking).
HandoverResult refengine_handover(const MigrationOrder& order);

class HandoverRunner {
 public:
  using Executor = std::function<HandoverResult(const MigrationOrder&)>;
  explicit HandoverRunner(Executor executor = refengine_handover);
  ~HandoverRunner();  // waits for the orders still running
  HandoverRunner(const HandoverRunner&) = delete;
  HandoverRunner& operator=(const HandoverRunner&) = delete;

  void start(MigrationOrder order);
  // Results of the orders that ended since the last call.
  std::vector<HandoverResult> finished();

 private:
  Executor executor_;
  std::mutex mutex_;
  std::vector<HandoverResult> done_;
  std::vector<std::jthread> threads_;
};

}  // namespace thaw::coordinator
