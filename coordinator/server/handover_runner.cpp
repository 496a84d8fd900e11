#include "coordinator/server/handover_runner.hpp"

#include <fmt/format.h>

#include "coordinator/kv_migration/kv_migrate.hpp"

namespace thaw::coordinator {
namespace {

// Each HTTP call of a migration; a drain waits for whole requests, so it may take longer.
constexpr int kCallTimeoutMs = 60'000;
constexpr int kDrainTimeoutMs = 600'000;

}  // namespace

HandoverResult refengine_handover(const MigrationOrder& order) {
  HandoverResult result{order.plan_id, false, ""};
  if (order.drain) {
    auto ok = thaw::kv_migration::drain(order.from_url, kDrainTimeoutMs);
    result.ok = ok.has_value();
    if (!ok) result.error = ok.error();
    return result;
  }
  thaw::kv_migration::MigrationPlan plan;
  plan.stages = order.stage_urls;
  plan.target = order.to_url;
  plan.timeout_ms = kCallTimeoutMs;
  // Stage 0 answers each moved request's client with the whole answer, fetched from the
  // standalone worker, so a client sees one answer whatever moved underneath (the gateway
  // holds its connection to stage 0); stage 0 lives on until those answers are in.
  plan.forward_answers = true;
  auto moved = thaw::kv_migration::migrate(plan);
  if (!moved) {
    result.error = moved.error();
    return result;
  }
  // A request the standalone worker could not take stays on the pipeline (unpaused): the
  // pipeline must then drain, so this is not a completed migration.
  std::size_t stayed = 0, by_kv = 0, by_prompt = 0;
  std::string why;
  for (const thaw::kv_migration::MovedRequest& r : *moved) {
    if (r.how == "stayed") {
      ++stayed;
      why = r.why;
    }
    if (r.how == "kv" || r.how == "earlier") ++by_kv;
    if (r.how == "prompt") ++by_prompt;
  }
  result.detail = fmt::format("{} request(s): {} with their KV cache, {} restarted from the prompt",
                              moved->size(), by_kv, by_prompt);
  if (stayed > 0) {
    result.error =
        fmt::format("{} of {} request(s) stayed on the pipeline ({})", stayed, moved->size(), why);
    return result;
  }
  result.ok = true;
  return result;
}

HandoverRunner::HandoverRunner(Executor executor) : executor_(std::move(executor)) {}

HandoverRunner::~HandoverRunner() {
  threads_.clear();
}  // jthread joins

void HandoverRunner::start(MigrationOrder order) {
  std::lock_guard lock(mutex_);
  threads_.emplace_back([this, order = std::move(order)] {
    HandoverResult r = executor_(order);
    std::lock_guard inner(mutex_);
    done_.push_back(std::move(r));
  });
}

std::vector<HandoverResult> HandoverRunner::finished() {
  std::lock_guard lock(mutex_);
  std::vector<HandoverResult> out;
  out.swap(done_);
  return out;
}

}  // namespace thaw::coordinator
