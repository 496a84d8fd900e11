// `thaw-fetch status --cache DIR`: what a host cache holds, file by file. Opening the cache
// re-indexes it (as thawd does at start): entries found damaged are dropped and reported.
#include <fmt/format.h>

#include <filesystem>
#include <limits>

#include "byte_size.hpp"
#include "commands.hpp"
#include "daemon/store/cache/host_cache.hpp"
#include "report.hpp"

namespace thaw::fetch_cli {

int run_status(const StatusArgs& args) {
  std::error_code ec;
  if (!std::filesystem::is_directory(args.cache, ec)) {
    return report_error(
        fmt::format("--cache {}: no such directory; give a cache root that "
                    "thaw-fetch or thawd filled",
                    args.cache));
  }
  // No budget: looking must never evict.
  auto cache = store::HostCache::open(
      store::HostCacheConfig{args.cache, std::numeric_limits<std::uint64_t>::max(), {}, {}});
  if (!cache) return report_error(fmt::format("--cache {}: {}", args.cache, cache.error().message));
  for (const store::DroppedEntry& dropped : cache->reindex_report().dropped) {
    fmt::print(stderr, "{}: dropped {}: {}\n", kProgram, dropped.path.string(), dropped.reason);
  }
  if (args.json) {
    fmt::print("{}\n", cache_status(*cache).dump());
    return 0;
  }
  const auto models = cache->models();
  fmt::print("cache {}: {} in {} model(s)\n", cache->root().string(),
             format_bytes(static_cast<double>(cache->bytes_used())), models.size());
  for (const store::CachedModelInfo& m : models) {
    fmt::print("{}  {}{}\n", m.key, format_bytes(static_cast<double>(m.bytes)),
               m.pins > 0 ? fmt::format("  pinned x{}", m.pins) : "");
    for (const store::CachedFileInfo& f : m.files) {
      fmt::print("  {:<40} {:>10}  {:>5}/{:<5} chunks  {}\n", f.relative_path,
                 format_bytes(static_cast<double>(f.size)), f.verified_chunks, f.chunk_count,
                 f.being_created ? "creating" : store::to_string(f.state));
    }
  }
  return 0;
}

}  // namespace thaw::fetch_cli
