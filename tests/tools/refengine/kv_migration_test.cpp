// Pipeline serving and consolidation by KV migration (issue 25, HydraServe §6.2), end to end on
// the emulator: `refengine serve` processes as a PP=2 / PP=4 pipeline and as a full worker.
//  - a pipeline answers with the same tokens as one worker;
//  - mid-generation, a request moves with its KV cache into the full worker
//    (coordinator/kv_migration/kv_migrate.*, what the coordinator calls): each stage's exported
//    blocks equal, bit for bit, the single worker's KV of the same positions; the blocks land at
//    the right layers of the full worker (exported back from it, equal again); the remaining tokens
//    equal the single worker's;
//  - a stage killed mid-migration: the request restarts from its prompt, one correct answer;
//  - drain: the pipeline finishes what it accepted, refuses more, then stops;
//  - hostile KV-transfer calls get clear 4xx answers.
// The synthetic model (random weights) often repeats a token, so token equality alone would be
// a weak check of the KV; the byte comparisons are the strong one.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "coordinator/kv_migration/kv_migrate.hpp"
#include "engine_process.hpp"
#include "kv_transfer_format.hpp"
#include "serve_process.hpp"

namespace {

using namespace refengine_test;
using json = nlohmann::json;
using Tokens = std::vector<std::int32_t>;

httplib::Result post(const std::string& url, const std::string& path, const std::string& body,
                     const char* type = "application/json") {
  httplib::Client c(url);
  c.set_read_timeout(std::chrono::seconds(300));
  return c.Post(path.c_str(), body, type);
}

json get_json(const std::string& url, const std::string& path) {
  httplib::Client c(url);
  auto r = c.Get(path.c_str());
  if (!r || r->status != 200) return json();
  return json::parse(r->body);
}

json complete(const std::string& url, const Tokens& prompt, int max_tokens) {
  auto r = post(url, "/v1/completions",
                json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}}.dump());
  if (!r) return json{{"transport_error", httplib::to_string(r.error())}};
  json j = json::parse(r->body);
  j["status"] = r->status;
  return j;
}

const std::vector<Tokens> kPrompts = {
    {1, 2, 3, 4, 5, 6, 7}, {100, 2000, 31, 7}, {4000, 12, 999, 1234, 55, 66}};
constexpr int kLong = 40;  // tokens of the requests that migrate

// Waits until stage 0 lists every request running with at least `min_generated` tokens.
json wait_generating(const std::string& stage0, std::size_t count, std::size_t min_generated) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < end) {
    json l = get_json(stage0, "/kv/requests");
    std::size_t ok = 0;
    if (l.is_object())
      for (const auto& r : l["requests"])
        if (r["state"] == "running" && r["generated"].size() >= min_generated) ++ok;
    if (ok == count) return l;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return json();
}

