// An engine launched together with thawd's fetch (the agent no longer waits for the stage):
// it looks its model's files up before thawd has listed the model and created them. The
// registry serves thaw-manifest.json at 10 kB/s, so the listing takes seconds and the engine
// surely looks first. Under the shim, stat/fopen/open of such a file wait for thawd to create
// it (at its final size) and the engine loads the right bytes: the same tokens as from the
// finished model. A file the fetch never creates is still missing (ENOENT), and is answered as
// soon as the fetch has created every file, not when it ends. A listing of the model directory
// (Python's glob, os.listdir, a C program's readdir) started before thawd created its files
// names every file the fetch creates, as the directory does once the fetch is done.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <future>
#include <iostream>
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
  // ASAN_OPTIONS: in the ASan build the sanitizer's runtime is preloaded with the shim into
  // Debian's Python, whose own allocations still held at exit LeakSanitizer reports (exit
  // status 1); those are not the shim's (its leaks are checked in thaw's own programs).
  std::string shim_env() const {
    return "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
           " THAW_PRELOAD_LOG=" + (dir_.path() / "shim.log").string() +
           " ASAN_OPTIONS=detect_leaks=0";
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

// What an engine that finds its weights by listing does (vLLM: glob *.safetensors, then each
// shard's safetensors header; transformers: config.json), in Debian's Python: one JSON line.
constexpr const char* kListingEngine = R"(
import glob, json, os, struct, sys
d = sys.argv[1]
shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, '*.safetensors')))
tensors = 0
for name in shards:
    with open(os.path.join(d, name), 'rb') as f:  # as safetensors' safe_open reads the header
        n = struct.unpack('<Q', f.read(8))[0]
        tensors += sum(1 for k in json.loads(f.read(n)) if k != '__metadata__')
with open(os.path.join(d, 'config.json')) as f:
    config = json.load(f)
print(json.dumps({'shards': shards, 'listdir': sorted(os.listdir(d)),
                  'scandir': sorted((e.name, e.is_file()) for e in os.scandir(d)),
                  'tensors': tensors, 'config': sorted(config)}))
)";

