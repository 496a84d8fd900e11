// Transparent CUDA-graph restore (preload/restore/transparent_capture.hpp): the reference
// engine WITHOUT --thaw-restore under libthaw-preload.so and a private thawd (daemon + shim +
// emulator + private dbus-daemon + loopback nginx; the model in thawd's cache):
//   - a first run captures its decode graphs live and the shim records them; a second run,
//     unchanged, "captures" them again: the shim elides every launch, hands back the rebuilt
//     graph and the pre-instantiated exec, and the engine generates the same tokens and logits
//     as a run without the shim; the shim's summary line says every graph was restored;
//   - THAW_PRELOAD_TRANSPARENT_GRAPHS=0 turns it off;
//   - the fallbacks, each a live capture with the same tokens and logits, counted by reason: a
//     perturbed kernel parameter in the record (launch mismatch), a truncated record (corrupt),
//     a record whose allocation index is not this run's (allocation index), another layout
//     (stale: a changed allocation sequence);
//   - parity: a small capturing program (transparent_capture_probe) describes the CUgraph its
//     capture hands back with the driver's graph queries (graph_parity.hpp): the transparent
//     one equals the live one node by node (types, kernels, dimensions, parameter bytes) and
//     edge by edge, and so do the results; a node the driver captured meanwhile (a memset), an
//     unmodelled call (an event record, a capture-info query for the graph) and a perturbed
//     parameter each fall back to a graph equal to a live capture's.
#include <gtest/gtest.h>

#include <regex>

#include "engine_process.hpp"
#include "graph_parity.hpp"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

struct EngineRunOut {
  refengine_test::EngineRun engine;
  std::string shim_log;
  std::string logits;

  std::vector<nlohmann::json> tokens() const {
    std::vector<nlohmann::json> out;
    for (const auto& line : refengine_test::json_lines(engine.out)) out.push_back(line["tokens"]);
    return out;
  }
  std::string all() const { return engine.err + "\n" + shim_log; }
  // The shim's summary line ("" when it wrote none).
  std::string summary() const {
    const auto at = shim_log.find("thaw: graph restore summary: ");
    if (at == std::string::npos) return "";
    return shim_log.substr(at, shim_log.find('\n', at) - at);
  }
  std::size_t count(const std::string& what) const {
    std::size_t n = 0;
    for (auto at = shim_log.find(what); at != std::string::npos; at = shim_log.find(what, at + 1))
      ++n;
    return n;
  }
};

class TransparentRestoreWithThawd : public ThawdFixture {
 protected:
  void SetUp() override {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }

  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }
  fs::path logits_path() const { return dir_.path() / "logits.json"; }

  EngineRunOut run(const std::string& tag, bool shim = true,
                   const std::vector<std::string>& extra = {}, const std::string& env_extra = {}) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    std::string env;
    if (shim) {
      env = "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
            " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0";
    }
    if (!env_extra.empty()) env += (env.empty() ? "" : " ") + env_extra;
    std::vector<std::string> args = {"--cuda-graph-sizes", "1,2,4", "--logits-out",
                                     logits_path().string()};
    args.insert(args.end(), extra.begin(), extra.end());
    EngineRunOut r;
    fs::remove(logits_path());
    r.engine = refengine_test::run_engine(refengine_test::small_generate_args(model(), args), env);
    r.shim_log = thaw::testing::slurp(shim_log);
    r.logits = thaw::testing::slurp(logits_path());
    return r;
  }

  fs::path graphs_record() const {
    const fs::path dir = dir_.path() / "state" / "artifacts";
    fs::path found;
    if (!fs::exists(dir)) return found;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with("graphs-")) found = e.path();
    }
    return found;
  }

  static void expect_same_output(const EngineRunOut& r, const EngineRunOut& live) {
    ASSERT_EQ(r.engine.exit_code, 0) << r.all();
    EXPECT_EQ(r.tokens(), live.tokens());
    EXPECT_FALSE(r.logits.empty());
    EXPECT_TRUE(r.logits == live.logits) << "logits differ from a live capture's";
  }

  // A live run and a recording one; the record's path.
  void record(EngineRunOut& live) {
    live = run("live", false);
    ASSERT_EQ(live.engine.exit_code, 0) << live.all();
    const EngineRunOut first = run("first");
    expect_same_output(first, live);
    // Nothing to restore yet: no summary (no graphs record was there).
    EXPECT_EQ(first.summary(), "") << first.shim_log;
    ASSERT_FALSE(graphs_record().empty()) << first.all();
  }
};

