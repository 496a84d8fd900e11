// thaw-fetch's subcommands. Each returns the process exit code: 0 done, 1 failed (a
// one-line "thaw-fetch: error: ..." on stderr says what and what to do).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace thaw::fetch_cli {

inline constexpr const char* kProgram = "thaw-fetch";

struct FetchArgs {
  std::string registry;
  std::string model;
  std::string cache;
  std::string stage;  // "K/N" or empty
  bool consolidate = false;
  bool background = false;
  std::string key;
  std::string revision = "main";
  unsigned connections = 8;
  std::uint64_t budget = 0;    // 0: no budget beyond the disk
  std::uint64_t max_rate = 0;  // bytes/s; 0: no limit
  std::uint64_t chunk_size = 4ull << 20;
  std::vector<std::string> headers;
  bool no_file_sha256 = false;
  unsigned verify_threads = 0;
  bool json = false;
  bool quiet = false;
};

struct PublishArgs {
  std::string dir;
  std::uint64_t chunk_size = 4ull << 20;
  bool plain_chunk_digests = false;
  bool json = false;
  bool quiet = false;
};

struct StatusArgs {
  std::string cache;
  bool json = false;
};

int run_fetch(const FetchArgs& args);
int run_publish(const PublishArgs& args);
int run_status(const StatusArgs& args);

// Prints "thaw-fetch: error: <message>" on stderr (newlines flattened); returns 1.
int report_error(std::string message);

}  // namespace thaw::fetch_cli
