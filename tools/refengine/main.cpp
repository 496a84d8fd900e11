// refengine: the reference engine. A GPT-2 inference program written only against the CUDA
// driver API that starts up and calls the driver the way vLLM + PyTorch do (see
// ../../shared/CUDA-NOTES.md): it is the unmodified "third-party engine" that thaw's shim,
// prewarm slots and graph restore are tested with. It knows nothing about thaw, except with
// --thaw-restore: then it asks thaw's restore ABI, when the shim provides one, for the KV-cache
// size an earlier run's profiling pass decided and for the decode graphs an earlier run captured
// (thaw_restore_client.hpp), as an engine that opts in would.
//
//   refengine generate --model DIR --tokens 1,2,3 [--prompt TEXT] [--max-tokens N] [--json]
//   refengine serve    --model DIR [--port 8000]
//   (either, one stage of a pipeline) --pp-rank K --pp-size N --pp-peers h:p,h:p,...
//   (either) --engine-core-process: the engine runs in a forked child, as vLLM V1's EngineCore
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "allocator.hpp"
#include "engine.hpp"
#include "engine_core_process.hpp"
#include "graph_dump.hpp"
#include "kv_transfer_server.hpp"
#include "scheduler.hpp"
#include "server.hpp"
#include "timeline.hpp"
#include "tokenizer.hpp"

using namespace refengine;

namespace {

std::vector<std::int32_t> parse_ids(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    std::size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX)
      throw std::runtime_error(fmt::format("'{}' is not a token id list like 1,2,3", text));
    ids.push_back(std::int32_t(v));
  }
  return ids;
}

// PyTorch's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as vLLM users set it.
bool alloc_conf_expandable() {
  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  return conf != nullptr && std::string(conf).find("expandable_segments:True") != std::string::npos;
}

