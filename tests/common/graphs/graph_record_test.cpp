// The graph record codec: a record of every node type survives the text form unchanged, the text
// is deterministic, and every rule of graph_record_model.hpp refuses what breaks it with a
// message that names the place (each refusal below edits one value of a valid record's text).
#include "common/graphs/graph_record.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using namespace thaw::graphs;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kDigestA(64, 'a');
const std::string kDigestB = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kDigestC(64, '7');

std::vector<std::uint8_t> bytes(std::size_t n) {
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 37 + 5);
  return out;
}

RecordedNode kernel_node(const std::string& digest, std::string name, std::vector<ParamSlot> params,
                         std::size_t param_bytes) {
  KernelNode k;
  k.kernel = {digest, std::move(name)};
  k.grid = {128, 4, 2};
  k.block = {256, 1, 1};
  k.shared_bytes = 49152;
  k.params = std::move(params);
  k.param_bytes = bytes(param_bytes);
  k.cooperative = 1;
  k.priority = 3;
  k.cluster = {2, 2, 1};
  k.cluster_scheduling = 2;
  k.mem_sync_domain = 1;
  k.mem_sync_domain_map = {0, 1};
  k.carveout = 50;
  return {NodeType::kernel, k, std::nullopt, std::nullopt};
}

// Every node type, params, edges, two graphs, three modules; 64-bit values past 2^53.
GraphRecord rich() {
  GraphRecord r;
  r.identity = {"/usr/bin/python3 4096 1700000000.000000000", "org/model-7b",
                "NVIDIA H100 80GB HBM3", "12040"};
  r.modules = {{kDigestA, 1 << 20, ImageKind::cubin},
               {kDigestB, 123456789, ImageKind::fatbin},
               {kDigestC, 77, ImageKind::ptx}};
  RecordedGraph g;
  g.index = 0;
  g.allocation_index = 52;
  g.label = "decode batch=8 ~{}[]\"\\";
  g.nodes.push_back(kernel_node(kDigestA, "_Z6gemm_kPKfS0_Pfiii", {{0, 8}, {8, 8}, {16, 4}}, 20));
  g.nodes.push_back({NodeType::memset, std::nullopt,
                     MemsetNode{0x7f00'0000'1000'0000, 4096, 0xdeadbeef, 4, 1024, 16},
                     std::nullopt});
  g.nodes.push_back({NodeType::memcpy, std::nullopt, std::nullopt,
                     MemcpyNode{0xffff'ffff'ffff'fff0, 0x7f00'0000'2000'0000, 1ull << 40, 1, 2}});
  g.nodes.push_back({NodeType::empty, std::nullopt, std::nullopt, std::nullopt});
  g.nodes.push_back({NodeType::event_record, std::nullopt, std::nullopt, std::nullopt});
  g.nodes.push_back({NodeType::event_wait, std::nullopt, std::nullopt, std::nullopt});
  g.nodes.push_back({NodeType::host, std::nullopt, std::nullopt, std::nullopt});
  g.nodes.push_back({NodeType::other, std::nullopt, std::nullopt, std::nullopt});
  g.nodes.push_back(kernel_node(kDigestB, "sm90_xmma_gemm_f16f16", {{0, 4}, {8, 8}, {40, 8}}, 48));
  g.edges = {{0, 1}, {1, 2}, {0, 3}, {2, 4}, {3, 4}, {5, 6}, {4, 7}, {6, 7}, {7, 8}};
  r.graphs.push_back(g);
  RecordedGraph g2;
  g2.index = 3;
  g2.allocation_index = 0xffff'ffff'ffff'ffff;
  g2.nodes.push_back(kernel_node(kDigestC, "k", {}, 0));
  r.graphs.push_back(g2);
  r.graphs.push_back(RecordedGraph{4, 60, {}, {}});
  return r;
}

json rich_json() {
  return json::parse(graph_record_to_json(rich()));
}

// The error for the rich record's text after `edit`; "" when it parsed.
std::string refused(const std::function<void(json&)>& edit) {
  json doc = rich_json();
  edit(doc);
  GraphRecord out;
  return parse_graph_record(doc.dump(), out);
}

json& kernel0(json& doc) {
  return doc["graphs"][0]["nodes"][0]["kernel"];
}

TEST(GraphRecord, RichRecordRoundTrips) {
  const GraphRecord r = rich();
  const auto back = graph_record_from_json(graph_record_to_json(r));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, r);
  EXPECT_EQ(back->graphs[0].nodes[2].memcpy->src, 0xffff'ffff'ffff'fff0u);  // past 2^53, exact
}

TEST(GraphRecord, EmptyRecordRoundTrips) {
  const auto back = graph_record_from_json(graph_record_to_json(GraphRecord{}));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, GraphRecord{});
}

