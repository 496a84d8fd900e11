// The reference engine, unmodified, under libthaw-preload.so (no thawd: the shim works on
// its own): the same tokens and bit-identical logits as without it, in both ways of reaching
// the driver; the same device addresses on every run; eight engines at once; the engine forking
// its engine core into a child process that uses CUDA (vLLM V1's layout).
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <regex>
#include <set>
#include <sstream>

#include "engine_process.hpp"

namespace {

using namespace refengine_test;

const fs::path kModel = fs::path(REFENGINE_TEST_MODELS) / "gpt2-mini-f16";

std::vector<std::string> generate_args(const fs::path& logits) {
  return {"generate",
          "--model",
          kModel.string(),
          "--tokens",
          "1,2,3,4,5",
          "--tokens",
          "9,8,7",
          "--max-tokens",
          "5",
          "--ignore-eos",
          "--json",
          "--max-num-seqs",
          "4",
          "--max-model-len",
          "32",
          "--max-num-batched-tokens",
          "12",
          "--num-gpu-blocks-override",
          "32",
          "--logits-out",
          logits.string()};
}

struct Result {
  std::vector<std::vector<int>> tokens;
  std::string logits;
  std::string log;  // the shim's THAW_PRELOAD_LOG
  int exit_code = -1;
  std::string err;
};

Result generate(const std::string& binary, bool shim, const std::string& tag,
                const std::vector<std::string>& extra_args = {},
                const std::string& extra_env = "") {
  const fs::path dir =
      fs::temp_directory_path() / ("preload_refengine_" + std::to_string(::getpid()) + "_" + tag);
  fs::create_directories(dir);
  std::string env;
  if (shim) env = "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_PRELOAD_LOG=" + (dir / "shim.log").string();
  env += " " + extra_env;
  std::vector<std::string> args = generate_args(dir / "logits.json");
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const EngineRun r = run_engine(args, env, binary);
  Result out;
  out.exit_code = r.exit_code;
  out.err = r.err;
  if (r.exit_code == 0) {
    for (const auto& line : json_lines(r.out)) out.tokens.push_back(line["tokens"]);
  }
  out.logits = read_file(dir / "logits.json");
  out.log = read_file(dir / "shim.log");
  fs::remove_all(dir);
  return out;
}

// "cuMemAlloc(SIZE) = 0xADDR (deterministic #i)" lines of a shim log: (size, address).
std::vector<std::pair<std::string, std::string>> allocations(const std::string& log) {
  std::vector<std::pair<std::string, std::string>> out;
  static const std::regex line(R"(cuMemAlloc\((\d+)\) = (0x[0-9a-f]+) \(deterministic)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    out.emplace_back((*it)[1], (*it)[2]);
  }
  return out;
}

// The processes whose allocations a shim log shows going through the layout.
std::set<long> allocating_pids(const std::string& log) {
  std::set<long> out;
  static const std::regex line(
      R"(thaw-preload\[(\d+)\]: cuMemAlloc\(\d+\) = 0x[0-9a-f]+ \(deterministic)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    out.insert(std::stol((*it)[1]));
  }
  return out;
}

class RefengineUnderShim : public ::testing::TestWithParam<const char*> {
 protected:
  std::string binary() const {
    return std::string(GetParam()) == "linked" ? REFENGINE_LINKED_BIN : REFENGINE_BIN;
  }
};

TEST_P(RefengineUnderShim, SameTokensAndLogitsAsWithoutIt) {
  const Result plain = generate(binary(), false, std::string(GetParam()) + "_plain");
  const Result shimmed = generate(binary(), true, std::string(GetParam()) + "_shim");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(shimmed.exit_code, 0) << shimmed.err;
  ASSERT_EQ(plain.tokens.size(), 2u);
  EXPECT_EQ(plain.tokens, shimmed.tokens);
  EXPECT_FALSE(plain.logits.empty());
  EXPECT_TRUE(plain.logits == shimmed.logits) << "logits differ under the shim";
  // And the shim was really in the path: the engine's allocations went through the layout.
  EXPECT_GT(allocations(shimmed.log).size(), 5u) << shimmed.log;
}

TEST_P(RefengineUnderShim, SameDeviceAddressesOnEveryRun) {
  const Result first = generate(binary(), true, std::string(GetParam()) + "_a");
  const Result second = generate(binary(), true, std::string(GetParam()) + "_b");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const auto a = allocations(first.log), b = allocations(second.log);
  ASSERT_GT(a.size(), 5u) << first.log;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front().second, "0x200000000000");
}

