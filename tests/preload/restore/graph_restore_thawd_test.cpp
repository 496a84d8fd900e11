// The reference engine with --thaw-restore restoring its decode CUDA graphs under
// libthaw-preload.so and a private thawd (daemon + shim + emulator + private dbus-daemon +
// loopback nginx; the model in thawd's cache):
//   - a first run captures every size and labels each capture; the shim stores the "graphs"
//     record; a second run restores every size (no warm-up, no capture) and generates the same
//     tokens and logits as a run that captured live; the restored graphs have the recorded
//     nodes and edges (the shim's self-check of the rebuilt CUgraph before instantiation);
//   - the fallbacks, each a live capture with the same tokens: no shim, a corrupt record, a
//     record from a run of another layout (stale), a size the record lacks (none).
#include <gtest/gtest.h>

#include <regex>

#include "engine_process.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

struct GraphRun {
  refengine_test::EngineRun engine;
  std::string shim_log;
  std::string logits;
  std::vector<nlohmann::json> timeline;

  std::vector<nlohmann::json> tokens() const {
    std::vector<nlohmann::json> out;
    for (const auto& line : refengine_test::json_lines(engine.out)) out.push_back(line["tokens"]);
    return out;
  }
  nlohmann::json graphs() const {
    for (const auto& e : timeline) {
      if (e.value("event", "") == "graphs_captured") return e;
    }
    return {};
  }
  std::vector<std::string> graph_lines() const {
    std::vector<std::string> out;
    std::istringstream in(engine.err);
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("refengine: --thaw-restore:") && line.find("graph") != std::string::npos)
        out.push_back(line);
    }
    return out;
  }
  std::string all() const { return engine.err + "\n" + shim_log; }
};

class GraphRestoreWithThawd : public ThawdFixture {
 protected:
  void SetUp() override {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }

  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }
  fs::path logits_path() const { return dir_.path() / "logits.json"; }

  GraphRun run(const std::string& tag, bool shim = true, const std::vector<std::string>& extra = {},
               bool restore = true, const std::string& env_extra = {}) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    std::string env;
    if (shim) {
      env = "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
            " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0";
    }
    if (!env_extra.empty()) env += (env.empty() ? "" : " ") + env_extra;
    std::vector<std::string> args = {"--cuda-graph-sizes", "1,2,4", "--logits-out",
                                     logits_path().string()};
    if (restore) args.push_back("--thaw-restore");
    args.insert(args.end(), extra.begin(), extra.end());
    GraphRun r;
    fs::remove(logits_path());
    r.engine = refengine_test::run_engine(refengine_test::small_generate_args(model(), args), env);
    r.shim_log = thaw::testing::slurp(shim_log);
    r.logits = thaw::testing::slurp(logits_path());
    std::istringstream in(r.engine.err);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("event")) r.timeline.push_back(std::move(j));
    }
    return r;
  }

  std::vector<fs::path> artifacts(const std::string& kind) const {
    std::vector<fs::path> out;
    const fs::path dir = dir_.path() / "state" / "artifacts";
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with(kind + "-")) out.push_back(e.path());
    }
    return out;
  }

  static void expect_all(const GraphRun& r, const std::string& how) {
    ASSERT_EQ(r.engine.exit_code, 0) << r.all();
    const auto g = r.graphs();
    ASSERT_TRUE(g.is_object()) << r.engine.err;
    EXPECT_EQ(g["sizes"], nlohmann::json::array({1, 2, 4}));
    ASSERT_EQ(g["per_size"].size(), 3u) << g.dump();
    for (const auto& s : g["per_size"]) EXPECT_EQ(s["how"], how) << g.dump() << "\n" << r.all();
  }
  static void expect_same_output(const GraphRun& r, const GraphRun& live) {
    EXPECT_EQ(r.tokens(), live.tokens());
    EXPECT_FALSE(r.logits.empty());
    EXPECT_TRUE(r.logits == live.logits) << "logits differ from a live capture's";
  }
};