// The KV cache of a large device can be thousands of 20 MiB pages, each an fd in expandable
// mode on the emulator; like many servers, use the hard limit of open files.
void raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "refengine: a GPT-2 inference engine on the CUDA driver API that starts up like vLLM "
      "(weights from a private file mapping, profile run and KV-cache sizing, one CUDA graph per "
      "decode batch size). Phase timeline as JSON lines on stderr or --timeline."};
  app.require_subcommand(1);
  EngineOptions eo;
  std::string timeline_path, module_api = "library", peers, dump_graphs_path;
  bool all_positions = false, engine_core_process = false;

  auto add_engine_options = [&](CLI::App* c) {
    c->add_option("--model", eo.model, "model directory (config.json + safetensors, HF layout)")
        ->required()
        ->check(CLI::ExistingDirectory);
    c->add_option("--device", eo.device, "CUDA device ordinal")->capture_default_str();
    c->add_option("--gpu-memory-utilization", eo.gpu_memory_utilization,
                  "fraction of device memory for weights, buffers and KV cache")
        ->check(CLI::Range(0.01, 1.0))
        ->capture_default_str();
    c->add_option("--num-gpu-blocks-override", eo.num_gpu_blocks_override,
                  "use this many KV-cache blocks instead of sizing from free memory");
    c->add_option("--max-num-seqs", eo.limits.max_num_seqs,
                  "largest decode batch (and largest CUDA graph)")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    c->add_option("--max-model-len", eo.limits.max_model_len,
                  "longest sequence, prompt + output (default: min(n_positions, 1024))")
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--max-num-batched-tokens", eo.limits.max_num_batched_tokens,
                  "most prompt tokens per prefill step (default: --max-model-len)")
        ->check(CLI::Range(1, 1 << 20));
    c->add_flag("--enforce-eager", eo.enforce_eager, "no CUDA graphs: every step runs eagerly");
    c->add_option("--cuda-graph-sizes", eo.graph_sizes,
                  "decode batch sizes to capture (default 1 2 4 8 16 24 ... up to --max-num-seqs)")
        ->delimiter(',');
    c->add_option("--num-warmups", eo.num_warmups, "eager runs before capturing each graph")
        ->check(CLI::Range(0, 100))
        ->capture_default_str();
    c->add_flag("--expandable-segments", eo.expandable_segments,
                "allocator grows one VA reservation with cuMemCreate/cuMemMap pages (also "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)");
    c->add_option("--module-api", module_api, "how kernels are loaded: library | module")
        ->check(CLI::IsMember({"library", "module"}))
        ->capture_default_str();
    c->add_flag("--thaw-restore", eo.thaw_restore,
                "size the KV cache from thaw's record of an earlier run instead of profiling, and "
                "take each decode CUDA graph thaw restores instead of warming up and capturing it "
                "(thaw's restore ABI, under LD_PRELOAD=libthaw-preload.so); profiles and captures "
                "as usual, and records the results for the next run, where there is no valid "
                "record");
    c->add_option("--timeline", timeline_path, "write the phase timeline here instead of stderr");
    c->add_option("--dump-graphs", dump_graphs_path,
                  "once the decode CUDA graphs are ready (captured or restored), write here a JSON "
                  "object mapping each batch size to the canonical description of the executable "
                  "graph it launches: nodes, kernel identities, parameter bytes, edges (needs "
                  "thaw's CUDA driver emulator, which can list an executable graph's nodes)");
    c->add_option("--pp-rank", eo.pipeline.rank, "this process's pipeline stage")
        ->capture_default_str();
    c->add_option("--pp-size", eo.pipeline.size, "number of pipeline stages")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    c->add_option("--pp-peers", peers,
                  "host:port of every stage, in rank order, comma-separated (each listens on its "
                  "own)");
    c->add_option("--pp-connect-timeout", eo.pipeline.connect_timeout_s,
                  "seconds to wait for the other stages")
        ->capture_default_str();
    c->add_flag("--engine-core-process", engine_core_process,
                "run the engine in a child process, as vLLM V1 runs its EngineCore: this process "
                "reads the options and prompts, forks before any CUDA call and waits; the child "
                "initialises the driver, loads the model, runs and writes every result, and this "
                "process exits with its status (128 + N if signal N killed it)");
  };

  auto* gen = app.add_subcommand("generate", "generate completions for prompts and exit");
  add_engine_options(gen);
  std::vector<std::string> token_lists, prompts;
  std::string prompts_file, logits_out;
  int max_tokens = 16;
  bool ignore_eos = false, json_out = false;
  gen->add_option("--tokens", token_lists, "a prompt as token ids 1,2,3 (repeatable)");
  gen->add_option("--prompt", prompts, "a prompt as text (repeatable; needs a tokenizer)");
  gen->add_option("--prompts-file", prompts_file,
                  "one prompt per line: text, or 'ids:' followed by token ids")
      ->check(CLI::ExistingFile);
  gen->add_option("--max-tokens", max_tokens, "tokens to generate per prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
  gen->add_flag("--ignore-eos", ignore_eos, "do not stop at the end-of-text token");
  gen->add_flag("--json", json_out, "one JSON object per prompt on stdout");
  gen->add_option("--logits-out", logits_out,
                  "write the logits of every generated token (and with --all-positions every "
                  "prompt position) as JSON");
  gen->add_flag("--all-positions", all_positions, "with --logits-out: also score the prompt");

  auto* srv = app.add_subcommand("serve", "serve /v1/completions over HTTP");
  add_engine_options(srv);
  ServeOptions so;
  srv->add_option("--host", so.host, "address to listen on")->capture_default_str();
  srv->add_option("--port", so.port, "port to listen on")->capture_default_str();
  srv->add_option("--step-delay-ms", so.step_delay_ms,
                  "sleep this long after every step (tests of KV migration mid-generation)")
      ->check(CLI::Range(0, 10000));

  CLI11_PARSE(app, argc, argv);

  try {
    raise_fd_limit();
    Timeline timeline(timeline_path);
    if (alloc_conf_expandable()) eo.expandable_segments = true;
    eo.module_api =
        module_api == "module" ? KernelModule::Api::kModule : KernelModule::Api::kLibrary;
    if (eo.pipeline.size > 1) {
      std::stringstream ss(peers);
      std::string p;
      while (std::getline(ss, p, ',')) eo.pipeline.peers.push_back(p);
      if (eo.pipeline.rank < 0 || eo.pipeline.rank >= eo.pipeline.size)
        throw std::runtime_error(
            fmt::format("--pp-rank {} is not in 0..{}", eo.pipeline.rank, eo.pipeline.size - 1));
    }
    // Defaults that depend on the model.
    auto cfg = Checkpoint::open(eo.model);
    if (!cfg) throw std::runtime_error(cfg.error());
    const bool len_given = (gen->parsed() ? gen : srv)->count("--max-model-len") > 0;
    const bool tokens_given = (gen->parsed() ? gen : srv)->count("--max-num-batched-tokens") > 0;
    if (!len_given)
      eo.limits.max_model_len = int(std::min<std::int64_t>(cfg->config().n_positions, 1024));
    if (!tokens_given) eo.limits.max_num_batched_tokens = eo.limits.max_model_len;
    eo.limits.all_positions_logits = all_positions;

    std::optional<Tokenizer> tokenizer;
    if (auto t = Tokenizer::open(eo.model)) tokenizer.emplace(std::move(*t));

    std::vector<std::vector<std::int32_t>> inputs;
    if (gen->parsed() && eo.pipeline.rank == 0) {
      for (const auto& t : token_lists) inputs.push_back(parse_ids(t));
      auto encode = [&](const std::string& text) {
        if (!tokenizer)
          throw std::runtime_error(fmt::format(
              "--prompt needs a tokenizer, and {} has no vocab.json + merges.txt: pass --tokens",
              eo.model.string()));
        return tokenizer->encode(text);
      };
      for (const auto& p : prompts) inputs.push_back(encode(p));
      if (!prompts_file.empty()) {
        std::ifstream in(prompts_file);
        std::string line;
        while (std::getline(in, line)) {
          if (line.empty()) continue;
          inputs.push_back(line.starts_with("ids:") ? parse_ids(line.substr(4)) : encode(line));
        }
      }
      if (inputs.empty())
        throw std::runtime_error("no prompts: give --tokens, --prompt or --prompts-file");
    }

    if (engine_core_process) {
      if (std::optional<int> status = fork_engine_core_process()) return *status;
      timeline.mark("engine_core_process", {{"pid", ::getpid()}, {"parent_pid", ::getppid()}});
    }
    Engine engine(eo, timeline);
    if (!dump_graphs_path.empty()) {
      if (auto dumped = dump_graphs(engine.driver(), engine.graph_execs(), dump_graphs_path);
          !dumped)
        throw std::runtime_error(dumped.error());
    }
    if (eo.pipeline.rank > 0) {
      if (srv->parsed()) return serve_stage(engine, so);  // /health and /kv (KV transfer)
      engine.run_worker();
      return 0;
    }
    Scheduler scheduler(engine);
    if (srv->parsed()) {
      so.model_name = eo.model.filename().string();
      if (so.model_name.empty()) so.model_name = eo.model.parent_path().filename().string();
      return serve(engine, scheduler, tokenizer, so);
    }

    std::vector<std::future<Completion>> futures;
    for (const auto& ids : inputs)
      futures.push_back(scheduler.submit(
          Request{ids, max_tokens, ignore_eos, !logits_out.empty(), all_positions}));
    scheduler.run_until_idle();
    engine.shutdown_pipeline();
    nlohmann::json logits_json = nlohmann::json::array();
    int status = 0;
    for (std::size_t i = 0; i < futures.size(); ++i) {
      Completion c = futures[i].get();
      if (c.finish_reason == "error") {
        fmt::print(stderr, "refengine: prompt {}: {}\n", i, c.error);
        status = 1;
        continue;
      }
      if (json_out) {
        nlohmann::json line{{"index", i},
                            {"prompt_tokens", inputs[i]},
                            {"tokens", c.tokens},
                            {"finish_reason", c.finish_reason},
                            {"time_to_first_token_ms", c.time_to_first_token_ms}};
        if (tokenizer) line["text"] = tokenizer->decode(c.tokens);
        std::cout << line.dump() << "\n";
      } else if (tokenizer) {
        std::cout << tokenizer->decode(inputs[i]) << tokenizer->decode(c.tokens) << "\n";
      } else {
        std::cout << fmt::format("{}\n", fmt::join(c.tokens, ","));
      }
      if (!logits_out.empty()) logits_json.push_back({{"index", i}, {"logits", c.logits}});
    }
    if (!logits_out.empty()) {
      std::ofstream out(logits_out);
      out << logits_json.dump() << "\n";
      if (!out) throw std::runtime_error(fmt::format("--logits-out {}: write failed", logits_out));
    }
    return status;
  } catch (const std::exception& e) {
    fmt::print(stderr, "refengine: error: {}\n", e.what());
    return 1;
  }
}
