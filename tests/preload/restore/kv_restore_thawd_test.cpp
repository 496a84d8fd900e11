// The reference engine with --thaw-restore under libthaw-preload.so and a private thawd (daemon
// + shim + emulator + private dbus-daemon + loopback nginx; the model in thawd's cache):
//   - a first run profiles and records its KV-cache size (a "kvcache" artifact); a second run
//     restores it — its timeline has kv_restored and no profile_done — with the same blocks,
//     tokens and logits; both ways of reaching the driver;
//   - the fallbacks, each with one line saying why, each with the tokens and logits of a
//     profiling run: no shim; another configuration key; another device memory size (stale);
//     a corrupt stored record (refused, then replaced by the run's own record).
#include <gtest/gtest.h>

#include <regex>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

struct KvRun {
  refengine_test::EngineRun engine;
  std::string shim_log;
  std::string logits;
  std::vector<nlohmann::json> timeline;  // the JSON lines of stderr

  std::vector<nlohmann::json> tokens() const {
    std::vector<nlohmann::json> out;
    for (const auto& line : refengine_test::json_lines(engine.out)) out.push_back(line["tokens"]);
    return out;
  }
  std::optional<nlohmann::json> event(const std::string& name) const {
    for (const auto& e : timeline) {
      if (e.value("event", "") == name) return e;
    }
    return std::nullopt;
  }
  // The engine's --thaw-restore lines.
  std::vector<std::string> restore_lines() const {
    std::vector<std::string> out;
    std::istringstream in(engine.err);
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("refengine: --thaw-restore:")) out.push_back(line);
    }
    return out;
  }
  std::string all() const { return engine.err + "\n" + shim_log; }
};

class KvRestoreWithThawd : public ThawdFixture {
 protected:
  void SetUp() override {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }

  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }

  // One --logits-out path for every run: thawd keeps records per command line, so runs of one
  // configuration must have the same one.
  fs::path logits_path() const { return dir_.path() / "logits.json"; }
  std::vector<std::string> args(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(),
                 {"--enforce-eager", "--thaw-restore", "--logits-out", logits_path().string()});
    return refengine_test::small_generate_args(model(), extra);
  }

  // `shim`: under LD_PRELOAD=libthaw-preload.so with thawd's socket.
  KvRun run(const std::string& tag, bool shim = true, const std::vector<std::string>& extra = {},
            const std::string& extra_env = "", const std::string& binary = REFENGINE_BIN) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    std::string env;
    // The engine's own emulated GPU (6 GB, not thawd's): a lease of thawd's pool would cap it
    // at a pool that is not its own.
    if (shim) {
      env = "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
            " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0";
    }
    env += " " + extra_env;
    KvRun r;
    fs::remove(logits_path());
    r.engine = refengine_test::run_engine(args(extra), env, binary);
    r.shim_log = thaw::testing::slurp(shim_log);
    r.logits = thaw::testing::slurp(logits_path());
    std::istringstream in(r.engine.err);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("event")) r.timeline.push_back(std::move(j));
    }
    return r;
  }

  std::vector<fs::path> kv_artifacts() const {
    std::vector<fs::path> out;
    const fs::path dir = dir_.path() / "state" / "artifacts";
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with("kvcache-")) out.push_back(e.path());
    }
    return out;
  }

  // A run that profiled and recorded: its KV cache, for later runs to compare with.
  void expect_profiled(const KvRun& r) {
    ASSERT_EQ(r.engine.exit_code, 0) << r.all();
    EXPECT_TRUE(r.event("profile_done")) << r.engine.err;
    EXPECT_FALSE(r.event("kv_restored")) << r.engine.err;
    ASSERT_TRUE(r.event("kv_cache_ready")) << r.engine.err;
    EXPECT_EQ((*r.event("kv_cache_ready"))["restored"], false);
  }
  void expect_restored(const KvRun& r, const KvRun& recorded) {
    ASSERT_EQ(r.engine.exit_code, 0) << r.all();
    EXPECT_FALSE(r.event("profile_done")) << "the profiling pass ran\n" << r.all();
    ASSERT_TRUE(r.event("kv_restored")) << r.all();
    EXPECT_TRUE(r.restore_lines().empty()) << r.engine.err;
    const auto ready = *r.event("kv_cache_ready");
    EXPECT_EQ(ready["restored"], true);
    EXPECT_EQ(ready["num_blocks"], (*recorded.event("kv_cache_ready"))["num_blocks"]);
    EXPECT_EQ(ready["bytes"], (*recorded.event("kv_cache_ready"))["bytes"]);
    EXPECT_GE((*r.event("kv_restored"))["ms"].get<double>(), 0.0);
    EXPECT_EQ(r.tokens(), recorded.tokens());
    EXPECT_FALSE(r.logits.empty());
    EXPECT_TRUE(r.logits == recorded.logits) << "logits differ after a restore";
  }
  // One --thaw-restore line, containing `why`.
  void expect_one_line(const KvRun& r, const std::string& why) {
    const auto lines = r.restore_lines();
    ASSERT_EQ(lines.size(), 1u) << r.engine.err;
    EXPECT_NE(lines[0].find(why), std::string::npos) << lines[0] << "\n(expected: " << why << ")";
    EXPECT_NE(lines[0].find("running the profiling pass"), std::string::npos) << lines[0];
  }
};

