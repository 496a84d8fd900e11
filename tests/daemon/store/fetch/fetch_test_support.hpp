// Shared by the model-fetch suites: a synthetic sharded GPT-2 (thaw-genmodel) published with
// a manifest under a registry root, a real nginx serving it (the registry suite's
// NginxServer), a host cache in a temporary directory, and checks on what the cache holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/safetensors/fetch_plan.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/fetch/chunk_set.hpp"
#include "daemon/store/registry/fetcher_config.hpp"
#include "daemon/store/registry/registry.hpp"
#include "nginx_server.hpp"
#include "test_support.hpp"

namespace thaw::store::testing {

inline constexpr const char* kModelName = "gpt-syn";
// Small chunks so that a 1-2 MB shard has many, and plans split inside files.
inline constexpr std::uint64_t kTestChunkBytes = 64 << 10;

// Runs a program; its exit code. Its stdout and stderr are kept where asked (else dropped).
int run_program(const std::vector<std::string>& argv, std::string* out = nullptr,
                std::string* err = nullptr);

// Writes thaw-genmodel's 8-layer GPT-2 (embd 256, vocab 1000, shards of at most 2 MB: 18
// shards plus config.json and the index) into `dir`.
void generate_model(const std::filesystem::path& dir);

std::vector<std::byte> read_file(const std::filesystem::path& path);
// Bytes [offset, offset + length) of a file.
std::vector<std::byte> read_range(const std::filesystem::path& path, std::uint64_t offset,
                                  std::uint64_t length);

// Every regular file of a model directory except the manifest, relative paths, sorted.
std::vector<std::string> model_files(const std::filesystem::path& dir);

// The chunks a plan's file entry needs, rounded out.
ChunkSet planned_chunks(const safetensors::FileFetch& file, std::uint64_t chunk_size);
// The chunks a readiness map has verified.
ChunkSet verified_chunks(const ChunkReadiness& readiness);

// A model published on a registry root served by nginx, and a cache to fetch it into.
class RegistryFixture {
 public:
  // `server_extra`: nginx directives (e.g. a throttled location); "/slow/" is added with
  // `limit_rate` when it is not empty.
  explicit RegistryFixture(std::string limit_rate = "");

  const std::filesystem::path& registry_root() const { return registry_.path(); }
  std::filesystem::path model_dir() const { return registry_.path() / kModelName; }
  const std::filesystem::path& cache_root() const { return cache_.path(); }
  NginxServer& server() { return *server_; }

  // http://127.0.0.1:<port><prefix> as a registry ("" or "/slow").
  std::unique_ptr<Registry> registry(const std::string& prefix = "") const;
  HostCache open_cache(std::uint64_t budget = std::uint64_t{1} << 40) const;
  HostCache open_cache_at(const std::filesystem::path& root,
                          std::uint64_t budget = std::uint64_t{1} << 40) const;

  std::filesystem::path cached_path(const std::string& file) const;
  // A bounded retry policy that recovers quickly from a restarted server.
  static FetcherConfig fast_retry_config();

 private:
  TempDir registry_;
  TempDir cache_;
  std::unique_ptr<NginxServer> server_;
};

}  // namespace thaw::store::testing