TEST_F(TransparentRestoreWithThawd, SecondRunRestoresEveryGraphWithTheSameTokensAndLogits) {
  EngineRunOut live;
  record(live);
  const std::string record_before = thaw::testing::slurp(graphs_record());

  const EngineRunOut second = run("second");
  expect_same_output(second, live);
  EXPECT_EQ(second.summary(), "thaw: graph restore summary: captures=3 transparent=3 fallbacks=0")
      << second.shim_log;
  EXPECT_EQ(second.count("restored transparently"), 3u) << second.shim_log;
  EXPECT_EQ(second.count("captured live"), 0u) << second.shim_log;
  // The graphs handed back are kept in the record as their recorded selves (not walked again):
  // the record the run stores is the one it restored from.
  EXPECT_EQ(thaw::testing::slurp(graphs_record()), record_before);

  // A third run restores again (the record it stored is as good as the first's).
  const EngineRunOut third = run("third");
  expect_same_output(third, live);
  EXPECT_EQ(third.summary(), "thaw: graph restore summary: captures=3 transparent=3 fallbacks=0")
      << third.shim_log;

  // What the shims reported to thawd at exit (protocol 5's graph restore counters).
  const std::string metrics = thaw::testing::run({"/usr/bin/curl", "-sf", metrics_url()}).output;
  EXPECT_NE(metrics.find("thaw_engine_graphs_restored_total 6\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("thaw_engine_graph_restore_fallbacks_total 0\n"), std::string::npos)
      << metrics;

  // Switched off: every graph captured live, nothing said.
  const EngineRunOut off = run("off", true, {}, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  expect_same_output(off, live);
  EXPECT_EQ(off.count("restored transparently"), 0u) << off.shim_log;
  EXPECT_EQ(off.summary(), "") << off.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentRestoreWithThawd, PerturbedParameterCapturesThatGraphLive) {
  EngineRunOut live;
  record(live);
  const fs::path path = graphs_record();
  std::string text = thaw::testing::slurp(path);
  // One parameter byte of the first graph's third node changed (a valid record still).
  std::size_t at = 0;
  for (int node = 0; node < 3; ++node) at = text.find("\"param_bytes\":\"", at + 1);
  ASSERT_NE(at, std::string::npos);
  char& digit = text[at + std::strlen("\"param_bytes\":\"")];
  digit = digit == '0' ? '1' : '0';
  std::ofstream(path, std::ios::trunc) << text;

  const EngineRunOut r = run("perturbed");
  expect_same_output(r, live);
  EXPECT_EQ(r.summary(),
            "thaw: graph restore summary: captures=3 transparent=2 fallbacks=1 "
            "(launch mismatch: 1)")
      << r.shim_log;
  EXPECT_NE(r.shim_log.find("recorded graph 0 captured live from node 2 of "), std::string::npos)
      << r.shim_log;
  EXPECT_NE(r.shim_log.find("differs from the record"), std::string::npos) << r.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentRestoreWithThawd, TruncatedRecordCapturesLive) {
  EngineRunOut live;
  record(live);
  const fs::path path = graphs_record();
  const std::string text = thaw::testing::slurp(path);
  std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() / 2);
  const EngineRunOut r = run("truncated");
  expect_same_output(r, live);
  EXPECT_EQ(r.summary(),
            "thaw: graph restore summary: captures=3 transparent=0 fallbacks=3 (corrupt: 3)")
      << r.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentRestoreWithThawd, AllocationIndexOfAnotherRunCapturesLive) {
  EngineRunOut live;
  record(live);
  const fs::path path = graphs_record();
  std::string text = thaw::testing::slurp(path);
  // Every graph said to be captured one allocation later than it was.
  const std::regex index(R"("allocation_index":(\d+))");
  std::string out;
  std::sregex_iterator it(text.begin(), text.end(), index), end;
  std::size_t last = 0;
  for (; it != end; ++it) {
    out += text.substr(last, it->position() - last);
    out += "\"allocation_index\":" + std::to_string(std::stoull((*it)[1]) + 1);
    last = it->position() + it->length();
  }
  out += text.substr(last);
  ASSERT_NE(out, text);
  std::ofstream(path, std::ios::trunc) << out;
  const EngineRunOut r = run("index");
  expect_same_output(r, live);
  EXPECT_EQ(r.summary(),
            "thaw: graph restore summary: captures=3 transparent=0 fallbacks=3 "
            "(allocation index: 3)")
      << r.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentRestoreWithThawd, AnotherAllocationSequenceCapturesLive) {
  EngineRunOut live;
  record(live);
  // A smaller KV cache: the allocation sequence leaves the layout record; thawd hands over the
  // other command line's records (the same model): stale, captured live with the same tokens.
  const EngineRunOut live_other = run("live_other", false, {"--gpu-memory-utilization", "0.8"});
  const EngineRunOut r = run("other", true, {"--gpu-memory-utilization", "0.8"});
  expect_same_output(r, live_other);
  EXPECT_NE(r.summary().find("transparent=0"), std::string::npos) << r.shim_log;
  EXPECT_EQ(r.count("restored transparently"), 0u) << r.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

class TransparentProbeWithThawd : public ThawdFixture {
 protected:
  void SetUp() override {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }
  struct Probe {
    refengine_test::EngineRun engine;
    std::string shim_log;
    nlohmann::json out;
    std::string summary() const {
      const auto at = shim_log.find("thaw: graph restore summary: ");
      if (at == std::string::npos) return "";
      return shim_log.substr(at, shim_log.find('\n', at) - at);
    }
  };
  // The probe in `mode`, under the shim (or not).
  Probe probe(const std::string& tag, const std::string& mode, bool shim = true,
              const std::string& env_extra = {}) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    std::string env = "THAW_EMU_KERNELS=" EMU_KERNELS_TWIN_LIB " PROBE_MODE=" + mode;
    if (shim) {
      env += " LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
             " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0";
    }
    if (!env_extra.empty()) env += " " + env_extra;
    Probe p;
    const fs::path model_file = dir_.path() / "cache" / "gpt-syn" / "config.json";
    p.engine =
        refengine_test::run_engine({model_file.string()}, env, TRANSPARENT_CAPTURE_PROBE_BIN);
    p.shim_log = thaw::testing::slurp(shim_log);
    const auto lines = refengine_test::json_lines(p.engine.out);
    if (lines.size() == 1) p.out = lines[0];
    return p;
  }
  // `p` gave what the live capture `live` gave: the same graph, node by node, and results.
  static void expect_parity(const Probe& p, const Probe& live) {
    ASSERT_EQ(p.engine.exit_code, 0) << p.engine.err << p.shim_log;
    ASSERT_TRUE(p.out.is_object()) << p.engine.out;
    ASSERT_TRUE(live.out.is_object()) << live.engine.out;
    EXPECT_EQ(thaw::testing::graph_parity_diff(p.out["graph"], live.out["graph"]), "")
        << p.shim_log;
    EXPECT_EQ(p.out["sum_a"], live.out["sum_a"]);
    EXPECT_EQ(p.out["sum_c"], live.out["sum_c"]);
  }
};

TEST_F(TransparentProbeWithThawd, HandedBackGraphEqualsTheLiveCaptureNodeByNode) {
  // The live capture under the shim (the deterministic layout: the same addresses), which
  // records it.
  const Probe live = probe("live", "plain", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err;
  ASSERT_EQ(live.out["graph"]["nodes"].size(), 3u) << live.engine.out;
  ASSERT_EQ(live.out["graph"]["edges"].size(), 2u) << live.engine.out;
  EXPECT_EQ(live.summary(), "") << live.shim_log;

  const Probe second = probe("second", "plain");
  expect_parity(second, live);
  EXPECT_EQ(second.summary(), "thaw: graph restore summary: captures=1 transparent=1 fallbacks=0")
      << second.shim_log;
  EXPECT_NE(second.shim_log.find("recorded graph 0 restored transparently (3 nodes"),
            std::string::npos)
      << second.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentProbeWithThawd, FallbacksGiveTheLiveGraph) {
  const Probe first = probe("first", "plain");
  ASSERT_EQ(first.engine.exit_code, 0) << first.engine.err << first.shim_log;
  // The plain capture's record, put back before each case (every run stores its own).
  fs::path record;
  for (const auto& e : fs::directory_iterator(dir_.path() / "state" / "artifacts")) {
    if (e.path().filename().string().starts_with("graphs-")) record = e.path();
  }
  ASSERT_FALSE(record.empty()) << first.shim_log;
  const std::string plain_record = thaw::testing::slurp(record);
  struct Case {
    const char* mode;
    const char* reason;
    const char* line;
  };
  for (const Case& c :
       {Case{"unhooked", "captured outside the shim: 1",
             "the driver captured 1 node(s) the shim does not elide"},
        Case{"event", "unmodelled call: 1", "cuEventRecord on the capturing stream"},
        Case{"scale", "launch mismatch: 1", "parameter 1 of axpb differs"},
        Case{"query", "unmodelled call: 1",
             "a capture-info query for the graph or its dependencies on the capturing stream"}}) {
    SCOPED_TRACE(c.mode);
    const Probe live =
        probe(std::string("live_") + c.mode, c.mode, true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
    ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err;
    std::ofstream(record, std::ios::trunc) << plain_record;
    const Probe p = probe(c.mode, c.mode);
    expect_parity(p, live);
    EXPECT_EQ(p.summary(), std::string("thaw: graph restore summary: captures=1 transparent=0 "
                                       "fallbacks=1 (") +
                               c.reason + ")")
        << p.shim_log;
    EXPECT_NE(p.shim_log.find(c.line), std::string::npos) << p.shim_log;
  }
  // A capture the driver invalidates (cuMemAlloc during a GLOBAL capture): every later call
  // answers as it does live, and the end fails as it does live.
  {
    const Probe live =
        probe("live_invalidate", "invalidate", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
    ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err;
    std::ofstream(record, std::ios::trunc) << plain_record;
    const Probe p = probe("invalidate", "invalidate");
    ASSERT_EQ(p.engine.exit_code, 0) << p.engine.err << p.shim_log;
    EXPECT_EQ(p.out["codes"], live.out["codes"]) << p.shim_log;
    EXPECT_NE(live.out["codes"][3], 0) << "the end of an invalidated capture fails";
    EXPECT_EQ(p.summary(),
              "thaw: graph restore summary: captures=1 transparent=0 fallbacks=1 "
              "(capture invalidated: 1)")
        << p.shim_log;
  }
  const Probe plain_live = probe("plain_live", "plain", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  std::ofstream(record, std::ios::trunc) << plain_record;
  const Probe again = probe("again", "plain");
  expect_parity(again, plain_live);
  EXPECT_EQ(again.summary(), "thaw: graph restore summary: captures=1 transparent=1 fallbacks=0")
      << again.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentProbeWithThawd, MemsetsAndDeviceCopiesAreElidedAndReplayed) {
  // A chain of a kernel, a device-to-device copy, a memset and two kernels.
  const Probe live = probe("live_ops", "ops", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err;
  ASSERT_EQ(live.out["graph"]["nodes"].size(), 5u) << live.engine.out;
  fs::path record;
  for (const auto& e : fs::directory_iterator(dir_.path() / "state" / "artifacts")) {
    if (e.path().filename().string().starts_with("graphs-")) record = e.path();
  }
  ASSERT_FALSE(record.empty()) << live.shim_log;
  const std::string ops_record = thaw::testing::slurp(record);
  const Probe ops = probe("ops", "ops");
  expect_parity(ops, live);
  EXPECT_EQ(ops.summary(), "thaw: graph restore summary: captures=1 transparent=1 fallbacks=0")
      << ops.shim_log;

  // A memset of another value: the kernel and the copy kept so far are replayed, the rest is
  // captured live — the live graph.
  const Probe live_value =
      probe("live_ops_value", "ops_value", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live_value.engine.exit_code, 0) << live_value.engine.err;
  std::ofstream(record, std::ios::trunc) << ops_record;
  const Probe value = probe("ops_value", "ops_value");
  expect_parity(value, live_value);
  EXPECT_EQ(value.summary(),
            "thaw: graph restore summary: captures=1 transparent=0 fallbacks=1 "
            "(launch mismatch: 1)")
      << value.shim_log;
  EXPECT_NE(value.shim_log.find("captured live from node 2 of 5: a memset that differs"),
            std::string::npos)
      << value.shim_log;
  EXPECT_NE(value.out["sum_c"], ops.out["sum_c"]) << "the memset's value reached the result";
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(TransparentProbeWithThawd, ClusterLaunchesAreElidedWithTheirAttributes) {
  // axpb launched with cuLaunchKernelEx, a cluster of 2 and priority -1 (as cuBLAS launches an
  // sm_90 GEMM): recorded with its attributes, restored transparently with none lost.
  const Probe live = probe("live_cluster", "cluster", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err;
  ASSERT_EQ(live.out["graph"]["nodes"].size(), 3u) << live.engine.out;
  bool clustered = false;
  for (const auto& node : live.out["graph"]["nodes"]) {
    if (node.value("name", "") == "axpb") {
      EXPECT_EQ(node["cluster"], nlohmann::json::array({2, 1, 1})) << live.engine.out;
      EXPECT_EQ(node["priority"], -1) << live.engine.out;
      clustered = true;
    }
  }
  ASSERT_TRUE(clustered) << live.engine.out;
  fs::path record;
  for (const auto& e : fs::directory_iterator(dir_.path() / "state" / "artifacts")) {
    if (e.path().filename().string().starts_with("graphs-")) record = e.path();
  }
  ASSERT_FALSE(record.empty()) << live.shim_log;
  const std::string cluster_record = thaw::testing::slurp(record);
  EXPECT_NE(cluster_record.find(R"("cluster":[2,1,1])"), std::string::npos) << cluster_record;

  const Probe restored = probe("cluster", "cluster");
  expect_parity(restored, live);
  EXPECT_EQ(restored.summary(), "thaw: graph restore summary: captures=1 transparent=1 fallbacks=0")
      << restored.shim_log;

  // Another cluster size: the launch differs from the record; the kept vec_add is replayed, the
  // rest captured live — the live graph, with the new cluster.
  const Probe live4 = probe("live_cluster4", "cluster4", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live4.engine.exit_code, 0) << live4.engine.err;
  std::ofstream(record, std::ios::trunc) << cluster_record;
  const Probe four = probe("cluster4", "cluster4");
  expect_parity(four, live4);
  EXPECT_EQ(four.summary(),
            "thaw: graph restore summary: captures=1 transparent=0 fallbacks=1 "
            "(launch mismatch: 1)")
      << four.shim_log;
  EXPECT_NE(four.shim_log.find("captured live from node 1 of 3: cluster dimension [4, 1, 1] "
                               "where the record has [2, 1, 1] (axpb)"),
            std::string::npos)
      << four.shim_log;

  // A node the driver captures after the cluster launch: the kept launches are added to the
  // capture as nodes, the cluster launch with its attributes — the live graph again.
  const Probe live_unhooked =
      probe("live_cluster_unhooked", "cluster_unhooked", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0");
  ASSERT_EQ(live_unhooked.engine.exit_code, 0) << live_unhooked.engine.err;
  std::ofstream(record, std::ios::trunc) << cluster_record;
  const Probe unhooked = probe("cluster_unhooked", "cluster_unhooked");
  expect_parity(unhooked, live_unhooked);
  EXPECT_EQ(unhooked.summary(),
            "thaw: graph restore summary: captures=1 transparent=0 fallbacks=1 "
            "(captured outside the shim: 1)")
      << unhooked.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// A driver that answers a carveout of 0 and a cluster of [1, 1, 1] for a node that set none (the
// emulator told so), not CUDA's documented -1 and [0, 0, 0]: the recorder probes those answers,
// keeps them in the record and records no node attribute for them, so the plain launches and the
// cluster launch are elided as on a driver that answers the documented ones. A run whose driver
// answers other defaults than the record's captures live and says why.
TEST_F(TransparentProbeWithThawd, ADriverWithOtherAttributeDefaultsStillElides) {
  const std::string other = "THAW_EMU_CARVEOUT_DEFAULT=0 THAW_EMU_CLUSTER_DEFAULT=1";
  const Probe live =
      probe("live_defaults", "cluster", true, "THAW_PRELOAD_TRANSPARENT_GRAPHS=0 " + other);
  ASSERT_EQ(live.engine.exit_code, 0) << live.engine.err << live.shim_log;
  fs::path record;
  for (const auto& e : fs::directory_iterator(dir_.path() / "state" / "artifacts")) {
    if (e.path().filename().string().starts_with("graphs-")) record = e.path();
  }
  ASSERT_FALSE(record.empty()) << live.shim_log;
  const std::string text = thaw::testing::slurp(record);
  const auto doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["attribute_defaults"]["carveout"], 0) << text;
  EXPECT_EQ(doc["attribute_defaults"]["cluster"], nlohmann::json::array({1, 1, 1})) << text;
  std::size_t kernels = 0;
  for (const auto& node : doc["graphs"][0]["nodes"]) {
    if (!node.contains("kernel")) continue;
    ++kernels;
    EXPECT_EQ(node["kernel"]["carveout"], 4294967295u) << text;  // "not set", not 0
    if (node["kernel"]["name"] != "axpb")
      EXPECT_EQ(node["kernel"]["cluster"], nlohmann::json::array({0, 0, 0})) << text;
  }
  EXPECT_GE(kernels, 2u) << text;

  const Probe restored = probe("restored_defaults", "cluster", true, other);
  expect_parity(restored, live);
  EXPECT_EQ(restored.summary(), "thaw: graph restore summary: captures=1 transparent=1 fallbacks=0")
      << restored.shim_log;

  // The record restored under a driver that answers the documented defaults: not this driver's
  // record; captured live (the same results; the graphs describe apart only in what each driver
  // answers for "no cluster"), and said why.
  // The run that restored stored the record again, with the same defaults (not CUDA's).
  EXPECT_EQ(nlohmann::json::parse(thaw::testing::slurp(record))["attribute_defaults"],
            doc["attribute_defaults"]);
  const Probe documented = probe("documented_defaults", "cluster");
  ASSERT_EQ(documented.engine.exit_code, 0) << documented.engine.err;
  EXPECT_EQ(documented.out["sum_a"], live.out["sum_a"]);
  EXPECT_EQ(documented.out["sum_c"], live.out["sum_c"]);
  EXPECT_NE(documented.summary().find("transparent=0 fallbacks=1"), std::string::npos)
      << documented.shim_log;
  EXPECT_NE(documented.shim_log.find("other kernel attribute defaults"), std::string::npos)
      << documented.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
