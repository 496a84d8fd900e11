// thaw-fetch as a user and a benchmark script run it: exit codes (0, 1 with one line naming
// what failed, 2 for usage), publish, fetch --json (the fields scripts read), status --json;
// and the CLI's pure pieces (sizes, the progress line).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "byte_size.hpp"
#include "daemon/store/registry/manifest.hpp"
#include "fetch_test_support.hpp"
#include "report.hpp"

namespace thaw::fetch_cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using store::testing::kModelName;
using store::testing::RegistryFixture;
using store::testing::TempDir;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

CliRun thaw_fetch(std::vector<std::string> args) {
  args.insert(args.begin(), THAW_FETCH_PATH);
  CliRun run;
  run.code = store::testing::run_program(args, &run.out, &run.err);
  return run;
}

std::size_t lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(ThawFetchCliTest, HelpAndUsageErrors) {
  CliRun help = thaw_fetch({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("fetch"), std::string::npos);
  CliRun fetch_help = thaw_fetch({"fetch", "--help"});
  EXPECT_EQ(fetch_help.code, 0);
  for (const char* flag : {"--registry", "--model", "--cache", "--stage", "--connections",
                           "--budget", "--json", "--quiet", "goodput_bytes_per_s"}) {
    EXPECT_NE(fetch_help.out.find(flag), std::string::npos) << flag;
  }
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{},
        {"fetch", "--model", "m"},
        {"frobnicate"},
        {"fetch", "--registry", "/r", "--model", "m", "--cache", "/c", "--budget", "lots"},
        {"fetch", "--registry", "/r", "--model", "m", "--cache", "/c", "--consolidate"},
        {"publish"}}) {
    CliRun run = thaw_fetch(bad);
    EXPECT_EQ(run.code, 2) << run.err;
    EXPECT_EQ(lines(run.err), 1u) << run.err;
    EXPECT_TRUE(run.err.starts_with("thaw-fetch: error: ")) << run.err;
  }
}

TEST(ThawFetchCliTest, PublishFetchJsonAndStatus) {
  RegistryFixture fixture;
  // Publish again with the CLI (the fixture's manifest has 64 KiB chunks; this one 128 KiB).
  CliRun publish =
      thaw_fetch({"publish", fixture.model_dir().string(), "--chunk-size", "128KiB", "--json"});
  ASSERT_EQ(publish.code, 0) << publish.err;
  const json published = json::parse(publish.out);
  EXPECT_EQ(published["files"], 20);
  EXPECT_EQ(published["chunk_size"], 128 << 10);
  EXPECT_TRUE(fs::exists(fixture.model_dir() / store::kManifestName));

  TempDir cache;
  CliRun fetch =
      thaw_fetch({"fetch", "--registry", fixture.server().base_url(), "--model", kModelName,
                  "--cache", cache.path().string(), "--stage", "1/4", "--json"});
  ASSERT_EQ(fetch.code, 0) << fetch.err;
  const json summary = json::parse(fetch.out);
  for (const char* field :
       {"model", "cache_key", "cache", "registry", "stage", "layers", "consolidate", "bytes",
        "bytes_planned", "bytes_cached", "seconds", "goodput_bytes_per_s", "time_to_plan_s",
        "time_to_first_tensor_s", "retries", "chunk_refetches", "files"}) {
    EXPECT_TRUE(summary.contains(field)) << field;
  }
  EXPECT_EQ(summary["model"], kModelName);
  EXPECT_EQ(summary["stage"], "1/4");
  EXPECT_EQ(summary["layers"], json::array({2, 4}));
  EXPECT_GT(summary["bytes"].get<std::uint64_t>(), 0u);
  EXPECT_GT(summary["goodput_bytes_per_s"].get<double>(), 0.0);
  EXPECT_TRUE(summary["time_to_first_tensor_s"].is_number());
  ASSERT_EQ(summary["files"].size(), 20u);
  std::uint64_t file_bytes = 0;
  for (const json& f : summary["files"]) {
    for (const char* field :
         {"path", "size", "whole", "plan_bytes", "chunk_size", "chunks", "chunks_fetched",
          "chunks_ready", "bytes_fetched", "state", "sha256_checked"}) {
      EXPECT_TRUE(f.contains(field)) << field;
    }
    EXPECT_EQ(f["chunk_size"], 128 << 10);
    file_bytes += f["bytes_fetched"].get<std::uint64_t>();
  }
  EXPECT_EQ(file_bytes, summary["bytes"].get<std::uint64_t>());

  CliRun status = thaw_fetch({"status", "--cache", cache.path().string(), "--json"});
  ASSERT_EQ(status.code, 0) << status.err;
  const json listing = json::parse(status.out);
  ASSERT_EQ(listing["models"].size(), 1u);
  EXPECT_EQ(listing["models"][0]["key"], kModelName);
  ASSERT_EQ(listing["models"][0]["files"].size(), 20u);
  std::set<std::string> states;
  for (const json& f : listing["models"][0]["files"]) states.insert(f["state"]);
  EXPECT_TRUE(states.contains("complete"));  // the small files, at least
  EXPECT_TRUE(states.contains("filling"));   // shards of which stage 1 needs a part

  // The rest, as a consolidation would; then everything is complete.
  CliRun rest =
      thaw_fetch({"fetch", "--registry", fixture.server().base_url(), "--model", kModelName,
                  "--cache", cache.path().string(), "--background", "--json", "--quiet"});
  ASSERT_EQ(rest.code, 0) << rest.err;
  const json full = json::parse(rest.out);
  EXPECT_EQ(full["stage"], nullptr);
  EXPECT_EQ(full["bytes_cached"], summary["bytes"]);
  for (const json& f : full["files"]) EXPECT_EQ(f["state"], "complete") << f["path"];
}