TEST(GraphRecord, TextIsDeterministicAndAFixpoint) {
  const std::string text = graph_record_to_json(rich());
  EXPECT_EQ(graph_record_to_json(rich()), text);
  const auto back = graph_record_from_json(text);
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(graph_record_to_json(*back), text);
}

TEST(GraphRecord, TextFormIsTheDocumentedOne) {
  GraphRecord r;
  r.identity = {"e", "m", "g", "12040"};
  r.modules = {{kDigestA, 10, ImageKind::cubin}};
  RecordedGraph g{0, 7, {}, {{0, 1}}};
  g.nodes.push_back(kernel_node(kDigestA, "k", {{0, 2}}, 2));
  g.nodes.push_back(
      {NodeType::memset, std::nullopt, MemsetNode{16, 0, 255, 1, 8, 1}, std::nullopt});
  r.graphs.push_back(g);
  const std::string a64(64, 'a');
  EXPECT_EQ(graph_record_to_json(r),
            R"({"version":4,"identity":{"engine":"e","model":"m","gpu":"g","driver":"12040"},)"
            R"("attribute_defaults":{"cooperative":0,"priority":0,"cluster":[0,0,0],)"
            R"("cluster_scheduling":0,"mem_sync_domain":0,"mem_sync_domain_map":[0,0],)"
            R"("carveout":4294967295},"modules":[{"digest":")" +
                a64 +
                R"(","bytes":10,"kind":"cubin"}],"graphs":[{"index":0,"allocation_index":7,)"
                R"("nodes":[{"type":"kernel","kernel":{"module_digest":")" +
                a64 +
                R"(","name":"k","grid":[128,4,2],"block":[256,1,1],"shared_bytes":49152,)"
                R"("params":[[0,2]],"param_bytes":"052a","cooperative":1,"priority":3,)"
                R"("cluster":[2,2,1],"cluster_scheduling":2,"mem_sync_domain":1,)"
                R"("mem_sync_domain_map":[0,1],"carveout":50}},)"
                R"({"type":"memset","memset":{"dst":16,"pitch":0,"value":255,"element_size":1,)"
                R"("width":8,"height":1}}],"edges":[[0,1]],"label":""}]})");
}

TEST(GraphRecord, NamesOfEnums) {
  EXPECT_EQ(to_string(NodeType::kernel), "kernel");
  EXPECT_EQ(to_string(NodeType::event_record), "event_record");
  EXPECT_EQ(to_string(NodeType::other), "other");
  EXPECT_EQ(to_string(ImageKind::fatbin), "fatbin");
  EXPECT_EQ(to_string(ImageKind::unknown), "unknown");
  EXPECT_EQ(to_string(static_cast<NodeType>(99)), "invalid");
}

