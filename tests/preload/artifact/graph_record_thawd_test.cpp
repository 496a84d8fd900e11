// The shim records the CUDA graphs an engine captures and thawd keeps them as an artifact of
// kind "graphs" (a private thawd on the emulator, a loopback registry serving gpt-syn):
//   - a small program (graph_capture_probe) captures two graphs; the stored record holds the
//     one the shim could describe completely, with the live graph's node count, node types
//     and edge count, kernel identities whose digests are the SHA-256 of the module images
//     the program loaded (a cubin by cuModuleLoadData, a fatbin by cuLibraryLoadData), and
//     the parameter bytes the program passed; the other graph (a memset node, whose
//     parameters the emulator does not give) is left out and the shim's log says why;
//   - the reference engine, unmodified, with --cuda-graph-sizes 1,2,4: three decode graphs,
//     largest first, every node a kernel of its one kernel image, in a chain.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "common/graphs/graph_record.hpp"
#include "emu_kernels_cubins.h"
#include "engine_process.hpp"
#include "preload/artifact/module_image.hpp"
#include "refengine_kernels_cubins.h"
#include "thawd_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using thaw::graphs::GraphRecord;
using thaw::graphs::NodeType;
using thaw::testing::BusPolicy;
using thaw::testing::ThawdFixture;

std::string digest_of(const ThawCubin& image) {
  return thaw::preload::sha256_hex({reinterpret_cast<const std::byte*>(image.data), image.size});
}

std::string hex(const std::vector<std::uint8_t>& bytes) {
  std::string out;
  for (std::uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

class GraphRecordWithThawd : public ThawdFixture {
 protected:
  fs::path model() const { return dir_.path() / "cache" / "gpt-syn"; }

  void start() {
    start_registry();
    start_thawd(BusPolicy::open);
    ASSERT_EQ(thawctl({"fetch", "gpt-syn"}).exit_code, 0) << log();
  }

  struct Run {
    refengine_test::EngineRun engine;
    std::string shim_log;
  };
  Run run_shimmed(const std::string& tag, const std::vector<std::string>& args,
                  const std::string& binary, const std::string& extra_env = "") {
    const fs::path shim_log = dir_.path() / (tag + ".shim.log");
    const std::string env =
        "LD_PRELOAD=" THAW_PRELOAD_LIB " THAW_SOCKET=" + socket_path().string() +
        " THAW_PRELOAD_LOG=" + shim_log.string() + " THAW_PRELOAD_LEASE=0 " + extra_env;
    Run r;
    r.engine = refengine_test::run_engine(args, env, binary);
    r.shim_log = thaw::testing::slurp(shim_log);
    return r;
  }

  // The stored graphs record (there must be exactly one).
  GraphRecord stored_graphs() {
    std::vector<fs::path> found;
    const fs::path dir = dir_.path() / "state" / "artifacts";
    if (fs::exists(dir)) {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().filename().string().starts_with("graphs-")) found.push_back(e.path());
      }
    }
    EXPECT_EQ(found.size(), 1u) << log();
    if (found.size() != 1) return {};
    auto record = thaw::graphs::graph_record_from_json(thaw::testing::slurp(found[0]));
    EXPECT_TRUE(record) << record.error();
    return record ? *record : GraphRecord{};
  }
};

