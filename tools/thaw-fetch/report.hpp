// What thaw-fetch prints: the progress line, and the JSON documents of --json (the
// fields scripts and benchmarks read; see the README section in main.cpp's --help).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon/store/cache/host_cache.hpp"
#include "daemon/store/fetch/manifest_publish.hpp"
#include "daemon/store/fetch/model_fetch.hpp"

namespace thaw::fetch_cli {

// One line: phase, percentage, bytes done / total, rate, ETA, files — at most `width`
// characters (a terminal's width; 0 = no limit).
std::string progress_line(std::string_view model, const store::ModelFetchProgress& progress,
                          std::size_t width);

struct FetchContext {
  std::string registry;  // as described by the registry
  std::string cache;     // cache root
  bool consolidate = false;
};

nlohmann::json fetch_summary(const store::ModelFetchResult& result, const FetchContext& context);
nlohmann::json fetch_failure(std::string_view model, const store::ModelFetchError& error,
                             const store::ModelFetchProgress& progress);
nlohmann::json cache_status(const store::HostCache& cache);
nlohmann::json publish_summary(const std::string& manifest_path, const store::Manifest& manifest,
                               std::uint64_t chunk_size);

}  // namespace thaw::fetch_cli