TEST(GraphRecord, TheExampleOfTheHeader) {
  // graphs[3].nodes[17]: three empty graphs before, seventeen nodes before.
  json doc = rich_json();
  json node = doc["graphs"][0]["nodes"][0];
  node["kernel"]["params"] = json::array({{0, 8}, {8, 32}, {40, 8}});
  node["kernel"]["param_bytes"] = std::string(88, '0');
  json graph = {{"index", 9},
                {"allocation_index", 0},
                {"nodes", json::array()},
                {"edges", json::array()},
                {"label", ""}};
  for (int i = 0; i < 17; ++i) graph["nodes"].push_back({{"type", "empty"}});
  graph["nodes"].push_back(node);
  doc["graphs"].push_back(graph);
  GraphRecord out;
  EXPECT_EQ(parse_graph_record(doc.dump(), out),
            "graphs[3].nodes[17].kernel.params[2]: offset 40 + size 8 is past the 44 parameter "
            "bytes");
  EXPECT_EQ(graph_record_from_json(doc.dump()).error(), parse_graph_record(doc.dump(), out));
}

// ---- the text ----

TEST(GraphRecordRefuses, TextOverTheLimitBeforeParsing) {
  const std::string text(kMaxGraphRecordBytes + 1, ' ');
  GraphRecord out;
  EXPECT_EQ(parse_graph_record(text, out), "record: 33554433 bytes, over the limit of 33554432");
}

TEST(GraphRecordRefuses, NotJson) {
  GraphRecord out;
  EXPECT_THAT(parse_graph_record("{\"version\":1,", out), StartsWith("record: not JSON: "));
  EXPECT_THAT(parse_graph_record("", out), StartsWith("record: not JSON: "));
  EXPECT_EQ(parse_graph_record("[]", out), "record: is an array, not an object");
}

TEST(GraphRecordRefuses, NestingDeeperThanTheFormat) {
  GraphRecord out;
  EXPECT_EQ(parse_graph_record(std::string(100000, '['), out),
            "record: nested deeper than 8 levels");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["params"][0][0] = json::array({json::array()}); }),
            "record: nested deeper than 8 levels");
}

TEST(GraphRecordRefuses, DuplicateKeys) {
  std::string text = graph_record_to_json(rich());
  text.insert(1, R"("version":4,)");
  GraphRecord out;
  EXPECT_EQ(parse_graph_record(text, out), "record: field \"version\" appears twice in one object");
}

TEST(GraphRecordRefuses, OtherVersions) {
  // Version 1 had no graph labels, version 2 no kernel launch attributes (a restore from it
  // would drop a GEMM's cluster), version 3 no driver attribute defaults (its attributes were
  // compared with assumed ones): their records are refused, as any other version's.
  for (int v : {1, 2, 3, 5}) {
    EXPECT_EQ(refused([v](json& d) { d["version"] = v; }),
              fmt::format("version: is {}, not 4 (the version this build reads)", v));
  }
  EXPECT_EQ(refused([](json& d) { d["version"] = "4"; }),
            "version: is a string, not 4 (the version this build reads)");
  EXPECT_EQ(refused([](json& d) { d["version"] = 4.0; }),
            "version: is a number with a fraction or an exponent, not 4 (the version this build "
            "reads)");
  EXPECT_EQ(refused([](json& d) { d.erase("version"); }), "record: no field \"version\"");
}

// The driver's defaults in the header: every field there, checked as a kernel's attributes.
TEST(GraphRecordRefuses, BadAttributeDefaults) {
  EXPECT_EQ(refused([](json& d) { d.erase("attribute_defaults"); }),
            "record: no field \"attribute_defaults\"");
  EXPECT_EQ(refused([](json& d) { d["attribute_defaults"].erase("carveout"); }),
            "attribute_defaults: no field \"carveout\"");
  EXPECT_EQ(refused([](json& d) { d["attribute_defaults"]["extra"] = 1; }),
            "attribute_defaults: unknown field \"extra\"");
  EXPECT_EQ(refused([](json& d) { d["attribute_defaults"]["carveout"] = 101; }),
            "attribute_defaults.carveout: is 101, not a percentage (0..100) or 4294967295 (the "
            "default)");
  EXPECT_EQ(refused([](json& d) {
              d["attribute_defaults"]["cluster"] = json::array({1, 0, 1});
            }),
            "attribute_defaults.cluster: is [1, 0, 1]: all 0 (no cluster) or each at least 1");
}

