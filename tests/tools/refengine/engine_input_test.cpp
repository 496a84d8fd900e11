// The reference engine facing bad input and serving HTTP (issue 4): malformed or truncated
// checkpoints, missing tensors, shapes that contradict config.json, more memory than the
// device has, bad prompts - each a one-line error naming the culprit and exit status 1, never a
// crash or garbage; and `serve` answering concurrent /v1/completions with the tokens
// `generate` produces.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include "engine_process.hpp"

namespace {

using namespace refengine_test;

const fs::path kTiny = REFENGINE_TINY_GPT2_DIR;

// A writable copy of the real tiny GPT-2.
fs::path copy_tiny(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("refengine_bad_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kTiny)) {
    fs::copy_file(e.path(), dir / e.path().filename());
    fs::permissions(dir / e.path().filename(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}

void edit_config(const fs::path& dir, const std::string& key, const nlohmann::json& value) {
  auto cfg = nlohmann::json::parse(read_file(dir / "config.json"));
  cfg[key] = value;
  std::ofstream(dir / "config.json") << cfg.dump(2);
}

// Runs generate with the timeline in a file, so stderr holds only the error.
EngineRun generate(const fs::path& model, std::vector<std::string> extra = {},
                   const std::string& env = {}) {
  const fs::path timeline =
      fs::temp_directory_path() / ("refengine_tl_" + std::to_string(::getpid()) + ".jsonl");
  std::vector<std::string> a = {
      "generate",       "--model", model.string(), "--max-tokens",   "2", "--max-model-len", "32",
      "--max-num-seqs", "2",       "--timeline",   timeline.string()};
  a.insert(a.end(), extra.begin(), extra.end());
  EngineRun r = run_engine(a, env);
  fs::remove(timeline);
  return r;
}

// Exit status 1, nothing on stdout, and exactly one line on stderr holding every `needle`.
void expect_one_line_error(const EngineRun& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 1) << "stderr: " << r.err;
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line expected: " << r.err;
  EXPECT_TRUE(r.err.starts_with("refengine: ")) << r.err;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << n << " in " << r.err;
}

TEST(EngineBadInput, TruncatedCheckpointNamesTheFile) {
  const fs::path dir = copy_tiny("truncated");
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 10);
  expect_one_line_error(generate(dir, {"--tokens", "1,2"}), {"model.safetensors"});
  fs::remove_all(dir);
}

TEST(EngineBadInput, GarbageHeaderNamesTheFile) {
  const fs::path dir = copy_tiny("garbage");
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("{\"x\":", 5);  // the JSON header no longer parses
  }
  expect_one_line_error(generate(dir, {"--tokens", "1,2"}), {"model.safetensors"});
  fs::remove_all(dir);
}

TEST(EngineBadInput, MissingTensorIsNamed) {
  const fs::path dir = copy_tiny("missing");
  edit_config(dir, "n_layer", 2);  // the file holds layer 0 only
  expect_one_line_error(generate(dir, {"--tokens", "1,2"}), {"missing tensor", "h.1."});
  fs::remove_all(dir);
}

TEST(EngineBadInput, ShapeContradictingConfigIsNamed) {
  const fs::path dir = copy_tiny("shape");
  edit_config(dir, "vocab_size", 22);
  expect_one_line_error(generate(dir, {"--tokens", "1,2"}), {"wte.weight", "config.json"});
  fs::remove_all(dir);
}

TEST(EngineBadInput, ModelLargerThanTheDeviceIsAnOutOfMemoryError) {
  const fs::path small = fs::path(REFENGINE_TEST_MODELS) / "gpt2-small-f32";
  const auto r = generate(small, {"--tokens", "1,2"}, "THAW_EMU_DEVICE_MEMORY=256M");
  expect_one_line_error(r, {"memory"});
}

TEST(EngineBadInput, TooLittleMemoryForTheKvCacheSaysWhatToChange) {
  const fs::path small = fs::path(REFENGINE_TEST_MODELS) / "gpt2-small-f32";
  const auto r = generate(small, {"--tokens", "1,2", "--gpu-memory-utilization", "0.05"},
                          "THAW_EMU_DEVICE_MEMORY=6G");
  expect_one_line_error(r, {"KV cache", "--gpu-memory-utilization"});
}

TEST(EngineBadInput, TokenOutsideTheVocabularyFailsThatPrompt) {
  const auto r = generate(kTiny, {"--tokens", "1,2,21"});
  expect_one_line_error(r, {"token id 21", "vocabulary"});
}

TEST(EngineBadInput, TextPromptWithoutTokenizerSaysToPassTokenIds) {
  const fs::path small = fs::path(REFENGINE_TEST_MODELS) / "gpt2-small-f32";
  expect_one_line_error(generate(small, {"--prompt", "hello"}), {"tokenizer", "--tokens"});
}

TEST(EngineTokenizer, EncodesWithTheModelsVocabularyAndMerges) {
  // merges.txt of the tiny model holds only "Ġ l", "Ġl o", "Ġlo w" and "e r", so BPE reaches
  // "Ġlow" (14) and "er" (15) but never the whole-word entries "Ġlowest" (16) or "Ġnewer"
  // (17) that vocab.json also lists; other pieces stay single characters (Ġ 10, n 9, e 3,
  // w 2, s 5, t 6, i 7, d 8).
  const auto r = generate(kTiny, {"--prompt", " lowest newer wider", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["prompt_tokens"],
            (std::vector<int>{14, 3, 5, 6, 10, 9, 3, 2, 15, 10, 2, 7, 8, 15}));
}

TEST(EngineServe, ConcurrentCompletionsMatchGenerate) {
  // What generate says for three prompts.
  const std::vector<std::vector<int>> prompts = {{1, 2, 3}, {5, 6}, {7, 8, 9, 10}};
  std::vector<std::string> gen_args;
  for (const auto& p : prompts) {
    std::string ids;
    for (int t : p) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    gen_args.push_back("--tokens");
    gen_args.push_back(ids);
  }
  gen_args.insert(gen_args.end(), {"--json", "--ignore-eos", "--max-tokens", "5"});
  const auto g = generate(kTiny, gen_args);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto expected = json_lines(g.out);
  ASSERT_EQ(expected.size(), prompts.size());

  const int port = free_port();
  const fs::path log =
      fs::temp_directory_path() / ("refengine_serve_" + std::to_string(::getpid()) + ".log");
  const std::string cmd =
      engine_command({"serve", "--model", kTiny.string(), "--port", std::to_string(port),
                      "--max-model-len", "32", "--max-num-seqs", "4"}) +
      " >" + quote(log.string()) + " 2>&1 & echo $!";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  int pid = 0;
  ASSERT_EQ(std::fscanf(p, "%d", &pid), 1);
  ::pclose(p);

  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  bool up = false;
  for (int i = 0; i < 600 && !up; ++i) {  // up to 60 s
    auto res = client.Get("/health");
    up = res && res->status == 200;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up) << read_file(log);

  std::vector<std::future<nlohmann::json>> answers;
  for (const auto& prompt : prompts)
    answers.push_back(std::async(std::launch::async, [&, prompt] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(60, 0);
      nlohmann::json body{{"prompt", prompt}, {"max_tokens", 5}, {"ignore_eos", true}};
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res) return nlohmann::json{{"transport_error", true}};
      return nlohmann::json::parse(res->body);
    }));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto a = answers[i].get();
    ASSERT_TRUE(a.contains("choices")) << a.dump();
    EXPECT_EQ(a["object"], "text_completion");
    EXPECT_EQ(a["choices"][0]["token_ids"], expected[i]["tokens"]) << a.dump();
    EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(a["usage"]["completion_tokens"], 5);
  }
  // A text prompt goes through the tokenizer; a sampling temperature is refused.
  auto text = client.Post("/v1/completions", R"({"prompt": " lowest", "max_tokens": 2})",
                          "application/json");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200) << text->body;
  auto hot =
      client.Post("/v1/completions", R"({"prompt": [1], "temperature": 0.7})", "application/json");
  ASSERT_TRUE(hot);
  EXPECT_EQ(hot->status, 400);
  EXPECT_NE(hot->body.find("temperature"), std::string::npos);

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  for (int i = 0; i < 200; ++i) {  // the engine is not our child: poll until it is gone
    if (::kill(pid, 0) != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  (void)status;
  EXPECT_NE(::kill(pid, 0), 0) << "serve did not exit on SIGTERM";
  fs::remove(log);
}

}  // namespace