TEST_F(GraphRestoreWithThawd, SecondRunRestoresEveryGraphWithTheSameTokensAndLogits) {
  // A live-capture run without the shim: the reference output.
  const GraphRun live = run("live", false, {}, false);
  expect_all(live, "captured");

  const GraphRun first = run("first");
  expect_all(first, "captured");
  expect_same_output(first, live);
  const auto stored = artifacts("graphs");
  ASSERT_EQ(stored.size(), 1u) << first.all();
  const auto doc = nlohmann::json::parse(thaw::testing::slurp(stored[0]));
  EXPECT_EQ(doc["version"], 4);
  EXPECT_TRUE(doc["attribute_defaults"].is_object()) << doc.dump();
  ASSERT_EQ(doc["graphs"].size(), 3u);
  std::size_t recorded_nodes = 0, recorded_edges = 0;
  std::vector<std::string> labels;
  for (const auto& g : doc["graphs"]) {
    labels.push_back(g["label"]);
    recorded_nodes += g["nodes"].size();
    recorded_edges += g["edges"].size();
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"refengine-decode/1 batch=4 pp=0/1",
                                              "refengine-decode/1 batch=2 pp=0/1",
                                              "refengine-decode/1 batch=1 pp=0/1"}));

  const GraphRun second = run("second");
  expect_all(second, "restored");
  EXPECT_TRUE(second.graph_lines().empty()) << second.engine.err;
  expect_same_output(second, live);
  // The rebuilt graphs (read back with cuGraphGetNodes/cuGraphGetEdges before instantiation)
  // have the recorded nodes and edges, which are the live capture's.
  std::size_t nodes = 0, edges = 0;
  const std::regex rebuilt(
      R"(restore: graph "[^"]+" rebuilt from thawd's record: (\d+) nodes, (\d+) edges)");
  for (std::sregex_iterator it(second.shim_log.begin(), second.shim_log.end(), rebuilt), end;
       it != end; ++it) {
    nodes += std::stoul((*it)[1]);
    edges += std::stoul((*it)[2]);
  }
  EXPECT_EQ(nodes, recorded_nodes) << second.shim_log;
  EXPECT_EQ(edges, recorded_edges) << second.shim_log;
  EXPECT_GT(nodes, 0u);
  EXPECT_NE(first.shim_log.find(std::to_string(recorded_nodes) + " nodes"), std::string::npos)
      << "the live captures' node count, as the recorder walked them\n"
      << first.shim_log;
  // Nothing captured: the record stays as it was.
  EXPECT_EQ(nlohmann::json::parse(thaw::testing::slurp(stored[0])), doc);
  // What the shims reported at exit: the first run stored three graphs and fell back three
  // times (it asked, nothing was recorded yet), the second restored all three.
  const std::string metrics = thaw::testing::run({"/usr/bin/curl", "-sf", metrics_url()}).output;
  for (const char* line :
       {"thaw_engine_graph_records_stored_total 3\n", "thaw_engine_graphs_restored_total 3\n",
        "thaw_engine_graph_restore_fallbacks_total 3\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(GraphRestoreWithThawd, FallbacksCaptureLiveWithTheSameTokens) {
  const GraphRun live = run("live", false, {}, false);
  const GraphRun first = run("first");
  expect_all(first, "captured");
  const auto stored = artifacts("graphs");  // thawd keeps one record per command line
  ASSERT_EQ(stored.size(), 1u);

  // Without the shim: one line, every size captured.
  const GraphRun plain = run("plain", false);
  expect_all(plain, "captured");
  expect_same_output(plain, live);

  // A size the record lacks: none for it, the others restored; the record keeps all four.
  const GraphRun more = run("more", true, {"--cuda-graph-sizes", "1,2,3,4"});
  ASSERT_EQ(more.engine.exit_code, 0) << more.all();
  const auto g = more.graphs();
  int restored = 0;
  for (const auto& s : g["per_size"]) restored += s["how"] == "restored";
  EXPECT_EQ(restored, 3) << g.dump() << more.all();
  EXPECT_NE(more.engine.err.find("no restored graph for batch size 3 (none: "), std::string::npos)
      << more.engine.err;
  expect_same_output(more, live);
  // Its command line's own record: the three restored graphs kept, the captured one added.
  auto now = artifacts("graphs");
  ASSERT_EQ(now.size(), 2u);
  const fs::path more_record = now[0] == stored[0] ? now[1] : now[0];
  const auto more_doc = nlohmann::json::parse(thaw::testing::slurp(more_record));
  ASSERT_EQ(more_doc["graphs"].size(), 4u) << more_doc.dump().substr(0, 400);
  EXPECT_EQ(more_doc["graphs"][3]["label"], "refengine-decode/1 batch=3 pp=0/1");
  const GraphRun more_again = run("more_again", true, {"--cuda-graph-sizes", "1,2,3,4"});
  ASSERT_EQ(more_again.engine.exit_code, 0) << more_again.all();
  const nlohmann::json more_again_graphs = more_again.graphs();  // (not a temporary's member)
  for (const auto& s : more_again_graphs["per_size"]) EXPECT_EQ(s["how"], "restored");
  expect_same_output(more_again, live);

  // A corrupt record: refused, every size captured and recorded again.
  std::ofstream(stored[0], std::ios::trunc) << "{\"version\":2,";
  const GraphRun corrupt = run("corrupt");
  expect_all(corrupt, "captured");
  EXPECT_NE(corrupt.engine.err.find("(corrupt: thawd's graphs record is refused: "),
            std::string::npos)
      << corrupt.engine.err;
  expect_same_output(corrupt, live);
  expect_all(run("after"), "restored");

  // Another layout (a smaller KV cache: --gpu-memory-utilization 0.8): thawd hands over the other
  // command line's layout and graphs records, the allocation sequence leaves the layout record
  // at the KV cache: stale, captured.
  const GraphRun other = run("other", true, {"--gpu-memory-utilization", "0.8"});
  expect_all(other, "captured");
  EXPECT_NE(other.engine.err.find("(stale: this run does not follow its layout record"),
            std::string::npos)
      << other.engine.err;
  EXPECT_EQ(other.tokens(), live.tokens());
}

TEST_F(GraphRestoreWithThawd, GraphsArePrebuiltInTheBackgroundBeforeTheEngineAsks) {
  const GraphRun live = run("live", false, {}, false);
  const GraphRun first = run("first");
  expect_all(first, "captured");
  // The emulator's timing model on, instantiation at 200 us a node (18 ms a graph here): the
  // engine's own build of batch=4 leaves the worker time to pre-build the others.
  const GraphRun second =
      run("second", true, {}, true, "THAW_EMU_TIMING=1 THAW_EMU_INSTANTIATE_NODE_US=200");
  expect_all(second, "restored");
  expect_same_output(second, live);
  const std::string& shim = second.shim_log;
  // The record came in the background, before the engine's first request.
  const auto fetched = shim.find("restore: graphs record fetched in the background: 3 graphs");
  const auto first_request = shim.find("restore: graph \"");
  ASSERT_NE(fetched, std::string::npos) << shim;
  ASSERT_NE(first_request, std::string::npos) << shim;
  EXPECT_LT(fetched, first_request) << shim;
  // The worker builds the last captured first (batch=1), while the engine builds batch=4 itself:
  // at least one graph is pre-built, then handed out as such when the engine asks for it.
  const std::regex prebuilt(
      R"re(restore: graph "([^"]+)" pre-built in the background: \d+ nodes)re");
  int handed = 0;
  for (std::sregex_iterator it(shim.begin(), shim.end(), prebuilt), end; it != end; ++it) {
    const std::string label = (*it)[1];
    const auto built_at = static_cast<std::size_t>(it->position());
    const auto handed_at =
        shim.find("restore: graph \"" + label + "\" rebuilt from thawd's record");
    ASSERT_NE(handed_at, std::string::npos) << label << "\n" << shim;
    EXPECT_LT(built_at, handed_at) << label << "\n" << shim;
    const auto eol = shim.find('\n', handed_at);
    EXPECT_NE(shim.substr(handed_at, eol - handed_at).find("(pre-built in the background)"),
              std::string::npos)
        << shim;
    ++handed;
  }
  EXPECT_GE(handed, 1) << shim;
  EXPECT_EQ(shim.find("discarded"), std::string::npos) << shim;
  EXPECT_EQ(shim.find("never asked for"), std::string::npos) << shim;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
