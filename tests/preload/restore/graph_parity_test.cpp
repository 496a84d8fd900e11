// Node-by-node parity of the engine-assisted graph restore (issue 24 acceptance): the reference
// engine under libthaw-preload.so and a private thawd (daemon + shim + emulator + private
// dbus-daemon + loopback nginx), run twice with --thaw-restore and --dump-graphs:
//   - the first run captures every decode graph live and the shim records it;
//   - the second run gets every graph from thaw_restore_graph (no warm-up, no capture);
// and the executable graph each batch size launches is, as the emulator describes it
// (thawEmuDescribeGraphExec: kernel identity, geometry, parameter bytes, memset/memcpy
// parameters, edges), the same node for node and edge for edge, with the same tokens and logits.
// The deterministic device layout puts every buffer at the same address in both runs, so the
// parameter bytes (pointers included) must be equal too. The comparison itself is shown to catch
// one wrong node, parameter byte, edge or missing size in a hand-edited copy of a real dump.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "engine_process.hpp"
#include "graph_dump_compare.hpp"
#include "thaw/emu_inspect.h"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

using thaw::testing::graph_dump_differences;

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

struct ParityRun {
  refengine_test::EngineRun engine;
  std::string shim_log;
  std::string logits;
  json graphs;  // --dump-graphs
  json timeline_graphs;

  std::vector<json> tokens() const {
    std::vector<json> out;
    for (const auto& line : refengine_test::json_lines(engine.out)) out.push_back(line["tokens"]);
    return out;
  }
  std::string all() const { return engine.err + "\n" + shim_log; }
};

class GraphParity : public ThawdFixture {
 protected:
  void SetUp() override {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }

  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }

  // Under the shim with --thaw-restore (`assisted`) or without (an unmodified engine: the shim
  // restores transparently), or (`thaw` false) the engine alone, as a user runs it.
  ParityRun run(const std::string& tag, bool thaw = true, bool assisted = true) {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    const fs::path logits = dir_.path() / (tag + ".logits.json");
    const fs::path dump = dir_.path() / (tag + ".graphs.json");
    const std::string env =
        !thaw ? std::string()
              : "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
                    " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0";
    ParityRun r;
    std::vector<std::string> args = {"--cuda-graph-sizes", "1,2,4",         "--logits-out",
                                     logits.string(),      "--dump-graphs", dump.string()};
    if (thaw && assisted) args.push_back("--thaw-restore");
    r.engine = refengine_test::run_engine(refengine_test::small_generate_args(model(), args), env);
    r.shim_log = thaw::testing::slurp(shim_log);
    r.logits = thaw::testing::slurp(logits);
    r.graphs = json::parse(thaw::testing::slurp(dump), nullptr, false);
    std::istringstream in(r.engine.err);
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "graphs_captured") r.timeline_graphs = j;
    }
    return r;
  }

  static void expect_every_size(const ParityRun& r, const std::string& how) {
    ASSERT_EQ(r.engine.exit_code, 0) << r.all();
    ASSERT_TRUE(r.timeline_graphs.is_object()) << r.engine.err;
    ASSERT_EQ(r.timeline_graphs["per_size"].size(), 3u) << r.timeline_graphs.dump();
    for (const auto& s : r.timeline_graphs["per_size"]) EXPECT_EQ(s["how"], how) << r.all();
  }
};