TEST_F(PendingModelFiles, ListingsStartedBeforeTheFilesExistNameEveryFile) {
  start_slow_registry_and_thawd();
  const fs::path model = dir_.path() / "cache" / "gpt-syn";
  const auto python = [&](const std::string& env) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    if (!env.empty()) {
      std::istringstream in(env);
      for (std::string kv; in >> kv;) argv.push_back(kv);
    }
    for (const char* a : {"/usr/bin/python3", "-c", kListingEngine}) argv.emplace_back(a);
    argv.push_back(model.string());
    return thaw::testing::run(argv);
  };
  const auto c_listing = [&](const std::string& mode) {
    std::istringstream in(shim_env());
    std::vector<std::string> argv = {"/usr/bin/env"};
    for (std::string kv; in >> kv;) argv.push_back(kv);
    argv.insert(argv.end(), {LIST_DIR_PROBE_BIN, mode, model.string()});
    return thaw::testing::run(argv);
  };

  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
  // What makes this test mean anything: every lister starts before the directory exists.
  ASSERT_FALSE(fs::exists(model)) << "thawd created the model directory before the listers "
                                     "started; the registry is not slow enough";
  const auto started = std::chrono::steady_clock::now();
  auto plain = std::async(std::launch::async, [&] { return python(""); });
  auto shimmed = std::async(std::launch::async, [&] { return python(shim_env()); });
  std::vector<std::future<thaw::testing::ProgramResult>> c_listers;
  for (const char* mode : {"readdir", "readdir64", "scandir", "fdopendir"}) {
    c_listers.push_back(
        std::async(std::launch::async, [&, m = std::string(mode)] { return c_listing(m); }));
  }
  const auto early_plain = plain.get();
  const auto listed = shimmed.get();
  const std::chrono::duration<double> listing_s = std::chrono::steady_clock::now() - started;
  ASSERT_EQ(listed.exit_code, 0) << listed.output << shim_log();

  // The fetch's end, then the directory as it stays: what every listing must have said.
  for (int i = 0; i < 600 && fetch_running().empty(); ++i) std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(fetch_running().empty()) << "the fetch did not end within 60 s";
  const std::chrono::duration<double> fetch_s = std::chrono::steady_clock::now() - started;
  // For the record: the engine's listing and header reads against the whole fetch.
  std::cout << fmt::format("listing engine done after {:.2f} s; fetch done after {:.2f} s\n",
                           listing_s.count(), fetch_s.count());
  const auto finished = python("");
  ASSERT_EQ(finished.exit_code, 0) << finished.output;
  const auto expected = nlohmann::json::parse(program_output(finished.output));
  const auto got = nlohmann::json::parse(program_output(listed.output));
  EXPECT_EQ(got, expected);
  // Every shard the registry publishes, and a listing with more than the shards (config.json,
  // the tokenizer, the index, thaw's own .thaw directory).
  std::vector<std::string> published;
  for (const auto& f : thaw::store::testing::model_files(registry_->model_dir()))
    if (f.ends_with(".safetensors")) published.push_back(f);
  EXPECT_EQ(got["shards"].get<std::vector<std::string>>(), published);
  EXPECT_EQ(published.size(), 18u);
  EXPECT_GT(got["listdir"].size(), published.size() + 1);
  EXPECT_GT(got["tensors"].get<int>(), 0);
  // Without the shim, the same engine started at the same moment found nothing to load.
  EXPECT_NE(early_plain.exit_code, 0) << early_plain.output;

  // C programs' readdir, readdir64, scandir and open + fdopendir, started with the Python ones.
  const auto on_disk = c_listing("readdir");  // now, after the fetch: the reference
  ASSERT_EQ(on_disk.exit_code, 0) << on_disk.output;
  for (auto& f : c_listers) {
    const auto r = f.get();
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(program_output(r.output), program_output(on_disk.output));
  }
  const std::string log_text = shim_log();
  EXPECT_NE(log_text.find("is listed once thawd's fetch of gpt-syn has created every file"),
            std::string::npos)
      << log_text;
}

// A listing once the fetch has created its files waits for their headers at most, not for
// the fetch's end (~9 s of tensor bytes); the fdopendir path (os.listdir of a descriptor,
// os.fwalk) included.
TEST_F(PendingModelFiles, ListingOnceTheFilesAreCreatedDoesNotWaitForTheFetchsEnd) {
  start_slow_registry_and_thawd();
  const fs::path model = dir_.path() / "cache" / "gpt-syn";
  ASSERT_EQ(thawctl({"fetch", "--no-wait", "gpt-syn"}).exit_code, 0) << log();
  // thawd creates every weight file at once, after the small files.
  const auto files = thaw::store::testing::model_files(registry_->model_dir());
  std::string last_shard;
  for (const auto& f : files)
    if (f.ends_with(".safetensors")) last_shard = f;
  for (int i = 0; i < 600 && !fs::exists(model / last_shard); ++i)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(fs::exists(model / last_shard));
  std::istringstream in(shim_env());
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (std::string kv; in >> kv;) argv.push_back(kv);
  argv.insert(argv.end(), {"/usr/bin/python3", "-c",
                           "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); "
                           "print(sorted(os.listdir(fd)))",
                           model.string()});
  const auto start = std::chrono::steady_clock::now();
  const auto r = thaw::testing::run(argv);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(fetch_running(), "") << "the fetch ended first; the test cannot tell waiting for "
                                    "it from not waiting";
  EXPECT_LT(took, 3s);
  for (const auto& f : files)
    if (f.ends_with(".safetensors") || f == "config.json")
      EXPECT_NE(r.output.find("'" + f + "'"), std::string::npos) << f << "\n" << r.output;
}

}  // namespace