TEST(GraphRecord, ProbedAttributeDefaultsRoundTrip) {
  GraphRecord r = rich();
  r.attribute_defaults.carveout = 0;
  r.attribute_defaults.cluster = {1, 1, 1};
  r.attribute_defaults.priority = static_cast<std::uint32_t>(-1);
  const auto back = graph_record_from_json(graph_record_to_json(r));
  ASSERT_TRUE(back) << back.error();
  EXPECT_EQ(*back, r);
}

TEST(GraphRecordRefuses, UnknownAndMissingFields) {
  EXPECT_EQ(refused([](json& d) { d["extra"] = 1; }), "record: unknown field \"extra\"");
  EXPECT_EQ(refused([](json& d) { d["identity"]["pid"] = 1; }), "identity: unknown field \"pid\"");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["attrs"] = 1; }),
            "graphs[0].nodes[0].kernel: unknown field \"attrs\"");
  EXPECT_EQ(refused([](json& d) { kernel0(d).erase("priority"); }),
            "graphs[0].nodes[0].kernel: no field \"priority\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1].erase("edges"); }),
            "graphs[1]: no field \"edges\"");
  EXPECT_EQ(refused([](json& d) { d["modules"][2].erase("kind"); }),
            "modules[2]: no field \"kind\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][3]["x\n\"y"] = 1; }),
            "graphs[0].nodes[3]: unknown field \"x\\x0a\\x22y\"");
}

TEST(GraphRecordRefuses, LaunchAttributesOutOfRange) {
  EXPECT_EQ(refused([](json& d) { kernel0(d).erase("cluster"); }),
            "graphs[0].nodes[0].kernel: no field \"cluster\"");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["cluster"] = json::array({2, 1});
            }),
            "graphs[0].nodes[0].kernel.cluster: is an array, not an array [x, y, z]");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["cluster"] = json::array({2, 0, 1});
            }),
            "graphs[0].nodes[0].kernel.cluster: is [2, 0, 1]: all 0 (no cluster) or each at "
            "least 1");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["cluster"][2] = -1; }),
            "graphs[0].nodes[0].kernel.cluster[2]: is -1, not an unsigned integer");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["cluster_scheduling"] = 3; }),
            "graphs[0].nodes[0].kernel.cluster_scheduling: is 3, above 2");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["mem_sync_domain"] = 2; }),
            "graphs[0].nodes[0].kernel.mem_sync_domain: is 2, above 1");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["mem_sync_domain_map"][1] = 256; }),
            "graphs[0].nodes[0].kernel.mem_sync_domain_map[1]: is 256, above 255");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["mem_sync_domain_map"] = 0; }),
            "graphs[0].nodes[0].kernel.mem_sync_domain_map: is 0, not an array [default, remote]");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["carveout"] = 101; }),
            "graphs[0].nodes[0].kernel.carveout: is 101, not a percentage (0..100) or 4294967295 "
            "(the default)");
}

TEST(GraphRecord, NoClusterAndTheDefaultCarveoutRoundTrip) {
  GraphRecord r = rich();
  KernelNode& k = *r.graphs[0].nodes[0].kernel;
  k.cluster = {0, 0, 0};
  k.carveout = kCarveoutDefault;
  k.mem_sync_domain_map = {255, 7};
  const auto back = graph_record_from_json(graph_record_to_json(r));
  ASSERT_TRUE(back.has_value()) << back.error();
  EXPECT_EQ(*back, r);
  EXPECT_NE(r, rich());  // the attributes are part of the comparison
}

