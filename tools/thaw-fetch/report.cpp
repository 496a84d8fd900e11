#include "report.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "byte_size.hpp"

namespace thaw::fetch_cli {

using nlohmann::json;

std::string progress_line(std::string_view model, const store::ModelFetchProgress& p,
                          std::size_t width) {
  // Until the headers give the plan there is no total to show a share of ("0 B / 0 B").
  if (p.bytes_total == 0) {
    std::string line = fmt::format("{} [{}] resolving…", model, store::to_string(p.phase));
    if (width > 0 && line.size() > width) line.resize(width);
    return line;
  }
  const double fraction =
      std::min(1.0, static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total));
  // A bar where a terminal is wide enough for it.
  constexpr std::size_t kBar = 20;
  std::string bar;
  if (width >= 100) {
    const auto filled = static_cast<std::size_t>(fraction * kBar);
    bar = "[" + std::string(filled, '#') + std::string(kBar - filled, '.') + "] ";
  }
  std::string line = fmt::format(
      "{} [{}] {}{:5.1f}% {} / {}  {}/s  ETA {}  files {}/{}", model, store::to_string(p.phase),
      bar, 100.0 * fraction, format_bytes(static_cast<double>(p.bytes_done)),
      format_bytes(static_cast<double>(p.bytes_total)), format_bytes(p.rate_bytes_per_s),
      format_duration(p.eta_s), p.files_done, p.files_total);
  if (p.retries > 0) line += fmt::format("  retries {}", p.retries);
  if (p.chunk_refetches > 0) line += fmt::format("  refetched chunks {}", p.chunk_refetches);
  if (width > 0 && line.size() > width) line.resize(width);
  return line;
}

json fetch_summary(const store::ModelFetchResult& r, const FetchContext& context) {
  json files = json::array();
  for (const store::FetchedFile& f : r.files) {
    files.push_back({{"path", f.path},
                     {"size", f.size},
                     {"whole", f.whole},
                     {"plan_bytes", f.plan_bytes},
                     {"chunk_size", f.chunk_size},
                     {"chunks", f.chunk_count},
                     {"chunks_fetched", f.chunks_fetched},
                     {"chunks_ready", f.chunks_ready},
                     {"bytes_fetched", f.bytes_fetched},
                     {"state", store::to_string(f.state)},
                     {"sha256_checked", f.sha256_checked}});
  }
  const auto optional_number = [](const std::optional<double>& v) -> json {
    return v ? json(*v) : json(nullptr);
  };
  json out = {
      {"model", r.model},
      {"cache_key", r.cache_key},
      {"cache", context.cache},
      {"registry", context.registry},
      {"stage",
       r.stage ? json(fmt::format("{}/{}", r.stage->stage, r.stage->num_stages)) : json(nullptr)},
      {"layers", r.stage ? json::array({r.plan.layer_begin, r.plan.layer_end}) : json(nullptr)},
      {"consolidate", context.consolidate},
      {"bytes", r.bytes_fetched},
      {"bytes_planned", r.bytes_planned},
      {"bytes_cached", r.bytes_cached},
      {"seconds", r.seconds},
      {"goodput_bytes_per_s", r.goodput_bytes_per_s()},
      {"time_to_plan_s", optional_number(r.time_to_plan_s)},
      {"time_to_first_tensor_s", optional_number(r.time_to_first_tensor_s)},
      {"retries", r.retries},
      {"chunk_refetches", r.chunk_refetches},
      {"files", std::move(files)},
  };
  return out;
}

json fetch_failure(std::string_view model, const store::ModelFetchError& error,
                   const store::ModelFetchProgress& progress) {
  return {{"model", model},
          {"error", {{"code", store::to_string(error.code)}, {"message", error.message}}},
          {"bytes", progress.bytes_verified},
          {"seconds", progress.elapsed_s}};
}

json cache_status(const store::HostCache& cache) {
  json models = json::array();
  for (const store::CachedModelInfo& m : cache.models()) {
    json files = json::array();
    for (const store::CachedFileInfo& f : m.files) {
      files.push_back({{"path", f.relative_path},
                       {"size", f.size},
                       {"chunk_size", f.chunk_size},
                       {"chunks", f.chunk_count},
                       {"chunks_ready", f.verified_chunks},
                       {"state", f.being_created ? "creating" : store::to_string(f.state)}});
    }
    models.push_back({{"key", m.key},
                      {"bytes", m.bytes},
                      {"pins", m.pins},
                      {"last_used_unix_ns", m.last_used_unix_ns},
                      {"files", std::move(files)}});
  }
  return {{"cache", cache.root().string()},
          {"bytes_used", cache.bytes_used()},
          {"models", std::move(models)}};
}

json publish_summary(const std::string& manifest_path, const store::Manifest& manifest,
                     std::uint64_t chunk_size) {
  std::uint64_t bytes = 0;
  for (const store::ManifestFile& f : manifest.files) bytes += f.size;
  return {{"manifest", manifest_path},
          {"files", manifest.files.size()},
          {"bytes", bytes},
          {"chunk_size", chunk_size}};
}

}  // namespace thaw::fetch_cli
