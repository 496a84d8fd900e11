// thaw-fetch: fetch a model (or one pipeline stage of it) from a registry into a thaw host
// cache, publish a model's thaw-manifest.json, and show what a cache holds.
//
// Exit codes: 0 done; 1 failed (one line on stderr names what failed and what to do);
// 2 the command line is wrong.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>

#include "byte_size.hpp"
#include "commands.hpp"

namespace {

using namespace thaw::fetch_cli;

constexpr const char* kDescription =
    "Fetches models into a thaw host cache, streaming them tensor by tensor with per-chunk\n"
    "sha256 verification, and publishes the manifests that make that verification possible.\n"
    "Exit codes: 0 done, 1 failed (one line on stderr says what and what to do), 2 usage.";

constexpr const char* kFetchDescription =
    "Fetch a model, or pipeline stage K of N of it, into a cache.";

constexpr const char* kFetchFooter =
    "Order: config and tokenizer files first, then the safetensors headers, then the stage's\n"
    "tensors in file order. Each chunk is checked against thaw-manifest.json's digest before\n"
    "it counts as ready. An interrupted fetch resumes from the chunks already verified.\n"
    "Progress goes to stderr (redrawn on a terminal, a line every 5 s otherwise).\n"
    "--json prints one object on stdout: model, cache_key, cache, registry, stage (\"K/N\" or\n"
    "null), layers ([begin, end) or null), consolidate, bytes (fetched and verified in this\n"
    "run), bytes_planned, bytes_cached (needed and already in the cache), seconds,\n"
    "goodput_bytes_per_s, time_to_plan_s, time_to_first_tensor_s, retries, chunk_refetches,\n"
    "files [{path, size, whole, plan_bytes, chunk_size, chunks, chunks_fetched, chunks_ready,\n"
    "bytes_fetched, state, sha256_checked}]; on failure {model, error: {code, message}, bytes,\n"
    "seconds}.";

// A SIZE option given as text: converted after parsing so the error names the option.
std::uint64_t size_of(const std::string& option, const std::string& text) {
  auto size = parse_byte_size(text);
  if (!size) {
    throw CLI::ValidationError(fmt::format(
        "{}: cannot read '{}' as a size (e.g. 4MiB, 500MB, 2GB, 1048576)", option, text));
  }
  return *size;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, kProgram};
  app.require_subcommand(1);

  FetchArgs fetch;
  std::string fetch_budget, fetch_chunk = "4MiB", fetch_rate;
  CLI::App* fetch_cmd = app.add_subcommand("fetch", kFetchDescription);
  fetch_cmd->footer(kFetchFooter);
  fetch_cmd
      ->add_option("--registry", fetch.registry,
                   "where models are: http(s)://host/base (a plain directory, e.g. nginx),\n"
                   "hf+http(s)://host (the Hugging Face hub API), or a local directory")
      ->required()
      ->type_name("URL");
  fetch_cmd->add_option("--model", fetch.model, "the model's name on the registry (e.g. org/name)")
      ->required()
      ->type_name("NAME");
  fetch_cmd->add_option("--cache", fetch.cache, "the cache root directory (created if absent)")
      ->required()
      ->type_name("DIR");
  fetch_cmd
      ->add_option("--stage", fetch.stage,
                   "only pipeline stage K of N (0-based): its layers, plus the embeddings\n"
                   "for the first stage and the final norm and LM head for the last")
      ->type_name("K/N");
  fetch_cmd->add_flag("--consolidate", fetch.consolidate,
                      "with --stage: then fetch the rest of the model at background priority");
  fetch_cmd->add_flag("--background", fetch.background,
                      "fetch tensor ranges at background priority (e.g. a consolidation run)");
  fetch_cmd->add_option("--key", fetch.key,
                        "the model's key in the cache (default: the name, '/' as '--')");
  fetch_cmd->add_option("--revision", fetch.revision, "revision on a Hugging Face hub registry")
      ->capture_default_str();
  fetch_cmd
      ->add_option("--connections", fetch.connections,
                   "parallel HTTP connections, in all and per file")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  fetch_cmd
      ->add_option("--budget", fetch_budget,
                   "cache size budget; least recently used models are evicted to stay\n"
                   "under it (default: no budget, only the disk's free space)")
      ->type_name("SIZE");
  fetch_cmd
      ->add_option("--max-rate", fetch_rate,
                   "download rate limit in bytes per second, e.g. 100MB (default: none)")
      ->type_name("SIZE");
  fetch_cmd
      ->add_option("--chunk-size", fetch_chunk,
                   "readiness chunk size for files whose manifest gives none")
      ->type_name("SIZE")
      ->capture_default_str();
  fetch_cmd
      ->add_option("--header", fetch.headers,
                   "extra HTTP request header, e.g. 'Authorization: Bearer ...' (repeatable)")
      ->type_name("'NAME: VALUE'");
  fetch_cmd->add_flag("--no-file-sha256", fetch.no_file_sha256,
                      "skip the separate whole-file sha256 of files with plain chunk digests "
                      "(chained manifests check it with the last chunk, at no cost)");
  fetch_cmd
      ->add_option("--verify-threads", fetch.verify_threads,
                   "threads hashing chunks (default: up to 4)")
      ->check(CLI::Range(1u, 64u));
  fetch_cmd->add_flag("--json", fetch.json, "print a JSON summary on stdout");
  fetch_cmd->add_flag("-q,--quiet", fetch.quiet, "no progress on stderr");