TEST(GraphRecordRefuses, FieldsOfTheWrongType) {
  EXPECT_EQ(refused([](json& d) { d["identity"]["engine"] = 7; }),
            "identity.engine: is 7, not a string");
  EXPECT_EQ(refused([](json& d) { d["identity"] = json::array(); }),
            "identity: is an array, not an object");
  EXPECT_EQ(refused([](json& d) { d["modules"] = json::object(); }),
            "modules: is an object, not an array");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["allocation_index"] = -1; }),
            "graphs[0].allocation_index: is -1, not an unsigned integer");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["allocation_index"] = 2.5; }),
            "graphs[0].allocation_index: is a number with a fraction or an exponent, not an "
            "unsigned integer");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["shared_bytes"] = 1ull << 32; }),
            "graphs[0].nodes[0].kernel.shared_bytes: is 4294967296, above 4294967295");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["cooperative"] = true; }),
            "graphs[0].nodes[0].kernel.cooperative: is true, not an unsigned integer");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][1]["memset"]["dst"] = nullptr; }),
            "graphs[0].nodes[1].memset.dst: is null, not an unsigned integer");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][2]["memcpy"]["bytes"] = "1"; }),
            "graphs[0].nodes[2].memcpy.bytes: is a string, not an unsigned integer");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][4] = "empty"; }),
            "graphs[0].nodes[4]: is a string, not an object");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][4]["type"] = 3; }),
            "graphs[0].nodes[4].type: is 3, not a string");
}

TEST(GraphRecordRefuses, UnknownNodeTypes) {
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][6]["type"] = "conditional"; }),
            "graphs[0].nodes[6].type: unknown node type \"conditional\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][6]["type"] = "Kernel"; }),
            "graphs[0].nodes[6].type: unknown node type \"Kernel\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][6].erase("type"); }),
            "graphs[0].nodes[6]: no field \"type\"");
}

TEST(GraphRecordRefuses, UnknownImageKinds) {
  EXPECT_EQ(refused([](json& d) { d["modules"][1]["kind"] = "elf"; }),
            "modules[1].kind: unknown image kind \"elf\"");
  EXPECT_EQ(refused([](json& d) { d["modules"][1]["kind"] = 0; }),
            "modules[1].kind: is 0, not a string");
}

TEST(GraphRecordRefuses, DigestsThatAreNot64LowercaseHex) {
  const std::string upper(64, 'A');
  EXPECT_EQ(refused([&](json& d) { d["modules"][0]["digest"] = upper; }),
            "modules[0].digest: \"" + upper.substr(0, 64) +
                "\" is not a digest (64 lowercase hex digits)");
  EXPECT_THAT(refused([](json& d) { d["modules"][0]["digest"] = std::string(63, 'a'); }),
              StartsWith("modules[0].digest: \"aaa"));
  EXPECT_THAT(refused([](json& d) { d["modules"][0]["digest"] = std::string(65, 'a'); }),
              HasSubstr("is not a digest"));
  EXPECT_THAT(refused([](json& d) { kernel0(d)["module_digest"] = std::string(64, 'g'); }),
              StartsWith("graphs[0].nodes[0].kernel.module_digest: \"ggg"));
}

TEST(GraphRecordRefuses, ModulesListedTwiceOrEmpty) {
  EXPECT_EQ(refused([](json& d) { d["modules"][2]["digest"] = kDigestA; }),
            "modules[2].digest: is listed already as modules[0]");
  EXPECT_EQ(refused([](json& d) { d["modules"][1]["bytes"] = 0; }),
            "modules[1].bytes: is 0, below 1");
}

TEST(GraphRecordRefuses, KernelsOfUnlistedModules) {
  const std::string other(64, 'e');
  EXPECT_EQ(refused([&](json& d) { kernel0(d)["module_digest"] = other; }),
            "graphs[0].nodes[0].kernel.module_digest: \"" + other +
                "\" is not one of the record's modules");
  EXPECT_EQ(refused([](json& d) { d["modules"].erase(2); }),
            "graphs[1].nodes[0].kernel.module_digest: \"" + kDigestC +
                "\" is not one of the record's modules");
}

