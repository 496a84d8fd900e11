// The reference engine's start-up as the driver sees it (issue 4 acceptance): the emulator's
// call trace (THAW_EMU_TRACE) of a run on a sharded synthetic gpt2-small (a smaller sharded
// model under the sanitizers) shows the vLLM +
// PyTorch sequence that thaw's shim will meet on real engines:
//  - the driver reached through cuGetProcAddress_v2 at CUDA 12.8 with per-thread default
//    streams, every entry point resolved before its first use;
//  - one cuMemcpyHtoDAsync per tensor whose source lies in a PRIVATE mapping of the
//    safetensors file, inside the tensor's bytes of that file;
//  - cuMemGetInfo (KV sizing) after the weights and before the graphs;
//  - graphs captured in global mode, largest batch first, each instantiated and its source
//    graph destroyed right away.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine_process.hpp"

namespace {

using namespace refengine_test;

std::vector<nlohmann::json> read_trace(const fs::path& p) {
  return json_lines(read_file(p));
}

std::uint64_t safetensors_data_start(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  return 8 + n;
}

class EngineTrace : public ::testing::Test {
 protected:
  std::vector<nlohmann::json> trace_of(const std::string& binary,
                                       std::vector<std::string> extra = {}) {
    const fs::path trace =
        fs::temp_directory_path() / ("refengine_trace_" + std::to_string(::getpid()) + ".jsonl");
    fs::remove(trace);
    std::vector<std::string> a = {"generate",
                                  "--model",
                                  model_.string(),
                                  "--tokens",
                                  "1,2,3",
                                  "--max-tokens",
                                  "2",
                                  "--ignore-eos",
                                  "--max-num-seqs",
                                  "4",
                                  "--max-model-len",
                                  "16",
                                  "--max-num-batched-tokens",
                                  "4"};
    a.insert(a.end(), extra.begin(), extra.end());
    const EngineRun r = run_engine(a, "THAW_EMU_TRACE=" + trace.string(), binary);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto t = read_trace(trace);
    fs::remove(trace);
    return t;
  }
  // The first model of the determinism list: gpt2-small-f32 (3 shards), or the sanitizer
  // build's small stand-in.
  fs::path model_ = fs::path(REFENGINE_TEST_MODELS) /
                    std::string(REFENGINE_DETERMINISM_MODELS)
                        .substr(0, std::string(REFENGINE_DETERMINISM_MODELS).find(','));

  // What the model's shards hold: tensor count (GPT-2: wte, wpe, 12 per layer, ln_f x 2) and
  // the bytes of their data sections.
  int expected_tensors() const {
    const auto cfg = nlohmann::json::parse(read_file(model_ / "config.json"));
    return 4 + 12 * cfg["n_layer"].get<int>();
  }
  std::map<std::string, std::uint64_t> shard_data_bytes() const {
    std::map<std::string, std::uint64_t> out;
    for (const auto& e : fs::directory_iterator(model_))
      if (e.path().extension() == ".safetensors")
        out[fs::canonical(e.path()).string()] =
            fs::file_size(e.path()) - safetensors_data_start(e.path());
    return out;
  }
};

std::size_t first_index(const std::vector<nlohmann::json>& t, const std::string& call) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i]["call"] == call) return i;
  return t.size();
}
std::size_t last_index(const std::vector<nlohmann::json>& t, const std::string& call) {
  std::size_t at = t.size();
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i]["call"] == call) at = i;
  return at;
}

TEST_F(EngineTrace, DriverEntryPointsComeFromCuGetProcAddressV2WithPerThreadStreams) {
  const auto t = trace_of(REFENGINE_BIN);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.front()["call"], "cuGetProcAddress") << t.front().dump();
  std::set<std::string> resolved;
  for (const auto& e : t) {
    const std::string call = e["call"];
    if (call == "cuGetProcAddress") {
      EXPECT_EQ(e["args"]["version"], 12080) << e.dump();
      EXPECT_EQ(e["args"]["flags"], 2)
          << "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: " << e.dump();
      resolved.insert(e["args"]["symbol"].get<std::string>());
      continue;
    }
    EXPECT_TRUE(resolved.contains(call)) << call << " was called before cuGetProcAddress gave it";
    if (call == "cuMemcpyHtoDAsync" || call == "cuMemcpyDtoHAsync") {
      EXPECT_EQ(e["args"].value("ptds", false), true) << "the _ptsz variant: " << e.dump();
    }
  }
}