TEST_F(GraphRecordWithThawd, TheStoredRecordIsTheLiveGraphWithItsImagesAndParameters) {
  start();
  // Any file of the model names it (the layout record's identity).
  const fs::path model_file = model() / "config.json";
  ASSERT_TRUE(fs::exists(model_file));
  const Run run = run_shimmed("probe", {model_file.string()}, GRAPH_CAPTURE_PROBE_BIN,
                              "THAW_EMU_KERNELS=" EMU_KERNELS_TWIN_LIB);
  ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
  const auto live = refengine_test::json_lines(run.engine.out);
  ASSERT_EQ(live.size(), 2u) << run.engine.out;
  EXPECT_NE(log().find("stored its graphs artifact for gpt-syn"), std::string::npos) << log();

  const GraphRecord record = stored_graphs();
  EXPECT_EQ(record.identity.model, "gpt-syn");
  // Both graphs: graph 1 holds a memset node, which the driver describes
  // (cuGraphMemsetNodeGetParams) and the record keeps.
  ASSERT_EQ(record.graphs.size(), 2u) << run.shim_log;
  for (std::size_t g = 0; g < 2; ++g) {
    const auto& recorded_graph = record.graphs[g];
    EXPECT_EQ(recorded_graph.index, g);
    ASSERT_EQ(recorded_graph.nodes.size(), live[g]["nodes"].get<std::size_t>()) << g;
    EXPECT_EQ(recorded_graph.edges.size(), live[g]["edges"].get<std::size_t>()) << g;
    for (std::size_t i = 0; i < recorded_graph.nodes.size(); ++i) {
      EXPECT_EQ(thaw::graphs::to_string(recorded_graph.nodes[i].type),
                live[g]["types"][i].get<std::string>())
          << g << " " << i;
    }
  }
  const auto& graph = record.graphs[0];
  EXPECT_EQ(graph.allocation_index, 3u) << "the probe allocated three buffers before capturing";
  EXPECT_EQ(graph.edges.size(), 2u);
  // cuMemsetD32Async(c, 0, 4096, s1): the memset node as captured.
  const thaw::graphs::MemsetNode* memset = nullptr;
  for (const auto& node : record.graphs[1].nodes) {
    if (node.memset) memset = &*node.memset;
  }
  ASSERT_NE(memset, nullptr);
  EXPECT_EQ(memset->element_size, 4u);
  EXPECT_EQ(memset->value, 0u);
  EXPECT_EQ(memset->width, 4096u);
  EXPECT_EQ(memset->height, 1u);
  EXPECT_NE(memset->dst, 0u);

  const std::string cubin = digest_of(thaw_cubin_samples());
  const std::string fatbin = digest_of(thaw_fatbin_chain());
  std::set<std::pair<std::string, std::string>> recorded, passed;
  for (const auto& node : graph.nodes) {
    ASSERT_TRUE(node.kernel);
    const auto& k = *node.kernel;
    EXPECT_EQ(k.kernel.module_digest, k.kernel.name == "vec_add" ? cubin : fatbin) << k.kernel.name;
    EXPECT_EQ(k.block, (std::array<std::uint32_t, 3>{128, 1, 1}));
    EXPECT_EQ(k.grid, (std::array<std::uint32_t, 3>{32, 1, 1}));
    recorded.emplace(k.kernel.name, hex(k.param_bytes));
  }
  for (const auto& k : live[0]["kernels"]) passed.emplace(k["name"], k["params"]);
  EXPECT_EQ(recorded, passed);
  // The images the kernels name, and only those.
  ASSERT_EQ(record.modules.size(), 2u);
  for (const auto& m : record.modules) {
    if (m.digest == cubin) {
      EXPECT_EQ(m.kind, thaw::graphs::ImageKind::cubin);
      EXPECT_EQ(m.bytes, thaw_cubin_samples().size);
    } else {
      EXPECT_EQ(m.digest, fatbin);
      EXPECT_EQ(m.kind, thaw::graphs::ImageKind::fatbin);
      EXPECT_EQ(m.bytes, thaw_fatbin_chain().size);
    }
  }
  // What the shim says about the run.
  EXPECT_NE(run.shim_log.find("CUDA graphs: 2 captured, 2 recorded (5 nodes, 96 parameter bytes"),
            std::string::npos)
      << run.shim_log;
  EXPECT_EQ(stop_thawd(), 0) << log();
}

TEST_F(GraphRecordWithThawd, TheReferenceEnginesDecodeGraphsAreRecorded) {
  start();
  const Run run = run_shimmed(
      "refengine", refengine_test::small_generate_args(model(), {"--cuda-graph-sizes", "1,2,4"}),
      REFENGINE_BIN);
  ASSERT_EQ(run.engine.exit_code, 0) << run.engine.err << run.shim_log;
  EXPECT_NE(log().find("stored its graphs artifact for gpt-syn"), std::string::npos) << log();
  const GraphRecord record = stored_graphs();
  ASSERT_EQ(record.graphs.size(), 3u) << run.shim_log;
  const std::string image = digest_of(thaw_cubin_kernels());
  ASSERT_EQ(record.modules.size(), 1u);
  EXPECT_EQ(record.modules[0].digest, image);
  std::size_t nodes = 0;
  std::vector<std::uint32_t> rows;  // argmax's first parameter-free dimension: the batch size
  for (const auto& g : record.graphs) {
    ASSERT_FALSE(g.nodes.empty());
    nodes += g.nodes.size();
    // One stream: a chain.
    EXPECT_EQ(g.edges.size(), g.nodes.size() - 1);
    for (const auto& n : g.nodes) {
      ASSERT_EQ(n.type, NodeType::kernel);
      EXPECT_EQ(n.kernel->kernel.module_digest, image);
      EXPECT_FALSE(n.kernel->param_bytes.empty());
    }
    EXPECT_EQ(g.nodes.back().kernel->kernel.name, "argmax_f32");
    rows.push_back(g.nodes.back().kernel->grid[0]);
    EXPECT_EQ(g.allocation_index, record.graphs[0].allocation_index) << "captures allocate nothing";
  }
  // Largest batch first, as vLLM captures (argmax runs one block per row).
  EXPECT_EQ(rows, (std::vector<std::uint32_t>{4, 2, 1}));
  EXPECT_NE(run.shim_log.find(fmt::format("CUDA graphs: 3 captured, 3 recorded ({} nodes", nodes)),
            std::string::npos)
      << run.shim_log;
  std::smatch m;
  if (std::regex_search(run.shim_log, m, std::regex("CUDA graphs: .*"))) {
    std::cout << "[ shim     ] " << m[0] << "\n";
  }
  EXPECT_EQ(stop_thawd(), 0) << log();
}

}  // namespace