  PublishArgs publish;
  std::string publish_chunk = "4MiB";
  CLI::App* publish_cmd = app.add_subcommand(
      "publish", "Write DIR/thaw-manifest.json for the model in DIR (publish it to a registry).");
  publish_cmd->footer(
      "The manifest lists every file's size, sha256 and a digest per chunk, so that fetches\n"
      "verify each chunk as it lands. The chunk digests are SHA-256 chaining states (the\n"
      "hash's state after each chunk): a fetch checks any chunk from the state before it,\n"
      "and the last chunk's check is the file's sha256, so one hashing pass verifies both.\n"
      "Chunk sizes must be multiples of 64 bytes for that; other sizes, or\n"
      "--plain-chunk-digests, give one plain sha256 per chunk (a fetch then hashes the file\n"
      "a second time for its sha256). Run it where the registry serves DIR from; hidden\n"
      "directories (.git, .cache) are left out. Smaller chunks fit pipeline stages' layer\n"
      "boundaries more tightly and wake streaming readers sooner; each costs 67 bytes of\n"
      "manifest.");
  publish_cmd->add_option("dir", publish.dir, "the model's directory")
      ->required()
      ->type_name("DIR");
  publish_cmd->add_option("--chunk-size", publish_chunk, "bytes per chunk digest")
      ->type_name("SIZE")
      ->capture_default_str();
  publish_cmd->add_flag("--plain-chunk-digests", publish.plain_chunk_digests,
                        "one sha256 per chunk instead of chaining states");
  publish_cmd->add_flag("--json", publish.json,
                        "print {manifest, files, bytes, chunk_size} on stdout");
  publish_cmd->add_flag("-q,--quiet", publish.quiet, "print nothing but errors");

  StatusArgs status;
  CLI::App* status_cmd = app.add_subcommand(
      "status", "List the models and files a cache holds, with their readiness.");
  status_cmd->footer(
      "Per file: chunks verified of all, and state filling / complete / failed. Opening the\n"
      "cache re-indexes it, dropping damaged entries; not while thawd or a fetch holds it.");
  status_cmd->add_option("--cache", status.cache, "the cache root directory")
      ->required()
      ->type_name("DIR");
  status_cmd->add_flag("--json", status.json,
                       "print {cache, bytes_used, models: [{key, bytes, pins, last_used_unix_ns,\n"
                       "files: [{path, size, chunk_size, chunks, chunks_ready, state}]}]}");

  try {
    app.parse(argc, argv);
    if (fetch_cmd->parsed()) {
      if (!fetch_budget.empty()) fetch.budget = size_of("--budget", fetch_budget);
      if (!fetch_rate.empty()) fetch.max_rate = size_of("--max-rate", fetch_rate);
      fetch.chunk_size = size_of("--chunk-size", fetch_chunk);
      if (fetch.consolidate && fetch.stage.empty()) {
        throw CLI::ValidationError("--consolidate needs --stage");
      }
    }
    if (publish_cmd->parsed()) publish.chunk_size = size_of("--chunk-size", publish_chunk);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    fmt::print(stderr, "{}: error: {} (see {} --help)\n", kProgram, message, kProgram);
    return 2;
  }
  if (fetch_cmd->parsed()) return run_fetch(fetch);
  if (publish_cmd->parsed()) return run_publish(publish);
  return run_status(status);
}
