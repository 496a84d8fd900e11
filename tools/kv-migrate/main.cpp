// refengine-migrate: consolidation by KV migration from the command line
// (coordinator/kv_migration/kv_migrate.hpp), for operators and scripts; the coordinator links the
// library.
//   refengine-migrate --stages http://a:8001,http://b:8002 --to http://c:8003 [--wait]
//   refengine-migrate --drain http://a:8001
// Prints one JSON object per request.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <iostream>

#include <nlohmann/json.hpp>

#include "coordinator/kv_migration/kv_migrate.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "refengine-migrate: move a pipeline's requests, KV cache included, into a full "
      "worker (docs/KV-TRANSFER.md), or drain the pipeline"};
  thaw::kv_migration::MigrationPlan plan;
  std::string drain_url;
  bool wait = false;
  int wait_ms = 600000;
  app.add_option("--stages", plan.stages, "the pipeline's stages in rank order")->delimiter(',');
  app.add_option("--to", plan.target, "the full worker that takes over");
  app.add_option("--timeout-ms", plan.timeout_ms, "each HTTP call")->capture_default_str();
  app.add_flag("--wait", wait, "wait for the moved requests' answers and print them");
  app.add_option("--wait-ms", wait_ms, "with --wait: at most this long")->capture_default_str();
  app.add_option("--drain", drain_url, "drain this stage 0 instead (finish on the pipeline)");
  CLI11_PARSE(app, argc, argv);
  if (!drain_url.empty()) {
    if (auto r = thaw::kv_migration::drain(drain_url, wait_ms); !r) {
      fmt::print(stderr, "refengine-migrate: {}\n", r.error());
      return 1;
    }
    return 0;
  }
  if (plan.stages.empty() || plan.target.empty()) {
    fmt::print(stderr, "refengine-migrate: give --stages and --to (or --drain)\n");
    return 2;
  }
  auto moved = thaw::kv_migration::migrate(plan);
  if (!moved) {
    fmt::print(stderr, "refengine-migrate: {}\n", moved.error());
    return 1;
  }
  int status = 0;
  if (wait) {
    if (auto r = thaw::kv_migration::wait_results(plan.target, *moved, wait_ms); !r) {
      fmt::print(stderr, "refengine-migrate: {}\n", r.error());
      status = 1;
    }
  }
  for (const auto& m : *moved) {
    nlohmann::json j{{"request_id", m.request_id},
                     {"how", m.how},
                     {"generated_before", m.generated_before},
                     {"released", m.released}};
    if (!m.why.empty()) j["why"] = m.why;
    if (wait) {
      j["token_ids"] = m.tokens;
      j["finish_reason"] = m.finish_reason;
      if (!m.error.empty()) j["error"] = m.error;
    }
    std::cout << j.dump() << "\n";
    if (m.how == "stayed") status = 1;
  }
  return status;
}