// A KV body's K and V for positions [0, upto) of every layer it holds, by absolute layer:
// [layer] -> bytes (K then V, position-major per head as in the cache, unused slots dropped).
std::map<std::uint32_t, std::string> kv_positions(const std::string& body, std::uint32_t upto) {
  auto v = refengine::parse_kv_blob(body, 1ull << 30);
  EXPECT_TRUE(v) << (v ? "" : v.error());
  std::map<std::uint32_t, std::string> out;
  if (!v) return out;
  const auto& h = v->header;
  EXPECT_GE(h.token_count, upto);
  const std::size_t row = h.head_dim * sizeof(float);
  for (std::uint32_t l = h.layer_begin; l < h.layer_end; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (std::uint32_t p = 0; p < upto; ++p)
        for (std::uint32_t head = 0; head < h.n_head; ++head) {
          const std::size_t at = h.offset(l, kv == 1, p / h.block_size) +
                                 (std::size_t(head) * h.block_size + p % h.block_size) * row;
          out[l].append(v->payload.substr(at, row));
        }
  return out;
}

std::string export_kv(const std::string& url, std::uint64_t id, const json& blocks, int kv_tokens) {
  auto r = post(url, "/kv/export",
                json{{"request_id", id}, {"blocks", blocks}, {"kv_tokens", kv_tokens}}.dump());
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  return r ? r->body : "";
}

class KvMigration : public ::testing::Test {
 protected:
  // The single worker's answers, from the full worker before anything moves into it.
  std::vector<Tokens> reference(Serve& worker, int max_tokens) {
    std::vector<Tokens> out;
    for (const Tokens& p : kPrompts) {
      json j = complete(worker.url(), p, max_tokens);
      EXPECT_EQ(j.value("status", 0), 200) << j.dump();
      out.push_back(j["choices"][0]["token_ids"].get<Tokens>());
    }
    return out;
  }
};

TEST_F(KvMigration, PipelinesOfTwoAndFourStagesAnswerLikeOneWorker) {
  Serve single({}, 5);
  Pipeline pp2(2), pp4(4);
  ASSERT_TRUE(single.ready()) << single.log();
  ASSERT_TRUE(pp2.ready()) << pp2.logs();
  ASSERT_TRUE(pp4.ready()) << pp4.logs();
  const auto want = reference(single, 24);
  for (Pipeline* pp : {&pp2, &pp4}) {
    const std::string label = "PP=" + std::to_string(pp->stages.size());
    // All prompts in one request: batched prefill and decode through every stage.
    auto r = post(pp->stages[0]->url(), "/v1/completions",
                  json{{"prompt", kPrompts}, {"max_tokens", 24}, {"ignore_eos", true}}.dump());
    ASSERT_TRUE(r && r->status == 200) << label << ": " << (r ? r->body : "") << pp->logs();
    const json j = json::parse(r->body);
    for (std::size_t i = 0; i < kPrompts.size(); ++i)
      EXPECT_EQ(j["choices"][i]["token_ids"].get<Tokens>(), want[i]) << label << " prompt " << i;
    // Every stage is up on /health and /kv/info, and the stages hold the layers in order.
    int next = 0;
    for (std::size_t k = 0; k < pp->stages.size(); ++k) {
      const json info = get_json(pp->stages[k]->url(), "/kv/info");
      ASSERT_TRUE(info.is_object()) << label << " stage " << k;
      EXPECT_EQ(info["pp_rank"], int(k));
      EXPECT_EQ(info["layers"][0], next);
      next = info["layers"][1];
      EXPECT_EQ(info["schedules"], k == 0);
    }
    EXPECT_EQ(next, 4) << label;
  }
}

// From a pipeline of GetParam() stages.
class KvMigrationFrom : public KvMigration, public ::testing::WithParamInterface<int> {};

TEST_P(KvMigrationFrom, MidGenerationRequestsMoveWithTheirKvAndFinishLikeOneWorker) {
  // The full worker steps slowly too, so that it can be paused while the moved requests run.
  Serve target({"--step-delay-ms", "20"}, 5);
  Pipeline pp(GetParam(), {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, kLong);
  const std::string s0 = pp.stages[0]->url();

  std::vector<std::future<json>> clients;
  for (std::size_t i = 0; i < 2; ++i)  // the first two prompts, as separate requests
    clients.push_back(
        std::async(std::launch::async, [&, i] { return complete(s0, kPrompts[i], kLong); }));
  ASSERT_TRUE(wait_generating(s0, 2, 4).is_object()) << pp.logs();

  // Stilled pipeline: every stage's blocks equal the single worker's KV of the same positions.
  ASSERT_TRUE(post(s0, "/kv/pause", "{}")) << pp.logs();
  const json listed = get_json(s0, "/kv/requests");
  ASSERT_EQ(listed["requests"].size(), 2u);
  const json& r0 = listed["requests"][0];
  const int kv_tokens = r0["kv_tokens"];
  const std::size_t which = r0["prompt"].get<Tokens>() == kPrompts[0] ? 0 : 1;
  ASSERT_EQ(kv_tokens, int(kPrompts[which].size() + r0["generated"].size()) - 1);
  ASSERT_LT(r0["generated"].size(), std::size_t(kLong)) << "the request finished before the move";
  std::map<std::uint32_t, std::string> pipeline_kv;
  for (const auto& st : pp.stages)
    pipeline_kv.merge(kv_positions(export_kv(st->url(), r0["request_id"], r0["blocks"], kv_tokens),
                                   std::uint32_t(kv_tokens)));
  ASSERT_EQ(pipeline_kv.size(), 4u) << "the stages' exports cover the 4 layers";
  {
    // The same prompt on the single worker, paused once it is past those positions.
    auto solo = std::async(std::launch::async,
                           [&] { return complete(target.url(), kPrompts[which], kLong); });
    json mine;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      ASSERT_LT(std::chrono::steady_clock::now(), end);
      ASSERT_TRUE(post(target.url(), "/kv/pause", "{}"));
      mine = get_json(target.url(), "/kv/requests")["requests"];
      if (mine.size() == 1 && mine[0]["kv_tokens"].get<int>() >= kv_tokens) break;
      ASSERT_TRUE(post(target.url(), "/kv/unpause", "{}"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto single_kv = kv_positions(
        export_kv(target.url(), mine[0]["request_id"], mine[0]["blocks"], mine[0]["kv_tokens"]),
        std::uint32_t(kv_tokens));
    ASSERT_TRUE(post(target.url(), "/kv/unpause", "{}"));
    ASSERT_EQ(single_kv.size(), 4u);
    for (std::uint32_t l = 0; l < 4; ++l)
      EXPECT_TRUE(single_kv.at(l) == pipeline_kv.at(l)) << "layer " << l << " KV differs";
    EXPECT_EQ(solo.get()["choices"][0]["token_ids"].get<Tokens>(), want[which]);
  }

  // The move itself (stage 0 is paused already; migrate pauses it again, harmlessly).
  thaw::kv_migration::MigrationPlan plan{pp.urls(), target.url(), 60000, {}};
  auto moved = thaw::kv_migration::migrate(plan);
  ASSERT_TRUE(moved) << moved.error();
  // The moved request on the full worker: its imported KV sits at the right blocks and layers.
  ASSERT_TRUE(post(target.url(), "/kv/pause", "{}"));
  bool checked_import = false;
  const json on_target = get_json(target.url(), "/kv/requests");
  for (const json& m : on_target["requests"]) {
    if (m["prompt"].get<Tokens>() != kPrompts[which] || m["kv_tokens"].get<int>() < kv_tokens)
      continue;
    const auto imported =
        kv_positions(export_kv(target.url(), m["request_id"], m["blocks"], m["kv_tokens"]),
                     std::uint32_t(kv_tokens));
    for (std::uint32_t l = 0; l < 4; ++l)
      EXPECT_TRUE(imported.at(l) == pipeline_kv.at(l)) << "imported layer " << l << " differs";
    checked_import = true;
  }
  EXPECT_TRUE(checked_import) << "the moved request was not running on the full worker: "
                              << on_target.dump();
  ASSERT_TRUE(post(target.url(), "/kv/unpause", "{}"));

  ASSERT_EQ(moved->size(), 2u);
  auto results = thaw::kv_migration::wait_results(target.url(), *moved, 120000);
  ASSERT_TRUE(results) << results.error();
  for (const auto& m : *moved) {
    const std::size_t i = m.prompt == kPrompts[0] ? 0 : 1;
    EXPECT_EQ(m.how, "kv") << m.why;
    EXPECT_TRUE(m.released);
    EXPECT_FALSE(m.generated_before.empty());
    EXPECT_EQ(m.tokens, want[i]) << "prompt " << i << " after " << m.generated_before.size()
                                 << " tokens on the pipeline";
    EXPECT_EQ(m.finish_reason, "length");
  }
  // Stage 0's callers got the tokens so far and where the rest is.
  for (auto& c : clients) {
    const json j = c.get();
    ASSERT_EQ(j.value("status", 0), 200) << j.dump();
    const json& ch = j["choices"][0];
    EXPECT_EQ(ch["finish_reason"], "migrated");
    bool found = false;
    for (const auto& m : *moved)
      if (m.request_id == ch["request_id"].get<std::uint64_t>()) {
        EXPECT_EQ(ch["token_ids"].get<Tokens>(), m.generated_before);
        found = true;
      }
    EXPECT_TRUE(found) << j.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, KvMigrationFrom, ::testing::Values(2, 4),
                         [](const auto& info) { return "PP" + std::to_string(info.param); });

// Stage GetParam() is killed mid-migration, before its blocks are gathered.
class KvMigrationCrash : public KvMigration, public ::testing::WithParamInterface<int> {};

TEST_P(KvMigrationCrash, AStageCrashingMidMigrationRestartsTheRequestFromItsPrompt) {
  const int victim = GetParam();
  Serve target({}, 5);
  Pipeline pp(2, {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, kLong);
  const std::string s0 = pp.stages[0]->url();
  auto client = std::async(std::launch::async, [&] { return complete(s0, kPrompts[2], kLong); });
  ASSERT_TRUE(wait_generating(s0, 1, 3).is_object()) << pp.logs();
  bool killed = false;
  thaw::kv_migration::MigrationPlan plan{pp.urls(), target.url(), 20000,
                                         [&](int rank, std::uint64_t) {
                                           if (rank == victim && !killed) {
                                             pp.stages[victim]->kill_now();  // mid-migration
                                             killed = true;
                                           }
                                         }};
  auto moved = thaw::kv_migration::migrate(plan);
  ASSERT_TRUE(moved) << moved.error();
  ASSERT_TRUE(killed);
  ASSERT_EQ(moved->size(), 1u);
  EXPECT_EQ((*moved)[0].how, "prompt");
  EXPECT_NE((*moved)[0].why.find("stage " + std::to_string(victim)), std::string::npos)
      << (*moved)[0].why;
  // Stage 0 answers its caller "migrated" unless it is the one that died.
  EXPECT_EQ((*moved)[0].released, victim != 0);
  auto results = thaw::kv_migration::wait_results(target.url(), *moved, 120000);
  ASSERT_TRUE(results) << results.error();
  EXPECT_EQ((*moved)[0].tokens, want[2]) << "one answer, equal to the single worker's";
  EXPECT_EQ((*moved)[0].finish_reason, "length");
  const json client_answer = client.get();
  if (victim != 0)
    EXPECT_EQ(client_answer["choices"][0]["finish_reason"], "migrated") << client_answer.dump();
  else  // its connection to stage 0 broke: the gateway's retry answers from the full worker
    EXPECT_FALSE(client_answer.contains("choices")) << client_answer.dump();
  // The import that was under way (stage 0's blocks, when stage 1 died) was dropped: no pending
  // import is left holding the full worker's blocks.
  auto abort = post(target.url(), "/kv/abort", json{{"request_id", (*moved)[0].request_id}}.dump());
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->status, 404) << abort->body;
}

INSTANTIATE_TEST_SUITE_P(Stage, KvMigrationCrash, ::testing::Values(0, 1),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

// The coordinator dies twice mid-consolidation; each restarted one calls migrate() again and
// goes on from what the nodes hold: a request resumed but not released is only released, a
// half-imported one is gathered again; each request answers once, like one worker.
TEST_F(KvMigration, AnInterruptedMigrationGoesOnFromWhatTheNodesHold) {
  Serve target({"--step-delay-ms", "10"}, 5);
  Pipeline pp(2, {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, kLong);
  const std::string s0 = pp.stages[0]->url();
  std::vector<std::future<json>> clients;
  for (std::size_t i = 0; i < 2; ++i)
    clients.push_back(
        std::async(std::launch::async, [&, i] { return complete(s0, kPrompts[i], kLong); }));
  ASSERT_TRUE(wait_generating(s0, 2, 3).is_object()) << pp.logs();
  struct CoordinatorDied {};
  // First coordinator: dies right after the full worker resumed the first request.
  std::uint64_t first = 0;
  thaw::kv_migration::MigrationPlan plan{pp.urls(), target.url(), 20000, {}, [&](std::uint64_t id) {
                                           first = id;
                                           throw CoordinatorDied{};
                                         }};
  EXPECT_THROW((void)thaw::kv_migration::migrate(plan), CoordinatorDied);
  ASSERT_NE(first, 0u);
  // Second: dies before exporting stage 1's blocks of the other request (stage 0's are in).
  plan.after_resume = nullptr;
  plan.before_export = [&](int rank, std::uint64_t id) {
    if (rank == 1 && id != first) throw CoordinatorDied{};
  };
  EXPECT_THROW((void)thaw::kv_migration::migrate(plan), CoordinatorDied);
  // Third: finishes.
  plan.before_export = nullptr;
  auto moved = thaw::kv_migration::migrate(plan);
  ASSERT_TRUE(moved) << moved.error();
  ASSERT_EQ(moved->size(), 1u) << "the second coordinator released the first request";
  EXPECT_EQ((*moved)[0].how, "kv") << (*moved)[0].why;
  EXPECT_NE((*moved)[0].request_id, first);
  thaw::kv_migration::MovedRequest earlier;
  earlier.request_id = first;
  earlier.how = "earlier";
  moved->push_back(earlier);
  auto results = thaw::kv_migration::wait_results(target.url(), *moved, 120000);
  ASSERT_TRUE(results) << results.error();
  std::set<Tokens> got, expected = {want[0], want[1]};
  for (const auto& m : *moved) got.insert(m.tokens);
  EXPECT_EQ(got, expected);
  for (auto& c : clients) {
    const json j = c.get();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "migrated") << j.dump();
  }
  EXPECT_TRUE(get_json(s0, "/kv/requests")["requests"].empty());
}

TEST_F(KvMigration, DrainFinishesOnThePipelineRefusesNewRequestsThenStops) {
  Serve single({}, 5);
  Pipeline pp(2, {"--step-delay-ms", "10"});
  ASSERT_TRUE(single.ready()) << single.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(single, kLong);
  const std::string s0 = pp.stages[0]->url();
  auto client = std::async(std::launch::async, [&] { return complete(s0, kPrompts[1], kLong); });
  ASSERT_TRUE(wait_generating(s0, 1, 2).is_object()) << pp.logs();
  auto drained = thaw::kv_migration::drain(s0, 120000);
  ASSERT_TRUE(drained) << drained.error();
  // Drain returned only once the request was done: its answer is already there, whole.
  ASSERT_EQ(client.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  const json j = client.get();
  EXPECT_EQ(j["choices"][0]["token_ids"].get<Tokens>(), want[1]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json refused = complete(s0, kPrompts[0], 4);
  EXPECT_EQ(refused.value("status", 0), 503) << refused.dump();
  // Then stopping stage 0 stops the pipeline: stage 1 exits on its own, cleanly.
  pp.stages[0]->terminate();
  EXPECT_EQ(pp.stages[0]->wait_exit(30000), 0) << pp.logs();
  EXPECT_EQ(pp.stages[1]->wait_exit(30000), 0) << pp.logs();
}

// refengine-migrate, the operators' CLI over the same library: one JSON line per moved
// request with its whole answer (--wait); a clear error and status 1 when a node is down.
TEST_F(KvMigration, TheCliMovesARequestAndPrintsItsAnswer) {
  Serve target({}, 5);
  Pipeline pp(2, {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, kLong);
  const std::string s0 = pp.stages[0]->url();
  auto client = std::async(std::launch::async, [&] { return complete(s0, kPrompts[0], kLong); });
  ASSERT_TRUE(wait_generating(s0, 1, 3).is_object()) << pp.logs();
  const fs::path out =
      fs::temp_directory_path() / ("refengine_migrate_" + std::to_string(::getpid()));
  const std::string cli = quote(REFENGINE_MIGRATE_BIN);
  int status = std::system((cli + " --stages " + s0 + "," + pp.stages[1]->url() + " --to " +
                            target.url() + " --wait >" + quote(out.string()))
                               .c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const auto lines = json_lines(read_file(out));
  ASSERT_EQ(lines.size(), 1u) << read_file(out);
  EXPECT_EQ(lines[0]["how"], "kv");
  EXPECT_EQ(lines[0]["token_ids"].get<Tokens>(), want[0]);
  EXPECT_EQ(client.get()["choices"][0]["finish_reason"], "migrated");
  // A full worker that is not there.
  const std::string dead = "http://127.0.0.1:" + std::to_string(unique_port());
  status = std::system(
      (cli + " --stages " + s0 + " --to " + dead + " 2>" + quote(out.string())).c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(read_file(out).find(dead), std::string::npos) << read_file(out);
  fs::remove(out);
}

// forward_answers: stage 0's callers get the whole answer (fetched from the full worker), so
// the move is invisible to them; stopping stage 0 right after the move waits for those answers.
TEST_F(KvMigration, ForwardedAnswersReachTheCallerWholeEvenAsStage0Stops) {
  Serve target({"--step-delay-ms", "20"}, 5);
  Pipeline pp(2, {"--step-delay-ms", "25"});
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, kLong);
  const std::string s0 = pp.stages[0]->url();
  auto client = std::async(std::launch::async, [&] { return complete(s0, kPrompts[1], kLong); });
  ASSERT_TRUE(wait_generating(s0, 1, 3).is_object()) << pp.logs();
  thaw::kv_migration::MigrationPlan plan{pp.urls(), target.url(), 20000, {}, {}};
  plan.forward_answers = true;
  auto moved = thaw::kv_migration::migrate(plan);
  ASSERT_TRUE(moved) << moved.error();
  ASSERT_EQ(moved->size(), 1u);
  EXPECT_EQ((*moved)[0].how, "kv");
  EXPECT_TRUE((*moved)[0].released);
  pp.stages[0]->terminate();  // the coordinator stops the pipeline at once
  ASSERT_EQ(client.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const json j = client.get();
  ASSERT_EQ(j.value("status", 0), 200) << j.dump();
  EXPECT_EQ(j["choices"][0]["token_ids"].get<Tokens>(), want[1]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(pp.stages[0]->wait_exit(30000), 0) << pp.logs();
}

// A request that reached stage 0 but was never scheduled (no KV yet) moves as a prompt retry.
TEST_F(KvMigration, AWaitingRequestMovesAsAPromptRetry) {
  Serve target({}, 5);
  Pipeline pp(2);
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  const auto want = reference(target, 12);
  const std::string s0 = pp.stages[0]->url();
  ASSERT_TRUE(post(s0, "/kv/pause", "{}"));
  auto client = std::async(std::launch::async, [&] { return complete(s0, kPrompts[1], 12); });
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  json listed;
  do {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "the request never arrived";
    listed = get_json(s0, "/kv/requests");
  } while (listed["requests"].empty());
  EXPECT_EQ(listed["requests"][0]["state"], "waiting");
  EXPECT_EQ(listed["requests"][0]["kv_tokens"], 0);
  auto moved = thaw::kv_migration::migrate({pp.urls(), target.url(), 20000, {}, {}});
  ASSERT_TRUE(moved) << moved.error();
  ASSERT_EQ(moved->size(), 1u);
  EXPECT_EQ((*moved)[0].how, "prompt");
  EXPECT_TRUE((*moved)[0].released);
  ASSERT_TRUE(thaw::kv_migration::wait_results(target.url(), *moved, 60000));
  EXPECT_EQ((*moved)[0].tokens, want[1]);
  const json j = client.get();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "migrated") << j.dump();
  EXPECT_TRUE(j["choices"][0]["token_ids"].empty());
}

// After a migration stage 0 stays paused until it is stopped; a request that reached it then
// waits. SIGTERM must still stop it (the HTTP server joins its threads) and answer that caller.
TEST_F(KvMigration, APausedWorkerStopsOnSigtermAndAnswersItsWaitingCaller) {
  Serve worker({}, 5);
  ASSERT_TRUE(worker.ready()) << worker.log();
  ASSERT_TRUE(post(worker.url(), "/kv/pause", "{}"));
  auto caller = std::async(std::launch::async, [&] { return complete(worker.url(), {1, 2}, 4); });
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (get_json(worker.url(), "/kv/requests")["requests"].empty())
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "the request never arrived";
  worker.terminate();
  EXPECT_EQ(worker.wait_exit(20000), 0) << worker.log();
  ASSERT_EQ(caller.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const json j = caller.get();
  EXPECT_EQ(j.value("status", 0), 503) << j.dump();
}

TEST_F(KvMigration, HostileKvTransferCallsGetClearErrors) {
  Serve target({}, 5);
  Pipeline pp(2);
  ASSERT_TRUE(target.ready()) << target.log();
  ASSERT_TRUE(pp.ready()) << pp.logs();
  auto status = [](const httplib::Result& r) { return r ? r->status : -1; };
  const std::string t = target.url(), s0 = pp.stages[0]->url(), s1 = pp.stages[1]->url();
  EXPECT_EQ(status(post(t, "/kv/import", "garbage", "application/octet-stream")), 400);
  // A valid body of another model's shape.
  refengine::KvBlobHeader h;
  h.layer_end = h.n_layer = 4;
  h.n_head = 3;  // the model has 4 heads
  h.head_dim = 64;
  h.block_size = 16;
  h.token_count = 5;
  std::string body = refengine::encode_kv_header(h);
  body.resize(body.size() + h.payload_bytes);
  auto r = post(t, "/kv/import", body, "application/octet-stream");
  EXPECT_EQ(status(r), 422) << (r ? r->body : "");
  // Header claims more bytes than it brings.
  h.n_head = 4;
  std::string shortb = refengine::encode_kv_header(h) + "xx";
  EXPECT_EQ(status(post(t, "/kv/import", shortb, "application/octet-stream")), 400);
  // Pipeline stages import nothing; resume needs imported KV; unknown ids are 404.
  EXPECT_EQ(status(post(s0, "/kv/import", body, "application/octet-stream")), 409);
  EXPECT_EQ(status(post(t, "/kv/resume",
                        json{{"request_id", 7},
                             {"prompt", {1, 2}},
                             {"generated", {3}},
                             {"max_tokens", 4},
                             {"kv_tokens", 2}}
                            .dump())),
            409);
  EXPECT_EQ(status(post(t, "/kv/resume", "{\"request_id\": \"x\"}")), 400);
  EXPECT_EQ(status(post(t, "/kv/resume", "[1,2")), 400);
  EXPECT_EQ(status(httplib::Client(t).Get("/kv/result?request_id=99")), 404);
  EXPECT_EQ(status(httplib::Client(t).Get("/kv/result?request_id=-1")), 400);
  // Export: stage 0 refuses while scheduling; stages > 0 need stage 0's block table, in range.
  EXPECT_EQ(status(post(s0, "/kv/export", "{\"request_id\": 1}")), 409);
  EXPECT_EQ(status(post(s1, "/kv/export", "{\"request_id\": 1}")), 400);
  EXPECT_EQ(status(post(s1, "/kv/export",
                        json{{"request_id", 1}, {"blocks", {64}}, {"kv_tokens", 3}}.dump())),
            400);
  EXPECT_EQ(status(post(s1, "/kv/export",
                        json{{"request_id", 1}, {"blocks", {1, 2}}, {"kv_tokens", 3}}.dump())),
            400);
  EXPECT_EQ(status(post(s0, "/kv/release", "{\"request_id\": 1}")), 409);
  // Integers exactly: no truncation of large values into valid block ids, no fractions, and a
  // wrongly typed option is a 400, not a 500.
  EXPECT_EQ(
      status(post(s1, "/kv/export",
                  json{{"request_id", 1}, {"blocks", {4294967297ull}}, {"kv_tokens", 3}}.dump())),
      400);
  EXPECT_EQ(status(post(s1, "/kv/export",
                        json{{"request_id", 1}, {"blocks", {1}}, {"kv_tokens", 1.5}}.dump())),
            400);
  EXPECT_EQ(status(post(s0, "/kv/drain", "{\"timeout_ms\": \"soon\"}")), 400);
  // Pull: only from an http:// stage; a stage that does not answer is a 502 naming it.
  const json pull{{"request_id", 1}, {"blocks", {0}}, {"kv_tokens", 3}};
  json bad_from = pull;
  bad_from["from"] = "file:///etc/passwd";
  EXPECT_EQ(status(post(t, "/kv/pull", bad_from.dump())), 400);
  json dead = pull;
  dead["from"] = "http://127.0.0.1:" + std::to_string(unique_port());
  dead["timeout_ms"] = "2000";
  EXPECT_EQ(status(post(t, "/kv/pull", dead.dump())), 400);
  dead["timeout_ms"] = 2000;
  auto d = post(t, "/kv/pull", dead.dump());
  EXPECT_EQ(status(d), 502);
  EXPECT_NE(d ? d->body.find(dead["from"].get<std::string>()) : 0, std::string::npos);
  // A stage refusing the export (no paused stage 0, unknown blocks) is a 502 with its reason.
  json refused = pull;
  refused["from"] = s1;
  refused["blocks"] = {99};
  auto rr = post(t, "/kv/pull", refused.dump());
  EXPECT_EQ(status(rr), 502) << (rr ? rr->body : "");
  EXPECT_EQ(status(post(s1, "/kv/requests", "")), 404);  // GET only
  // Still serving afterwards.
  EXPECT_EQ(complete(t, kPrompts[0], 2).value("status", 0), 200);
}

}  // namespace
