// The deterministic layout's record through thawd (daemon + shim + emulator + private
// dbus-daemon + loopback nginx, the reference engine unmodified):
//   - a first run stores its record (allocation sequence, H2D copy map, cuMemGetInfo
//     answers) in thawd's state dir; a second run finds it, matches it and gets the same
//     addresses; a run whose allocation sequence differs (another --max-num-batched-tokens)
//     leaves deterministic mode at the first differing allocation, says which, and still
//     produces the tokens it produces without the shim;
//   - the shims' counters reach thawd's metrics when the engines exit;
//   - an engine attached to a prewarmed slot sizes its KV cache by thawd's budget;
//   - eight engines at once under one thawd, streaming a model thawd is still fetching.
#include <gtest/gtest.h>

#include <future>
#include <regex>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

std::vector<std::string> engine_args(const fs::path& model,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = refengine_test::small_generate_args(model, {"--enforce-eager"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<nlohmann::json> tokens_of(const refengine_test::EngineRun& r) {
  std::vector<nlohmann::json> out;
  for (const auto& line : refengine_test::json_lines(r.out)) out.push_back(line["tokens"]);
  return out;
}

// "cuMemAlloc(SIZE) = 0xADDR (deterministic #i)" lines of a shim log.
std::vector<std::string> deterministic_allocations(const std::string& log) {
  std::vector<std::string> out;
  static const std::regex line(R"(cuMemAlloc\((\d+)\) = (0x[0-9a-f]+) \(deterministic)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1].str() + "@" + (*it)[2].str());
  }
  return out;
}

// One sample of thawd's metrics, e.g. "thaw_engine_reports_total".
long metric(const std::string& text, const std::string& name) {
  const std::regex line("(^|\n)" + name + " ([0-9]+)");
  std::smatch m;
  return std::regex_search(text, m, line) ? std::stol(m[2]) : -1;
}

class LayoutRecordWithThawd : public ThawdFixture {
 protected:
  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }

  // The model fully in thawd's cache.
  void fetch_model() { ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log(); }

  struct Run {
    refengine_test::EngineRun engine;
    std::string shim_log;
  };
  Run run_shimmed(const std::string& tag, std::vector<std::string> args,
                  const std::string& extra_env = "", const std::string& binary = REFENGINE_BIN) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    // These engines run on an emulated GPU of their own (6 GB, not thawd's 256 MiB one): a
    // lease of thawd's pool would cap them at a pool that is not theirs.
    const std::string env =
        "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
        " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0 " + extra_env;
    Run r;
    r.engine = refengine_test::run_engine(args, env, binary);
    r.shim_log = thaw::testing::slurp(shim_log);
    return r;
  }

  std::vector<fs::path> stored_artifacts() const {
    std::vector<fs::path> out;
    const fs::path dir = dir_.path() / "state" / "artifacts";
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
    return out;
  }

  std::string metrics() const {
    return thaw::testing::run({"/usr/bin/curl", "-sf", metrics_url()}).output;
  }
};

TEST_F(LayoutRecordWithThawd, FirstRunRecordsLaterRunsMatchAChangedSequenceFallsBack) {
  start_registry();
  start_thawd(BusPolicy::open);
  fetch_model();

  const Run first = run_shimmed("first", engine_args(model()));
  ASSERT_EQ(first.engine.exit_code, 0) << first.engine.err << first.shim_log;
  EXPECT_NE(log().find("stored its layout artifact for gpt-syn"), std::string::npos) << log();
  const auto artifacts = stored_artifacts();
  ASSERT_EQ(artifacts.size(), 1u);
  const auto record = nlohmann::json::parse(thaw::testing::slurp(artifacts[0]));
  EXPECT_EQ(record["identity"]["model"], "gpt-syn");
  const auto first_allocations = deterministic_allocations(first.shim_log);
  ASSERT_GT(first_allocations.size(), 5u) << first.shim_log;
  EXPECT_EQ(record["allocations"].size(), first_allocations.size());
  // The copy map: the weights came from the model's safetensors, copied into the layout.
  std::uint64_t copied = 0;
  for (const auto& c : record["copies"]) {
    EXPECT_EQ(c[2].get<std::string>().find(".safetensors"), c[2].get<std::string>().size() - 12);
    copied += c[4].get<std::uint64_t>();
  }
  std::uint64_t safetensors_bytes = 0;
  for (const auto& e : fs::directory_iterator(model())) {
    if (e.path().extension() == ".safetensors") safetensors_bytes += e.file_size();
  }
  EXPECT_GT(copied, safetensors_bytes * 9 / 10) << record["copies"].dump();
  EXPECT_LE(copied, safetensors_bytes);
  EXPECT_FALSE(record["mem_info"].empty()) << "the engine sized its KV cache by cuMemGetInfo";

  // Same engine, model, GPU, driver: the record is found and matched, the addresses repeat.
  const Run second = run_shimmed("second", engine_args(model()));
  ASSERT_EQ(second.engine.exit_code, 0) << second.engine.err;
  EXPECT_NE(second.shim_log.find("thawd has a layout record for gpt-syn"), std::string::npos)
      << second.shim_log;
  EXPECT_EQ(second.shim_log.find("diverged"), std::string::npos) << second.shim_log;
  EXPECT_EQ(deterministic_allocations(second.shim_log), first_allocations);
  EXPECT_EQ(tokens_of(second.engine), tokens_of(first.engine));

  // A fixed KV-cache size changes the engine's KV allocations: the sequence diverges after
  // the weights, the shim says where and leaves deterministic mode; the tokens are right.
  const std::vector<std::string> fixed_kv = {"--num-gpu-blocks-override", "32"};
  const auto plain = refengine_test::run_engine(engine_args(model(), fixed_kv));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const Run changed = run_shimmed("changed", engine_args(model(), fixed_kv));
  ASSERT_EQ(changed.engine.exit_code, 0) << changed.engine.err << changed.shim_log;
  EXPECT_EQ(tokens_of(changed.engine), tokens_of(plain));
  const std::string all = changed.shim_log + changed.engine.err;
  std::smatch where;
  ASSERT_TRUE(std::regex_search(
      all, where, std::regex(R"(diverged from its recorded layout: allocation #(\d+))")))
      << all;
  const std::size_t diverged_at = std::stoul(where[1]);
  EXPECT_GT(diverged_at, 0u);
  const auto changed_allocations = deterministic_allocations(changed.shim_log);
  EXPECT_EQ(changed_allocations.size(), diverged_at) << "deterministic mode left at the divergence";
  EXPECT_TRUE(std::equal(changed_allocations.begin(), changed_allocations.end(),
                         first_allocations.begin()));

  const std::string m = metrics();
  EXPECT_EQ(metric(m, "thaw_engine_reports_total"), 3) << m;
  EXPECT_EQ(metric(m, "thaw_engine_layout_divergences_total"), 1) << m;
  EXPECT_EQ(metric(m, "thaw_artifacts_stored_total"), 2) << "first run, and the diverged one\n"
                                                         << m;
  EXPECT_EQ(metric(m, "thaw_artifacts_served_total"), 2) << m;
  EXPECT_GT(metric(m, "thaw_engine_calls_intercepted_total"), 20) << m;
  EXPECT_GT(metric(m, "thaw_engine_deterministic_allocations_total"), 10) << m;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(LayoutRecordWithThawd, AnEngineAttachedToAPrewarmedSlotSeesThawdsBudget) {
  start_registry();
  start_thawd(BusPolicy::open);
  ASSERT_EQ(thawctl({"prewarm", "gpt-syn"}).exit_code, 0) << log();
  const auto reference = refengine_test::run_engine(engine_args(model()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  // The engine shares thawd's emulated GPU (THAW_EMU_STATE_DIR).
  const std::string device =
      "THAW_EMU_DEVICE_MEMORY=256M THAW_EMU_STATE_DIR=" + emu_state_dir().string() +
      " THAW_PRELOAD_ATTACH=1";
  // The engine's weights are copied out of the slot into its own memory (weight injection's
  // copy mode), which must fit beside thawd's pool on the driver: hence the lower
  // utilization.
  const Run attached =
      run_shimmed("attached", engine_args(model(), {"--gpu-memory-utilization", "0.5"}), device);
  ASSERT_EQ(attached.engine.exit_code, 0) << attached.engine.err << attached.shim_log;
  EXPECT_EQ(tokens_of(attached.engine), tokens_of(reference));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      attached.shim_log, m,
      std::regex(
          R"(attached to slot (g0s\d+) of gpt-syn: cuMemGetInfo answers a budget of (\d+) bytes)")))
      << attached.shim_log;
  const std::uint64_t budget = std::stoull(m[2]);
  EXPECT_GT(budget, 0u);
  EXPECT_LE(budget, 128ull << 20) << "more than thawd's pool (pool_share 0.5 of 256 MiB)";
  // The engine's memory profile saw the budget as the device's total.
  bool seen = false;
  std::istringstream timeline(attached.engine.err);
  for (std::string text; std::getline(timeline, text);) {
    const auto line = nlohmann::json::parse(text, nullptr, false);
    if (line.is_object() && line.value("event", "") == "profile_done") {
      EXPECT_EQ(line["total"].get<std::uint64_t>(), budget) << line.dump();
      EXPECT_LE(line["free"].get<std::uint64_t>(), budget) << line.dump();
      seen = true;
    }
  }
  EXPECT_TRUE(seen) << attached.engine.err;
  // While it ran the slot was the engine's; it gave the pages it copied out back, and at its
  // exit thawd evicted the rest.
  EXPECT_NE(log().find("evicted as its engine went without handing it back"), std::string::npos)
      << log();
}

TEST_F(LayoutRecordWithThawd, EightEnginesAtOnceUnderOneThawdStreamingTheModel) {
  start_registry();
  start_thawd(BusPolicy::open, "8MB");
  const auto reference = refengine_test::run_engine(engine_args(registry_->model_dir()));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
  const auto files = thaw::store::testing::model_files(registry_->model_dir());
  ASSERT_TRUE(thaw::testing::eventually([&] {
    for (const auto& f : files) {
      if (!fs::exists(model() / f)) return false;
    }
    return true;
  }));
  std::vector<std::future<Run>> runs;
  for (int i = 0; i < 8; ++i) {
    runs.push_back(std::async(std::launch::async, [this, i] {
      // A fixed KV cache: eight engines share the emulated device's memory. Both ways of
      // reaching the driver, alternately.
      return run_shimmed("many" + std::to_string(i),
                         engine_args(model(), {"--num-gpu-blocks-override", "32"}), "",
                         i % 2 ? REFENGINE_LINKED_BIN : REFENGINE_BIN);
    }));
  }
  for (auto& f : runs) {
    const Run r = f.get();
    ASSERT_EQ(r.engine.exit_code, 0) << r.engine.err << r.shim_log;
    EXPECT_EQ(tokens_of(r.engine), tokens_of(reference));
    EXPECT_NE(r.shim_log.find("readiness from thawd"), std::string::npos) << r.shim_log;
  }
  EXPECT_EQ(metric(metrics(), "thaw_engine_reports_total"), 8);
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