TEST_F(KvRestoreWithThawd, FirstRunRecordsSecondRunRestoresWithTheSameTokensAndLogits) {
  const KvRun first = run("first");
  expect_profiled(first);
  expect_one_line(first, "no usable KV record (none: thawd holds no KV record");
  EXPECT_NE(log().find("stored its kvcache artifact for gpt-syn"), std::string::npos) << log();
  const auto stored = kv_artifacts();
  ASSERT_EQ(stored.size(), 1u);
  const auto doc = nlohmann::json::parse(thaw::testing::slurp(stored[0]));
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["identity"]["model"], "gpt-syn");
  EXPECT_EQ(doc["kv"]["num_blocks"], (*first.event("kv_cache_ready"))["num_blocks"]);
  EXPECT_EQ(doc["conditions"]["device_total"], 6ull << 30);
  EXPECT_NE(doc["key"].get<std::string>().find("gpu_memory_utilization=0.9"), std::string::npos);
  EXPECT_GT(doc["conditions"]["engine_bytes"].get<std::uint64_t>(), 0u) << "weights, buffers";

  const KvRun second = run("second");
  expect_restored(second, first);
  EXPECT_NE(second.shim_log.find("restore: KV record found"), std::string::npos) << second.shim_log;
  // The engine linked against libcuda.so.1 finds the same ABI through the same dlsym.
  const KvRun linked = run("linked", true, {}, "", REFENGINE_LINKED_BIN);
  ASSERT_EQ(linked.engine.exit_code, 0) << linked.all();
  EXPECT_TRUE(linked.event("profile_done")) << "another engine binary: another identity\n"
                                            << linked.all();
  const KvRun linked_again = run("linked2", true, {}, "", REFENGINE_LINKED_BIN);
  expect_restored(linked_again, first);
  // What the shims reported at exit: two lookups without a usable record, two restores.
  const std::string metrics = thaw::testing::run({"/usr/bin/curl", "-sf", metrics_url()}).output;
  for (const char* line :
       {"thaw_engine_kv_restores_total 2\n", "thaw_engine_kv_restore_fallbacks_total 2\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(KvRestoreWithThawd, WithoutTheShimTheEngineProfiles) {
  const KvRun recorded = run("recorded");
  expect_profiled(recorded);
  const KvRun plain = run("plain", false);
  expect_profiled(plain);
  expect_one_line(plain, "thaw's restore ABI is not in this process (no libthaw-preload.so)");
  EXPECT_EQ(plain.tokens(), recorded.tokens());
  EXPECT_TRUE(plain.logits == recorded.logits);
  EXPECT_EQ((*plain.event("kv_cache_ready"))["num_blocks"],
            (*recorded.event("kv_cache_ready"))["num_blocks"]);
}

TEST_F(KvRestoreWithThawd, AnotherConfigurationOrDeviceMakesTheRecordStale) {
  const KvRun recorded = run("recorded");
  expect_profiled(recorded);

  // Another --gpu-memory-utilization: thawd hands over the other command line's record, whose
  // key differs; this run profiles and records its own, which the next such run restores.
  const std::vector<std::string> less = {"--gpu-memory-utilization", "0.8"};
  const KvRun changed = run("changed", true, less);
  expect_profiled(changed);
  expect_one_line(changed, "stale: the KV record is stale: the configuration key differs");
  EXPECT_LT((*changed.event("kv_cache_ready"))["num_blocks"].get<int>(),
            (*recorded.event("kv_cache_ready"))["num_blocks"].get<int>());
  EXPECT_EQ(changed.tokens(), recorded.tokens());
  EXPECT_TRUE(changed.logits == recorded.logits);
  EXPECT_EQ(kv_artifacts().size(), 2u) << "one record per command line";
  expect_restored(run("changed_again", true, less), changed);

  // Another device memory size: the same identity (the GPU's name does not change), stale.
  const KvRun smaller =
      run("smaller", true, {},
          "THAW_EMU_DEVICE_MEMORY=4G THAW_EMU_STATE_DIR=" + (dir_.path() / "emu4g").string());
  expect_profiled(smaller);
  expect_one_line(smaller, "stale: the KV record is stale: the device's total memory differs");
  EXPECT_LT((*smaller.event("kv_cache_ready"))["num_blocks"].get<int>(),
            (*recorded.event("kv_cache_ready"))["num_blocks"].get<int>());
  EXPECT_EQ(smaller.tokens(), recorded.tokens());
  EXPECT_TRUE(smaller.logits == recorded.logits);
  // It recorded the 4 GB device's size over the 6 GB one's: a 6 GB run now finds that stale.
  const KvRun back = run("back");
  expect_profiled(back);
  expect_one_line(back, "the device's total memory differs");
}

TEST_F(KvRestoreWithThawd, ACorruptStoredRecordIsRefusedAndReplaced) {
  const KvRun recorded = run("recorded");
  expect_profiled(recorded);
  const auto stored = kv_artifacts();
  ASSERT_EQ(stored.size(), 1u);
  const std::string good = thaw::testing::slurp(stored[0]);

  const std::vector<std::pair<std::string, std::string>> corruptions = {
      {"truncated", good.substr(0, good.size() / 2)},
      {"future", std::regex_replace(good, std::regex(R"("version":1)"), R"("version":2)")},
      {"inconsistent",
       std::regex_replace(good, std::regex(R"("num_blocks":\d+)"), R"("num_blocks":3)")},
  };
  const std::vector<std::string> reasons = {"it is not JSON",
                                            "its version 2 is not one this shim reads (1)",
                                            "is not num_blocks 3 x block_bytes"};
  for (std::size_t i = 0; i < corruptions.size(); ++i) {
    const auto& [tag, text] = corruptions[i];
    ASSERT_NE(text, good) << tag;
    std::ofstream(stored[0], std::ios::trunc) << text;
    const KvRun r = run(tag);
    expect_profiled(r);
    expect_one_line(r, "(corrupt: thawd's KV record is refused: ");
    expect_one_line(r, reasons[i]);
    EXPECT_EQ(r.tokens(), recorded.tokens()) << tag;
    EXPECT_TRUE(r.logits == recorded.logits) << tag;
    // The run recorded its own: the file is a good record again.
    EXPECT_EQ(thaw::testing::slurp(stored[0]), good) << tag;
  }
  expect_restored(run("after"), recorded);
}

}  // namespace