TEST_F(EngineTrace, WeightsAreCopiedPerTensorFromPrivateMappingsOfTheCheckpointFiles) {
  const auto t = trace_of(REFENGINE_BIN);
  std::map<std::string, std::uint64_t> bytes_per_file;
  int copies = 0;
  for (const auto& e : t) {
    if (e["call"] != "cuMemcpyHtoDAsync" || !e["args"].contains("src_map")) continue;
    const std::string file = e["args"]["src_map"];
    if (!file.ends_with(".safetensors")) continue;
    ++copies;
    EXPECT_EQ(e["args"]["src_map_shared"], false) << "MAP_PRIVATE expected: " << e.dump();
    EXPECT_EQ(e["result"], "CUDA_SUCCESS");
    const std::uint64_t off = e["args"]["src_map_offset"], n = e["args"]["bytes"];
    EXPECT_GE(off, safetensors_data_start(file)) << "a copy out of the header: " << e.dump();
    EXPECT_LE(off + n, fs::file_size(file)) << e.dump();
    bytes_per_file[file] += n;
  }
  // Every tensor copied once: per shard, the copies add up to its whole data section.
  EXPECT_EQ(copies, expected_tensors());
  EXPECT_GE(bytes_per_file.size(), 2u) << "a sharded model";
  EXPECT_EQ(bytes_per_file, shard_data_bytes());
}

TEST_F(EngineTrace, KvSizingFollowsTheWeightsAndGraphsAreCapturedGloballyLargestFirst) {
  const auto t = trace_of(REFENGINE_BIN);
  std::size_t last_weight = 0;
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i]["call"] == "cuMemcpyHtoDAsync" && t[i]["args"].contains("src_map") &&
        t[i]["args"]["src_map"].get<std::string>().ends_with(".safetensors"))
      last_weight = i;
  const std::size_t mem_info = first_index(t, "cuMemGetInfo");
  const std::size_t first_capture = first_index(t, "cuStreamBeginCapture");
  ASSERT_LT(mem_info, t.size());
  ASSERT_LT(first_capture, t.size());
  EXPECT_LT(last_weight, mem_info);
  EXPECT_LT(mem_info, first_capture);

  // Each capture: Begin (global mode) ... End -> graph G; the next graph calls instantiate G
  // and destroy G. The embedding launch inside says the batch size.
  std::vector<int> sizes;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i]["call"] != "cuStreamBeginCapture") continue;
    EXPECT_EQ(t[i]["args"]["mode"], 0) << "CU_STREAM_CAPTURE_MODE_GLOBAL";
    std::size_t j = i + 1;
    int batch = -1;
    for (; j < t.size() && t[j]["call"] != "cuStreamEndCapture"; ++j)
      if (t[j]["call"] == "cuLaunchKernel" &&
          t[j]["args"]["kernel"].get<std::string>().starts_with("embedding_"))
        batch = t[j]["args"]["grid_y"];
    ASSERT_LT(j, t.size());
    sizes.push_back(batch);
    const std::string graph = t[j]["out"]["graph"];
    std::vector<std::string> next;
    for (std::size_t k = j + 1; k < t.size() && next.size() < 2; ++k) {
      const std::string c = t[k]["call"];
      if (c.starts_with("cuGraph")) next.push_back(c + " " + t[k]["args"].value("graph", ""));
    }
    EXPECT_EQ(next, (std::vector<std::string>{"cuGraphInstantiateWithFlags " + graph,
                                              "cuGraphDestroy " + graph}));
  }
  EXPECT_EQ(sizes, (std::vector<int>{4, 2, 1}));
  EXPECT_GT(first_index(t, "cuGraphLaunch"), last_index(t, "cuStreamEndCapture"));
}

TEST_F(EngineTrace, TheLinkedBuildCallsTheDriverDirectly) {
  const auto t = trace_of(REFENGINE_LINKED_BIN, {"--enforce-eager"});
  ASSERT_FALSE(t.empty());
  int lookups = 0, copies = 0;
  for (const auto& e : t) {
    if (e["call"] == "cuGetProcAddress") ++lookups;
    if (e["call"] == "cuMemcpyHtoDAsync" && e["args"].contains("src_map") &&
        e["args"]["src_map"].get<std::string>().ends_with(".safetensors")) {
      ++copies;
      EXPECT_EQ(e["args"].value("ptds", false), true) << e.dump();
    }
  }
  EXPECT_EQ(lookups, 0) << "entry points resolved by the dynamic linker, not cuGetProcAddress";
  EXPECT_EQ(copies, expected_tensors());
  EXPECT_EQ(first_index(t, "cuStreamBeginCapture"), t.size()) << "--enforce-eager";
}

}  // namespace
