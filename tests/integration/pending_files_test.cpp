// An engine launched together with thawd's fetch (the agent no longer waits for the stage):
// it looks its model's files up before thawd has listed the model and created them. The
// registry serves thaw-manifest.json at 10 kB/s, so the listing takes seconds and the engine
// surely looks first. Under the shim, stat/fopen/open of such a file wait for thawd to create
// it (at its final size) and the engine loads the right bytes: the same tokens as from the
// finished model. A file the fetch never creates is still missing (ENOENT), and is answered as
// soon as the fetch has created every file, not when it ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

std::vector<nlohmann::json> tokens_of(const refengine_test::EngineRun& r) {
  std::vector<nlohmann::json> out;
  for (const auto& line : refengine_test::json_lines(r.out)) out.push_back(line["tokens"]);
  return out;
}

// The program's own output: run() gives stdout and stderr together, and the shim says on
// stderr that it loaded.
std::string program_output(const std::string& both) {
  std::string out, line;
  std::istringstream in(both);
  while (std::getline(in, line))
    if (!line.starts_with("thaw-preload[")) out += line + "\n";
  return out;
}

class PendingModelFiles : public ThawdFixture {
 protected:
  // nginx: /slow/ serves the model's manifest (what thawd lists the model from) at 10 kB/s;
  // thawd fetches the rest at 3 MB/s (store.max_rate).
  void start_slow_registry_and_thawd() {
    registry_ = std::make_unique<thaw::store::testing::RegistryFixture>(
        "1m; if ($uri ~ thaw-manifest) { set $limit_rate 10k; } limit_rate_after 0");
    bus_ = std::make_unique<thaw::testing::PrivateBus>(dir_.path(), BusPolicy::open);
    metrics_port_ = thaw::store::testing::free_loopback_port();
    write_config("3MB");  // the rest of the model: ~9 s
    std::string config = thaw::testing::slurp(dir_.path() / "thawd.toml");
    const std::string base = registry_->server().base_url();
    config = std::regex_replace(config, std::regex("registry = \"[^\"]*\""),
                                "registry = \"" + base + "/slow\"");
    std::ofstream(dir_.path() / "thawd.toml") << config;
    thaw::testing::NotifySocket notify(dir_.path() / "notify");
    pid_ = thaw::testing::spawn(
        {THAWD_PATH, "--config", (dir_.path() / "thawd.toml").string()},
        {"NOTIFY_SOCKET=" + (dir_.path() / "notify").string(), "THAW_LIBCUDA=" THAW_EMU_LIBCUDA,
         "THAW_EMU_DEVICE_MEMORY=256M", "THAW_EMU_STATE_DIR=" + emu_state_dir().string(),
         "no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1"},
        dir_.path() / "thawd.log");
    ASSERT_FALSE(notify.until("READY=1").empty()) << "thawd did not start:\n" << log();
  }
  fs::path cached(const std::string& file) const {
    return dir_.path() / "cache" / "gpt-syn" / file;
  }
  std::string shim_env() const {
    return "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
           " THAW_PRELOAD_LOG=" + (dir_.path() / "shim.log").string();
  }
  std::string shim_log() const { return thaw::testing::slurp(dir_.path() / "shim.log"); }
  // thawctl models' table ("" when the fetch of gpt-syn is not running).
  std::string fetch_running() {
    const auto r = thawctl({"models"});
    return r.output.find("fetching") != std::string::npos ? "" : r.output;
  }
};