TEST_F(GraphParity, AssistedRestoreIsNodeForNodeTheLiveCapture) {
  const ParityRun live = run("live");
  expect_every_size(live, "captured");
  const ParityRun restored = run("restored");
  expect_every_size(restored, "restored");

  // The dumps describe real graphs: every size, kernels with their module and parameter bytes.
  ASSERT_TRUE(live.graphs.is_object()) << live.all();
  ASSERT_TRUE(restored.graphs.is_object()) << restored.all();
  EXPECT_EQ(live.graphs.size(), 3u);
  std::size_t kernels = 0;
  for (const auto& size : {"1", "2", "4"}) {
    ASSERT_TRUE(live.graphs.contains(size)) << live.graphs.dump().substr(0, 400);
    const json& g = live.graphs[size];
    EXPECT_EQ(g["kind"], "exec");
    EXPECT_GT(g["nodes"].size(), 1u);
    EXPECT_FALSE(g["edges"].empty());
    for (const auto& n : g["nodes"]) {
      if (n["type"] != "kernel") continue;
      ++kernels;
      EXPECT_TRUE(n["module"].is_string()) << n.dump();
      EXPECT_TRUE(n["module"].get<std::string>().starts_with("emu-fnv1a64:")) << n.dump();
      EXPECT_FALSE(n["params"].get<std::string>().empty()) << n.dump();
    }
  }
  EXPECT_GT(kernels, 0u);
  // The sizes really differ (the comparison below would be blind to a dump of one graph thrice).
  EXPECT_NE(live.graphs["1"], live.graphs["4"]);

  // The parity: node for node, edge for edge, parameter bytes included.
  const auto diffs = graph_dump_differences(live.graphs, restored.graphs);
  EXPECT_TRUE(diffs.empty()) << joined(diffs);
  EXPECT_EQ(live.graphs, restored.graphs);
  // And the same output.
  EXPECT_EQ(restored.tokens(), live.tokens());
  EXPECT_FALSE(live.logits.empty());
  EXPECT_TRUE(restored.logits == live.logits) << "logits of the restored graphs differ";

  // The engine alone, without thaw, captures the same graphs but for where its buffers are: the
  // same kernels, geometry and edges, the same tokens and logits. (Its addresses differ, so the
  // parameter bytes and memset/memcpy addresses are left out here; that they differ shows the
  // comparison above is not blind to pointers.)
  const ParityRun plain = run("plain", false);
  expect_every_size(plain, "captured");
  EXPECT_EQ(plain.tokens(), live.tokens());
  EXPECT_TRUE(plain.logits == live.logits) << "logits of a run without thaw differ";
  auto without_addresses = [](json dump) {
    for (auto& [size, g] : dump.items()) {
      for (auto& n : g["nodes"]) {
        for (const char* key : {"params", "dst", "src", "address"}) n.erase(key);
      }
    }
    return dump;
  };
  EXPECT_NE(plain.graphs, live.graphs);
  const auto plain_diffs =
      graph_dump_differences(without_addresses(live.graphs), without_addresses(plain.graphs));
  EXPECT_TRUE(plain_diffs.empty()) << joined(plain_diffs);

  // The comparison catches one wrong thing in a hand-edited copy of the restored dump.
  const json& good = restored.graphs;
  std::size_t kernel_at = 0;
  while (good["4"]["nodes"][kernel_at]["type"] != "kernel") ++kernel_at;
  {  // one parameter byte of one kernel node (e.g. a pointer one buffer off)
    json bad = good;
    std::string params = bad["4"]["nodes"][kernel_at]["params"];
    params[0] = params[0] == '0' ? '1' : '0';
    bad["4"]["nodes"][kernel_at]["params"] = params;
    const auto d = graph_dump_differences(live.graphs, bad);
    ASSERT_EQ(d.size(), 1u) << joined(d);
    EXPECT_TRUE(d[0].starts_with(fmt::format("batch size 4: node {} (kernel ", kernel_at))) << d[0];
    EXPECT_NE(d[0].find("): params \""), std::string::npos) << d[0];
  }
  {  // another kernel in one node
    json bad = good;
    bad["2"]["nodes"][kernel_at]["name"] = "_Z10not_itselfPf";
    EXPECT_EQ(graph_dump_differences(live.graphs, bad).size(), 1u);
  }
  {  // another module image, same kernel name
    json bad = good;
    bad["2"]["nodes"][kernel_at]["module"] = "emu-fnv1a64:0000000000000000";
    EXPECT_EQ(graph_dump_differences(live.graphs, bad).size(), 1u);
  }
  {  // the grid of one node
    json bad = good;
    bad["1"]["nodes"][kernel_at]["grid"][0] =
        bad["1"]["nodes"][kernel_at]["grid"][0].get<int>() + 1;
    EXPECT_EQ(graph_dump_differences(live.graphs, bad).size(), 1u);
  }
  {  // one edge dropped
    json bad = good;
    bad["1"]["edges"].erase(bad["1"]["edges"].size() - 1);
    const auto d = graph_dump_differences(live.graphs, bad);
    ASSERT_EQ(d.size(), 1u) << joined(d);
    EXPECT_TRUE(d[0].starts_with("batch size 1: edges")) << d[0];
  }
  {  // one node missing, one size missing
    json bad = good;
    bad["4"]["nodes"].erase(bad["4"]["nodes"].size() - 1);
    bad.erase("2");
    const auto d = graph_dump_differences(live.graphs, bad);
    EXPECT_NE(joined(d).find("batch size 2: missing"), std::string::npos) << joined(d);
    EXPECT_NE(joined(d).find("batch size 4: "), std::string::npos) << joined(d);
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// The transparent restore (no engine change): the engine captures as usual, the shim checks its
// launches against the record and hands back the graph and exec it built from it. The exec the
// engine launches is node for node and edge for edge what a live capture gave, parameter bytes
// included, with the same tokens and logits.
TEST_F(GraphParity, TransparentRestoreIsNodeForNodeTheLiveCapture) {
  const ParityRun live = run("live", true, false);
  expect_every_size(live, "captured");
  const ParityRun restored = run("transparent", true, false);
  expect_every_size(restored, "captured");  // the engine did capture: elided underneath
  // Every capture was elided (not a live capture that happens to be equal).
  EXPECT_NE(restored.shim_log.find("graph restore summary: captures=3 transparent=3 fallbacks=0"),
            std::string::npos)
      << restored.shim_log;
  ASSERT_TRUE(live.graphs.is_object()) << live.all();
  ASSERT_TRUE(restored.graphs.is_object()) << restored.all();
  EXPECT_EQ(live.graphs.size(), 3u);
  const auto diffs = graph_dump_differences(live.graphs, restored.graphs);
  EXPECT_TRUE(diffs.empty()) << joined(diffs);
  EXPECT_EQ(live.graphs, restored.graphs);
  EXPECT_EQ(restored.tokens(), live.tokens());
  EXPECT_FALSE(live.logits.empty());
  EXPECT_TRUE(restored.logits == live.logits)
      << "logits of the transparently restored graphs differ";
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// --dump-graphs on the engine variant that links libcuda.so.1 (found with dlsym(RTLD_DEFAULT)
// there) describes the same graphs; on a driver without the emulator's inspection calls it is a
// clear error, not an empty or partial dump.
TEST_F(GraphParity, DumpGraphsWorksLinkedAndNeedsTheEmulator) {
  const fs::path dump = dir_.path() / "linked.graphs.json";
  const auto args = refengine_test::small_generate_args(
      model(), {"--cuda-graph-sizes", "1,2", "--dump-graphs", dump.string()});
  const auto linked = refengine_test::run_engine(args, {}, REFENGINE_LINKED_BIN);
  ASSERT_EQ(linked.exit_code, 0) << linked.err;
  const json graphs = json::parse(thaw::testing::slurp(dump), nullptr, false);
  ASSERT_TRUE(graphs.is_object());
  EXPECT_EQ(graphs.size(), 2u) << graphs.dump().substr(0, 400);
  EXPECT_GT(graphs["1"]["nodes"].size(), 1u);

  fs::remove(dump);
  const auto real = refengine_test::run_engine(
      args, "REFENGINE_LIBCUDA=" DRIVER_WITHOUT_INSPECTION);  // (the later assignment wins)
  EXPECT_EQ(real.exit_code, 1) << real.err;
  EXPECT_NE(
      real.err.find("refengine: error: --dump-graphs needs thaw's CUDA driver emulator "
                    "(its thawEmuDescribeGraphExec call): the driver " DRIVER_WITHOUT_INSPECTION
                    " has none"),
      std::string::npos)
      << real.err;
  EXPECT_FALSE(fs::exists(dump));
  EXPECT_EQ(stop_thawd(), 0) << log();
}

// The description itself, on the emulator in this process: a graph built in another creation
// order describes the same (the canonical order), its executable graph describes the same nodes
// and edges, one different memset value does not; misuse gets the documented errors.
class EmuGraphDescription : public ::testing::Test {
 protected:
  template <class Fn>
  Fn sym(const char* name) {
    void* f = dlsym(lib_, name);
    EXPECT_NE(f, nullptr) << name;
    return reinterpret_cast<Fn>(f);
  }
  void SetUp() override {
    lib_ = dlopen(THAW_EMU_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
    describe_exec_ = sym<decltype(&thawEmuDescribeGraphExec)>("thawEmuDescribeGraphExec");
    describe_graph_ = sym<decltype(&thawEmuDescribeGraph)>("thawEmuDescribeGraph");
    graph_create_ = sym<decltype(&cuGraphCreate)>("cuGraphCreate");
    add_memset_ = sym<decltype(&cuGraphAddMemsetNode)>("cuGraphAddMemsetNode");
    instantiate_ = sym<decltype(&cuGraphInstantiateWithFlags)>("cuGraphInstantiateWithFlags");
    exec_destroy_ = sym<decltype(&cuGraphExecDestroy)>("cuGraphExecDestroy");
    graph_destroy_ = sym<decltype(&cuGraphDestroy)>("cuGraphDestroy");
    ASSERT_FALSE(HasFailure());
    char* text = nullptr;
    // Before cuInit, as the other inspection calls.
    EXPECT_EQ(describe_graph_(nullptr, &text), CUDA_ERROR_NOT_INITIALIZED);
    ASSERT_EQ(sym<decltype(&cuInit)>("cuInit")(0), CUDA_SUCCESS);
    ASSERT_EQ(sym<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain")(&ctx_, 0),
              CUDA_SUCCESS);
    ASSERT_EQ(sym<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent")(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(sym<decltype(&cuMemAlloc_v2)>("cuMemAlloc_v2")(&buf_, 4096), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (buf_ != 0) (void)sym<decltype(&cuMemFree_v2)>("cuMemFree_v2")(buf_);
    if (ctx_ != nullptr)
      (void)sym<decltype(&cuDevicePrimaryCtxRelease_v2)>("cuDevicePrimaryCtxRelease_v2")(0);
  }

  CUgraphNode memset(CUgraph g, std::size_t offset, unsigned value,
                     std::vector<CUgraphNode> deps = {}) {
    CUDA_MEMSET_NODE_PARAMS p{};
    p.dst = buf_ + offset;
    p.value = value;
    p.elementSize = 4;
    p.width = 16;
    p.height = 1;
    CUgraphNode n = nullptr;
    EXPECT_EQ(add_memset_(&n, g, deps.data(), deps.size(), &p, ctx_), CUDA_SUCCESS);
    return n;
  }
  // Two memsets with no order between them, then one after both: `first_two` in creation order.
  CUgraph diamond(bool swapped, unsigned second_value = 2) {
    CUgraph g = nullptr;
    EXPECT_EQ(graph_create_(&g, 0), CUDA_SUCCESS);
    CUgraphNode a = nullptr, b = nullptr;
    if (!swapped) {
      a = memset(g, 0, 1);
      b = memset(g, 256, second_value);
    } else {
      b = memset(g, 256, second_value);
      a = memset(g, 0, 1);
    }
    memset(g, 512, 3, swapped ? std::vector{b, a} : std::vector{a, b});
    return g;
  }
  json describe(CUgraph g) {
    char* text = nullptr;
    EXPECT_EQ(describe_graph_(g, &text), CUDA_SUCCESS);
    json j = json::parse(text ? text : "null", nullptr, false);
    std::free(text);
    return j;
  }
  json describe(CUgraphExec e) {
    char* text = nullptr;
    EXPECT_EQ(describe_exec_(e, &text), CUDA_SUCCESS);
    json j = json::parse(text ? text : "null", nullptr, false);
    std::free(text);
    return j;
  }

  void* lib_ = nullptr;  // stays loaded: the emulator's threads outlive the test
  CUcontext ctx_ = nullptr;
  CUdeviceptr buf_ = 0;
  decltype(&thawEmuDescribeGraphExec) describe_exec_ = nullptr;
  decltype(&thawEmuDescribeGraph) describe_graph_ = nullptr;
  decltype(&cuGraphCreate) graph_create_ = nullptr;
  decltype(&cuGraphAddMemsetNode) add_memset_ = nullptr;
  decltype(&cuGraphInstantiateWithFlags) instantiate_ = nullptr;
  decltype(&cuGraphExecDestroy) exec_destroy_ = nullptr;
  decltype(&cuGraphDestroy) graph_destroy_ = nullptr;
};

TEST_F(EmuGraphDescription, IsCanonicalAcrossCreationOrdersAndSeesOneDifferentValue) {
  CUgraph plain = diamond(false), swapped = diamond(true), other = diamond(false, 7);
  const json a = describe(plain), b = describe(swapped), c = describe(other);
  ASSERT_TRUE(a.is_object()) << a;
  EXPECT_EQ(a["kind"], "graph");
  ASSERT_EQ(a["nodes"].size(), 3u) << a;
  EXPECT_EQ(a["nodes"][0]["type"], "memset");
  EXPECT_EQ(a["nodes"][0]["dst"], fmt::format("{:#x}", buf_));
  EXPECT_EQ(a["nodes"][0]["value"], 1);
  EXPECT_EQ(a["nodes"][0]["element_size"], 4);
  EXPECT_EQ(a["nodes"][0]["width"], 16);
  EXPECT_EQ(a["nodes"][2]["value"], 3);
  EXPECT_EQ(a["edges"], json::parse("[[0,2],[1,2]]"));
  EXPECT_EQ(a, b) << "creation order changed the description";
  const auto d = graph_dump_differences(json{{"1", a}}, json{{"1", c}});
  ASSERT_EQ(d.size(), 1u) << joined(d);
  EXPECT_EQ(d[0], "batch size 1: node 1 (memset): value 7, not 2");

  CUgraphExec ea = nullptr, eb = nullptr;
  ASSERT_EQ(instantiate_(&ea, plain, 0), CUDA_SUCCESS);
  ASSERT_EQ(instantiate_(&eb, swapped, 0), CUDA_SUCCESS);
  const json xa = describe(ea), xb = describe(eb);
  EXPECT_EQ(xa["kind"], "exec");
  EXPECT_EQ(xa["nodes"], a["nodes"]);
  EXPECT_EQ(xa["edges"], a["edges"]);
  EXPECT_EQ(xa, xb);

  char* text = nullptr;
  EXPECT_EQ(describe_exec_(ea, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(describe_graph_(nullptr, &text), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(exec_destroy_(eb), CUDA_SUCCESS);
  EXPECT_EQ(describe_exec_(eb, &text), CUDA_ERROR_INVALID_VALUE) << "a destroyed exec";
  EXPECT_EQ(text, nullptr);
  EXPECT_EQ(exec_destroy_(ea), CUDA_SUCCESS);
  for (CUgraph g : {plain, swapped, other}) EXPECT_EQ(graph_destroy_(g), CUDA_SUCCESS);
}

}  // namespace