TEST(GraphRecordRefuses, KernelNamesEmptyOrTooLong) {
  EXPECT_EQ(refused([](json& d) { kernel0(d)["name"] = ""; }),
            "graphs[0].nodes[0].kernel.name: is empty");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["name"] = std::string(kMaxNameBytes + 1, 'k'); }),
            "graphs[0].nodes[0].kernel.name: is 4097 bytes long, over the limit of 4096");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["name"] = std::string(kMaxNameBytes, 'k'); }), "");
  EXPECT_EQ(refused([](json& d) { d["identity"]["model"] = std::string(kMaxNameBytes + 1, 'm'); }),
            "identity.model: is 4097 bytes long, over the limit of 4096");
}

TEST(GraphRecordRefuses, EdgesNamingMissingNodes) {
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["edges"][3] = {2, 9};
            }),
            "graphs[0].edges[3]: node 9 does not exist (the graph has 9 nodes)");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][1]["edges"] = json::array({json::array({1, 0})});
            }),
            "graphs[1].edges[0]: node 1 does not exist (the graph has 1 node)");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["edges"][0] = json::array({0}); }),
            "graphs[0].edges[0]: is an array, not a row of two numbers");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["edges"][0] = {0, -1};
            }),
            "graphs[0].edges[0][1]: is -1, not an unsigned integer");
}

TEST(GraphRecordRefuses, EdgesThatAreSelfLoopsDuplicatesOrCycles) {
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["edges"][5] = {4, 4};
            }),
            "graphs[0].edges[5]: node 4 depends on itself");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["edges"].push_back({2, 4});
            }),
            "graphs[0].edges[9]: 2 -> 4 is listed already as edges[3]");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["edges"].push_back({8, 1});
            }),
            "graphs[0].edges: form a cycle: 5 nodes are on a cycle or depend on one (node 1 "
            "first)");
}

TEST(GraphRecordRefuses, ParamsOutsideParamBytes) {
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["params"][2] = {16, 8};
            }),
            "graphs[0].nodes[0].kernel.params[2]: offset 16 + size 8 is past the 20 parameter "
            "bytes");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["params"][2] = {4294967295u, 4294967295u};
            }),
            "graphs[0].nodes[0].kernel.params[2]: offset 4294967295 + size 4294967295 is past "
            "the 20 parameter bytes");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["param_bytes"] = ""; }),
            "graphs[0].nodes[0].kernel.params[0]: offset 0 + size 8 is past the 0 parameter "
            "bytes");
}

TEST(GraphRecordRefuses, ParamsOverlappingOrEmpty) {
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["params"][1] = {4, 8};
            }),
            "graphs[0].nodes[0].kernel.params[1]: offset 4 is before the end of params[0] at 8");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["params"][1] = {8, 0};
            }),
            "graphs[0].nodes[0].kernel.params[1]: offset 8 has size 0");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["params"][1] = json::object(); }),
            "graphs[0].nodes[0].kernel.params[1]: is an object, not a row of two numbers");
}

TEST(GraphRecordRefuses, ParamBytesNotLowercaseHex) {
  EXPECT_EQ(refused([](json& d) { kernel0(d)["param_bytes"] = "0a1"; }),
            "graphs[0].nodes[0].kernel.param_bytes: has 3 hex digits, not two per byte");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["param_bytes"] = std::string(38, '0') + "0A"; }),
            "graphs[0].nodes[0].kernel.param_bytes: \"A\" at character 39 is not a lowercase hex "
            "digit");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["param_bytes"] = std::string(38, '0') + "x0"; }),
            "graphs[0].nodes[0].kernel.param_bytes: \"x\" at character 38 is not a lowercase hex "
            "digit");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["param_bytes"] = json::array({1, 2});
            }),
            "graphs[0].nodes[0].kernel.param_bytes: is an array, not a string");
}