TEST(ThawFetchCliTest, FailureIsOneLineAndExitOne) {
  RegistryFixture fixture;
  TempDir cache;
  CliRun run = thaw_fetch({"fetch", "--registry", fixture.server().base_url(), "--model", "missing",
                           "--cache", cache.path().string(), "--json"});
  EXPECT_EQ(run.code, 1);
  EXPECT_EQ(lines(run.err), 1u) << run.err;
  EXPECT_TRUE(run.err.starts_with("thaw-fetch: error: ")) << run.err;
  EXPECT_NE(run.err.find("missing"), std::string::npos);
  const json failure = json::parse(run.out);
  EXPECT_EQ(failure["error"]["code"], "registry");

  CliRun status = thaw_fetch({"status", "--cache", (cache.path() / "nope").string()});
  EXPECT_EQ(status.code, 1);
  EXPECT_EQ(lines(status.err), 1u) << status.err;
}

TEST(ThawFetchCliTest, SizesAndProgressLine) {
  EXPECT_EQ(parse_byte_size("4MiB"), 4u << 20);
  EXPECT_EQ(parse_byte_size("2GB"), 2'000'000'000u);
  EXPECT_EQ(parse_byte_size("1048576"), 1u << 20);
  EXPECT_EQ(parse_byte_size("1.5kib"), 1536u);
  for (const char* bad : {"", "MiB", "0", "4 MiB", "4XB", "-1", "1e30"}) {
    EXPECT_FALSE(parse_byte_size(bad)) << bad;
  }
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * (1 << 20)), "1.5 MiB");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(std::nullopt), "?");

  store::ModelFetchProgress p;
  p.phase = store::FetchPhase::tensors;
  p.bytes_total = 100 << 20;
  p.bytes_done = 25 << 20;
  p.rate_bytes_per_s = 10 << 20;
  p.eta_s = 7.5;
  p.files_total = 20;
  p.files_done = 5;
  const std::string line = progress_line("m", p, 0);
  EXPECT_EQ(line, "m [tensors]  25.0% 25.0 MiB / 100.0 MiB  10.0 MiB/s  ETA 0:08  files 5/20");
  EXPECT_EQ(progress_line("m", p, 10).size(), 10u);
  // A terminal wide enough gets a bar.
  EXPECT_NE(progress_line("m", p, 120).find("[#####...............]  25.0%"), std::string::npos)
      << progress_line("m", p, 120);
  // Before the plan gives a total: no "0 B / 0 B", no share, no ETA.
  store::ModelFetchProgress start;
  start.phase = store::FetchPhase::listing;
  EXPECT_EQ(progress_line("m", start, 0), "m [listing] resolving…");
}

}  // namespace
}  // namespace thaw::fetch_cli
