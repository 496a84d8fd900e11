// thawctl: the operator's CLI for thawd, over D-Bus like machinectl (org.thaw.Node1).
//
//   thawctl [--bus system|user|ADDRESS] [--json] COMMAND
//     status | gpus | slots | models
//     fetch MODEL [--no-wait]          progress on stderr until cached
//     prewarm MODEL [--gpu N] [--layers K] [--no-wait]
//     activate SLOT [--kv-bytes SIZE] | deactivate SLOT | evict SLOT
//     wait MODEL [--timeout SECONDS]
//     artifacts [MODEL]                engines' recorded artifacts (layout, kvcache, graphs)
//     net                              traffic shaping: on/off and why, class rates, counters
//     cluster deploy|cold-start|load|state   (thaw-coordinator's frontend endpoint, not D-Bus)
//
// Exit codes: 0 done; 1 thawd unreachable or it refused (the message says why); 2 bad
// usage; 3 the fetch or prewarm failed; 4 timed out.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "cluster_commands.hpp"
#include "commands.hpp"
#include "common/text/byte_size.hpp"

int main(int argc, char** argv) {
  using namespace thawctl;
  CLI::App app{"thawctl: look at and steer thawd, the thaw node daemon (over D-Bus)"};
  const char* env_bus = std::getenv("THAW_BUS");
  std::string bus = env_bus != nullptr ? env_bus : "system";
  Options o;
  app.add_option("--bus", bus, "system, user, or a D-Bus address (default: $THAW_BUS or system)");
  app.add_flag("--json", o.json, "print JSON for scripts (progress lines are not printed)");
  app.require_subcommand(1);
  std::string model, slot, kv;
  bool no_wait = false;
  int gpu = -1;
  auto* status_cmd = app.add_subcommand("status", "node id, version, state, cache use, GPUs");
  auto* gpus_cmd = app.add_subcommand("gpus", "each GPU's pool: size, free, prewarm slots");
  auto* slots_cmd = app.add_subcommand("slots", "prewarm slots: model, GPU, state, bytes resident");
  auto* models_cmd = app.add_subcommand("models", "cached and fetching models");
  auto* artifacts_cmd = app.add_subcommand(
      "artifacts",
      "engines' recorded artifacts (layout, KV-cache sizing, CUDA graphs) and what each holds");
  artifacts_cmd->add_option("model", model, "only this model's (cache key or registry name)");
  auto* net_cmd = app.add_subcommand(
      "net",
      "traffic shaping on the uplink: on or off (and why), each class's rate and ceiling, "
      "whether the coordinator set them, bytes and drops per class and direction");
  auto* fetch_cmd = app.add_subcommand("fetch", "fetch a model into the node's cache");
  fetch_cmd->add_option("model", model, "registry name (\"gpt2\", \"org/name\") or cache key")
      ->required();
  fetch_cmd->add_flag("--no-wait", no_wait, "return once the fetch started");
  auto* prewarm_cmd = app.add_subcommand("prewarm", "load a model's weights into a prewarm slot");
  prewarm_cmd->add_option("model", model, "registry name or cache key (fetched if needed)")
      ->required();
  prewarm_cmd->add_option("--gpu", gpu, "GPU index (default: the one with most free memory)");
  prewarm_cmd
      ->add_option("--layers", o.layers,
                   "only the embeddings and the first K layers (partial prewarm: an engine "
                   "attached to it streams the rest)")
      ->check(CLI::NonNegativeNumber);
  prewarm_cmd->add_flag("--no-wait", no_wait, "return once the slot exists");
  auto* activate_cmd = app.add_subcommand("activate", "make a prewarmed slot its GPU's active one");
  activate_cmd->add_option("slot", slot, "slot id (thawctl slots), e.g. g0s1")->required();
  activate_cmd->add_option("--kv-bytes", kv, "KV cache to map, e.g. 8GiB (default: what is free)");
  auto* deactivate_cmd = app.add_subcommand("deactivate", "stop serving from a slot (KV unmapped)");
  deactivate_cmd->add_option("slot", slot, "slot id")->required();
  auto* evict_cmd = app.add_subcommand("evict", "free a prewarmed slot's GPU memory");
  evict_cmd->add_option("slot", slot, "slot id")->required();
  auto* wait_cmd = app.add_subcommand("wait", "wait until a model is cached (or its fetch fails)");
  wait_cmd->add_option("model", model, "registry name or cache key")->required();
  wait_cmd->add_option("--timeout", o.timeout_s, "give up after this many seconds (exit 4)");
  // cluster: thaw-coordinator's frontend endpoint (ZeroMQ), not thawd.
  ClusterOptions cluster;
  const char* env_coordinator = std::getenv("THAW_COORDINATOR");
  cluster.endpoint =
      env_coordinator != nullptr ? env_coordinator : "ipc:///run/thaw-coordinator/frontend.sock";
  thaw::cluster::v1::ModelSpec spec;
  std::string size_text;
  double rps = 0;
  auto* cluster_cmd =
      app.add_subcommand("cluster", "the cluster's coordinator: deploy, cold-start, load, state");
  cluster_cmd->require_subcommand(1);
  cluster_cmd->add_option("--coordinator", cluster.endpoint,
                          "its frontend endpoint (default: $THAW_COORDINATOR or "
                          "ipc:///run/thaw-coordinator/frontend.sock)");
  cluster_cmd->add_option("--timeout", cluster.timeout_s, "seconds to wait for a reply")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* deploy_cmd = cluster_cmd->add_subcommand("deploy", "describe a model to the coordinator");
  deploy_cmd->add_option("model", model, "registry name, as nodes fetch it")->required();
  deploy_cmd->add_option("--size", size_text, "weight bytes, e.g. 13GiB")->required();
  deploy_cmd->add_option("--layers", o.layers, "transformer layers")->check(CLI::NonNegativeNumber);
  double ttft = 0, tpot = 0, prefill = 0, decode = 0;
  deploy_cmd->add_option("--ttft", ttft, "TTFT SLO in seconds (0: none)")
      ->check(CLI::NonNegativeNumber);
  deploy_cmd->add_option("--tpot", tpot, "TPOT SLO in seconds (0: none)")
      ->check(CLI::NonNegativeNumber);
  deploy_cmd->add_option("--prefill", prefill, "prefill time on one GPU, seconds (t_p)")
      ->check(CLI::NonNegativeNumber);
  deploy_cmd->add_option("--decode", decode, "time per output token on one GPU, seconds (t_d)")
      ->check(CLI::NonNegativeNumber);
  auto* cold_cmd = cluster_cmd->add_subcommand(
      "cold-start", "plan a cold start (pipeline stages on nodes) and send its tasks");
  cold_cmd->add_option("model", model, "a deployed model")->required();
  double concurrent = 0;
  unsigned instances = 0;
  auto* load_cmd = cluster_cmd->add_subcommand(
      "load", "report a model's load (WarmServe predicts each window's from these)");
  load_cmd->add_option("model", model, "a deployed model")->required();
  load_cmd->add_option("--concurrent", concurrent, "requests in flight now")
      ->required()
      ->check(CLI::NonNegativeNumber);
  load_cmd->add_option("--instances", instances, "instances serving or starting (K)");
  load_cmd->add_option("--rps", rps, "arrivals per second (informational)")
      ->check(CLI::NonNegativeNumber);
  auto* state_cmd = cluster_cmd->add_subcommand("state", "nodes, deployed models and plans");
  app.footer(
      "Exit codes: 0 done, 1 thawd unreachable or refused (see the message), 2 bad usage,\n"
      "3 the fetch or prewarm failed, 4 timed out.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  o.wait = !no_wait;
  if (cluster_cmd->parsed()) {
    cluster.json = o.json;
    try {
      if (deploy_cmd->parsed()) {
        auto size = thaw::text::parse_byte_size(size_text);
        if (!size || *size == 0) {
          fmt::print(stderr, "thawctl: --size {}: not a size (e.g. 13GiB, 500MB)\n", size_text);
          return kExitUsage;
        }
        spec.set_name(model);
        spec.set_size_bytes(*size);
        spec.set_layers(static_cast<std::uint32_t>(o.layers.value_or(0)));
        spec.set_slo_ttft_s(ttft);
        spec.set_slo_tpot_s(tpot);
        spec.set_prefill_s(prefill);
        spec.set_decode_s(decode);
        return cluster_deploy(spec, cluster);
      }
      if (cold_cmd->parsed()) return cluster_cold_start(model, cluster);
      if (load_cmd->parsed()) return cluster_load(model, concurrent, instances, rps, cluster);
      if (state_cmd->parsed()) return cluster_state(cluster);
    } catch (const Failure& f) {
      if (o.json)
        fmt::print("{}\n", nlohmann::json{{"error", "cluster"}, {"message", f.message}}.dump());
      fmt::print(stderr, "thawctl: {}\n", f.message);
      return f.exit_code;
    }
  }
  if (gpu >= 0) o.gpu = gpu;
  auto kv_bytes = kv.empty() ? std::optional<std::uint64_t>(0) : thaw::text::parse_byte_size(kv);
  if (!kv_bytes) {
    fmt::print(stderr, "thawctl: --kv-bytes {}: not a size (e.g. 512MiB, 8GiB, 1000000)\n", kv);
    return kExitUsage;
  }
  o.kv_bytes = *kv_bytes;
  try {
    Bus connection = connect(bus);
    sd_bus* b = connection.get();
    if (status_cmd->parsed()) return status(b, o);
    if (gpus_cmd->parsed()) return gpus(b, o);
    if (slots_cmd->parsed()) return slots(b, o);
    if (models_cmd->parsed()) return models(b, o);
    if (fetch_cmd->parsed()) return fetch(b, model, o);
    if (prewarm_cmd->parsed()) return prewarm(b, model, o);
    if (activate_cmd->parsed()) return slot_action(b, "Activate", slot, o);
    if (deactivate_cmd->parsed()) return slot_action(b, "Deactivate", slot, o);
    if (evict_cmd->parsed()) return slot_action(b, "Evict", slot, o);
    if (wait_cmd->parsed()) return wait_model(b, model, o);
    if (artifacts_cmd->parsed()) return artifacts(b, model, o);
    if (net_cmd->parsed()) return net(b, o);
  } catch (const Failure& f) {
    if (o.json) {
      fmt::print("{}\n", nlohmann::json{{"error", f.error_name}, {"message", f.message}}.dump());
    }
    fmt::print(stderr, "thawctl: {}\n", f.message);
    return f.exit_code;
  }
  return kExitUsage;
}
