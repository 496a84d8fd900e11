// Weight injection (daemon + shim + emulator + private dbus-daemon + loopback nginx, the
// reference engine unmodified, attached with THAW_PRELOAD_ATTACH=1):
//   - copy mode: a slot prewarmed in the packed layout feeds the engine's weight copies
//     device-to-device; the pages it copied out go back to thawd; the tokens are those of
//     an engine without thaw; nothing stays allocated on the GPU but thawd's pool;
//   - zero-copy: after a first run recorded its layout, thawd prewarms the model in that
//     engine layout; the next engine's weight allocations are the slot's pages and its
//     weight copies move no byte; at its exit the slot is handed back prewarmed and a third
//     engine runs from it again — same tokens each time;
//   - a partial prewarm (first k layers) injects what it holds, the rest is copied from
//     the files, in both modes;
//   - a perturbed allocation sequence (expandable segments) leaves zero-copy and copies for
//     real; an engine killed with SIGKILL leaves nothing behind (its slot is evicted);
//   - at the shipped pool_share (0.9) an attached engine's budget is the pool's: it sizes its
//     KV cache nearly as it would without thaw and allocates all of it, and one that asks
//     for more than its budget is refused at once (issue 20).
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

std::vector<std::string> engine_args(const fs::path& model,
                                     const std::vector<std::string>& extra = {}) {
  // A fixed KV size keeps the allocation sequence the same whatever cuMemGetInfo answers.
  std::vector<std::string> args = refengine_test::small_generate_args(
      model, {"--num-gpu-blocks-override", "32", "--enforce-eager"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<nlohmann::json> tokens_of(const refengine_test::EngineRun& r) {
  std::vector<nlohmann::json> out;
  for (const auto& line : refengine_test::json_lines(r.out)) out.push_back(line["tokens"]);
  return out;
}

// The shim's summary line at exit: "slot g0s1: I bytes injected, S skipped (zero-copy on|off),
// C copied from files, M pages mapped, F freed; ..."
struct Injection {
  std::uint64_t injected = 0, skipped = 0, copied = 0, mapped = 0, freed = 0;
  bool zero_copy = false;
  bool handed_back = false;
};
std::optional<Injection> injection_of(const std::string& shim_log) {
  static const std::regex line(
      R"(slot g0s\d+: (\d+) bytes injected, (\d+) skipped \(zero-copy (on|off)\), (\d+) copied from files, (\d+) pages mapped, (\d+) freed; (.*))");
  std::smatch m;
  if (!std::regex_search(shim_log, m, line)) return std::nullopt;
  return Injection{std::stoull(m[1]),
                   std::stoull(m[2]),
                   std::stoull(m[4]),
                   std::stoull(m[5]),
                   std::stoull(m[6]),
                   m[3] == "on",
                   m[7].str().starts_with("handing it back")};
}

class WeightInjection : public ThawdFixture {
 protected:
  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }

  std::string device_env(bool attach) const {
    return "THAW_EMU_DEVICE_MEMORY=256M THAW_EMU_STATE_DIR=" + emu_state_dir().string() +
           (attach ? " THAW_PRELOAD_ATTACH=1" : "");
  }

  struct Run {
    refengine_test::EngineRun engine;
    std::string shim_log;
  };
  Run run_shimmed(const std::string& tag, std::vector<std::string> args, bool attach) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    const std::string env =
        "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
        " THAW_PRELOAD_LOG=" + shim_log.string() + " " + device_env(attach);
    Run r;
    r.engine = refengine_test::run_engine(args, env);
    r.shim_log = thaw::testing::slurp(shim_log);
    return r;
  }

  nlohmann::json slots() {
    auto r = thawctl({"--json", "slots"});
    auto doc = nlohmann::json::parse(r.output, nullptr, false);
    return doc.is_discarded() ? nlohmann::json::array() : doc;
  }

  // Slots once thawd has reaped evicted ones (its timer) and its bus objects caught up (they
  // refresh every 250 ms): when none is left, or after ~5 s.
  nlohmann::json slots_settled() {
    nlohmann::json s;
    for (int i = 0; i < 50; ++i) {
      s = slots();
      if (s.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return s;
  }

  std::uint64_t pool_bytes() {
    auto doc = nlohmann::json::parse(thawctl({"--json", "gpus"}).output, nullptr, false);
    return doc.is_array() && !doc.empty() ? doc[0].value("pool_bytes", std::uint64_t{0}) : 0;
  }

  // Whether the emulated GPU holds thawd's whole pool and nothing else — once pages given
  // back to the driver for an engine are in the pool again (thawd's timer) and the engine's
  // memory is gone; waits up to ~5 s for that.
  ::testing::AssertionResult only_thawds_pool_on_the_gpu() {
    std::uint64_t used = 0, pool = 0;
    for (int i = 0; i < 50; ++i) {
      used = device_bytes_in_use();
      pool = pool_bytes();
      if (used == pool && pool == pool_size()) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return ::testing::AssertionFailure()
           << "the GPU holds " << used << " bytes, thawd's pool " << pool << " of " << pool_size();
  }
  // pool_share of the 256 MiB emulated GPU, in whole 2 MiB pages.
  std::uint64_t pool_size() const {
    constexpr std::uint64_t kPage = 2ull << 20;
    const auto bytes = static_cast<std::uint64_t>(double(256ull << 20) * std::stod(pool_share_));
    return bytes / kPage * kPage;
  }

  // Bytes in use on the emulated GPU by every live process sharing thawd's GPU.
  std::uint64_t device_bytes_in_use() {
    auto r = thaw::testing::run(
        {"/usr/bin/env", "THAW_LIBCUDA=" THAW_EMU_LIBCUDA, "THAW_EMU_DEVICE_MEMORY=256M",
         "THAW_EMU_STATE_DIR=" + emu_state_dir().string(), EMU_DEVICE_USAGE_BIN});
    auto doc = nlohmann::json::parse(r.output, nullptr, false);
    return doc.is_object() ? doc.value("device_bytes_in_use", std::uint64_t{0}) : ~0ull;
  }
};

TEST_F(WeightInjection, CopyModeFeedsTheWeightsFromAPackedSlotAndFreesItsPages) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_EQ(slots()[0].value("layout", ""), "packed") << slots().dump();
  const auto reference = refengine_test::run_engine(engine_args(model()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  const Run run = run_shimmed("copy", engine_args(model()), true);
  ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
  EXPECT_EQ(tokens_of(run.engine), tokens_of(reference));
  auto inj = injection_of(run.shim_log);
  ASSERT_TRUE(inj) << run.shim_log;
  EXPECT_FALSE(inj->zero_copy);
  EXPECT_GT(inj->injected, 1000000u) << "the weights came from the slot";
  EXPECT_EQ(inj->copied, 0u) << "every weight byte was in the slot";
  EXPECT_GT(inj->freed, 0u) << "pages copied out went back to thawd";
  EXPECT_FALSE(inj->handed_back);
  // The slot gave its pages up: thawd evicts the rest once the engine is gone.
  EXPECT_NE(log().find("evicted as its engine went without handing it back"), std::string::npos)
      << log();
  EXPECT_TRUE(slots_settled().empty()) << slots().dump();
  EXPECT_TRUE(only_thawds_pool_on_the_gpu());
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(WeightInjection, ZeroCopyFromAnEngineLayoutSlotThenHandBackAndRunAgain) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  const auto reference = refengine_test::run_engine(engine_args(model()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  // A first run records where this engine puts the model's bytes.
  const Run first = run_shimmed("record", engine_args(model()), false);
  ASSERT_EQ(first.engine.exit_code, 0) << first.engine.err << first.shim_log;
  ASSERT_NE(log().find("stored its layout artifact for gpt-syn"), std::string::npos) << log();

  // thawd now prewarms that engine layout.
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_EQ(slots()[0].value("layout", ""), "engine") << slots().dump() << log();

  for (const char* tag : {"zero-copy", "after-hand-back"}) {
    SCOPED_TRACE(tag);
    const Run run = run_shimmed(tag, engine_args(model()), true);
    ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
    EXPECT_EQ(tokens_of(run.engine), tokens_of(reference));
    auto inj = injection_of(run.shim_log);
    ASSERT_TRUE(inj) << run.shim_log;
    EXPECT_TRUE(inj->zero_copy) << run.shim_log;
    EXPECT_GT(inj->mapped, 0u);
    EXPECT_GT(inj->skipped, 1000000u) << "weight copies completed without moving a byte";
    EXPECT_EQ(inj->injected, 0u);
    EXPECT_EQ(inj->copied, 0u);
    EXPECT_EQ(inj->freed, 0u);
    EXPECT_TRUE(inj->handed_back) << run.shim_log;
    // Handed back: checked against the model, then prewarmed again in the engine layout,
    // free for the next engine (and the bus objects caught up).
    nlohmann::json s;
    for (int i = 0; i < 100; ++i) {
      s = slots();
      if (s.size() == 1 && s[0].value("owner", "x").empty() &&
          s[0].value("state", "") == "prewarmed") {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_EQ(s.size(), 1u) << s.dump();
    EXPECT_EQ(s[0].value("state", ""), "prewarmed") << s.dump();
    EXPECT_EQ(s[0].value("owner", "x"), "") << s.dump();
    EXPECT_TRUE(only_thawds_pool_on_the_gpu());
  }
  EXPECT_NE(log().find("handed back by"), std::string::npos) << log();
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(WeightInjection, APartialPrewarmInjectsItsLayersAndTheRestComesFromTheFiles) {
  start_registry();
  start_thawd(BusPolicy::open);
  // Embeddings and the first 2 of the model's 8 layers (WarmServe's partial prewarm).
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn", "--layers", "2"}).exit_code, 0) << log();
  const auto reference = refengine_test::run_engine(engine_args(model()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  auto s = slots();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_LT(s[0]["resident_bytes"].get<std::uint64_t>(), s[0]["total_bytes"].get<std::uint64_t>());
  EXPECT_GT(s[0]["resident_bytes"].get<std::uint64_t>(), 0u);

  const Run copy = run_shimmed("partial-copy", engine_args(model()), true);
  ASSERT_EQ(copy.engine.exit_code, 0) << copy.engine.err << copy.shim_log;
  EXPECT_EQ(tokens_of(copy.engine), tokens_of(reference));
  auto inj = injection_of(copy.shim_log);
  ASSERT_TRUE(inj) << copy.shim_log;
  EXPECT_GT(inj->injected, 0u) << "the resident layers came from the slot";
  EXPECT_GT(inj->copied, 0u) << "the others from the files";
  EXPECT_TRUE(slots_settled().empty()) << slots().dump();

  // The same in the engine layout: resident pages mapped, the rest copied for real.
  const Run record = run_shimmed("partial-record", engine_args(model()), false);
  ASSERT_EQ(record.engine.exit_code, 0) << record.engine.err;
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn", "--layers", "2"}).exit_code, 0) << log();
  ASSERT_EQ(slots()[0].value("layout", ""), "engine") << slots().dump();
  const Run zero = run_shimmed("partial-zero", engine_args(model()), true);
  ASSERT_EQ(zero.engine.exit_code, 0) << zero.engine.err << zero.shim_log;
  EXPECT_EQ(tokens_of(zero.engine), tokens_of(reference));
  inj = injection_of(zero.shim_log);
  ASSERT_TRUE(inj) << zero.shim_log;
  EXPECT_TRUE(inj->zero_copy);
  EXPECT_GT(inj->skipped, 0u);
  EXPECT_GT(inj->copied, 0u);
  // Handed back only when no real copy went into the slot's pages (a prefix that ends
  // inside a page the engine maps gets the rest of that page copied in): thawd does what
  // the shim said.
  if (inj->handed_back) {
    EXPECT_FALSE(inj->mapped == 0);
    EXPECT_NE(log().find("handed back by"), std::string::npos) << log();
  } else {
    EXPECT_TRUE(slots_settled().empty()) << slots().dump();
  }
  EXPECT_TRUE(only_thawds_pool_on_the_gpu());
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(WeightInjection, APerturbedSequenceCopiesForRealAndAKilledEngineLeavesNothing) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  const Run first = run_shimmed("record", engine_args(model()), false);
  ASSERT_EQ(first.engine.exit_code, 0) << first.engine.err << first.shim_log;
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();

  // Expandable segments: the engine's allocation calls differ from the record's from the
  // first one, so the layout leaves deterministic mode and no copy is skipped.
  const std::vector<std::string> perturbed = {"--expandable-segments"};
  const auto reference = refengine_test::run_engine(engine_args(model(), perturbed));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const Run run = run_shimmed("perturbed", engine_args(model(), perturbed), true);
  ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
  EXPECT_EQ(tokens_of(run.engine), tokens_of(reference));
  EXPECT_NE((run.shim_log + run.engine.err).find("diverged from its recorded layout"),
            std::string::npos)
      << run.shim_log;
  auto inj = injection_of(run.shim_log);
  ASSERT_TRUE(inj) << run.shim_log;
  EXPECT_EQ(inj->skipped, 0u);
  EXPECT_EQ(inj->mapped, 0u);
  EXPECT_GT(inj->injected + inj->copied, 1000000u) << "every weight byte moved";
  EXPECT_TRUE(slots_settled().empty()) << slots().dump();
  EXPECT_TRUE(only_thawds_pool_on_the_gpu());

  // An engine killed once its weights are in: thawd evicts its slot, the GPU is thawd's
  // pool again.
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  const fs::path err = dir_.path() / "killed.err";
  const std::string env = "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
                          " " + device_env(true);
  const std::vector<std::string> serve = {"serve",
                                          "--model",
                                          model().string(),
                                          "--port",
                                          std::to_string(refengine_test::free_port()),
                                          "--max-num-seqs",
                                          "4",
                                          "--max-model-len",
                                          "32",
                                          "--max-num-batched-tokens",
                                          "12",
                                          "--enforce-eager",
                                          "--num-gpu-blocks-override",
                                          "32"};
  const std::string cmd = refengine_test::engine_command(serve, env) + " >/dev/null 2>" +
                          err.string() +
                          " & pid=$!; for i in $(seq 600); do grep -q "
                          "weights_loaded " +
                          err.string() + " && break; sleep 0.1; done; kill -9 $pid; wait $pid";
  (void)thaw::testing::run({"/bin/bash", "-c", cmd});
  EXPECT_NE(thaw::testing::slurp(err).find("weights_loaded"), std::string::npos)
      << thaw::testing::slurp(err);
  EXPECT_TRUE(slots_settled().empty()) << slots().dump() << log();
  EXPECT_NE(log().find("evicted as its engine went"), std::string::npos) << log();
  EXPECT_TRUE(only_thawds_pool_on_the_gpu()) << "nothing of the killed engine is left";
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// The KV-cache blocks an engine chose (its kv_cache_ready timeline event), or -1.
long kv_blocks_of(const refengine_test::EngineRun& r) {
  static const std::regex blocks(R"re("kv_cache_ready".*?"num_blocks":(\d+))re");
  std::smatch m;
  return std::regex_search(r.err, m, blocks) ? std::stol(m[1]) : -1;
}

TEST_F(WeightInjection, AtTheShippedPoolShareAZeroCopyEngineGetsNearlyTheKvCacheOfOneWithoutThaw) {
  start_registry();
  // The KV cache sized from cuMemGetInfo, as vLLM sizes it.
  auto sized = [](const fs::path& model) {
    return refengine_test::small_generate_args(
        model, {"--gpu-memory-utilization", "0.9", "--enforce-eager"});
  };
  // Without thaw, the whole emulated GPU is the engine's.
  const auto alone = refengine_test::run_engine(sized(registry_->model_dir()), device_env(false));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  const long alone_blocks = kv_blocks_of(alone);
  ASSERT_GT(alone_blocks, 0) << alone.err;

  pool_share_ = "0.9";  // packaging/thawd.toml's
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  // A first run (fixed KV: the driver alone has only a tenth of the GPU) records the layout.
  const Run first = run_shimmed("record", engine_args(model()), false);
  ASSERT_EQ(first.engine.exit_code, 0) << first.engine.err << first.shim_log;
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_EQ(slots()[0].value("layout", ""), "engine") << slots().dump() << log();

  const Run run = run_shimmed("zero-copy", sized(model()), true);
  ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
  EXPECT_EQ(tokens_of(run.engine), tokens_of(alone));
  auto inj = injection_of(run.shim_log);
  ASSERT_TRUE(inj) << run.shim_log;
  EXPECT_TRUE(inj->zero_copy) << run.shim_log;
  const long blocks = kv_blocks_of(run.engine);
  // kv_cache_ready comes after every KV tensor was allocated: it has all of it.
  EXPECT_GE(double(blocks), 0.85 * double(alone_blocks))
      << "KV blocks under thaw " << blocks << ", without thaw " << alone_blocks;
  EXPECT_TRUE(only_thawds_pool_on_the_gpu());
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(WeightInjection, AnEngineAskingForMoreThanItsBudgetIsRefusedAtOnce) {
  start_registry();
  pool_share_ = "0.9";
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  // 2 million KV blocks are far more than the 256 MiB GPU: the allocation is refused
  // (OUT_OF_MEMORY, no hang) and nothing of another slot or of the pool is taken.
  const auto started = std::chrono::steady_clock::now();
  const Run run =
      run_shimmed("greedy",
                  refengine_test::small_generate_args(
                      model(), {"--num-gpu-blocks-override", "2000000", "--enforce-eager"}),
                  true);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(120));
  EXPECT_NE(run.engine.exit_code, 0);
  EXPECT_NE(run.engine.err.find("out of memory"), std::string::npos) << run.engine.err;
  EXPECT_TRUE(only_thawds_pool_on_the_gpu());
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