TEST(GraphRecordRefuses, LaunchDimensionsBelowOne) {
  EXPECT_EQ(refused([](json& d) { kernel0(d)["grid"][1] = 0; }),
            "graphs[0].nodes[0].kernel.grid[1]: is 0, below 1");
  EXPECT_EQ(refused([](json& d) { kernel0(d)["block"][2] = 0; }),
            "graphs[0].nodes[0].kernel.block[2]: is 0, below 1");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["block"] = {1, 1};
            }),
            "graphs[0].nodes[0].kernel.block: is an array, not an array [x, y, z]");
}

TEST(GraphRecordRefuses, MemsetElementSizesOtherThan124) {
  for (int size : {0, 3, 8}) {
    EXPECT_EQ(
        refused([&](json& d) { d["graphs"][0]["nodes"][1]["memset"]["element_size"] = size; }),
        fmt::format("graphs[0].nodes[1].memset.element_size: is {}, not 1, 2 or 4", size));
  }
  EXPECT_EQ(refused([](json& d) {
              auto& m = d["graphs"][0]["nodes"][1]["memset"];
              m["element_size"] = 2;
              m["value"] = 0x10000;
            }),
            "graphs[0].nodes[1].memset.value: 65536 does not fit an element of 2 bytes");
  EXPECT_EQ(refused([](json& d) {
              auto& m = d["graphs"][0]["nodes"][1]["memset"];
              m["element_size"] = 1;
              m["value"] = 0xff;
            }),
            "");
}

TEST(GraphRecordRefuses, MemcpyMemoryTypesOutsideCuMemorytype) {
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][2]["memcpy"]["src_memory_type"] = 0; }),
            "graphs[0].nodes[2].memcpy.src_memory_type: is 0, below 1");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][2]["memcpy"]["dst_memory_type"] = 5; }),
            "graphs[0].nodes[2].memcpy.dst_memory_type: is 5, above 4");
}

TEST(GraphRecordRefuses, NodeTypeAndPayloadThatDisagree) {
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][0].erase("kernel"); }),
            "graphs[0].nodes[0]: a node of type kernel has no field \"kernel\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][3]["memset"] = json::object(); }),
            "graphs[0].nodes[3]: a node of type empty carries no memset");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][0]["nodes"][1]["kernel"] = d["graphs"][0]["nodes"][0]["kernel"];
            }),
            "graphs[0].nodes[1]: a node of type memset carries no kernel");
  EXPECT_EQ(refused([](json& d) { d["graphs"][0]["nodes"][2]["type"] = "memset"; }),
            "graphs[0].nodes[2]: a node of type memset carries no memcpy");
  // In memory, a node whose payload disagrees is written as it is and refused when read.
  GraphRecord r = rich();
  r.graphs[0].nodes[7].memcpy = MemcpyNode{};
  EXPECT_EQ(graph_record_from_json(graph_record_to_json(r)).error(),
            "graphs[0].nodes[7]: a node of type other carries no memcpy");
}

TEST(GraphRecordRefuses, GraphsOutOfCaptureOrder) {
  EXPECT_EQ(refused([](json& d) { d["graphs"][2]["index"] = 3; }),
            "graphs[2].index: is 3, not after graphs[1].index 3 (capture order)");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1]["index"] = 0; }),
            "graphs[1].index: is 0, not after graphs[0].index 0 (capture order)");
}