TEST_F(PendingModelFiles, EngineStartedWithTheFetchLoadsTheRightBytes) {
  start_slow_registry_and_thawd();
  const auto reference = refengine_test::run_engine(refengine_test::small_generate_args(
      registry_->model_dir(), {"--num-gpu-blocks-override", "32", "--enforce-eager"}));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;

  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
  // What makes this test mean anything: the engine starts before its files exist.
  ASSERT_FALSE(fs::exists(cached("config.json")))
      << "thawd listed the model before the engine started; the registry is not slow enough";
  const auto streamed = refengine_test::run_engine(
      refengine_test::small_generate_args(dir_.path() / "cache" / "gpt-syn",
                                          {"--num-gpu-blocks-override", "32", "--enforce-eager"}),
      shim_env());
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err << shim_log();
  EXPECT_EQ(tokens_of(streamed), tokens_of(reference));
  const std::string log_text = shim_log();
  EXPECT_NE(log_text.find("is not in the cache yet: thawd is fetching gpt-syn"), std::string::npos)
      << log_text;
  // The engine's first look (its CLI checks the model directory) waited for the directory.
  // (Whether stdio's read of config.json then had to wait for its bytes depends on timing:
  // "fopen of ... waits for the whole file" in the log when it did.)
  EXPECT_NE(log_text.find("gpt-syn: created by thawd's fetch after"), std::string::npos)
      << log_text;
}

TEST_F(PendingModelFiles, StatAnswersTheFinalSizeOfAFileNotCreatedYet) {
  start_slow_registry_and_thawd();
  const auto files = thaw::store::testing::model_files(registry_->model_dir());
  std::string shard;
  for (const auto& f : files)
    if (f.ends_with(".safetensors")) shard = f;
  ASSERT_FALSE(shard.empty());
  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
  ASSERT_FALSE(fs::exists(cached(shard))) << "the registry is not slow enough";
  // coreutils' stat (statx or fstatat in glibc 2.36) under the shim.
  const auto r = thaw::testing::run({"/usr/bin/env", "LD_PRELOAD=" THAW_PRELOAD_LIB,
                                     "THAW_SOCKET=" + socket_path().string(), "/usr/bin/stat", "-c",
                                     "%s", cached(shard).string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(program_output(r.output),
            std::to_string(fs::file_size(registry_->model_dir() / shard)) + "\n")
      << r.output;
  // Python's os.stat too, on another shard, and access().
  const auto py = thaw::testing::run(
      {"/usr/bin/env", "LD_PRELOAD=" THAW_PRELOAD_LIB, "THAW_SOCKET=" + socket_path().string(),
       "/usr/bin/python3.11", "-c",
       "import os,sys; p=sys.argv[1]; print(os.stat(p).st_size, os.access(p, os.R_OK))",
       cached(files.front()).string()});
  ASSERT_EQ(py.exit_code, 0) << py.output;
  EXPECT_EQ(program_output(py.output),
            std::to_string(fs::file_size(registry_->model_dir() / files.front())) + " True\n");

  // A file the model does not have: missing, and said so while the fetch still runs (every
  // file is created by then; waiting for the fetch's end would stall an engine checking for
  // an optional file).
  const auto absent = thaw::testing::run({"/usr/bin/env", "LD_PRELOAD=" THAW_PRELOAD_LIB,
                                          "THAW_SOCKET=" + socket_path().string(), "/usr/bin/stat",
                                          "-c", "%s", cached("no-such-file.bin").string()});
  EXPECT_NE(absent.exit_code, 0) << absent.output;
  EXPECT_NE(absent.output.find("No such file"), std::string::npos) << absent.output;
  EXPECT_EQ(fetch_running(), "") << "the fetch ended before the missing file was answered; "
                                    "the test cannot tell waiting for it from not waiting";
}

// Without thawd (or for a model it is not fetching), a missing file is missing at once.
TEST_F(PendingModelFiles, WithoutAFetchAMissingFileIsMissingAtOnce) {
  start_registry();
  start_thawd(BusPolicy::open);
  fs::create_directories(dir_.path() / "cache" / "other");
  const auto start = std::chrono::steady_clock::now();
  const auto r = thaw::testing::run(
      {"/usr/bin/env", "LD_PRELOAD=" THAW_PRELOAD_LIB, "THAW_SOCKET=" + socket_path().string(),
       "/usr/bin/stat", "-c", "%s", (dir_.path() / "cache" / "other" / "config.json").string()});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("No such file"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
