// The engine's KV-transfer endpoints (docs/KV-TRANSFER.md), the stand-in for vLLM's KV-connector
// interface that consolidation by KV migration (HydraServe §6.2) needs: stage 0 pauses and lists
// its requests; every stage exports a request's blocks for its own layers; a full worker
// imports them layer range by layer range and resumes the request from its last token.
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine.hpp"
#include "kv_transfer_format.hpp"
#include "scheduler.hpp"
#include "server.hpp"

namespace httplib {
class Server;
struct Response;
}  // namespace httplib

namespace refengine {

// Largest KV body an import accepts (and any request body to a server with these routes).
inline constexpr std::uint64_t kKvMaxBodyBytes = 1ull << 30;

class KvTransfer {
 public:
  // `scheduler` is null on stages > 0 (they schedule nothing: stage 0's block tables rule).
  KvTransfer(Engine& engine, Scheduler* scheduler) : engine_(engine), scheduler_(scheduler) {}
  ~KvTransfer();
  KvTransfer(const KvTransfer&) = delete;
  KvTransfer& operator=(const KvTransfer&) = delete;

  void add_routes(httplib::Server& server);

 private:
  // Checks a KV body and writes its blocks (POST /kv/import, /kv/pull); answers on `res`.
  void import_body(const std::string& body, httplib::Response& res);

  struct Pending {  // an import under way: blocks reserved, some layers written
    std::vector<int> blocks;
    std::uint32_t token_count = 0;
    std::vector<bool> layers;  // by absolute layer: written
  };
  Engine& engine_;
  Scheduler* scheduler_;
  std::mutex mu_;
  std::map<std::uint64_t, Pending> pending_;  // by source request id
  struct Resumed {
    std::shared_future<Completion> done;
    // The tokens it had when it came (their KV came with it), then each one decoded here:
    // GET /kv/result?tokens_after=N answers with them before the request ends.
    std::vector<std::int32_t> generated_before;
    std::shared_ptr<TokenStream> stream;
  };
  std::map<std::uint64_t, Resumed> results_;  // resumed, by source id
};

// `refengine serve` on a stage > 0: /health and the KV routes on options.host:port while the
// stage serves steps from stage 0; returns when stage 0 shuts the pipeline down.
int serve_stage(Engine& engine, const ServeOptions& options);

}  // namespace refengine