TEST(GraphRecordRefuses, LabelsThatAreNotPrintableAsciiOrTooLong) {
  EXPECT_EQ(refused([](json& d) { d["graphs"][0].erase("label"); }),
            "graphs[0]: no field \"label\"");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1]["label"] = 8; }),
            "graphs[1].label: is 8, not a string");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1]["label"] = "bs\n8"; }),
            "graphs[1].label: byte 2 is 0x0a, not printable ASCII");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1]["label"] = "b\u00e9"; }),
            "graphs[1].label: byte 1 is 0xc3, not printable ASCII");
  EXPECT_EQ(
      refused([](json& d) { d["graphs"][1]["label"] = std::string(kMaxLabelBytes + 1, 'x'); }),
      "graphs[1].label: is 4097 bytes long, over the limit of 4096");
  EXPECT_EQ(refused([](json& d) { d["graphs"][1]["label"] = std::string(kMaxLabelBytes, '~'); }),
            "");
  // One label on several graphs is allowed (a restore takes the last).
  EXPECT_EQ(refused([](json& d) {
              d["graphs"][1]["label"] = "same";
              d["graphs"][2]["label"] = "same";
            }),
            "");
}

TEST(GraphRecordRefuses, CountsOverTheLimits) {
  EXPECT_EQ(refused([](json& d) {
              d["modules"] = json::array();
              for (std::size_t i = 0; i <= kMaxModules; ++i)
                d["modules"].push_back(
                    {{"digest", fmt::format("{:064x}", i)}, {"bytes", 1}, {"kind", "cubin"}});
            }),
            "modules: has 4097 entries, over the limit of 4096");
  EXPECT_EQ(refused([](json& d) {
              d["graphs"] = json::array();
              for (std::size_t i = 0; i <= kMaxGraphs; ++i)
                d["graphs"].push_back({{"index", i},
                                       {"allocation_index", 0},
                                       {"nodes", json::array()},
                                       {"edges", json::array()}});
            }),
            "graphs: has 1025 entries, over the limit of 1024");
  EXPECT_EQ(refused([](json& d) {
              json& nodes = d["graphs"][2]["nodes"];
              for (std::size_t i = 0; i <= kMaxNodesPerGraph; ++i)
                nodes.push_back({{"type", "empty"}});
            }),
            "graphs[2].nodes: has 65537 entries, over the limit of 65536");
  EXPECT_EQ(refused([](json& d) {
              json& edges = d["graphs"][0]["edges"];
              for (std::size_t i = 0; i <= kMaxEdgesPerGraph; ++i) edges.push_back({0, 1});
            }),
            "graphs[0].edges: has 262154 entries, over the limit of 262144");
  EXPECT_EQ(refused([](json& d) {
              json& params = kernel0(d)["params"];
              params = json::array();
              for (std::size_t i = 0; i <= kMaxParamsPerKernel; ++i) params.push_back({i, 1});
              kernel0(d)["param_bytes"] = std::string(2 * (kMaxParamsPerKernel + 1), '0');
            }),
            "graphs[0].nodes[0].kernel.params: has 4097 entries, over the limit of 4096");
  EXPECT_EQ(refused([](json& d) {
              kernel0(d)["param_bytes"] = std::string(2 * (kMaxParamBytes + 1), '0');
            }),
            "graphs[0].nodes[0].kernel.param_bytes: holds 32765 bytes, over the limit of 32764");
  // At the limits, a record is accepted.
  EXPECT_EQ(refused([](json& d) {
              json& nodes = d["graphs"][2]["nodes"];
              for (std::size_t i = 0; i < kMaxNodesPerGraph; ++i)
                nodes.push_back({{"type", "host"}});
              kernel0(d)["param_bytes"] = std::string(2 * kMaxParamBytes, 'f');
            }),
            "");
}

TEST(GraphRecordRefuses, WithPrintableOneLineMessages) {
  GraphRecord out;
  const std::string e = parse_graph_record(std::string("{\"a\xff\x01\":1}"), out);
  ASSERT_FALSE(e.empty());
  for (char c : e) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << e;
  const std::string long_key = refused([](json& d) { d[std::string(5000, 'z')] = 1; });
  EXPECT_EQ(long_key, "record: unknown field \"" + std::string(64, 'z') + "\"...");
}

}  // namespace