// PyTorch's expandable segments reserve VA with cuMemAddressReserve and map their own memory
// into it: the reservations come from the layout's region too, at the same place every run,
// and the tokens and logits are those of a run without the shim.
TEST_P(RefengineUnderShim, ExpandableSegmentsReserveInTheLayoutAtTheSameAddresses) {
  const std::string expandable = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
  const std::string tag = std::string(GetParam()) + "_expandable";
  const Result plain = generate(binary(), false, tag + "_plain", {}, expandable);
  const Result first = generate(binary(), true, tag + "_a", {}, expandable);
  const Result second = generate(binary(), true, tag + "_b", {}, expandable);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(first.exit_code, 0) << first.err << first.log;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(first.tokens, plain.tokens);
  EXPECT_TRUE(first.logits == plain.logits) << "logits differ under the shim";
  static const std::regex reserve(
      R"(cuMemAddressReserve\((\d+)\) = (0x[0-9a-f]+) \(deterministic)");
  auto reservations = [&](const std::string& log) {
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), reserve);
         it != std::sregex_iterator(); ++it) {
      out.push_back((*it)[1].str() + "@" + (*it)[2].str());
    }
    return out;
  };
  const auto a = reservations(first.log);
  ASSERT_FALSE(a.empty()) << "the expandable segment's reservation did not go through the layout\n"
                          << first.log;
  EXPECT_EQ(a, reservations(second.log));
  EXPECT_EQ(a.front().rfind("@0x2000", a.front().find('@')), a.front().find('@')) << a.front();
}

// The pid in a timeline event of the engine's stderr ("process_start": the process that was
// started; "engine_core_process": the forked engine core), or 0.
long timeline_pid(const std::string& err, const std::string& event, const char* key = "pid") {
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == event) return j.value(key, 0L);
  }
  return 0;
}

// vLLM V1 forks its EngineCore before any CUDA call; the child initialises the driver through
// the shim the parent was started with. Nothing may differ from a single process without it.
TEST_P(RefengineUnderShim, AnEngineCoreForkedBeforeCudaGivesTheSameResults) {
  const Result plain = generate(binary(), false, std::string(GetParam()) + "_plain");
  const Result forked =
      generate(binary(), true, std::string(GetParam()) + "_core", {"--engine-core-process"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(forked.exit_code, 0) << forked.err;
  ASSERT_EQ(plain.tokens.size(), 2u);
  EXPECT_EQ(plain.tokens, forked.tokens);
  EXPECT_FALSE(plain.logits.empty());
  EXPECT_TRUE(plain.logits == forked.logits) << "logits differ in a forked engine core";
  // The engine really ran in a child of the started process ...
  const long parent = timeline_pid(forked.err, "process_start");
  const long core = timeline_pid(forked.err, "engine_core_process");
  ASSERT_NE(core, 0) << forked.err;
  EXPECT_NE(core, parent);
  EXPECT_EQ(timeline_pid(forked.err, "engine_core_process", "parent_pid"), parent);
  // ... and its allocations, all of them the child's, went through the deterministic layout.
  const auto a = allocations(forked.log);
  ASSERT_GT(a.size(), 5u) << forked.log;
  EXPECT_EQ(a.front().second, "0x200000000000");
  EXPECT_EQ(allocating_pids(forked.log), std::set<long>{core}) << forked.log;
}

INSTANTIATE_TEST_SUITE_P(BothDriverPaths, RefengineUnderShim,
                         ::testing::Values("dlopen", "linked"));

TEST(RefengineUnderShimConcurrency, EightEnginesAtOnce) {
  const Result reference = generate(REFENGINE_BIN, false, "ref");
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  std::vector<std::future<Result>> runs;
  for (int i = 0; i < 8; ++i) {
    runs.push_back(std::async(std::launch::async, [i] {
      return generate(i % 2 ? REFENGINE_LINKED_BIN : REFENGINE_BIN, true,
                      "many" + std::to_string(i));
    }));
  }
  for (auto& f : runs) {
    const Result r = f.get();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.tokens, reference.tokens);
    EXPECT_TRUE(r.logits == reference.logits);
  }
}

}  // namespace
